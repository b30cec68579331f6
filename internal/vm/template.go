package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

// Template is a booted-once image frozen at the point its agent answered: a RAM file,
// a device-state file and a frozen disk overlay. Every create restores one.
type Template struct {
	Key        string    `json:"key"`
	Dir        string    `json:"-"`
	ImageHash  string    `json:"image_hash"`
	CPUs       int       `json:"cpus"`
	MemoryMiB  int64     `json:"memory_mib"`
	DiskBytes  int64     `json:"disk_bytes"`
	Accel      string    `json:"accel"`
	CPUModel   string    `json:"cpu_model"`
	QEMU       string    `json:"qemu_version"`
	Machine    string    `json:"machine"`
	DeviceSet  string    `json:"device_set"`
	ColdBootMs int64     `json:"cold_boot_ms"`
	CreatedAt  time.Time `json:"created_at"`
}

func (t *Template) ram() string   { return filepath.Join(t.Dir, "ram") }
func (t *Template) state() string { return filepath.Join(t.Dir, "state") }
func (t *Template) disk() string  { return filepath.Join(t.Dir, "disk.qcow2") }

// templates finds and builds the templates of a template dir: one per
// image and shape, made once by a cold boot and then restored by every
// create of that shape.
type templates struct {
	dir         string
	runDir      string // short directory for a build's sockets
	qemuVersion string
	accel       string
	bootTimeout time.Duration
	hv          Hypervisor
	log         *slog.Logger
	// machineConfig and newNetwork make a build's machine configuration
	// and network (the service's, as for any VM).
	machineConfig func(v *store.VM, p paths, img *image.Image) qemu.Config
	newNetwork    func() (*network.Network, error)
	unfinished    *unfinished // holds a build's machine (the service's)
}

// key names a template shape: a restore needs all of these to match.
func (ts *templates) key(img *image.Image, cpus int, memMiB int64) string {
	return hashStrings(img.Hash, ts.qemuVersion, qemu.MachineType, ts.accel, qemu.CPUModel(ts.accel),
		qemu.DeviceSet, fmt.Sprint(cpus), fmt.Sprint(memMiB), kernelAppend(ts.accel), GuestMAC)
}

// EnsureTemplate returns the template for this image and shape, cold-booting it
// once if needed.
func (s *Service) EnsureTemplate(ctx context.Context, imageName string, cpus int, memMiB int64) (*Template, error) {
	img, err := s.ImageNamed(ctx, imageName)
	if err != nil {
		return nil, err
	}
	return s.tpl.ensure(ctx, img, cpus, memMiB)
}

// Templates lists the templates (every image and shape that has been
// cold-booted once), newest first.
func (s *Service) Templates() ([]*Template, error) { return s.tpl.list() }

// ensure returns the template of img and the shape, building it first if
// there is none. Builds are serialised across processes with a lock file.
func (ts *templates) ensure(ctx context.Context, img *image.Image, cpus int, memMiB int64) (*Template, error) {
	key := ts.key(img, cpus, memMiB)
	dir := filepath.Join(ts.dir, key)
	if t, err := loadTemplate(dir); err == nil {
		return t, nil
	}
	// One build per key, across goroutines and processes: flock is per open file.
	lf, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	defer syscall.Flock(int(lf.Fd()), syscall.LOCK_UN)
	if t, err := loadTemplate(dir); err == nil {
		return t, nil
	}
	// The build outlives a caller that gives up (a client timeout): the
	// next create then finds the template.
	return ts.build(context.WithoutCancel(ctx), img, key, dir, cpus, memMiB)
}

func loadTemplate(dir string) (*Template, error) {
	b, err := os.ReadFile(filepath.Join(dir, "template.json"))
	if err != nil {
		return nil, err
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, err
	}
	t.Dir = dir
	return &t, nil
}

func (ts *templates) build(ctx context.Context, img *image.Image, key, dir string, cpus int, memMiB int64) (*Template, error) {
	log := ts.log.With("op", "template", "key", key)
	log.Info("cold-booting template (first use of this image and shape)", "cpus", cpus, "memory_mib", memMiB, "accel", ts.accel)
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	t := &Template{Key: key, Dir: tmp, ImageHash: img.Hash, CPUs: cpus, MemoryMiB: memMiB, DiskBytes: img.SizeBytes,
		Accel: ts.accel, CPUModel: qemu.CPUModel(ts.accel), QEMU: ts.qemuVersion, Machine: qemu.MachineType,
		DeviceSet: qemu.DeviceSet, CreatedAt: time.Now().UTC()}
	if err := disk.Overlay(ctx, img.Disk, t.disk(), 0); err != nil {
		return nil, err
	}
	if err := os.Truncate(t.ram(), 0); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	if f, err := os.OpenFile(t.ram(), os.O_CREATE|os.O_RDWR, 0o600); err != nil {
		return nil, err
	} else {
		f.Truncate(memMiB << 20)
		f.Close()
	}
	run := filepath.Join(ts.runDir, "tpl-"+key[:8])
	os.MkdirAll(run, 0o700)
	defer os.RemoveAll(run)
	p := paths{Dir: tmp, Disk: t.disk(), Log: filepath.Join(tmp, "boot.log"), Run: run,
		QMP: filepath.Join(run, "qmp.sock"), Agent: filepath.Join(run, "agent.sock"), Net: filepath.Join(run, "net.sock")}
	v := &store.VM{ID: "tpl-" + key[:12], CPUs: cpus, MemoryMiB: memMiB, Layout: qemu.DeviceSet}
	mc := ts.machineConfig(v, p, img)
	mc.Disk, mc.RAMPath, mc.RAMShared = t.disk(), t.ram(), true

	net, err := ts.newNetwork()
	if err != nil {
		return nil, err
	}
	defer net.Close()
	start := time.Now()
	m, err := ts.hv.Start(ctx, mc)
	if err != nil {
		return nil, err
	}
	defer m.Kill()
	handed, err := ts.unfinished.add(m) // a daemon that stops mid-build kills it
	if err != nil {
		return nil, err
	}
	defer handed()
	// Every step below ends when the machine does (the build itself has
	// no deadline: it outlives the caller).
	ctx, stopWatch := untilExit(ctx, m)
	defer stopWatch()
	if err := attachNetwork(ctx, net, p.Net, m); err != nil {
		return nil, fmt.Errorf("template %w", err)
	}
	bctx, cancel := context.WithTimeout(ctx, ts.bootTimeout)
	defer cancel()
	agent, err := connectAgent(bctx, p.Agent, m.Done(), guest.HandshakeOptions{})
	if err != nil {
		if errors.Is(bctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("%w: template cold boot (%s) did not reach the guest agent within %s; the accelerator may not run this kernel (try --accel tcg)%s",
				ErrUnavailable, ts.accel, ts.bootTimeout, qemu.LogTail(p.Log))
		}
		return nil, fmt.Errorf("template cold boot: %w%s", err, qemu.LogTail(p.Log))
	}
	defer agent.Close()
	// Let boot finish so clones do not each redo the tail of it.
	var out strings.Builder
	agent.Run(bctx, guest.ExecRequest{Argv: []string{"systemctl", "is-system-running", "--wait"}, TimeoutMS: 120000}, nil, &out, &out)
	t.ColdBootMs = time.Since(start).Milliseconds()
	log.Info("template booted", "ms", t.ColdBootMs, "system", strings.TrimSpace(out.String()))
	// The image's services (the browser: Xvfb and Chromium) get a deadline
	// of their own after the boot (readyTimeout): on a loaded host under
	// TCG they are ready minutes after the boot ends.
	rctx, rcancel := context.WithTimeout(ctx, max(ts.bootTimeout, readyTimeout))
	defer rcancel()
	if err := waitReady(rctx, agent, img); err != nil {
		return nil, fmt.Errorf("template of image %s: %w%s", img.Name, err, qemu.LogTail(p.Log))
	}
	if len(img.Warm) > 0 { // the image's first-command warm-up (image.Image.Warm)
		agent.Run(rctx, guest.ExecRequest{Argv: img.Warm, TimeoutMS: 120000}, nil, nil, nil)
	}
	agent.Run(rctx, guest.ExecRequest{Argv: []string{"sync"}}, nil, nil, nil)
	agent.Close()
	if err := m.SaveState(ctx, t.state()); err != nil {
		return nil, fmt.Errorf("save template state: %w%s", err, qemu.LogTail(p.Log))
	}
	handed() // saved: its exit from here on is the build's own
	m.Quit()
	for _, f := range []string{t.ram(), t.disk(), t.state()} {
		os.Chmod(f, 0o444)
	}
	t.Dir = dir
	b, _ := json.MarshalIndent(t, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "template.json"), b, 0o444); err != nil {
		return nil, err
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	ok = true
	log.Info("template saved", "dir", dir)
	return t, nil
}

// readyTimeout bounds an image's readiness after its template's cold boot:
// Chromium's first start took 140 s here under TCG on an idle 2-core host
// (its profile is made), and over 180 s with another server's VMs beside it.
const readyTimeout = 10 * time.Minute

// waitReady runs the image's readiness command in the guest until it succeeds,
// so the saved template holds its services already warm.
func waitReady(ctx context.Context, agent *guest.Client, img *image.Image) error {
	if len(img.Ready) == 0 {
		return nil
	}
	var last string
	for {
		var out strings.Builder
		res, err := agent.Run(ctx, guest.ExecRequest{Argv: img.Ready, TimeoutMS: 30000}, nil, &out, &out)
		if err == nil && res.ExitCode == 0 {
			return nil
		}
		last = strings.TrimSpace(out.String())
		if err != nil {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s did not become ready (%s): %s", ErrUnavailable, img.Name, strings.Join(img.Ready, " "), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
