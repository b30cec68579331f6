#!/usr/bin/env bash
# Quick start, command 2: the whole test suite. Unit tests run with -race; the
# end-to-end tests start real servers and real QEMU VMs, two tests at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PATH:/usr/local/go/bin"
# The end-to-end suite runs on QEMU 10 (on Debian 12 the bookworm-backports
# packages unpacked beside the distribution's QEMU 7.2, which stays installed),
# and a smoke subset (create, exec, suspend/wake, snapshot, fork) on the
# distribution's QEMU. AGENTVM_QEMU, when set, names the QEMU for the suite.
smoke='^(TestCreateAndExec|TestPauseSuspendWake|TestSnapshotAndFork)$'
qemu_major=$(qemu-system-x86_64 --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
e2e_qemu=${AGENTVM_QEMU:-}
if [ -z "$e2e_qemu" ] && [ "$qemu_major" -lt 10 ] && [ "$(id -u)" = 0 ]; then # (the e2e tests need root)
	rc=0
	e2e_qemu=$(scripts/qemu-backports.sh --dir "${AGENTVM_QEMU_DIR:-/opt/agentvm/qemu-10}" | tail -1) || rc=$?
	[ "$rc" = 0 ] || [ "$rc" = 3 ] || exit "$rc" # 3: not Debian 12, the distribution's QEMU it is
fi
# e2e_go runs go test on the suite's QEMU ($e2e_qemu; empty: the distribution's).
e2e_go() {
	if [ -n "$e2e_qemu" ]; then
		AGENTVM_QEMU=$e2e_qemu go test -count=1 "$@"
	else
		env -u AGENTVM_QEMU go test -count=1 "$@"
	fi
}
suite_qemu=${e2e_qemu:-qemu-system-x86_64}
# From here two things run in the background, each in a process group of
# its own that ends if this script stops first:
# - the test S3 server the cluster tests use, built from its Go module
#   (internal/s3test);
# - the long lane: the guest images the end-to-end tests use, built (or
#   found in ~/.cache/agentvm) with the same guest agent the tests build,
#   then at once the browser VMs' test (package e2e/browser, half an hour
#   of Chromium under emulation) and the smoke tests on the distribution's
#   QEMU. It starts while the unit tests run, so the long test does not
#   set the suite's length; its log is printed after package e2e's.
# Then package e2e's tests run two at a time (each calls t.Parallel; the
# VMs of one test mostly keep one core busy, and its waits leave it idle;
# AGENTVM_E2E_PARALLEL changes how many). At the end the slowest tests of
# both are listed, to see where the time goes.
cache=${AGENTVM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentvm} # as image.DefaultCacheDir
work=$(mktemp -d)
side_log=$work/side.log
e2e_log=$work/e2e.log
s3_pid=
side_pid=
# Stopped early (a failure under set -e, Ctrl-C, a CI timeout's SIGTERM):
# what runs in the background ends too, and what the long lane logged so
# far is shown. Killed outright (SIGKILL), the lane's watchdog ends it.
stop_background() {
	[ -z "$s3_pid" ] || kill -- -"$s3_pid" 2>/dev/null || true
	if [ -n "$side_pid" ]; then
		kill -- -"$side_pid" 2>/dev/null || true
		echo "==> the long lane (images, browser test, smoke tests), stopped (the end of its log)"
		tail -n 200 "$side_log"
	fi
	rm -rf "$work"
}
trap stop_background EXIT
trap 'exit 130' INT TERM
set -m # the background jobs get process groups of their own
vgw_dir="$cache/tools/versitygw-v1.8.0"
if [ "$(id -u)" = 0 ] && [ ! -x "$vgw_dir/versitygw" ]; then
	(mkdir -p "$vgw_dir" && GOBIN="$vgw_dir" GOFLAGS= go install github.com/versity/versitygw/cmd/versitygw@v1.8.0) </dev/null >"$work/s3.log" 2>&1 &
	s3_pid=$!
fi
par=${AGENTVM_E2E_PARALLEL:-2}
echo "==> in the background: the guest images, then the browser VMs' test (e2e/browser) and the smoke tests on the distribution's QEMU (log: $side_log, printed at the end)"
(
	# A script killed outright (SIGKILL, no trap) takes the lane with it.
	lane=$BASHPID # the lane's process group
	(while kill -0 $$ 2>/dev/null; do sleep 5; done; kill -- -"$lane" 2>/dev/null) </dev/null >/dev/null 2>&1 &
	watchdog=$!
	trap 'kill "$watchdog" 2>/dev/null' EXIT
	if [ "$(id -u)" = 0 ]; then
		echo "==> building the guest images"
		for img in default code-interpreter browser; do
			bin/agentvm image build --force=false --name "$img" --guest-agent bin/agentvm-guest || { echo 1 >"$work/images.rc"; exit 1; }
		done
	fi
	echo 0 >"$work/images.rc"
	src=0
	echo "==> the browser VMs' test on $("$suite_qemu" --version | head -1)"
	e2e_go -timeout 75m -v ./e2e/browser/ || src=$?
	if [ -n "$e2e_qemu" ]; then
		echo "==> end-to-end smoke tests on the distribution's $(qemu-system-x86_64 --version | head -1)"
		env -u AGENTVM_QEMU go test -count=1 -timeout 30m -parallel 1 -v -run "$smoke" ./e2e/ || src=$?
	fi
	exit "$src"
) </dev/null >"$side_log" 2>&1 &
side_pid=$!
set +m
echo "==> go vet"
go vet ./...
echo "==> unit tests (-race; the store's suite on SQLite and on a PostgreSQL it starts)"
env -u AGENTVM_TEST_NO_POSTGRES go test -race -count=1 $(go list ./... | grep -v -e /e2e -e /bench)
echo "==> code interpreter server (python unittest, real Jupyter kernels)"
(cd internal/image/codeinterp && CODEINTERP_REQUIRE=1 /usr/bin/python3 -m unittest -q test_server test_languages)
echo "==> fuzzing (a short run of every target; scripts/fuzz.sh runs them longer)"
FUZZTIME="${FUZZTIME:-5s}" scripts/fuzz.sh
if [ -n "$s3_pid" ]; then
	echo "==> waiting for the test S3 server's build"
	if ! wait "$s3_pid"; then
		cat "$work/s3.log"
		echo "scripts/test.sh: building the test S3 server failed (above)" >&2
		exit 1
	fi
	s3_pid=
fi
echo "==> waiting for the guest images"
while [ ! -s "$work/images.rc" ] && kill -0 "$side_pid" 2>/dev/null; do sleep 2; done
if [ "$(cat "$work/images.rc" 2>/dev/null)" != 0 ]; then
	cat "$side_log"
	side_pid=
	echo "scripts/test.sh: building the guest images failed (above)" >&2
	exit 1
fi
echo "==> end-to-end tests (real QEMU VMs) on $("$suite_qemu" --version | head -1): $suite_qemu"
echo "    $par at a time; the long lane goes on beside them"
rc=0
e2e_go -timeout 75m -parallel "$par" -v ./e2e/ 2>&1 | tee "$e2e_log" || rc=$?
src=0
wait "$side_pid" || src=$?
side_pid=
echo "==> beside them: the guest images, the browser VMs' test (e2e/browser) and the smoke tests on the distribution's QEMU"
cat "$side_log"
echo "==> the slowest end-to-end tests"
grep -hE '^--- (PASS|FAIL): Test[A-Za-z0-9_]+ \([0-9.]+s\)' "$e2e_log" "$side_log" |
	sed -E 's/^--- (PASS|FAIL): (Test[A-Za-z0-9_]+) \(([0-9.]+)s\)/\3 \2 \1/' | sort -rn | head -n 12 |
	awk '{printf "    %7.0f s  %s%s\n", $1, $2, ($3 == "FAIL" ? " (failed)" : "")}' || true
if [ "$rc" != 0 ] || [ "$src" != 0 ]; then
	echo "scripts/test.sh: end-to-end tests failed (above)" >&2
	exit 1
fi
echo "==> all tests passed"
