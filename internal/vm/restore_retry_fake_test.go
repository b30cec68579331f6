package vm

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// crashRestores makes the next n restores of a VM (not templates) crash as
// QEMU 10.0.2 did right after the state load: the process exits before the
// guest answers. It returns how many it crashed so far.
func (e *fakeEnv) crashRestores(n int) func() int {
	var mu sync.Mutex
	crashed := 0
	e.hv.OnStarted(func(cfg qemu.Config) {
		mu.Lock()
		defer mu.Unlock()
		if cfg.Incoming == "" || !strings.HasPrefix(cfg.ID, "vm-") || crashed >= n {
			return
		}
		crashed++
		e.hv.MachineOf(cfg.ID).Segfault()
	})
	return func() int { mu.Lock(); defer mu.Unlock(); return crashed }
}

// A create, create --from and fork child whose QEMU crashes once before the
// guest answers succeed in a fresh QEMU; the crash is an event.
func TestRestoreCrashIsRetried(t *testing.T) {
	e := newFakeEnv(t)
	e.create("warm") // the template exists
	crashed := e.crashRestores(1)
	v := e.create("box")
	if crashed() != 1 {
		t.Fatalf("%d restores crashed, want 1", crashed())
	}
	if out := e.exec("box", "echo up"); out != "up\n" {
		t.Fatalf("the retried VM: %q", out)
	}
	evs, err := e.s.Events(e.ctx, v.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range evs {
		found = found || strings.Contains(ev.Message, "crashed") && strings.Contains(ev.Message, "retrying once")
	}
	if !found {
		t.Fatalf("no crash event among %d", len(evs))
	}

	// The same through a QEMU whose start itself reports the crash (qmp
	// cont: connection closed), for a copy of a snapshot.
	if _, err := e.s.Snapshot(e.ctx, "box", "s1"); err != nil {
		t.Fatal(err)
	}
	e.hv.FailNextStart(fmt.Errorf("restore x: %w (signal: segmentation fault): qmp cont: connection closed", qemu.ErrExited))
	c, _, err := e.s.CreateFrom(e.ctx, "s1", CreateOptions{Name: "copy"})
	if err != nil || c.State != store.StateRunning {
		t.Fatalf("create --from after one crash: %v", err)
	}
	// A fork child.
	crashed = e.crashRestores(1)
	r, err := e.s.ForkWith(e.ctx, "box", ForkOptions{Count: 1})
	if err != nil || len(r.Children) != 1 || crashed() != 1 {
		t.Fatalf("fork after one crash: %v %+v (crashed %d)", err, r, crashed())
	}
}

// Two crashes in a row reach the caller, and leave nothing half made.
func TestRestoreCrashTwiceFails(t *testing.T) {
	e := newFakeEnv(t)
	e.create("warm")
	crashed := e.crashRestores(2)
	_, _, err := e.s.Create(e.ctx, CreateOptions{Name: "box", MemoryMiB: 512})
	if err == nil || !errors.Is(err, qemu.ErrExited) || crashed() != 2 {
		t.Fatalf("create after two crashes: %v (crashed %d)", err, crashed())
	}
	if _, err := e.s.Get(e.ctx, "box"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the failed create left a VM: %v", err)
	}
}

// A restore that QEMU refuses on its own (exit status 1: a state it cannot
// load) is not a crash: it would fail the same way again, so it is not
// retried.
func TestRestoreRefusalIsNotRetried(t *testing.T) {
	e := newFakeEnv(t)
	e.create("warm")
	before := len(e.hv.Starts())
	e.hv.FailNextStart(errors.New("restore x: qemu-system-x86_64: load of migration failed: Invalid argument"))
	if _, _, err := e.s.Create(e.ctx, CreateOptions{Name: "box", MemoryMiB: 512}); err == nil || errors.Is(err, qemu.ErrExited) {
		t.Fatalf("create after a refused state: %v", err)
	}
	if n := len(e.hv.Starts()) - before; n != 1 {
		t.Fatalf("%d starts for one refused restore, want 1", n)
	}
}

// A wake whose QEMU dies in its start (loading the state, or at the cont
// that would run the guest: QEMU 10.0.2 segfaulted so in a loaded e2e run)
// is retried once; one that crashes after the start (the guest ran, and
// may have changed its disk) is not, and the VM stays suspended with its
// state for the next wake.
func TestWakeCrashInStartIsRetried(t *testing.T) {
	e := newFakeEnv(t)
	e.create("box")
	if _, err := e.s.Suspend(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	before := len(e.hv.Starts())
	e.hv.FailNextStart(fmt.Errorf("restore x: %w (signal: segmentation fault): qmp cont: connection closed", qemu.ErrExited))
	if _, err := e.s.Wake(e.ctx, "box"); err != nil {
		t.Fatalf("a wake whose QEMU crashed in its start: %v", err)
	}
	if n := len(e.hv.Starts()) - before; n != 2 {
		t.Fatalf("%d starts for one crashed wake, want 2", n)
	}
	if out := e.exec("box", "echo up"); out != "up\n" {
		t.Fatalf("the woken VM: %q", out)
	}

	if _, err := e.s.Suspend(e.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	crashed := e.crashRestores(1) // the machine starts, then dies: the guest ran
	before = len(e.hv.Starts())
	if _, err := e.s.Wake(e.ctx, "box"); err == nil || crashed() != 1 {
		t.Fatalf("a wake that crashed after its start: %v (crashed %d)", err, crashed())
	}
	if n := len(e.hv.Starts()) - before; n != 1 {
		t.Fatalf("%d starts for a wake that crashed after its start, want 1 (no retry)", n)
	}
	if v := e.state("box"); v.State != store.StateSuspended {
		t.Fatalf("after the failed wake the VM is %s", v.State)
	}
	if _, err := e.s.Wake(e.ctx, "box"); err != nil {
		t.Fatalf("the next wake: %v", err)
	}
}
