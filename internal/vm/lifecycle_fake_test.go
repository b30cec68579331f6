package vm

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/hypervisor/fakehv"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/store"
)

// fakeEnv is a Service on a real SQLite store and real files, whose
// machines are fakeHV's: everything but QEMU and the guest kernel is real
// (the agent, its protocol, qcow2 overlays made by qemu-img, the network).
type fakeEnv struct {
	t    *testing.T
	hv   *fakehv.HV
	st   *store.Store
	cfg  Config
	img  *image.Image
	s    *Service
	ctx  context.Context
	dirs string
	// vst, when set, is the store the service uses instead of st (a test
	// that changes what its reads return).
	vst Store
}

func newFakeEnv(t *testing.T) *fakeEnv {
	t.Helper()
	skipWithoutFakeMachines(t)
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "agentvm.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return newFakeEnvOn(t, st, dir, nil)
}

// newFakeEnvOn starts a service on st with its files under dir; setup, if
// set, adjusts the env (its Config, its vst) before the service starts.
func newFakeEnvOn(t *testing.T, st *store.Store, dir string, setup func(*fakeEnv)) *fakeEnv {
	t.Helper()
	run, err := os.MkdirTemp("", "avm-run-") // unix socket paths must stay short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	e := &fakeEnv{t: t, hv: fakehv.New(), st: st, ctx: context.Background(), dirs: dir}
	e.cfg = Config{DataDir: filepath.Join(dir, "data"), RunDir: run, CacheDir: filepath.Join(dir, "cache"),
		QEMUVersion: "10.0.2", Accel: "tcg", Hypervisor: HypervisorOf(e.hv),
		Log: slog.New(slog.DiscardHandler), BootTimeout: time.Minute}
	if setup != nil {
		setup(e)
	}
	if e.img, err = fakehv.Image(filepath.Join(dir, "image")); err != nil {
		t.Fatal(err)
	}
	e.cfg.EnsureImage = fakehv.EnsureImage(e.img)
	e.s = e.newService()
	t.Cleanup(func() {
		e.s.Close()
		for _, pid := range e.hv.PIDs() {
			e.hv.Kill(pid)
		}
	})
	return e
}

// skipWithoutFakeMachines skips a test where fake machines cannot run.
func skipWithoutFakeMachines(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("the in-process guest agent runs commands as the VM's users: needs root")
	}
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("needs qemu-img for the disk overlays")
	}
}

// newService starts a service on the env's store, files and processes: a
// daemon (re)start.
func (e *fakeEnv) newService() *Service {
	e.t.Helper()
	var st Store = e.st
	if e.vst != nil {
		st = e.vst
	}
	s, err := New(e.cfg, st)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// create makes a VM and checks that its agent answers.
func (e *fakeEnv) create(name string) *store.VM {
	e.t.Helper()
	v, _, err := e.s.Create(e.ctx, CreateOptions{Name: name, MemoryMiB: 512})
	if err != nil {
		e.t.Fatalf("create %s: %v", name, err)
	}
	if v.State != store.StateRunning {
		e.t.Fatalf("create %s: state %s", name, v.State)
	}
	return v
}

// exec runs sh -c cmd in the VM through the service's agent session.
func (e *fakeEnv) exec(name, cmd string) string {
	e.t.Helper()
	_, gc, err := e.s.Guest(e.ctx, name)
	if err != nil {
		e.t.Fatalf("guest %s: %v", name, err)
	}
	var out strings.Builder
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	st, err := gc.Run(ctx, guest.ExecRequest{Argv: []string{"sh", "-c", cmd}}, nil, &out, &out)
	if err != nil || st.ExitCode != 0 {
		e.t.Fatalf("exec %q in %s: %v %+v: %s", cmd, name, err, st, out.String())
	}
	return out.String()
}

func (e *fakeEnv) state(name string) *store.VM {
	e.t.Helper()
	v, err := e.s.Get(e.ctx, name)
	if err != nil {
		e.t.Fatalf("get %s: %v", name, err)
	}
	return v
}

// waitState waits (generously) for the VM's recorded state.
func (e *fakeEnv) waitState(name string, want store.State) *store.VM {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v := e.state(name)
		if v.State == want {
			return v
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: state %s, want %s (error %q)", name, v.State, want, v.Error)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// last is the configuration of the last machine started.
func (e *fakeEnv) last() qemu.Config {
	starts := e.hv.Starts()
	return starts[len(starts)-1]
}

func (e *fakeEnv) machine(v *store.VM) *fakehv.Machine {
	e.t.Helper()
	m := e.hv.MachineOf(v.ID)
	if m == nil {
		e.t.Fatalf("%s: no machine runs", v.Name)
	}
	return m
}

// Every lifecycle operation, through the service, against fake machines:
// the states recorded, what runs, and what memory each start restores.
func TestLifecycleOnFakeMachines(t *testing.T) {
	e := newFakeEnv(t)
	v := e.create("box")
	if got := e.exec("box", "echo hi"); got != "hi\n" {
		t.Fatalf("exec: %q", got)
	}
	// The first create of a shape cold-boots its template, then restores it.
	starts := e.hv.Starts()
	if len(starts) != 2 || starts[0].Incoming != "" || starts[0].ID == v.ID {
		t.Fatalf("the template build: %d starts, first %+v", len(starts), starts[0])
	}
	if c := starts[1]; c.ID != v.ID || !strings.HasSuffix(c.Incoming, "/state") || !c.IncomingShared || c.RAMPath == "" {
		t.Fatalf("a create restores the template: %+v", c)
	}
	tpls, err := e.s.Templates()
	if err != nil || len(tpls) != 1 || tpls[0].CPUs != 1 || tpls[0].MemoryMiB != 512 {
		t.Fatalf("templates: %v %v", tpls, err)
	}
	e.create("box2") // the next one only restores it
	if n := len(e.hv.Starts()); n != 3 {
		t.Fatalf("%d starts after a second create", n)
	}
	if err := e.s.Delete(e.ctx, "box2"); err != nil {
		t.Fatal(err)
	}
	e.machine(v).SetMemory("work in progress")

	if _, err := e.s.Pause(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.machine(v).Status(e.ctx); st != "paused" || e.state("box").State != store.StatePaused {
		t.Fatalf("pause: machine %s, VM %s", st, e.state("box").State)
	}
	if _, err := e.s.Pause(e.ctx, "box"); err != nil { // a no-op
		t.Fatalf("pause of a paused VM: %v", err)
	}
	if _, err := e.s.Resume(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.machine(v).Status(e.ctx); st != "running" {
		t.Fatalf("resume: machine %s", st)
	}

	if _, err := e.s.Suspend(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if e.hv.MachineOf(v.ID) != nil || e.state("box").State != store.StateSuspended {
		t.Fatalf("suspend: a machine still runs, or state %s", e.state("box").State)
	}
	if _, err := os.Stat(e.s.suspendPath(v.ID)); err != nil {
		t.Fatalf("suspend state: %v", err)
	}
	if _, _, err := e.s.Guest(e.ctx, "box"); err != nil { // reaching a suspended VM wakes it
		t.Fatalf("wake on use: %v", err)
	}
	if e.state("box").State != store.StateRunning || e.machine(v).Memory() != "work in progress" {
		t.Fatalf("wake: state %s, memory %q", e.state("box").State, e.machine(v).Memory())
	}
	if got := e.exec("box", "echo back"); got != "back\n" {
		t.Fatalf("exec after wake: %q", got)
	}

	if _, err := e.s.Stop(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if e.hv.MachineOf(v.ID) != nil || e.state("box").State != store.StateStopped {
		t.Fatal("stop: a machine still runs, or not stopped")
	}
	if _, err := e.s.Pause(e.ctx, "box"); !errors.Is(err, ErrConflict) {
		t.Fatalf("pause of a stopped VM: %v", err)
	}
	if _, err := e.s.Start(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if last := e.last(); last.Incoming != "" || e.machine(v).Memory() != "booted" {
		t.Fatalf("a start after a stop boots from the disk: incoming %q, memory %q", last.Incoming, e.machine(v).Memory())
	}
	e.exec("box", "true")

	disk := e.state("box").Disk
	if err := e.s.Delete(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Get(e.ctx, "box"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	if e.hv.Running() != 0 {
		t.Fatalf("%d machines still run after the delete", e.hv.Running())
	}
	if _, err := os.Stat(disk); !os.IsNotExist(err) {
		t.Fatalf("the deleted VM's disk %s: %v", disk, err)
	}
	if n := e.s.ops.size(); n != 0 {
		t.Fatalf("%d VM lock entries left after the only VM was deleted", n)
	}
}

// A start that fails leaves the VM as it was, with the error, and nothing running.
func TestFailedStartLeavesNothingRunning(t *testing.T) {
	e := newFakeEnv(t)
	e.create("box")
	if _, err := e.s.Stop(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	e.hv.FailNextStart(errors.New("qemu: could not open disk"))
	if _, err := e.s.Start(e.ctx, "box"); err == nil || !strings.Contains(err.Error(), "could not open disk") {
		t.Fatalf("start: %v", err)
	}
	if v := e.state("box"); v.State == store.StateRunning || e.hv.Running() != 0 {
		t.Fatalf("after a failed start: state %s, %d machines", v.State, e.hv.Running())
	}
	if _, err := e.s.Start(e.ctx, "box"); err != nil { // and the next one works
		t.Fatalf("start again: %v", err)
	}
	e.exec("box", "true")
}

// The exit monitor: a machine that dies is recorded crashed, a guest that
// powers off stopped; both can start again.
func TestExitMonitor(t *testing.T) {
	e := newFakeEnv(t)
	v := e.create("box")
	e.machine(v).Crash()
	got := e.waitState("box", store.StateCrashed)
	if !strings.Contains(got.Error, "exited unexpectedly") || got.PID != 0 {
		t.Fatalf("crash recorded as %+v", got)
	}
	if _, err := e.s.Start(e.ctx, "box"); err != nil {
		t.Fatalf("start after a crash: %v", err)
	}
	e.machine(v).PowerOff()
	if got := e.waitState("box", store.StateStopped); got.Error != "" {
		t.Fatalf("power-off recorded with error %q", got.Error)
	}
	// An exit the service causes is not a crash.
	if _, err := e.s.Start(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Stop(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if st := e.state("box").State; st != store.StateStopped {
		t.Fatalf("after a stop: %s", st)
	}
}

// A daemon restart: running machines are re-attached (and answer), a VM
// whose machine died meanwhile is crashed, an unfinished create is removed,
// and a stray machine of a VM is killed.
func TestReconcileAfterRestart(t *testing.T) {
	e := newFakeEnv(t)
	a := e.create("alive")
	d := e.create("dies")
	e.machine(a).SetMemory("kept")
	e.s.Close() // the daemon goes; its machines run on

	e.machine(d).Crash()
	stray, err := e.hv.Start(e.ctx, qemu.Config{ID: a.ID, AgentSock: filepath.Join(e.cfg.RunDir, "stray-a"), NetSock: filepath.Join(e.cfg.RunDir, "stray-n"), LogPath: filepath.Join(e.dirs, "stray.log")})
	if err != nil {
		t.Fatal(err)
	}
	half := &store.VM{ID: "vm-halfmade00001", Name: "half", State: store.StateCreating, CPUs: 1, MemoryMiB: 512, Image: image.Default}
	if err := e.st.CreateVM(e.ctx, half); err != nil {
		t.Fatal(err)
	}

	e.s = e.newService()
	if err := e.s.Reconcile(e.ctx); err != nil {
		t.Fatal(err)
	}
	if v := e.state("alive"); v.State != store.StateRunning || v.PID != a.PID || e.machine(a).Memory() != "kept" {
		t.Fatalf("re-attached VM: %+v", v)
	}
	if got := e.exec("alive", "echo still"); got != "still\n" {
		t.Fatalf("exec after re-attach: %q", got)
	}
	if v := e.state("dies"); v.State != store.StateCrashed || !strings.Contains(v.Error, "lost while the daemon was down") {
		t.Fatalf("VM whose machine died: %s %q", v.State, v.Error)
	}
	if _, err := e.st.GetVM(e.ctx, half.ID); err == nil {
		t.Fatal("the unfinished create is still recorded")
	}
	select {
	case <-stray.Done():
	default:
		t.Fatal("the stray machine still runs")
	}
}

// A fork of a running VM: each child restores the parent's memory at the
// fork, on its own disk overlay, and runs on its own; the parent goes on.
func TestForkOnFakeMachines(t *testing.T) {
	e := newFakeEnv(t)
	p := e.create("parent")
	e.machine(p).SetMemory("step 41")
	res, err := e.s.Fork(e.ctx, "parent", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Children) != 2 || res.Parent.State != store.StateRunning {
		t.Fatalf("fork: %d children, parent %s", len(res.Children), res.Parent.State)
	}
	disks := map[string]bool{e.state("parent").Disk: true}
	for _, c := range res.Children {
		m := e.machine(c)
		if m.Memory() != "step 41" || c.State != store.StateRunning {
			t.Fatalf("child %s: memory %q, state %s", c.Name, m.Memory(), c.State)
		}
		e.exec(c.Name, "true")
		if disks[c.Disk] {
			t.Fatalf("child %s shares disk %s", c.Name, c.Disk)
		}
		disks[c.Disk] = true
	}
	e.machine(res.Children[0]).SetMemory("child's own")
	if e.machine(res.Children[1]).Memory() != "step 41" || e.machine(p).Memory() != "step 41" {
		t.Fatal("a child's memory leaked into its sibling or parent")
	}
	if got := e.exec("parent", "echo on"); got != "on\n" {
		t.Fatalf("parent after the fork: %q", got)
	}
	// The children outlive the parent.
	if err := e.s.Delete(e.ctx, "parent"); err != nil {
		t.Fatal(err)
	}
	e.exec(res.Children[1].Name, "true")
}

// Snapshots of a running and of a paused VM, a VM made from one, and
// resizes of a running and of a stopped VM, against fake machines.
func TestSnapshotCreateFromAndResizeOnFakeMachines(t *testing.T) {
	e := newFakeEnv(t)
	v := e.create("box")
	e.machine(v).SetMemory("at the snapshot")
	sn, err := e.s.Snapshot(e.ctx, "box", "snap1")
	if err != nil {
		t.Fatal(err)
	}
	got := e.state("box")
	if got.State != store.StateRunning || len(got.Layers) != 1 || got.Disk == v.Disk {
		t.Fatalf("after a snapshot: state %s, layers %v, disk %s (was %s)", got.State, got.Layers, got.Disk, v.Disk)
	}
	if st, _ := e.machine(v).Status(e.ctx); st != "running" {
		t.Fatalf("the snapshotted machine is %s", st)
	}
	e.machine(v).SetMemory("after the snapshot")

	if _, err := e.s.Pause(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Snapshot(e.ctx, "box", "snap2"); err != nil {
		t.Fatal(err)
	}
	if st, _ := e.machine(v).Status(e.ctx); st != "paused" || e.state("box").State != store.StatePaused {
		t.Fatalf("a paused VM's snapshot leaves it %s (recorded %s)", st, e.state("box").State)
	}
	if _, err := e.s.Snapshot(e.ctx, "box", "snap1"); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second snapshot named snap1: %v", err)
	}
	if _, err := e.s.Resume(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}

	c, _, err := e.s.CreateFrom(e.ctx, sn.Name, CreateOptions{Name: "copy"})
	if err != nil {
		t.Fatal(err)
	}
	if c.State != store.StateRunning || e.machine(c).Memory() != "at the snapshot" || c.Disk == e.state("box").Disk {
		t.Fatalf("from the snapshot: state %s, memory %q, disk %s", c.State, e.machine(c).Memory(), c.Disk)
	}
	e.exec("copy", "true")
	if e.machine(v).Memory() != "after the snapshot" {
		t.Fatal("the snapshot's copy changed its source")
	}

	// A running VM grows now: vCPUs hot-added, memory plugged, disk grown.
	res, err := e.s.Resize(e.ctx, "box", ResizeOptions{CPUs: 2, MemoryMiB: 1024, DiskBytes: 10 << 30})
	if err != nil {
		t.Fatal(err)
	}
	m := e.machine(v)
	cpus, _ := m.PresentCPUs(e.ctx)
	plugged, _ := m.RequestedMemory(e.ctx)
	if got := e.state("box"); got.CPUs != 2 || got.MemoryMiB != 1024 || got.DiskBytes != 10<<30 || cpus != 2 || plugged != 512 {
		t.Fatalf("live resize (%s): recorded %d vCPU %d MiB %d bytes; machine %d vCPU, %d MiB plugged", res.Message, got.CPUs, got.MemoryMiB, got.DiskBytes, cpus, plugged)
	}
	if _, err := e.s.Resize(e.ctx, "box", ResizeOptions{DiskBytes: 1 << 30}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("shrinking the disk: %v", err)
	}
	// A stopped VM's new sizes apply at its next start, as boot memory.
	if _, err := e.s.Stop(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Resize(e.ctx, "box", ResizeOptions{MemoryMiB: 1536}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Start(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	if last := e.last(); last.MemoryMiB != 1536 || last.PluggedMiB != 0 || last.CPUs != 2 {
		t.Fatalf("the start after the resize: %d MiB boot memory, %d plugged, %d vCPU", last.MemoryMiB, last.PluggedMiB, last.CPUs)
	}
	if err := e.s.DeleteSnapshot(e.ctx, "snap1"); err != nil {
		t.Fatal(err)
	}
	e.exec("copy", "true") // a VM outlives the snapshot it was made from
}

// A fence kills every VM of the node at once and refuses operations; the
// unfence after the node is back records them crashed, with the reason,
// and they start again. Another node's VM is listed but neither run,
// reconciled nor operated on here.
func TestFenceAndOtherNodes(t *testing.T) {
	e := newFakeEnv(t)
	e.create("a")
	e.create("b")
	other := &store.VM{ID: "vm-elsewhere0001", Name: "remote", State: store.StateRunning, CPUs: 1, MemoryMiB: 512, NetIndex: 90, Node: "node-2", PID: 4242, CreatedAt: time.Now()}
	if err := e.st.CreateVM(e.ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Pause(e.ctx, "remote"); !errors.Is(err, ErrOtherNode) {
		t.Fatalf("pause of another node's VM: %v", err)
	}
	if err := e.s.Delete(e.ctx, "remote"); !errors.Is(err, ErrOtherNode) {
		t.Fatalf("delete of another node's VM: %v", err)
	}
	if _, _, err := e.s.Guest(e.ctx, "remote"); !errors.Is(err, ErrOtherNode) {
		t.Fatalf("exec in another node's VM: %v", err)
	}
	if vms, _ := e.s.List(e.ctx); len(vms) != 3 {
		t.Fatalf("list shows %d VMs, want all 3", len(vms))
	}

	e.s.Fence("the lease could not be renewed")
	if n := e.hv.Running(); n != 0 {
		t.Fatalf("%d machines run after the fence", n)
	}
	if _, err := e.s.Pause(e.ctx, "a"); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "lease could not be renewed") {
		t.Fatalf("pause while fenced: %v", err)
	}
	if _, _, err := e.s.Create(e.ctx, CreateOptions{Name: "c", MemoryMiB: 512}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("create while fenced: %v", err)
	}
	if err := e.s.Unfence(e.ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		if v := e.state(name); v.State != store.StateCrashed || !strings.Contains(v.Error, "fence") {
			t.Fatalf("%s after the unfence: %s %q", name, v.State, v.Error)
		}
	}
	if v := e.state("remote"); v.State != store.StateRunning || v.Error != "" {
		t.Fatalf("another node's VM was reconciled here: %s %q", v.State, v.Error)
	}
	if _, err := e.s.Start(e.ctx, "a"); err != nil {
		t.Fatal(err)
	}
	e.exec("a", "true")

	// Another node's VM is deleted only once that node is lost: then its
	// record goes (and the delete hooks run), and nothing here is touched.
	lost := false
	e.s.cfg.NodeLost = func(_ context.Context, id string) (bool, error) { return lost && id == "node-2", nil }
	if err := e.s.Delete(e.ctx, "remote"); !errors.Is(err, ErrOtherNode) {
		t.Fatalf("delete of a live node's VM: %v", err)
	}
	hooked := make(chan string, 1)
	e.s.OnDelete(func(id string) { hooked <- id })
	lost = true
	if err := e.s.Delete(e.ctx, "remote"); err != nil {
		t.Fatalf("delete of a lost node's VM: %v", err)
	}
	if _, err := e.st.GetVM(e.ctx, "remote"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the lost node's VM is still recorded: %v", err)
	}
	select {
	case id := <-hooked:
		if id != other.ID {
			t.Fatalf("delete hook ran for %s", id)
		}
	case <-time.After(time.Minute):
		t.Fatal("the delete hooks did not run for a lost node's VM")
	}
	e.exec("a", "true")
}

// A machine that an operation was starting when the fence came is killed
// as it would be recorded: the operation fails, and nothing runs.
func TestFenceDuringALaunch(t *testing.T) {
	e := newFakeEnv(t)
	e.create("first") // builds the template: the next create only restores it
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.hv.OnStarted(func(cfg qemu.Config) {
		once.Do(func() { close(held); <-release })
	})
	errc := make(chan error, 1)
	go func() {
		_, _, err := e.s.Create(e.ctx, CreateOptions{Name: "late", MemoryMiB: 512})
		errc <- err
	}()
	<-held
	e.s.Fence("test fence")
	close(release)
	if err := <-errc; !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "fenced") {
		t.Fatalf("a create the fence interrupted: %v", err)
	}
	if n := e.hv.Running(); n != 0 {
		t.Fatalf("%d machines run on the fenced node", n)
	}
	if err := e.s.Unfence(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.GetVM(e.ctx, "late"); err == nil {
		t.Fatal("the interrupted create left its VM")
	}
	if v := e.state("first"); v.State != store.StateCrashed {
		t.Fatalf("first after the unfence: %s", v.State)
	}
	e.create("after") // and creates work again

	// A fence that comes while a wake starts an existing VM's machine: the
	// machine is killed as it would be published, the VM stays suspended
	// with its state, and wakes once the node is back.
	if _, err := e.s.Suspend(e.ctx, "after"); err != nil {
		t.Fatal(err)
	}
	held2, release2 := make(chan struct{}), make(chan struct{})
	var once2 sync.Once
	e.hv.OnStarted(func(cfg qemu.Config) {
		once2.Do(func() { close(held2); <-release2 })
	})
	go func() {
		_, err := e.s.Wake(e.ctx, "after")
		errc <- err
	}()
	<-held2
	e.s.Fence("test fence 2")
	close(release2)
	if err := <-errc; err == nil {
		t.Fatal("a wake the fence interrupted succeeded")
	}
	if n := e.hv.Running(); n != 0 {
		t.Fatalf("%d machines run on the fenced node", n)
	}
	if err := e.s.Unfence(e.ctx); err != nil {
		t.Fatal(err)
	}
	if v := e.state("after"); v.State != store.StateSuspended || !strings.Contains(v.Error, "test fence 2") {
		t.Fatalf("the VM whose wake the fence interrupted, after the unfence: %s %q", v.State, v.Error)
	}
	if out := e.exec("after", "echo up"); out != "up\n" {
		t.Fatalf("exec (a wake) after the unfence: %q", out)
	}
}
