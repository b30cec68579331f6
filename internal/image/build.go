package image

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

type builder struct {
	cacheDir   string
	imagesDir  string
	rootfsBase string
	recipe     string  // rootfs stage key: RecipeHash, or the flavor's
	baseRecipe string  // the default image's rootfs key (a flavor builds on it)
	flavor     *flavor // nil for the default image
	hash       string
	agentPath  string
	agentSum   string
	force      bool
	progress   Progress
}

var errMissingTools = "install with: apt-get install debootstrap e2fsprogs qemu-utils"

// checkTools verifies that the build can run on this host.
func checkTools() error {
	if os.Geteuid() != 0 {
		return errors.New("image: building the guest image needs root (debootstrap and chroot); run as root once to populate the cache")
	}
	var missing []string
	for _, t := range []string{"debootstrap", "chroot", "mkfs.ext4", "qemu-img", "cp"} {
		if _, err := lookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("image: missing %s; %s", strings.Join(missing, ", "), errMissingTools)
	}
	return nil
}

// lookPath is exec.LookPath that also searches the sbin directories, which
// are often not in a non-login PATH.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

func (b *builder) name() string {
	if b.flavor != nil {
		return b.flavor.name
	}
	return Default
}

func (b *builder) rootfsDir() string { return filepath.Join(b.rootfsBase, b.recipe) }

func (b *builder) build(ctx context.Context) error {
	start := time.Now()
	rootfs := b.rootfsDir()
	_, err := os.Stat(filepath.Join(rootfs, "root", "etc", "os-release"))
	if err != nil || b.force {
		if err := b.buildRootfsStage(ctx); err != nil {
			return err
		}
		b.progress(fmt.Sprintf("rootfs stage done in %s", time.Since(start).Round(time.Second)))
	} else {
		b.progress("rootfs stage cached: " + rootfs)
	}
	t := time.Now()
	if err := b.buildImage(ctx); err != nil {
		return err
	}
	b.progress(fmt.Sprintf("image stage done in %s", time.Since(t).Round(time.Second)))
	return nil
}

// buildRootfsStage builds the rootfs stage: the default one, or a flavor's on
// top of the default one (built first if missing).
func (b *builder) buildRootfsStage(ctx context.Context) error {
	if b.flavor == nil {
		return b.buildRootfs(ctx)
	}
	base := *b
	base.flavor, base.recipe = nil, b.baseRecipe
	if _, err := os.Stat(filepath.Join(base.rootfsDir(), "root", "etc", "os-release")); err != nil || b.force {
		if err := base.buildRootfs(ctx); err != nil {
			return err
		}
	}
	return b.buildFlavorRootfs(ctx, b.flavor, base.rootfsDir())
}

// buildRootfs runs debootstrap and the chroot configuration and publishes
// CacheDir/rootfs/<recipe>/{root,vmlinuz,initrd.img}.
func (b *builder) buildRootfs(ctx context.Context) (err error) {
	if err := os.MkdirAll(b.rootfsBase, 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	tmp, err := os.MkdirTemp(b.rootfsBase, ".tmp-"+b.recipe+"-")
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer func() {
		if err != nil {
			removeTree(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	root := filepath.Join(tmp, "root")

	b.progress(fmt.Sprintf("debootstrap: %s (%s, %d extra packages) from %s", suite, variant, len(packages), mirror))
	dbs, _ := lookPath("debootstrap")
	args := []string{
		"--variant=" + variant,
		"--include=" + strings.Join(packages, ","),
		"--components=main",
		suite, root, mirror,
	}
	dp := &debootstrapProgress{progress: b.progress}
	if err := b.run(ctx, dp.line, dbs, args...); err != nil {
		return err
	}
	dp.flush()
	// debootstrap unmounts on exit, but be sure nothing is left mounted.
	if err := unmountUnder(root); err != nil {
		return err
	}

	chroot, _ := lookPath("chroot")
	stepLine := func(l string) {
		if s, ok := strings.CutPrefix(l, "step: "); ok {
			b.progress("configure: " + s)
		}
	}
	if err := b.run(ctx, stepLine, chroot, root, "/bin/sh", "-c", lateScript); err != nil {
		return err
	}
	b.progress("configure: writing config files")
	for _, f := range rootfsFiles {
		if err := writeFileIn(root, f.Path, f.Content, os.FileMode(f.Mode)); err != nil {
			return err
		}
	}
	b.progress("configure: running chroot setup (users, services, kernel hold, initramfs)")
	if err := b.run(ctx, stepLine, chroot, root, "/bin/sh", "-c", configureScript); err != nil {
		return err
	}
	if err := unmountUnder(root); err != nil {
		return err
	}

	b.progress("configure: extracting kernel and initrd")
	kernel, err := single(filepath.Join(root, "boot", "vmlinuz-*"))
	if err != nil {
		return err
	}
	initrd, err := single(filepath.Join(root, "boot", "initrd.img-*"))
	if err != nil {
		return err
	}
	if err := copyFile(kernel, filepath.Join(tmp, kernelName), 0o444); err != nil {
		return err
	}
	if err := copyFile(initrd, filepath.Join(tmp, initrdName), 0o444); err != nil {
		return err
	}
	return publish(tmp, b.rootfsDir())
}

// buildImage copies the rootfs, installs the agent, and makes the qcow2.
func (b *builder) buildImage(ctx context.Context) (err error) {
	if err := os.MkdirAll(b.imagesDir, 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	tmp, err := os.MkdirTemp(b.imagesDir, ".tmp-"+b.hash+"-")
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer func() {
		if err != nil {
			removeTree(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	src := b.rootfsDir()
	root := filepath.Join(tmp, "root")

	b.progress("image: copying rootfs")
	cp, _ := lookPath("cp")
	if err := b.run(ctx, nil, cp, "-a", "--reflink=auto", filepath.Join(src, "root"), root); err != nil {
		return err
	}

	b.progress("image: installing guest agent")
	if err := copyFile(b.agentPath, filepath.Join(root, agentGuestPath), 0o755); err != nil {
		return err
	}
	unitPath := "/etc/systemd/system/" + agentUnitName
	if err := writeFileIn(root, unitPath, agentUnit, 0o644); err != nil {
		return err
	}
	wants := filepath.Join(root, "etc/systemd/system", agentWantedBy+".wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	link := filepath.Join(wants, agentUnitName)
	os.Remove(link)
	if err := os.Symlink(unitPath, link); err != nil {
		return fmt.Errorf("image: %w", err)
	}

	if b.flavor != nil {
		if err := b.installFlavor(ctx, root); err != nil {
			return err
		}
	}

	if err := b.packDisk(ctx, root, tmp, filepath.Join(src, kernelName), filepath.Join(src, initrdName)); err != nil {
		return err
	}
	manifest, _ := json.MarshalIndent(map[string]any{
		"hash":         b.hash,
		"image":        b.name(),
		"recipe_hash":  b.recipe,
		"agent_sha256": b.agentSum,
		"suite":        suite,
		"size_bytes":   diskSize,
		"created":      time.Now().UTC().Format(time.RFC3339),
	}, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "manifest.json"), append(manifest, '\n'), 0o444); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return publish(tmp, filepath.Join(b.imagesDir, b.hash))
}

// packDisk makes tmp's disk, kernel and initrd: root (removed once
// copied) as a sparse ext4 filesystem of diskSize on the whole device,
// converted to qcow2, and copies of kernel and initrd, all read-only.
func (b *builder) packDisk(ctx context.Context, root, tmp, kernel, initrd string) error {
	raw := filepath.Join(tmp, "rootfs.raw")
	b.progress(fmt.Sprintf("image: creating %d GiB ext4 filesystem", diskSize>>30))
	f, err := os.Create(raw)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	err = f.Truncate(diskSize)
	f.Close()
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	mkfs, _ := lookPath("mkfs.ext4")
	if err := b.run(ctx, nil, mkfs, "-q", "-F", "-L", fsLabel, "-d", root, raw,
		fmt.Sprintf("%dk", diskSize>>10)); err != nil {
		if strings.Contains(err.Error(), "Could not allocate") || strings.Contains(err.Error(), "No space left") {
			return fmt.Errorf("image: the image's files do not fit a %d GiB root filesystem", diskSize>>30)
		}
		return err
	}
	if err := removeTree(root); err != nil {
		return err
	}

	b.progress("image: converting to qcow2")
	qimg, _ := lookPath("qemu-img")
	disk := filepath.Join(tmp, diskName)
	if err := b.run(ctx, nil, qimg, "convert", "-f", "raw", "-O", "qcow2", raw, disk); err != nil {
		return err
	}
	if err := os.Remove(raw); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if err := copyFile(kernel, filepath.Join(tmp, kernelName), 0o444); err != nil {
		return err
	}
	if err := copyFile(initrd, filepath.Join(tmp, initrdName), 0o444); err != nil {
		return err
	}
	if err := os.Chmod(disk, 0o444); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return nil
}

// publish atomically renames tmp to dst, replacing an existing dst.
func publish(tmp, dst string) error {
	if _, err := os.Lstat(dst); err == nil {
		old := dst + ".old-" + fmt.Sprint(time.Now().UnixNano())
		if err := os.Rename(dst, old); err != nil {
			return fmt.Errorf("image: %w", err)
		}
		defer removeTree(old)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("image: publish: %w", err)
	}
	return nil
}

// removeStaleTemps deletes temp dirs left by interrupted builds. The caller
// holds the cache lock, so no build is running.
func (b *builder) removeStaleTemps() {
	for _, d := range []string{b.imagesDir, b.rootfsBase} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".tmp-") || strings.Contains(e.Name(), ".old-") {
				removeTree(filepath.Join(d, e.Name()))
			}
		}
	}
}

// run runs a command with its output merged; each line goes to onLine (if
// set); on failure the error carries the tail of the output. Cancelling ctx
// kills the whole process group.
func (b *builder) run(ctx context.Context, onLine func(string), name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(),
		"LC_ALL=C", "DEBIAN_FRONTEND=noninteractive",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	tail := &tailBuffer{max: 40}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			tail.add(l)
			if onLine != nil {
				onLine(l)
			}
		}
		io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	wg.Wait()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("image: %s: %w", filepath.Base(name), ctx.Err())
		}
		return fmt.Errorf("image: %s failed: %w\n%s", filepath.Base(name), err, tail.String())
	}
	return nil
}

type tailBuffer struct {
	max   int
	lines []string
}

func (t *tailBuffer) add(l string) {
	t.lines = append(t.lines, l)
	if len(t.lines) > t.max {
		t.lines = t.lines[len(t.lines)-t.max:]
	}
}

func (t *tailBuffer) String() string { return strings.Join(t.lines, "\n") }

// debootstrapProgress turns debootstrap's per-package "I: Retrieving foo"
// lines into throttled counts per phase ("debootstrap: unpacking 120 packages").
type debootstrapProgress struct {
	progress Progress
	phase    string
	count    int
	emitted  int
	last     time.Time
}

var debootstrapPhases = map[string]string{
	"Retrieving": "downloading", "Validating": "downloading",
	"Extracting": "extracting", "Unpacking": "unpacking", "Configuring": "configuring",
}

func (d *debootstrapProgress) line(l string) {
	msg, ok := strings.CutPrefix(l, "I: ")
	if !ok {
		if strings.HasPrefix(l, "E: ") || strings.HasPrefix(l, "W: ") {
			d.progress("debootstrap: " + l)
		}
		return
	}
	verb, rest, _ := strings.Cut(msg, " ")
	phase, isPkg := debootstrapPhases[verb]
	if !isPkg || strings.HasSuffix(rest, "packages...") || strings.HasPrefix(rest, "Release") ||
		strings.HasPrefix(rest, "InRelease") || strings.HasPrefix(rest, "Packages") ||
		strings.HasPrefix(rest, "the ") {
		d.flush()
		d.progress("debootstrap: " + strings.TrimSuffix(msg, "..."))
		return
	}
	if phase != d.phase {
		d.flush()
		d.phase, d.last = phase, time.Now()
	}
	if verb != "Validating" {
		d.count++
	}
	if time.Since(d.last) >= 2*time.Second {
		d.emit()
	}
}

func (d *debootstrapProgress) emit() {
	d.last, d.emitted = time.Now(), d.count
	d.progress(fmt.Sprintf("debootstrap: %s %d packages", d.phase, d.count))
}

// flush reports the final count of the current phase and ends it.
func (d *debootstrapProgress) flush() {
	if d.phase != "" && d.count > 0 && d.count != d.emitted {
		d.emit()
	}
	d.phase, d.count, d.emitted = "", 0, 0
}

// writeFileIn writes content to rel inside root, replacing symlinks (e.g. a
// resolv.conf link) rather than following them out of the tree.
func writeFileIn(root, rel, content string, mode os.FileMode) error {
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if st, err := os.Lstat(p); err == nil && !st.Mode().IsRegular() {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("image: %w", err)
		}
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return os.Chmod(p, mode)
}

// copyFile copies src to dst (replacing it) with mode.
func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	os.Remove(dst)
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("image: copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return os.Chmod(dst, mode)
}

func single(pattern string) (string, error) {
	m, _ := filepath.Glob(pattern)
	if len(m) != 1 {
		return "", fmt.Errorf("image: expected exactly one %s, found %d", pattern, len(m))
	}
	return m[0], nil
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	dir = filepath.Clean(dir)
	var out []string
	for _, line := range bytes.Split(data, []byte("\n")) {
		f := strings.Fields(string(line))
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%3o", &v); err == nil {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder detaches every mount at or below dir (proc, sys, dev binds a
// chroot tool may have left) and fails if any remain.
func unmountUnder(dir string) error {
	mps, err := mountsUnder(dir)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	for _, mp := range mps {
		syscall.Unmount(mp, syscall.MNT_DETACH)
	}
	if left, _ := mountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("image: could not unmount %s", strings.Join(left, ", "))
	}
	return nil
}

// removeTree removes dir after making sure nothing is mounted below it (a
// bind-mounted /dev must never be deleted through a chroot).
func removeTree(dir string) error {
	if err := unmountUnder(dir); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return nil
}
