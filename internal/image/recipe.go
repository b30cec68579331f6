package image

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strings"
)

// recipeVersion is bumped whenever the build logic changes in a way the
// constants below do not capture.
const recipeVersion = "agentvm-image-recipe-v1"

const (
	suite   = "bookworm"
	mirror  = "http://deb.debian.org/debian"
	variant = "minbase"

	// diskSize is the virtual size of rootfs.qcow2 (the ext4 filesystem size).
	diskSize int64 = 8 << 30
	// fsLabel is the ext4 volume label.
	fsLabel = "agentvm-root"

	agentGuestPath = "/usr/local/bin/agentvm-guest"
	agentUnitName  = "agentvm-guest.service"
	agentWantedBy  = "multi-user.target"
)

// packages installed by debootstrap --include.
var packages = []string{
	"systemd", "systemd-sysv", "udev", "dbus",
	"linux-image-amd64", "initramfs-tools",
	"ca-certificates", "python3", "git", "curl", "wget", "sudo",
	"procps", "iproute2", "less", "vim-tiny", "unzip", "xz-utils", "jq",
	"rsync", "openssh-client", "netbase",
	// E2B's base template has Node.js next to python3 and git (npm is
	// installed by configureScript: debootstrap cannot configure it).
	"nodejs",
}

// maskedUnits are linked to /dev/null so they never run (timers firing after
// every restore skew timings; a getty on ttyS0 hangs up other writers).
var maskedUnits = []string{
	"serial-getty@ttyS0.service",
	"getty@tty1.service",
	"apt-daily.timer",
	"apt-daily-upgrade.timer",
	"man-db.timer",
	"e2scrub_all.timer",
	"e2scrub_reap.service",
	"fstrim.timer",
	"dpkg-db-backup.timer",
	"systemd-timesyncd.service",
}

// initramfsModules are forced into the initramfs.
var initramfsModules = []string{
	"virtio_pci", "virtio_blk", "virtio_net", "virtio_console", "ext4",
}

// lateScript installs, after debootstrap and before the recipe's files
// replace its resolv.conf, what debootstrap itself cannot configure.
var lateScript = `set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C PATH=/usr/sbin:/usr/bin:/sbin:/bin
echo "step: npm"
apt-get update -qq
apt-get install -y -qq --no-install-recommends ` + strings.Join(latePackages, " ") + ` >/dev/null
`

// latePackages are installed by lateScript.
var latePackages = []string{"npm", "python-is-python3"}

// recipeFile is a file the rootfs stage writes into the tree before the
// configuration script runs.
type recipeFile struct {
	Path    string
	Mode    uint32
	Content string
}

var rootfsFiles = []recipeFile{
	{"/etc/apt/sources.list", 0o644, "" +
		"deb http://deb.debian.org/debian bookworm main\n" +
		"deb http://deb.debian.org/debian bookworm-updates main\n" +
		"deb http://security.debian.org/debian-security bookworm-security main\n"},
	{"/etc/hostname", 0o644, "agentvm\n"},
	{"/etc/hosts", 0o644, "" +
		"127.0.0.1\tlocalhost\n" +
		"127.0.1.1\tagentvm\n" +
		"::1\t\tlocalhost ip6-localhost ip6-loopback\n" +
		"ff02::1\t\tip6-allnodes\n" +
		"ff02::2\t\tip6-allrouters\n"},
	{"/etc/fstab", 0o644, "/dev/vda / ext4 rw,relatime 0 1\n"},
	// A plain file (not a symlink to resolved); the guest agent rewrites it.
	{"/etc/resolv.conf", 0o644, "# written by agentvm-guest at boot\n"},
	{"/etc/sudoers.d/agent", 0o440, "agent ALL=(ALL:ALL) NOPASSWD: ALL\n"},
	// user is the default user of E2B's SDKs (their base template's).
	{"/etc/sudoers.d/user", 0o440, "user ALL=(ALL:ALL) NOPASSWD: ALL\n"},
	{"/etc/initramfs-tools/modules", 0o644, "# agentvm: virtio and root fs drivers\n" +
		strings.Join(initramfsModules, "\n") + "\n"},
	{"/etc/sysctl.d/10-agentvm.conf", 0o644, "kernel.printk = 3 4 1 3\n"},
}

// configureScript runs inside the chroot after debootstrap and after
// rootfsFiles were written.
var configureScript = `set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C PATH=/usr/sbin:/usr/bin:/sbin:/bin
echo "step: users"
passwd -l root >/dev/null
if ! id agent >/dev/null 2>&1; then
	useradd -m -u 1000 -U -d /home/agent -s /bin/bash -G sudo agent
fi
if ! id user >/dev/null 2>&1; then
	useradd -m -u 1001 -U -d /home/user -s /bin/bash -G sudo user
fi
echo "step: services"
# eth0 is configured by the guest agent from the identity the host pushes after
# every boot and restore (no DHCP client: a restored clone must not keep the
# template's lease).
for u in ` + strings.Join(maskedUnits, " ") + `; do
	ln -sf /dev/null "/etc/systemd/system/$u"
done
echo "step: hold kernel"
apt-mark hold linux-image-amd64 $(dpkg-query -W -f='${Package}\n' 'linux-image-[0-9]*') >/dev/null
echo "step: initramfs"
update-initramfs -u -k all
echo "step: cleanup"
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/lib/dpkg/*-old
rm -rf /tmp/* /var/tmp/* /var/log/*.log /var/log/apt/* /root/.bash_history
rm -f /var/lib/dbus/machine-id /etc/ssh/ssh_host_*
: > /etc/machine-id
`

// agentUnit is the systemd unit of the guest agent (final stage).
const agentUnit = `[Unit]
Description=agentvm guest agent
DefaultDependencies=no
After=systemd-journald.socket

[Service]
ExecStart=/usr/local/bin/agentvm-guest
Restart=always
RestartSec=100ms
KillMode=process
OOMScoreAdjust=-900

[Install]
WantedBy=multi-user.target
`

// RecipeHash returns the hex hash of the image recipe only (everything this
// package puts into the rootfs stage: packages, files, configuration). It keys the rootfs
// stage of the build.
func RecipeHash() string {
	h := sha256.New()
	writeRecipe(h)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func writeRecipe(w io.Writer) {
	field := func(k, v string) { fmt.Fprintf(w, "%s %d\n%s\n", k, len(v), v) }
	field("version", recipeVersion)
	field("suite", suite)
	field("mirror", mirror)
	field("variant", variant)
	pk := append([]string(nil), packages...)
	sort.Strings(pk)
	field("packages", strings.Join(pk, ","))
	field("masked", strings.Join(maskedUnits, ","))
	files := append([]recipeFile(nil), rootfsFiles...)
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	for _, f := range files {
		field("file", fmt.Sprintf("%s %o\n%s", f.Path, f.Mode, f.Content))
	}
	field("late-script", lateScript)
	field("script", configureScript)
}

// writeImageStage covers what only the image stage uses (agent unit, disk size), so
// changing those does not redo debootstrap.
func writeImageStage(w io.Writer) {
	field := func(k, v string) { fmt.Fprintf(w, "%s %d\n%s\n", k, len(v), v) }
	field("unit", agentUnit)
	field("agent-path", agentGuestPath)
	field("wanted-by", agentWantedBy)
	field("disk", fmt.Sprintf("%d %s", diskSize, fsLabel))
}

// imageHash combines the recipe hash with the sha256 (hex) of the agent and
// what the image stage adds (for a flavor, its files and script).
func imageHash(recipeHash, agentSHA256 string, fl *flavor) string {
	h := sha256.New()
	fmt.Fprintf(h, "recipe %s\nagent %s\n", recipeHash, agentSHA256)
	writeImageStage(h)
	if fl != nil {
		fl.writeStage(h)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}
