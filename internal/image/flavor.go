package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/agentvm/agentvm/internal/image/codeinterp"
)

// A flavor is an image built on the default one: more Debian packages, files
// and a setup script, applied to a copy of the default rootfs. It shares the
// default image's kernel, so every VM boots the same kernel whatever its image.
type flavor struct {
	name     string
	aliases  []string
	packages []string
	files    []recipeFile
	script   string
	// ready is a command the guest runs (as root) until it succeeds before a
	// template of this image is saved, so a create restores a warm service.
	ready []string
}

// Default is the name of the default image.
const Default = "default"

// CodeInterpreter is the name of the code-interpreter image.
const CodeInterpreter = "code-interpreter"

// CodeInterpreterPort is where the code-interpreter server listens inside the
// guest, on loopback only (the host reaches it through the guest agent), the
// port E2B's code-interpreter SDKs use.
const CodeInterpreterPort = 49999

const codeInterpDir = "/usr/local/lib/agentvm/codeinterp"

const codeInterpUnit = `[Unit]
Description=agentvm code interpreter (Jupyter kernels; E2B code-interpreter protocol on port 49999)
After=agentvm-guest.service

[Service]
# The server runs as root so that a context may ask to run as root (E2B's
# kernels do); every other context runs as user, as before, and only root
# (the guest agent) and user may connect.  --warm r: the default R context
# starts with it and is in the template (an idle R kernel sleeps in poll:
# guest memory, no CPU); Java is not (an idle JVM wakes ~5 times a second),
# nor TypeScript.  --spares 2: two Python kernels started ahead, so that a
# new context and its restart both find one ready.
User=root
WorkingDirectory=/home/user
Environment=HOME=/home/user PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ExecStart=/usr/bin/python3 ` + codeInterpDir + `/server.py --host 127.0.0.1 --port 49999 --user user --env-file /etc/agentvm/env --warm r --spares 2
Restart=always
RestartSec=200ms

[Install]
WantedBy=multi-user.target
`

var flavors = []flavor{{
	name:    CodeInterpreter,
	aliases: []string{"code-interpreter-v1"},
	packages: []string{
		"python3-ipykernel", "python3-jupyter-client", "python3-numpy", "python3-pandas",
		"python3-matplotlib", "python3-matplotlib-inline",
		"node-typescript", "r-cran-irkernel", "openjdk-17-jdk-headless",
	},
	files: append([]recipeFile{
		{"/etc/systemd/system/agentvm-codeinterp.service", 0o644, codeInterpUnit},
	}, codeInterpFiles()...),
	script: `set -eu
ln -sf /etc/systemd/system/agentvm-codeinterp.service /etc/systemd/system/multi-user.target.wants/agentvm-codeinterp.service
# Compile once here, not in every VM on first import.
python3 -m compileall -q ` + codeInterpDir + ` >/dev/null 2>&1 || true
# javac's loader finds its libraries through /proc/self/exe.
mount -t proc proc /proc
classes=$(mktemp -d)
javac -nowarn -XDignore.symbol.file -d "$classes" ` + codeInterpDir + `/JShellKernel.java
mkdir -p ` + codeInterpDir + `/java
jar --create --file ` + codeInterpDir + `/java/kernel.jar -C "$classes" .
rm -rf "$classes"
# A class-data archive of what the Java kernel loads to become ready (JShell
# and javac's classes), which each Java context's JVM then maps instead of
# parsing and verifying them again (javacontext.py; the class path must be
# jars for it).  The kernel starts with no commands and exits at the end of
# its input.  Without it the kernel still works, only slower to start.
CODEINTERP_FDS=0,1 java ` + javaKernelFlags + ` -XX:ArchiveClassesAtExit=` + codeInterpDir + `/java/kernel.jsa \
  -cp ` + codeInterpDir + `/java/kernel.jar JShellKernel </dev/null >/dev/null ||
  echo "agentvm: no class-data archive for the Java kernel" >&2
umount /proc
`,
	ready: []string{"curl", "-sf", "-o", "/dev/null", "--max-time", "5", "http://127.0.0.1:49999/health"},
}, browserFlavor}

// javaKernelFlags are the JVM flags of javacontext.py's jvm_flags: a class
// data archive is used only by a JVM of the same flags.
const javaKernelFlags = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:-UsePerfData -Xss1m -XX:MaxRAMPercentage=50"

func codeInterpFiles() []recipeFile {
	var out []recipeFile
	for name, content := range codeinterp.Files() {
		out = append(out, recipeFile{codeInterpDir + "/" + name, 0o644, content})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Names lists the images a VM can be made from, the default first.
func Names() []string {
	out := []string{Default}
	for _, f := range flavors {
		out = append(out, f.name)
	}
	return out
}

// Resolve maps an image name or alias ("" is the default) to its canonical
// name, or says which names exist.
func Resolve(name string) (string, error) {
	if name == "" || name == Default || name == "base" {
		return Default, nil
	}
	if IsOCIName(name) {
		return name, nil
	}
	for _, f := range flavors {
		if name == f.name || slices.Contains(f.aliases, name) {
			return f.name, nil
		}
	}
	return "", fmt.Errorf("unknown image %q: images are %s", name, strings.Join(Names(), ", "))
}

func findFlavor(name string) *flavor {
	for i := range flavors {
		if flavors[i].name == name {
			return &flavors[i]
		}
	}
	return nil
}

// recipeHash keys a flavor's rootfs stage: the default recipe plus the
// flavor's packages. Its files and script belong to the image stage (see
// writeStage), so changing them does not reinstall the packages.
func (f *flavor) recipeHash() string {
	h := sha256.New()
	writeRecipe(h)
	field := func(k, v string) { fmt.Fprintf(h, "%s %d\n%s\n", k, len(v), v) }
	field("flavor", f.name)
	pk := append([]string(nil), f.packages...)
	sort.Strings(pk)
	field("flavor-packages", strings.Join(pk, ","))
	field("flavor-install", f.installScript())
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// writeStage covers what the image stage adds for the flavor.
func (f *flavor) writeStage(w io.Writer) {
	field := func(k, v string) { fmt.Fprintf(w, "%s %d\n%s\n", k, len(v), v) }
	for _, file := range f.files {
		field("flavor-file", fmt.Sprintf("%s %o\n%s", file.Path, file.Mode, file.Content))
	}
	field("flavor-script", f.script)
	field("flavor-ready", strings.Join(f.ready, "\x00"))
}

// install writes the flavor's files into an image's tree and runs its script.
func (b *builder) installFlavor(ctx context.Context, root string) error {
	f := b.flavor
	for _, file := range f.files {
		if err := writeFileIn(root, file.Path, file.Content, os.FileMode(file.Mode)); err != nil {
			return err
		}
	}
	b.progress(f.name + ": setup script")
	chroot, _ := lookPath("chroot")
	err := b.run(ctx, nil, chroot, root, "/bin/sh", "-c", f.script)
	// A failed script may leave /proc mounted in the tree.
	if uerr := unmountUnder(root); err == nil {
		err = uerr
	}
	return err
}

// installScript runs in the chroot of the flavor's copy of the default rootfs.
func (f *flavor) installScript() string {
	return `set -eu
export DEBIAN_FRONTEND=noninteractive LC_ALL=C PATH=/usr/sbin:/usr/bin:/sbin:/bin
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
chmod 755 /usr/sbin/policy-rc.d
# Some packages' scripts need /proc (the JDK's runs java); unmounted below,
# or by the builder when this fails.
mount -t proc proc /proc
echo "step: apt-get update"
apt-get update -qq
echo "step: installing ` + strings.Join(f.packages, " ") + `"
apt-get install -y -qq --no-install-recommends ` + strings.Join(f.packages, " ") + ` >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/*.log
rm -f /usr/sbin/policy-rc.d
umount /proc
`
}

// buildFlavorRootfs copies the default rootfs, installs the flavor into it and
// publishes CacheDir/rootfs/<flavor recipe>/{root,vmlinuz,initrd.img}.
func (b *builder) buildFlavorRootfs(ctx context.Context, f *flavor, base string) (err error) {
	tmp, err := os.MkdirTemp(b.rootfsBase, ".tmp-"+b.recipe+"-")
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer func() {
		if err != nil {
			unmountUnder(tmp)
			removeTree(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	root := filepath.Join(tmp, "root")
	b.progress(fmt.Sprintf("%s: copying the default rootfs", f.name))
	cp, _ := lookPath("cp")
	if err := b.run(ctx, nil, cp, "-a", "--reflink=auto", filepath.Join(base, "root"), root); err != nil {
		return err
	}
	// apt in the chroot needs the host's resolver; the guest agent rewrites
	// resolv.conf at boot, and the placeholder comes back below.
	resolv := filepath.Join(root, "etc", "resolv.conf")
	placeholder, err := os.ReadFile(resolv)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	hostResolv, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return fmt.Errorf("image: the host's resolv.conf (apt needs DNS): %w", err)
	}
	if err := writeFileIn(root, "/etc/resolv.conf", string(hostResolv), 0o644); err != nil {
		return err
	}
	chroot, _ := lookPath("chroot")
	stepLine := func(l string) {
		if s, ok := strings.CutPrefix(l, "step: "); ok {
			b.progress(f.name + ": " + s)
		}
	}
	if err := b.run(ctx, stepLine, chroot, root, "/bin/sh", "-c", f.installScript()); err != nil {
		return err
	}
	if err := writeFileIn(root, "/etc/resolv.conf", string(placeholder), 0o644); err != nil {
		return err
	}
	if err := unmountUnder(root); err != nil {
		return err
	}
	for _, n := range []string{kernelName, initrdName} {
		if err := copyFile(filepath.Join(base, n), filepath.Join(tmp, n), 0o444); err != nil {
			return err
		}
	}
	return publish(tmp, b.rootfsDir())
}
