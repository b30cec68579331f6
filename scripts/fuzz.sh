#!/usr/bin/env bash
# Runs every native Go fuzz target (func FuzzXxx(f *testing.F)) for FUZZTIME
# each (default 10s), one after another, since a fuzz run already uses every
# core. Stops at the first failure: go test has then written the input to the
# package's testdata/fuzz/FuzzXxx/; commit it as a regression seed with the fix.
#
#   scripts/fuzz.sh                     # every package with fuzz targets
#   FUZZTIME=1m scripts/fuzz.sh ./api   # some packages, longer
#
# FUZZMINIMIZETIME (default 1s) caps the minimization of each new input; go's
# default of 60s can take up a whole short run. The FuzzUntar target skips
# itself unless run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
FUZZTIME="${FUZZTIME:-10s}"
FUZZMINIMIZETIME="${FUZZMINIMIZETIME:-1s}"

if [ $# -gt 0 ]; then
	pkgs=("$@")
else
	mapfile -t pkgs < <(grep -rl --include='*_test.go' --exclude-dir=.git \
		-E '^func Fuzz[A-Za-z0-9_]*\(' . | xargs -r -n1 dirname | sort -u)
fi
[ ${#pkgs[@]} -gt 0 ] || { echo "no fuzz targets found" >&2; exit 1; }

n=0
for pkg in "${pkgs[@]}"; do
	# go test -list compiles the package once (failing the script if it does
	# not build); the runs below reuse the build.
	list=$(go test -run='^$' -list='^Fuzz' "$pkg")
	for target in $(grep '^Fuzz' <<<"$list" || true); do
		echo "==> $target ($pkg, $FUZZTIME)"
		go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" -fuzzminimizetime="$FUZZMINIMIZETIME" "$pkg"
		n=$((n + 1))
	done
done
[ "$n" -gt 0 ] || { echo "no fuzz targets found in ${pkgs[*]}" >&2; exit 1; }
echo "==> $n fuzz targets passed ($FUZZTIME each)"
