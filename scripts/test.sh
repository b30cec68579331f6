#!/usr/bin/env bash
# Quick start, command 2: the whole test suite. Unit tests run with -race; the
# end-to-end tests start a real server and real QEMU VMs, one package at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PATH:/usr/local/go/bin"
echo "==> go vet"
go vet ./...
echo "==> unit tests (-race; the store's suite on SQLite and on a PostgreSQL it starts)"
env -u AGENTVM_TEST_NO_POSTGRES go test -race -count=1 $(go list ./... | grep -v -e /e2e -e /bench)
echo "==> code interpreter server (python unittest, real Jupyter kernels)"
(cd internal/image/codeinterp && CODEINTERP_REQUIRE=1 /usr/bin/python3 -m unittest -q test_server)
echo "==> fuzzing (a short run of every target; scripts/fuzz.sh runs them longer)"
FUZZTIME="${FUZZTIME:-5s}" scripts/fuzz.sh
echo "==> end-to-end tests (real QEMU VMs)"
go test -p 1 -count=1 -timeout 75m -v ./e2e/...
echo "==> all tests passed"
