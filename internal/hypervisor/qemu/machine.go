// Package qemu drives QEMU processes: command line, one persistent QMP connection
// per VM, accel detection, state save/restore and the shutdown ladder.
package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// MachineType is pinned so snapshots restore on the same virtual hardware.
const MachineType = "pc-q35-7.2"

// DeviceSet names the device layout baked into every template and snapshot; bump it
// whenever Args changes the guest-visible hardware.
const DeviceSet = "ds3:virtio-blk-4q,virtio-net-stream,virtio-serial-agent,vmgenid,serial,cpu-hotplug16,virtio-mem16G"

// CPUHotplugDeviceSet is the layout with vCPU hot-add but without the
// virtio-mem device. VMs saved by an earlier agentvm restore with it.
const CPUHotplugDeviceSet = "ds2:virtio-blk-4q,virtio-net-stream,virtio-serial-agent,vmgenid,serial,cpu-hotplug16"

// LegacyDeviceSet is the layout before vCPU hot-add (-smp N, virtio-blk
// queues following -smp). VMs saved by an earlier agentvm restore with it.
const LegacyDeviceSet = "ds1:virtio-blk,virtio-net-stream,virtio-serial-agent,vmgenid,serial"

// blkQueues is the virtio-blk queue count of every machine.
const blkQueues = 4

// Config is everything needed to start one QEMU process.
type Config struct {
	ID        string // VM id, passed as -name so a restarted daemon can re-identify the process
	Binary    string // qemu-system-x86_64
	Accel     string // "kvm" or "tcg"
	CPUModel  string
	CPUs      int
	MemoryMiB int64 // boot memory: the machine's main RAM
	Kernel    string
	Initrd    string
	Append    string
	Disk      string // qcow2 overlay
	// RAMPath, when set, backs guest RAM with this file (shared for a template,
	// private copy-on-write for a clone). Empty means anonymous RAM.
	RAMPath   string
	RAMShared bool
	Incoming  string // migration state file to restore from; empty means cold boot
	// IncomingShared says the state was saved with x-ignore-shared (a template: its
	// RAM is the RAMPath file, not in the stream).
	IncomingShared bool
	// EagerRAM restores a page-format state into anonymous memory, its
	// pages streamed back into QEMU (CatStateEager), rather than by mapping
	// its RAM file copy-on-write: for a VM's own state (a wake), whose later
	// saves would otherwise read the mapped file's holes, each one costing
	// a page of page cache. Snapshots and forks, whose RAM file many VMs
	// share, map it.
	EagerRAM bool
	// StateCat is the agentvm binary, whose state-cat modes (CatState,
	// CatStateEager) read a state into QEMU's migration pipe with splice;
	// "" uses plain cat, which cannot stream a page-format state back
	// whole (EagerRAM then maps the RAM file).
	StateCat string
	// incomingOffset is where QEMU's stream starts in Incoming (after a
	// page-format header), and incomingEager says the pages are streamed
	// back (EagerRAM); set by Start.
	incomingOffset int64
	incomingEager  bool
	incomingMapped bool // the state is FormatMapped: QEMU reads the file itself
	QMPSock        string
	AgentSock      string
	NetSock        string
	LogPath        string
	MAC            string
	VMGenID        string
	// Layout is the device set to start with: DeviceSet ("" means it),
	// CPUHotplugDeviceSet or LegacyDeviceSet for a state saved by an
	// earlier agentvm.
	Layout string
	// PluggedMiB is the memory plugged through the virtio-mem device on top
	// of MemoryMiB (a restore of a VM that grew; 0 for a boot).
	PluggedMiB int64
	// MemMerge offers the guest's RAM to the host's KSM (QEMU's mem-merge,
	// on by default in QEMU; off here unless serve --ksm: merging equal
	// pages across tenants opens a timing side channel between them).
	MemMerge bool
	// OOMScoreAdj is QEMU's oom_score_adj, written as soon as it starts
	// (before it loads a state, its hungriest moment); 0 leaves it the
	// daemon's.
	OOMScoreAdj int
}

// Args returns the QEMU command line (without the binary).
func (c Config) Args() []string {
	mem := fmt.Sprintf("memory-backend-ram,id=mem,size=%dM,merge=%s", c.MemoryMiB, onOff(c.MemMerge))
	if c.RAMPath != "" {
		share := "off"
		if c.RAMShared {
			share = "on"
		}
		mem = fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s,merge=%s", c.MemoryMiB, c.RAMPath, share, onOff(c.MemMerge))
	}
	smp := fmt.Sprintf("%d,maxcpus=%d", c.CPUs, MaxCPUs(c.CPUs))
	blk := "virtio-blk-pci,drive=disk0,id=vda,num-queues=" + strconv.Itoa(blkQueues)
	if c.Layout == LegacyDeviceSet {
		smp, blk = strconv.Itoa(c.CPUs), "virtio-blk-pci,drive=disk0,id=vda"
	}
	accel := c.Accel
	if accel == "tcg" {
		accel = "tcg,tb-size=256"
	}
	a := []string{
		"-name", "guest=" + c.ID + ",debug-threads=off",
		"-machine", MachineType + ",memory-backend=mem,mem-merge=" + onOff(c.MemMerge),
		"-accel", accel,
		"-cpu", c.CPUModel,
		"-smp", smp,
		"-m", c.memorySize(),
		"-object", mem,
		"-nodefaults", "-no-user-config", "-display", "none",
		"-kernel", c.Kernel, "-initrd", c.Initrd, "-append", c.Append,
		"-drive", "file=" + c.Disk + ",if=none,id=disk0,format=qcow2,discard=unmap",
		// num-queues is fixed: by default it follows -smp, and a VM whose
		// vCPUs were hot-added would restore with a different PCI layout.
		"-device", blk,
		"-netdev", "stream,id=net0,server=on,addr.type=unix,addr.path=" + c.NetSock,
		"-device", "virtio-net-pci,netdev=net0,id=nic0,mac=" + c.MAC,
		"-device", "virtio-serial-pci,id=vser0",
		"-chardev", "socket,id=agent0,path=" + c.AgentSock + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent0,name=agentvm.0",
		"-device", "vmgenid,guid=" + c.VMGenID,
		"-chardev", "file,id=ser0,path=" + c.LogPath + ",append=on",
		"-serial", "chardev:ser0",
		"-qmp", "unix:" + c.QMPSock + ",server=on,wait=off",
	}
	a = append(a, c.memoryDeviceArgs()...)
	if c.Incoming != "" {
		a = append(a, "-incoming", "defer")
	}
	return a
}

// SetOOMScoreAdj sets process pid's oom_score_adj. Raising it needs no
// privilege, nor lowering it down to 0; below 0 needs CAP_SYS_RESOURCE.
func SetOOMScoreAdj(pid, score int) error {
	err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(score)), 0)
	if err != nil {
		return fmt.Errorf("oom_score_adj of pid %d: %w", pid, err)
	}
	return nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// Machine is a running QEMU process and its QMP connection.
type Machine struct {
	cfg  Config
	pid  int
	qmp  *QMP
	done chan struct{}

	mu           sync.Mutex
	shutdownSeen bool   // QEMU reported SHUTDOWN (clean power-off or quit)
	reason       string // SHUTDOWN reason
	exitStatus   string // e.g. "signal: killed" (only for a QEMU this process started)
	version      string // Version's answer
	events       map[int]func(Event)
	nextEvent    int
}

// Start launches QEMU in its own session (so it outlives the daemon) with stdout and
// stderr appended to the VM log, and connects QMP.
func Start(ctx context.Context, cfg Config) (*Machine, error) {
	logf, err := os.OpenFile(cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	for _, s := range []string{cfg.QMPSock, cfg.AgentSock, cfg.NetSock} {
		os.Remove(s)
	}
	if cfg.Incoming != "" && cfg.RAMPath == "" {
		// A page-format state brings its RAM file: QEMU maps it
		// copy-on-write and loads only the rest from the stream. A
		// mapped-ram state QEMU reads itself.
		info, err := ReadStateInfo(cfg.Incoming)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		cfg.incomingMapped = info.Format == FormatMapped
		if info.Format == FormatPages {
			if info.RAMSize != cfg.MemoryMiB<<20 {
				return nil, fmt.Errorf("restore: state %s holds %d MiB of RAM, the VM has %d MiB", cfg.Incoming, info.RAMSize>>20, cfg.MemoryMiB)
			}
			if cfg.EagerRAM && info.InjectAt > 0 && cfg.StateCat != "" {
				cfg.incomingEager = true
			} else {
				cfg.RAMPath, cfg.RAMShared, cfg.incomingOffset = info.RAMPath, false, info.Offset
			}
		}
	}
	cmd := exec.Command(cfg.Binary, cfg.Args()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	m := &Machine{cfg: cfg, pid: cmd.Process.Pid, done: make(chan struct{})}
	if cfg.OOMScoreAdj != 0 {
		if err := SetOOMScoreAdj(m.pid, cfg.OOMScoreAdj); err != nil {
			fmt.Fprintf(logf, "[agentvm] %v\n", err)
		}
	}
	go func() {
		cmd.Wait()
		if ps := cmd.ProcessState; ps != nil {
			m.mu.Lock()
			m.exitStatus = ps.String()
			m.mu.Unlock()
			if f, err := os.OpenFile(cfg.LogPath, os.O_WRONLY|os.O_APPEND, 0); err == nil {
				fmt.Fprintf(f, "[agentvm] qemu pid %d exited: %s\n", m.pid, ps.String())
				f.Close()
			}
		}
		close(m.done)
	}()
	if err := m.connect(ctx); err != nil {
		m.Kill()
		return nil, fmt.Errorf("qemu did not come up: %w%s", err, LogTail(cfg.LogPath))
	}
	if cfg.Incoming != "" {
		if err := m.startIncoming(ctx); err != nil {
			// QEMU that died on its own (a crash while or right after it
			// loaded the state) is told apart from one that is still up
			// and refused the state: the caller may retry the first.
			// Only a death by a signal is a crash: QEMU that cannot load
			// a state (another device set, a bad file) exits with status 1
			// on its own, and would fail the same way again.
			select {
			case <-m.done:
				if st := m.ExitStatus(); strings.HasPrefix(st, "signal:") {
					return nil, fmt.Errorf("restore %s: %w (%s): %w%s", cfg.Incoming, ErrExited, st, err, LogTail(cfg.LogPath))
				}
			case <-time.After(time.Second):
			}
			m.Kill()
			<-m.done
			return nil, fmt.Errorf("restore %s: %w%s", cfg.Incoming, err, LogTail(cfg.LogPath))
		}
	}
	return m, nil
}

// ErrExited is a QEMU that a signal ended on its own (a crash) before it
// was called up.
var ErrExited = errors.New("qemu exited")

// Attach re-finds a QEMU started by an earlier daemon: the pid must be alive and its
// command line must carry this VM's -name.
func Attach(ctx context.Context, cfg Config, pid int) (*Machine, error) {
	if !IsOurs(pid, cfg.ID) {
		return nil, fmt.Errorf("pid %d is not the QEMU of %s", pid, cfg.ID)
	}
	m := &Machine{cfg: cfg, pid: pid, done: make(chan struct{})}
	go func() { // not our child: poll for its exit
		for syscall.Kill(pid, 0) == nil && IsOurs(pid, cfg.ID) {
			time.Sleep(200 * time.Millisecond)
		}
		close(m.done)
	}()
	if err := m.connect(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// FindOurs lists the live QEMU processes carrying -name guest=id, whether or
// not a record names their pid: a daemon that died while it started one
// (a wake, a start) may not have recorded it.
func FindOurs(id string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && IsOurs(pid, id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// IsOurs reports whether pid is a live QEMU carrying -name guest=id.
func IsOurs(pid int, id string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte("\x00guest="+id+",")) && bytes.Contains(b, []byte("qemu-system"))
}

func (m *Machine) connect(ctx context.Context) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.done:
			cancel()
		case <-cctx.Done():
		}
	}()
	q, err := DialQMP(cctx, m.cfg.QMPSock, m.onEvent)
	if err != nil {
		return err
	}
	m.qmp = q
	return nil
}

func (m *Machine) onEvent(e Event) {
	m.mu.Lock()
	if e.Event == "SHUTDOWN" {
		m.shutdownSeen = true
		var d struct {
			Reason string `json:"reason"`
		}
		json.Unmarshal(e.Data, &d)
		m.reason = d.Reason
	}
	hs := make([]func(Event), 0, len(m.events))
	for _, h := range m.events {
		hs = append(hs, h)
	}
	m.mu.Unlock()
	for _, h := range hs {
		h(e)
	}
}

// OnEvent registers an event handler until the returned func is called.
func (m *Machine) OnEvent(h func(Event)) (remove func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.events == nil {
		m.events = map[int]func(Event){}
	}
	id := m.nextEvent
	m.nextEvent++
	m.events[id] = h
	return func() {
		m.mu.Lock()
		delete(m.events, id)
		m.mu.Unlock()
	}
}

// PID returns the QEMU process id.
func (m *Machine) PID() int { return m.pid }

// Done is closed when the QEMU process has exited.
func (m *Machine) Done() <-chan struct{} { return m.done }

// CleanExit reports whether QEMU announced a SHUTDOWN before exiting, and why.
func (m *Machine) CleanExit() (bool, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.shutdownSeen, m.reason
}

// ExitStatus describes how a QEMU this process started exited ("" if
// unknown, e.g. for an attached one).
func (m *Machine) ExitStatus() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.exitStatus
}

// EventsDone is closed when the QMP connection has closed: every event
// QEMU sent before it exited has been read.
func (m *Machine) EventsDone() <-chan struct{} {
	if m.qmp == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return m.qmp.Done()
}

// Status returns QEMU's run state ("running", "paused", "inmigrate", ...).
func (m *Machine) Status(ctx context.Context) (string, error) {
	r, err := m.qmp.Execute(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var s struct {
		Status string `json:"status"`
	}
	err = json.Unmarshal(r, &s)
	return s.Status, err
}

// waitLoaded waits until an incoming migration has loaded the state. It
// reports whether the guest already runs (QEMU starts a guest saved while
// running itself); a guest saved stopped waits for run.
func (m *Machine) waitLoaded(ctx context.Context) (running bool, err error) {
	for {
		st, err := m.Status(ctx)
		if err != nil {
			return false, err
		}
		switch st {
		case "running":
			return true, nil
		case "paused", "postmigrate", "prelaunch":
			return false, nil
		case "inmigrate", "restore-vm":
		default:
			return false, fmt.Errorf("restore ended in state %q%s", st, LogTail(m.cfg.LogPath))
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("restore: %w", ctx.Err())
		case <-m.done:
			return false, fmt.Errorf("qemu exited during restore%s", LogTail(m.cfg.LogPath))
		case <-time.After(3 * time.Millisecond):
		}
	}
}

// run starts the loaded guest: the last command of a restore, so that a
// QEMU dying at any other finds a guest that has not run.
func (m *Machine) run(ctx context.Context) error {
	_, err := m.qmp.Execute(ctx, "cont", nil)
	return err
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// passFile opens path (for writing when write is set) and hands the descriptor to
// QEMU, returning the migration URI that names it. A file descriptor instead of
// `exec:cat` saves a copy through a pipe, which costs ~1 ms per MiB on these hosts.
func (m *Machine) passFile(ctx context.Context, path string, write bool) (string, error) {
	flag := os.O_RDONLY
	if write {
		flag = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return "", err
	}
	defer f.Close() // QEMU has its own copy once getfd returns
	name := "mig" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := m.qmp.ExecuteWithFD(ctx, "getfd", map[string]any{"fdname": name}, int(f.Fd())); err != nil {
		return "", err
	}
	return "fd:" + name, nil
}

// setIgnoreShared sets x-ignore-shared: when on, migration skips RAM backed by a
// shared file (the template's RAM file) and the stream holds only device state.
func (m *Machine) setIgnoreShared(ctx context.Context, on bool) error {
	_, err := m.qmp.Execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": on}}})
	return err
}

// startIncoming begins restoring the state file; QEMU starts the guest when it is loaded.
func (m *Machine) startIncoming(ctx context.Context) error {
	if m.cfg.IncomingShared {
		if err := m.setIgnoreShared(ctx, true); err != nil {
			return err
		}
	}
	if m.cfg.incomingMapped {
		if err := m.setMappedRAM(ctx, true, false); err != nil {
			return fmt.Errorf("%w (a state saved with mapped-ram needs QEMU %d.%d or later)", err, mappedRAMMajor, mappedRAMMinor)
		}
		if _, err := m.qmp.Execute(ctx, "migrate-incoming", map[string]any{"channels": fileChannel(m.cfg.Incoming)}); err != nil {
			return err
		}
		running, err := m.waitLoaded(ctx)
		if err != nil {
			return err
		}
		// Off again, before the guest runs: this QEMU's own saves
		// (snapshots and forks) choose their format, and mapped-ram needs
		// a file, not a pipe.
		if err := m.setMappedRAM(ctx, false, false); err != nil {
			return err
		}
		if running {
			return nil
		}
		return m.run(ctx)
	}
	// Incoming streams go through a pipe (Config.StateCat): QEMU 7.2 reading the state from a passed
	// file descriptor segfaulted now and then when several restores of one file ran
	// at once (forks), while the pipe has never failed.
	var cmd []string
	for _, a := range m.cfg.stateReader() {
		cmd = append(cmd, shellQuote(a))
	}
	switch off := m.cfg.incomingOffset; {
	case m.cfg.incomingEager:
		cmd = []string{shellQuote(m.cfg.StateCat), StateCatEagerArg}
	case off > 0 && m.cfg.StateCat == "":
		// CatState skips a page-format header itself; other readers get
		// the stream from where it starts.
		cmd = []string{"tail", "-c", "+" + strconv.FormatInt(off+1, 10)}
	}
	uri := "exec:" + strings.Join(cmd, " ") + " " + shellQuote(m.cfg.Incoming)
	if _, err := m.qmp.Execute(ctx, "migrate-incoming", map[string]any{"uri": uri}); err != nil {
		return err
	}
	if running, err := m.waitLoaded(ctx); err != nil || running {
		return err
	}
	return m.run(ctx)
}

// SaveState stops the guest and writes its device state, but not the RAM it shares
// through its memory file, to path (a template). The VM is left paused.
func (m *Machine) SaveState(ctx context.Context, path string) error {
	_, err := m.saveStopped(ctx, path, true, FormatStream)
	return err
}

// BlockResize grows the disk seen by the guest.
func (m *Machine) BlockResize(ctx context.Context, size int64) error {
	_, err := m.qmp.Execute(ctx, "block_resize", map[string]any{"device": "disk0", "size": size})
	return err
}

// Shutdown is the ladder: ACPI power button, wait up to grace, then QMP quit,
// then SIGKILL.
func (m *Machine) Shutdown(ctx context.Context, grace time.Duration) error {
	if _, err := m.qmp.Execute(ctx, "system_powerdown", nil); err == nil {
		select {
		case <-m.done:
			return nil
		case <-time.After(grace):
		case <-ctx.Done():
		}
	}
	return m.Quit()
}

// Quit asks QEMU to exit at once, and kills it if it does not within 3 s.
func (m *Machine) Quit() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m.qmp.Execute(ctx, "quit", nil)
	select {
	case <-m.done:
		return nil
	case <-time.After(3 * time.Second):
	}
	return m.Kill()
}

// Kill sends SIGKILL and waits for the exit. A machine that has exited is
// not signalled again: its pid may be another process's by now.
func (m *Machine) Kill() error {
	select {
	case <-m.done:
	default:
		if err := syscall.Kill(m.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		select {
		case <-m.done:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("qemu pid %d did not exit after SIGKILL", m.pid)
		}
	}
	if m.qmp != nil {
		m.qmp.Close()
	}
	return nil
}

// Close drops the QMP connection without touching the process (daemon shutdown).
func (m *Machine) Close() {
	if m.qmp != nil {
		m.qmp.conn.Close()
	}
}

// LogTail returns the end of a VM log, formatted to be appended to an error.
func LogTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return "; log tail: " + strings.TrimSpace(string(b))
}
