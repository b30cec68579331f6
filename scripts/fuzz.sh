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
#
# Go before 1.27 can fail a run at the -fuzztime boundary with a bare
# "context deadline exceeded" when its workers are starved of CPU
# (golang/go#75804): no input failed, none is written. Such a run is tried
# again once, and then counted as a flake; any run that writes a failing
# input, panics or fails otherwise stops the script.
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

# deadline_flake reports whether the run logged in $1 failed only at the
# -fuzztime boundary, with no failing input.
deadline_flake() {
	grep -q 'context deadline exceeded' "$1" &&
		! grep -qE 'Failing input written|panic:|_test\.go:[0-9]+:' "$1"
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

n=0
for pkg in "${pkgs[@]}"; do
	# go test -list compiles the package once (failing the script if it does
	# not build); the runs below reuse the build.
	list=$(go test -run='^$' -list='^Fuzz' "$pkg")
	for target in $(grep '^Fuzz' <<<"$list" || true); do
		echo "==> $target ($pkg, $FUZZTIME)"
		for try in 1 2; do
			rc=0
			go test -run='^$' -fuzz="^${target}\$" -fuzztime="$FUZZTIME" -fuzzminimizetime="$FUZZMINIMIZETIME" "$pkg" 2>&1 | tee "$out" || rc=$?
			[ "$rc" = 0 ] && break
			if ! deadline_flake "$out"; then
				exit "$rc"
			fi
			echo "==> $target: the fuzzing engine's deadline flake (golang/go#75804, no failing input); try $try of 2"
		done
		n=$((n + 1))
	done
done
[ "$n" -gt 0 ] || { echo "no fuzz targets found in ${pkgs[*]}" >&2; exit 1; }
echo "==> $n fuzz targets passed ($FUZZTIME each)"
