package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/guest/agent"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
)

// fakeHV is a Hypervisor of in-process machines, for unit tests of the
// lifecycle core without QEMU. Each machine runs the real guest agent
// (internal/guest/agent, with NoSystem and a temporary root) behind its
// agent socket, accepts the network socket, and keeps its "memory" as a
// string that saves write and restores read back, so a test can tell a
// restore from a cold boot. Processes outlive a Service (Close detaches),
// as QEMU outlives the daemon.
type fakeHV struct {
	mu      sync.Mutex
	nextPID int
	procs   map[int]*fakeMachine // running processes by pid
	starts  []qemu.Config        // every Start, in order
	// failStart makes the next Start fail with it.
	failStart error
}

func newFakeHV() *fakeHV { return &fakeHV{nextPID: 5_000_000, procs: map[int]*fakeMachine{}} }

// fakeState is what a fake save writes after the stream's magic.
type fakeState struct {
	Memory  string `json:"memory"`
	CPUs    int    `json:"cpus"`
	Plugged int64  `json:"plugged_mib"`
}

func (h *fakeHV) Start(ctx context.Context, cfg qemu.Config) (Machine, error) {
	h.mu.Lock()
	h.starts = append(h.starts, cfg)
	err := h.failStart
	h.failStart = nil
	h.nextPID++
	pid := h.nextPID
	h.mu.Unlock()
	if err != nil {
		return nil, err
	}
	m := &fakeMachine{hv: h, cfg: cfg, pid: pid, status: "running", cpus: cfg.CPUs, plugged: cfg.PluggedMiB, top: cfg.Disk, done: make(chan struct{})}
	if cfg.Incoming != "" {
		b, err := os.ReadFile(cfg.Incoming)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		var st fakeState
		if !bytes.HasPrefix(b, []byte("QEVM")) || json.Unmarshal(b[4:], &st) != nil {
			return nil, fmt.Errorf("restore: %s is not a fake state", cfg.Incoming)
		}
		m.memory, m.cpus = st.Memory, st.CPUs
	} else {
		m.memory = "booted"
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
	h.mu.Unlock()
	return m, nil
}

func (h *fakeHV) Attach(ctx context.Context, cfg qemu.Config, pid int) (Machine, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.procs[pid]
	if m == nil || m.cfg.ID != cfg.ID {
		return nil, fmt.Errorf("no machine of %s with pid %d", cfg.ID, pid)
	}
	return m, nil
}

func (h *fakeHV) IsOurs(pid int, id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.procs[pid]
	return m != nil && m.cfg.ID == id
}

func (h *fakeHV) FindOurs(id string) []int {
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

func (h *fakeHV) Kill(pid int) {
	h.mu.Lock()
	m := h.procs[pid]
	h.mu.Unlock()
	if m != nil {
		m.end(false, "killed")
	}
}

func (h *fakeHV) RunningLayout(pid int) string { return "" }

// machineOf returns the running machine of VM id (nil when none runs).
func (h *fakeHV) machineOf(id string) *fakeMachine {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.procs {
		if m.cfg.ID == id {
			return m
		}
	}
	return nil
}

// running counts the running machines.
func (h *fakeHV) running() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.procs)
}

// fakeMachine is one fake process.
type fakeMachine struct {
	hv  *fakeHV
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
	cancel  context.CancelFunc
	lns     []net.Listener
	port    *fakePort
	agentWG sync.WaitGroup
}

// run listens on the agent and network sockets and starts the agent.
func (m *fakeMachine) run() error {
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
func (m *fakeMachine) end(clean bool, reason string) {
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

// crash ends the process as a QEMU crash would; powerOff as a guest shutdown.
func (m *fakeMachine) crash()    { m.end(false, "") }
func (m *fakeMachine) powerOff() { m.end(true, "guest-shutdown") }

func (m *fakeMachine) setMemory(s string) { m.mu.Lock(); m.memory = s; m.mu.Unlock() }
func (m *fakeMachine) getMemory() string  { m.mu.Lock(); defer m.mu.Unlock(); return m.memory }

func (m *fakeMachine) PID() int                    { return m.pid }
func (m *fakeMachine) Done() <-chan struct{}       { return m.done }
func (m *fakeMachine) EventsDone() <-chan struct{} { return m.done }
func (m *fakeMachine) CleanExit() (bool, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clean, m.reason
}
func (m *fakeMachine) ExitStatus() string { _, r := m.CleanExit(); return "fake exit: " + r }
func (m *fakeMachine) Shutdown(ctx context.Context, grace time.Duration) error {
	m.end(true, "guest-shutdown")
	return nil
}
func (m *fakeMachine) Quit() error { m.end(true, "host-qmp-quit"); return nil }
func (m *fakeMachine) Kill() error { m.end(false, "killed"); return nil }
func (m *fakeMachine) Close()      {}

func (m *fakeMachine) alive() error {
	select {
	case <-m.done:
		return errors.New("fake machine exited")
	default:
		return nil
	}
}

func (m *fakeMachine) setStatus(want string) error {
	if err := m.alive(); err != nil {
		return err
	}
	m.mu.Lock()
	m.status = want
	m.mu.Unlock()
	return nil
}

func (m *fakeMachine) Status(ctx context.Context) (string, error) {
	if err := m.alive(); err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.status, nil
}
func (m *fakeMachine) Pause(ctx context.Context) error   { return m.setStatus("paused") }
func (m *fakeMachine) Resume(ctx context.Context) error  { return m.setStatus("running") }
func (m *fakeMachine) Repause(ctx context.Context) error { return m.setStatus("paused") }

// write saves the fake state to path.
func (m *fakeMachine) write(path string) (qemu.SaveResult, error) {
	if err := m.alive(); err != nil {
		return qemu.SaveResult{}, err
	}
	m.mu.Lock()
	b, _ := json.Marshal(fakeState{Memory: m.memory, CPUs: m.cpus, Plugged: m.plugged})
	m.mu.Unlock()
	b = append([]byte("QEVM"), b...)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return qemu.SaveResult{}, err
	}
	return qemu.SaveResult{Bytes: int64(len(b)), Format: qemu.FormatStream, Paused: time.Millisecond, Total: time.Millisecond}, nil
}

func (m *fakeMachine) SaveStopped(ctx context.Context, path, format string) (qemu.SaveResult, error) {
	if err := m.setStatus("postmigrate"); err != nil {
		return qemu.SaveResult{}, err
	}
	return m.write(path)
}

func (m *fakeMachine) SaveLive(ctx context.Context, path, format string, atStop func() error) (qemu.SaveResult, error) {
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

func (m *fakeMachine) SaveState(ctx context.Context, path string) error {
	if _, err := m.write(path); err != nil {
		return err
	}
	return m.setStatus("paused")
}

func (m *fakeMachine) EndOutgoingMigration(ctx context.Context) error { return m.alive() }
func (m *fakeMachine) ExitedDuringSave(err error) error {
	if m.alive() != nil {
		return fmt.Errorf("fake machine exited during the save: %w", err)
	}
	return err
}

func (m *fakeMachine) BlockResize(ctx context.Context, size int64) error { return m.alive() }

// FreezeDisk puts a real qcow2 overlay on the current top, as QEMU's
// blockdev-snapshot does.
func (m *fakeMachine) FreezeDisk(ctx context.Context, newTop string) error {
	if err := m.alive(); err != nil {
		return err
	}
	m.mu.Lock()
	top := m.top
	m.mu.Unlock()
	if err := disk.Overlay(ctx, top, newTop, 0); err != nil {
		return err
	}
	m.mu.Lock()
	m.top = newTop
	m.mu.Unlock()
	return nil
}

func (m *fakeMachine) DiskTop(ctx context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.top, nil
}

func (m *fakeMachine) Flatten(ctx context.Context, base string) error { return m.alive() }

func (m *fakeMachine) AddCPUs(ctx context.Context, want int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if want > m.cpus {
		m.cpus = want
	}
	return m.cpus, nil
}

func (m *fakeMachine) PresentCPUs(ctx context.Context) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cpus, nil
}

func (m *fakeMachine) SetPluggedMemory(ctx context.Context, mib int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.plugged = mib
	return nil
}

func (m *fakeMachine) WaitPlugged(ctx context.Context, mib int64) (int64, error) {
	return m.RequestedMemory(ctx)
}

func (m *fakeMachine) RequestedMemory(ctx context.Context) (int64, error) {
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
