// Package fakehv is a hypervisor of in-process machines for unit tests of
// the lifecycle core without QEMU (vm.HypervisorOf adapts it). Each
// machine runs the real guest agent (internal/guest/agent, with NoSystem
// and a temporary root whose PATH finds stub systemctl and sync) behind
// its agent socket, accepts its network socket, and keeps its "memory" as
// a string that saves write and restores read back, so a test can tell a
// restore from a cold boot. Processes outlive the service that started
// them (Close only detaches), as QEMU outlives the daemon; pids are
// numbers above any real pid, never signalled.
package fakehv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/guest/agent"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/image"
)

// HV is the fake hypervisor.
type HV struct {
	mu      sync.Mutex
	nextPID int
	procs   map[int]*Machine // running processes by pid
	starts  []qemu.Config    // every Start, in order
	// failStart makes the next Start fail with it.
	failStart error
	// started, when set, runs after each Start has made its machine, before
	// Start returns it (a test holds a start there).
	started func(qemu.Config)
	// rebootNext makes the next restore come up with a new boot id.
	rebootNext bool
}

// OnStarted sets a function that runs after each Start has made its
// machine, before Start returns it.
func (h *HV) OnStarted(fn func(qemu.Config)) { h.mu.Lock(); h.started = fn; h.mu.Unlock() }

// FailNextStart makes the next Start fail with err.
func (h *HV) FailNextStart(err error) { h.mu.Lock(); h.failStart = err; h.mu.Unlock() }

// RebootNextRestore makes the next restore's guest a fresh boot (a new boot
// id), as a kernel that panicked on the restore and rebooted would be.
func (h *HV) RebootNextRestore() { h.mu.Lock(); h.rebootNext = true; h.mu.Unlock() }

// Starts returns the configuration of every Start so far, in order.
func (h *HV) Starts() []qemu.Config {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]qemu.Config(nil), h.starts...)
}

// PIDs lists the running machines' pids.
func (h *HV) PIDs() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var pids []int
	for pid := range h.procs {
		pids = append(pids, pid)
	}
	return pids
}

// New returns a hypervisor with no machines.
func New() *HV { return &HV{nextPID: 5_000_000, procs: map[int]*Machine{}} }

// fakeState is what a fake save writes after the stream's magic.
type fakeState struct {
	Memory  string `json:"memory"`
	CPUs    int    `json:"cpus"`
	Plugged int64  `json:"plugged_mib"`
	BootID  string `json:"boot_id"`
}

// Start starts a machine: a restore of cfg.Incoming (a fake state) or a boot.
func (h *HV) Start(ctx context.Context, cfg qemu.Config) (*Machine, error) {
	h.mu.Lock()
	h.starts = append(h.starts, cfg)
	err := h.failStart
	h.failStart = nil
	h.nextPID++
	pid := h.nextPID
	reboot := h.rebootNext && cfg.Incoming != ""
	if reboot {
		h.rebootNext = false
	}
	h.mu.Unlock()
	if err != nil {
		return nil, err
	}
	m := &Machine{hv: h, cfg: cfg, pid: pid, status: "running", cpus: cfg.CPUs, plugged: cfg.PluggedMiB, top: cfg.Disk, done: make(chan struct{})}
	if cfg.Incoming != "" {
		b, err := os.ReadFile(cfg.Incoming)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		var st fakeState
		if !bytes.HasPrefix(b, []byte("QEVM")) || json.Unmarshal(b[4:], &st) != nil {
			return nil, fmt.Errorf("restore: %s is not a fake state", cfg.Incoming)
		}
		m.memory, m.cpus, m.bootID = st.Memory, st.CPUs, st.BootID
	} else {
		m.memory = "booted"
	}
	if m.bootID == "" || reboot {
		m.bootID = fmt.Sprintf("boot-%d", pid)
	}
	if cfg.RAMPath != "" {
		if f, err := os.OpenFile(cfg.RAMPath, os.O_CREATE|os.O_RDWR, 0o600); err == nil {
			f.Close()
		}
	}
	if err := m.run(); err != nil {
		m.end(false, "start failed")
		return nil, err
	}
	h.mu.Lock()
	h.procs[pid] = m
	hook := h.started
	h.mu.Unlock()
	if hook != nil {
		hook(cfg)
	}
	return m, nil
}

// Attach finds the running machine pid of cfg.ID.
func (h *HV) Attach(ctx context.Context, cfg qemu.Config, pid int) (*Machine, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.procs[pid]
	if m == nil || m.cfg.ID != cfg.ID {
		return nil, fmt.Errorf("no machine of %s with pid %d", cfg.ID, pid)
	}
	return m, nil
}

func (h *HV) IsOurs(pid int, id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.procs[pid]
	return m != nil && m.cfg.ID == id
}

func (h *HV) FindOurs(id string) []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var pids []int
	for pid, m := range h.procs {
		if m.cfg.ID == id {
			pids = append(pids, pid)
		}
	}
	return pids
}

func (h *HV) Kill(pid int) {
	h.mu.Lock()
	m := h.procs[pid]
	h.mu.Unlock()
	if m != nil {
		m.end(false, "killed")
	}
}

func (h *HV) RunningLayout(pid int) string { return "" }

// MachineOf returns the running machine of VM id (nil when none runs).
func (h *HV) MachineOf(id string) *Machine {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.procs {
		if m.cfg.ID == id {
			return m
		}
	}
	return nil
}

// Running counts the running machines.
func (h *HV) Running() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.procs)
}

// Machine is one fake machine process.
type Machine struct {
	hv  *HV
	cfg qemu.Config
	pid int

	mu      sync.Mutex
	status  string
	memory  string
	cpus    int
	plugged int64
	top     string
	clean   bool
	reason  string
	ended   bool
	done    chan struct{}
	bootID  string
	cancel  context.CancelFunc
	lns     []net.Listener
	port    *fakePort
	agentWG sync.WaitGroup
}

// run listens on the agent and network sockets and starts the agent.
func (m *Machine) run() error {
	for _, p := range []string{m.cfg.AgentSock, m.cfg.NetSock} {
		os.Remove(p)
		ln, err := net.Listen("unix", p)
		if err != nil {
			return err
		}
		m.lns = append(m.lns, ln)
	}
	if f, err := os.OpenFile(m.cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640); err == nil {
		fmt.Fprintf(f, "fake machine pid %d\n", m.pid)
		f.Close()
	}
	root, err := os.MkdirTemp("", "fakevm-root-")
	if err != nil {
		return err
	}
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	for _, f := range []string{"passwd", "group"} {
		if b, err := os.ReadFile("/etc/" + f); err == nil {
			os.WriteFile(filepath.Join(root, "etc", f), b, 0o644)
		}
	}
	os.WriteFile(filepath.Join(root, "etc/hosts"), []byte("127.0.0.1\tlocalhost\n"), 0o644)
	// The guest's boot id, which a restore keeps (the agent reads it under
	// its root).
	os.MkdirAll(filepath.Join(root, "proc/sys/kernel/random"), 0o755)
	os.WriteFile(filepath.Join(root, "proc/sys/kernel/random/boot_id"), []byte(m.bootID+"\n"), 0o444)
	// A template build runs systemctl and sync in the guest: stubs, found
	// first on the agent's PATH, answer for this host's.
	bin := filepath.Join(root, "stubbin")
	os.MkdirAll(bin, 0o755)
	os.WriteFile(filepath.Join(bin, "systemctl"), []byte("#!/bin/sh\necho running\n"), 0o755)
	os.WriteFile(filepath.Join(bin, "sync"), []byte("#!/bin/sh\n"), 0o755)
	os.MkdirAll(filepath.Join(root, "etc/agentvm"), 0o755)
	env, _ := json.Marshal(map[string]string{"PATH": bin + ":/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"})
	os.WriteFile(filepath.Join(root, "etc/agentvm/env"), env, 0o644)
	port := &fakePort{}
	m.port = port
	go port.serve(m.lns[0])
	go func() { // the network: hold connections open, drop what arrives
		for {
			c, err := m.lns[1].Accept()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, c)
		}
	}()
	a, err := agent.New(agent.Options{Open: func() (io.ReadWriteCloser, error) { return port, nil }, Root: root, NoSystem: true, Logf: func(string, ...any) {}})
	if err != nil {
		os.RemoveAll(root)
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.agentWG.Add(1)
	go func() {
		defer m.agentWG.Done()
		defer os.RemoveAll(root)
		a.Run(ctx)
	}()
	return nil
}

// end makes the process exit: clean is a guest power-off.
func (m *Machine) end(clean bool, reason string) {
	m.mu.Lock()
	if m.ended {
		m.mu.Unlock()
		return
	}
	m.ended, m.clean, m.reason, m.status = true, clean, reason, "shutdown"
	m.mu.Unlock()
	m.hv.mu.Lock()
	delete(m.hv.procs, m.pid)
	m.hv.mu.Unlock()
	for _, ln := range m.lns {
		ln.Close()
	}
	if m.port != nil {
		m.port.close() // ends the host's agent session, as QEMU's exit does
	}
	if m.cancel != nil {
		m.cancel()
		m.agentWG.Wait()
	}
	close(m.done)
}

// Crash ends the process as a QEMU crash would; Segfault as a QEMU that a
// signal ended; PowerOff as a guest shutdown.
func (m *Machine) Crash()    { m.end(false, "") }
func (m *Machine) Segfault() { m.end(false, "signal: segmentation fault") }
func (m *Machine) PowerOff() { m.end(true, "guest-shutdown") }

// SetMemory and Memory set and read the machine's "memory", which saves
// write and restores read back.
func (m *Machine) SetMemory(s string) { m.mu.Lock(); m.memory = s; m.mu.Unlock() }
func (m *Machine) Memory() string     { m.mu.Lock(); defer m.mu.Unlock(); return m.memory }

// Config is the configuration the machine was started with.
func (m *Machine) Config() qemu.Config { return m.cfg }

func (m *Machine) PID() int                    { return m.pid }
func (m *Machine) Done() <-chan struct{}       { return m.done }
func (m *Machine) EventsDone() <-chan struct{} { return m.done }
func (m *Machine) CleanExit() (bool, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clean, m.reason
}
func (m *Machine) ExitStatus() string { _, r := m.CleanExit(); return "fake exit: " + r }
func (m *Machine) Shutdown(ctx context.Context, grace time.Duration) error {
	m.end(true, "guest-shutdown")
	return nil
}
func (m *Machine) Quit() error { m.end(true, "host-qmp-quit"); return nil }
func (m *Machine) Kill() error { m.end(false, "killed"); return nil }
func (m *Machine) Close()      {}

func (m *Machine) alive() error {
	select {
	case <-m.done:
		return errors.New("fake machine exited")
	default:
		return nil
	}
}

func (m *Machine) setStatus(want string) error {
	if err := m.alive(); err != nil {
		return err
	}
	m.mu.Lock()
	m.status = want
	m.mu.Unlock()
	return nil
}

func (m *Machine) Status(ctx context.Context) (string, error) {
	if err := m.alive(); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.status, nil
}
func (m *Machine) Pause(ctx context.Context) error   { return m.setStatus("paused") }
func (m *Machine) Resume(ctx context.Context) error  { return m.setStatus("running") }
func (m *Machine) Repause(ctx context.Context) error { return m.setStatus("paused") }

// write saves the fake state to path.
func (m *Machine) write(path string) (qemu.SaveResult, error) {
	if err := m.alive(); err != nil {
		return qemu.SaveResult{}, err
	}
	m.mu.Lock()
	b, _ := json.Marshal(fakeState{Memory: m.memory, CPUs: m.cpus, Plugged: m.plugged, BootID: m.bootID})
	m.mu.Unlock()
	b = append([]byte("QEVM"), b...)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return qemu.SaveResult{}, err
	}
	return qemu.SaveResult{Bytes: int64(len(b)), Format: qemu.FormatStream, Paused: time.Millisecond, Total: time.Millisecond}, nil
}

func (m *Machine) SaveStopped(ctx context.Context, path, format string) (qemu.SaveResult, error) {
	if err := m.setStatus("postmigrate"); err != nil {
		return qemu.SaveResult{}, err
	}
	return m.write(path)
}

func (m *Machine) SaveLive(ctx context.Context, path, format string, atStop func() error) (qemu.SaveResult, error) {
	m.mu.Lock()
	was := m.status
	m.status = "finish-migrate"
	m.mu.Unlock()
	defer m.setStatus(was)
	if atStop != nil {
		if err := atStop(); err != nil {
			return qemu.SaveResult{}, err
		}
	}
	return m.write(path)
}

func (m *Machine) SaveState(ctx context.Context, path string) error {
	if _, err := m.write(path); err != nil {
		return err
	}
	return m.setStatus("paused")
}

func (m *Machine) EndOutgoingMigration(ctx context.Context) error { return m.alive() }
func (m *Machine) ExitedDuringSave(err error) error {
	if m.alive() != nil {
		return fmt.Errorf("fake machine exited during the save: %w", err)
	}
	return err
}

func (m *Machine) BlockResize(ctx context.Context, size int64) error { return m.alive() }

// PrepareFreeze makes a real qcow2 overlay on the current top, which
// commit makes the top, as QEMU's blockdev-snapshot does.
func (m *Machine) PrepareFreeze(ctx context.Context, newTop string) (func(context.Context) error, func(), error) {
	if err := m.alive(); err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	top := m.top
	m.mu.Unlock()
	if err := disk.Overlay(ctx, top, newTop, 0); err != nil {
		return nil, nil, err
	}
	committed := false
	commit := func(context.Context) error {
		if err := m.alive(); err != nil {
			return err
		}
		m.mu.Lock()
		m.top, committed = newTop, true
		m.mu.Unlock()
		return nil
	}
	abort := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if !committed {
			os.Remove(newTop)
		}
	}
	return commit, abort, nil
}

func (m *Machine) DiskTop(ctx context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.top, nil
}

func (m *Machine) Flatten(ctx context.Context, base string) error { return m.alive() }

func (m *Machine) AddCPUs(ctx context.Context, want int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if want > m.cpus {
		m.cpus = want
	}
	return m.cpus, nil
}

func (m *Machine) PresentCPUs(ctx context.Context) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cpus, nil
}

func (m *Machine) SetPluggedMemory(ctx context.Context, mib int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.plugged = mib
	return nil
}

func (m *Machine) WaitPlugged(ctx context.Context, mib int64) (int64, error) {
	return m.RequestedMemory(ctx)
}

func (m *Machine) RequestedMemory(ctx context.Context) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.plugged, nil
}

// fakePort is the guest end of a virtio-serial port behind a QEMU
// server=on chardev socket: one host connection at a time (a new one
// replaces the old), reads return EOF while no host is connected, and
// writes without a host are dropped.
type fakePort struct {
	mu     sync.Mutex
	cur    net.Conn
	closed bool
}

func (p *fakePort) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		if p.cur != nil {
			p.cur.Close()
		}
		p.cur = c
		p.mu.Unlock()
	}
}

func (p *fakePort) conn() net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

func (p *fakePort) Read(b []byte) (int, error) {
	c := p.conn()
	if c == nil {
		return 0, io.EOF
	}
	n, err := c.Read(b)
	if n > 0 {
		return n, nil
	}
	if err != nil {
		p.mu.Lock()
		if p.cur == c { // the host went away
			p.cur = nil
			c.Close()
		}
		p.mu.Unlock()
	}
	return 0, io.EOF
}

func (p *fakePort) Write(b []byte) (int, error) {
	if c := p.conn(); c != nil {
		c.Write(b)
	}
	return len(b), nil
}

func (p *fakePort) Close() error { return nil }

func (p *fakePort) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.cur != nil {
		p.cur.Close()
		p.cur = nil
	}
}

// Image makes, in dir, an image for fake machines: named image.Default,
// with a real (empty) 1 GiB qcow2 disk for the overlays made on it, and
// no kernel (fake machines boot none).
func Image(dir string) (*image.Image, error) {
	img := &image.Image{Name: image.Default, Hash: "fakeimage", Dir: dir, Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"), Disk: filepath.Join(dir, "rootfs.qcow2"), SizeBytes: 1 << 30}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", img.Disk, "1G").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("qemu-img create: %v: %s", err, out)
	}
	return img, nil
}

// EnsureImage returns a vm.Config.EnsureImage that knows only img.
func EnsureImage(img *image.Image) func(context.Context, image.Options) (*image.Image, error) {
	return func(_ context.Context, o image.Options) (*image.Image, error) {
		if o.Name != img.Name {
			return nil, fmt.Errorf("no image %s here (fake machines have only %s)", o.Name, img.Name)
		}
		return img, nil
	}
}
