#!/usr/bin/env bash
# QEMU 10 from bookworm-backports on Debian 12, in one of two ways (as root):
#
#   scripts/qemu-backports.sh --system     install qemu-system-x86 and qemu-utils from
#                                          bookworm-backports in place of Debian 12's QEMU 7.2
#   scripts/qemu-backports.sh --dir DIR    unpack them into DIR, beside the distribution's
#                                          QEMU, which stays installed and in use; run
#                                          `agentvm serve --qemu DIR/bin/qemu-system-x86_64`
#                                          (or AGENTVM_QEMU=DIR/bin/qemu-system-x86_64)
#
# Both add the bookworm-backports apt source if it is missing. Backports have apt
# priority 100, so nothing else on the host moves to backports. On any other system
# (Debian 13 and Ubuntu ship their own QEMU) it says so and does nothing.
# --dir prints the QEMU binary's path as its last line.
set -euo pipefail

mode=${1:-}
dir=${2:-}
case "$mode" in
--system) ;;
--dir) [ -n "$dir" ] || {
	echo "usage: $0 --system | --dir DIR" >&2
	exit 2
} ;;
*)
	echo "usage: $0 --system | --dir DIR" >&2
	exit 2
	;;
esac

. /etc/os-release
if [ "${ID:-}" != debian ] || [ "${VERSION_CODENAME:-}" != bookworm ]; then
	echo "agentvm setup: QEMU from bookworm-backports is for Debian 12 (bookworm) only; this is ${PRETTY_NAME:-an unknown system}: keeping its own QEMU" >&2
	exit 3
fi
if [ "$(id -u)" != 0 ]; then
	echo "agentvm setup: installing QEMU from bookworm-backports needs root" >&2
	exit 1
fi

pkgs=(qemu-system-x86 qemu-system-common qemu-system-data qemu-utils seabios)
if ! grep -qs '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; then
	echo "==> adding the bookworm-backports apt source (/etc/apt/sources.list.d/bookworm-backports.sources)"
	cat >/etc/apt/sources.list.d/bookworm-backports.sources <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
	apt-get update -qq
fi
candidate() { apt-cache madison "$1" | awk -F'|' '/bookworm-backports/ {gsub(/ /, "", $2); print $2; exit}'; }
if [ -z "$(candidate qemu-system-x86)" ]; then
	apt-get update -qq
	[ -n "$(candidate qemu-system-x86)" ] || {
		echo "agentvm setup: no qemu-system-x86 in bookworm-backports (apt-cache madison qemu-system-x86)" >&2
		exit 1
	}
fi

if [ "$mode" = --system ]; then
	echo "==> apt-get install -t bookworm-backports qemu-system-x86 qemu-utils"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports qemu-system-x86 qemu-utils >/dev/null
	qemu-system-x86_64 --version | head -1
	exit 0
fi

# --dir: the packages' files under DIR/root, and wrappers in DIR/bin that run them
# with their own firmware (-L) and modules. The libraries they link are bookworm's
# (the backports are built against it); a missing one is named. Option ROMs not
# in the packages (iPXE's efi-virtio.rom) come from the distribution's ipxe-qemu,
# the same files QEMU 7.2 loads: a ROM of another size would make a 7.2 state
# fail to load on QEMU 10 (RAM block length mismatch).
want=""
for p in "${pkgs[@]}"; do want+="$p=$(candidate "$p") "; done
if [ -f "$dir/.packages" ] && [ "$(cat "$dir/.packages")" = "$want" ] && [ -x "$dir/bin/qemu-system-x86_64" ]; then
	echo "==> QEMU from bookworm-backports already unpacked in $dir" >&2
	echo "$dir/bin/qemu-system-x86_64"
	exit 0
fi
echo "==> unpacking ${want}into $dir" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp" # apt-get download runs as _apt where it can
# shellcheck disable=SC2086
(cd "$tmp" && apt-get download -qq $want 2>&1 | grep -v 'unsandboxed' >&2 || true)
for p in "${pkgs[@]}"; do
	ls "$tmp/${p}_"*.deb >/dev/null 2>&1 || {
		echo "agentvm setup: apt-get download $p from bookworm-backports failed" >&2
		exit 1
	}
done
rm -rf "$dir.new"
mkdir -p "$dir.new/root" "$dir.new/bin"
for f in "$tmp"/*.deb; do dpkg-deb -x "$f" "$dir.new/root"; done
root=$dir/root
missing=$(ldd "$dir.new/root/usr/bin/qemu-system-x86_64" "$dir.new/root/usr/bin/qemu-img" | awk '/not found/ {print $1}' | sort -u)
if [ -n "$missing" ]; then
	echo "agentvm setup: QEMU from bookworm-backports needs libraries this host lacks: $missing (apt-get install the packages that ship them)" >&2
	exit 1
fi
# -L adds a data directory searched before the built-in ones (which name the
# distribution's /usr/share/qemu, /usr/share/seabios and /usr/lib/ipxe/qemu).
# QEMU_MODULE_DIR keeps the distribution's QEMU 7.2 modules out.
for b in qemu-system-x86_64; do
	cat >"$dir.new/bin/$b" <<EOF
#!/bin/sh
# QEMU from bookworm-backports, unpacked by agentvm's scripts/qemu-backports.sh.
QEMU_MODULE_DIR=$root/usr/lib/x86_64-linux-gnu/qemu exec $root/usr/bin/$b -L $root/usr/share/qemu -L $root/usr/share/seabios "\$@"
EOF
done
for b in qemu-img qemu-nbd qemu-io; do
	printf '#!/bin/sh\nexec %s "$@"\n' "$root/usr/bin/$b" >"$dir.new/bin/$b"
done
chmod 755 "$dir.new/bin/"*
echo "$want" >"$dir.new/.packages"
rm -rf "$dir.old"
[ ! -e "$dir" ] || mv "$dir" "$dir.old"
mv "$dir.new" "$dir"
rm -rf "$dir.old"
"$dir/bin/qemu-system-x86_64" --version | head -1 >&2
echo "$dir/bin/qemu-system-x86_64"
