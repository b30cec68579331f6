#!/usr/bin/env bash
# Installs what agentvm needs on a Debian/Ubuntu host (as root) and builds the binaries
# into bin/. Safe to re-run: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_go="1.26"
export PATH="$PATH:/usr/local/go/bin"

# AGENTVM_QEMU_BACKPORTS=1: on Debian 12, install QEMU 10 from bookworm-backports
# in place of the distribution's QEMU 7.2 (scripts/qemu-backports.sh --system adds
# the apt source if it is missing). Debian 13 and Ubuntu keep their own QEMU.
if [ "${AGENTVM_QEMU_BACKPORTS:-0}" != 0 ] &&
	! qemu-system-x86_64 --version 2>/dev/null | grep -q 'version \(1[0-9]\|[2-9][0-9]\)\.'; then
	rc=0
	scripts/qemu-backports.sh --system || rc=$?
	[ "$rc" = 0 ] || [ "$rc" = 3 ] || exit "$rc"
fi

pkgs=()
command -v qemu-system-x86_64 >/dev/null || pkgs+=(qemu-system-x86)
command -v qemu-img >/dev/null || pkgs+=(qemu-utils)
command -v debootstrap >/dev/null || pkgs+=(debootstrap)
command -v mkfs.ext4 >/dev/null || pkgs+=(e2fsprogs)
command -v ssh >/dev/null || pkgs+=(openssh-client)
command -v curl >/dev/null || pkgs+=(curl)
command -v rsync >/dev/null || pkgs+=(rsync)
# The recordings' test plays a terminal's recording with Debian's asciinema.
command -v asciinema >/dev/null || pkgs+=(asciinema)
# Hosted repositories are served by git's own http-backend (docs/git.md).
[ -x "$(git --exec-path 2>/dev/null)/git-http-backend" ] || pkgs+=(git)
# The compatibility tests install the published E2B and MCP clients (npm,
# and PyPI into a throwaway virtualenv).
command -v npm >/dev/null || pkgs+=(nodejs npm)
command -v python3 >/dev/null || pkgs+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || pkgs+=(python3-venv)
# The web console's tests drive Debian's headless Chromium (e2e/console_test.go).
command -v chromium >/dev/null || pkgs+=(chromium)
# The store's tests start a PostgreSQL of their own (internal/pgtest).
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || pkgs+=(postgresql)
# The code interpreter's server is tested on the host (scripts/test.sh) with
# the packages its image installs.
/usr/bin/python3 -c 'import ipykernel, jupyter_client, numpy, pandas, matplotlib' 2>/dev/null ||
	pkgs+=(python3-ipykernel python3-jupyter-client python3-numpy python3-pandas python3-matplotlib)
[ -d /usr/share/nodejs/typescript ] || pkgs+=(node-typescript)
[ -d /usr/lib/R/site-library/IRkernel ] || pkgs+=(r-cran-irkernel)
command -v jshell >/dev/null || pkgs+=(openjdk-17-jdk-headless)
if [ ${#pkgs[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "agentvm setup: missing packages: ${pkgs[*]}; run as root or: sudo apt-get install ${pkgs[*]}" >&2
		exit 1
	fi
	echo "==> apt-get install ${pkgs[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi

if ! command -v go >/dev/null; then
	echo "agentvm setup: Go $need_go or newer is required and was not found (install it from https://go.dev/dl into /usr/local/go)" >&2
	exit 1
fi
have_go=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -1)" != "$need_go" ]; then
	echo "agentvm setup: Go $have_go is too old: agentvm needs Go $need_go or newer (https://go.dev/dl)" >&2
	exit 1
fi
qv=$(qemu-system-x86_64 --version | sed -n 's/.*version \([0-9]*\.[0-9]*\).*/\1/p')
if [ "$(printf '%s\n%s\n' 7.2 "$qv" | sort -V | head -1)" != 7.2 ]; then
	echo "agentvm setup: QEMU $qv is too old: agentvm needs QEMU 7.2 or newer" >&2
	exit 1
fi

# The web console (web/) is built into internal/console/dist, which the
# agentvm binary embeds; without it the console page says how to build it.
echo "==> building the web console (npm ci && npm run build in web/)"
(cd web && npm ci --no-audit --no-fund --loglevel=error && npm run build --silent)

echo "==> building bin/agentvm and bin/agentvm-guest (Go $have_go, QEMU $qv)"
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -o bin/agentvm-guest ./cmd/agentvm-guest
go build -o bin/agentvm ./cmd/agentvm
