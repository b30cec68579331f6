package vm

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
)

// killCount is a Machine that counts its kills (only Kill is called).
type killCount struct {
	Machine
	kills atomic.Int32
}

func (k *killCount) Kill() error { k.kills.Add(1); return nil }

// The machines held when the daemon stops are killed, a machine handed
// over is not, and one added after the stop is killed at once.
func TestUnfinishedKill(t *testing.T) {
	var u unfinished
	held, handed, released, late := &killCount{}, &killCount{}, &killCount{}, &killCount{}
	if _, err := u.add(held); err != nil {
		t.Fatal(err)
	}
	u.add(handed)
	if !u.handOver(handed) {
		t.Fatal("a held machine was not handed over")
	}
	release, _ := u.add(released)
	release()
	if n := u.kill(); n != 1 {
		t.Fatalf("kill ended %d machines, want 1", n)
	}
	if _, err := u.add(late); !errors.Is(err, errStopping) {
		t.Fatalf("add after kill: %v", err)
	}
	if u.handOver(held) {
		t.Error("a killed machine was handed over")
	}
	if held.kills.Load() != 1 || handed.kills.Load() != 0 || released.kills.Load() != 0 || late.kills.Load() != 1 {
		t.Fatalf("kills: held %d, handed %d, released %d, late %d; want 1, 0, 0, 1", held.kills.Load(), handed.kills.Load(), released.kills.Load(), late.kills.Load())
	}
}

// A daemon that stops while a create starts its VM's machine, or while a
// template's machine boots, leaves no machine running (it left them
// running, unowned, until a next start of the daemon found them).
func TestCloseKillsUnfinishedMachines(t *testing.T) {
	for _, tc := range []struct {
		name, prefix string
		held         bool // the stop comes once the launch holds the machine, not while QEMU starts
	}{{"create", "vm-", false}, {"create, machine held", "vm-", true}, {"template build", "tpl-", false}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEnv(t)
			if tc.prefix == "vm-" {
				e.create("warm") // the template exists: the create restores
			}
			closed := make(chan struct{})
			var blocked atomic.Bool
			stop := func(id string) {
				if strings.HasPrefix(id, tc.prefix) && blocked.CompareAndSwap(false, true) {
					go func() { e.s.Close(); close(closed) }()
					<-closed // the daemon stopped while this machine started
					if tc.held && e.hv.MachineOf(id) != nil {
						t.Error("the stopped daemon left the machine it held running")
					}
				}
			}
			if tc.held {
				testHookStarted = stop
				t.Cleanup(func() { testHookStarted = func(string) {} })
			} else {
				e.hv.OnStarted(func(cfg qemu.Config) { stop(cfg.ID) })
			}
			errc := make(chan error, 1)
			go func() {
				_, _, err := e.s.Create(e.ctx, CreateOptions{Name: "box", MemoryMiB: 512})
				errc <- err
			}()
			var err error
			select {
			case err = <-errc:
			case <-time.After(2 * time.Minute):
				t.Fatal("the create did not end after the daemon stopped (a template build re-dialled the network of a killed machine forever)")
			}
			if err == nil {
				t.Fatal("a create across the daemon's stop succeeded")
			}
			if !blocked.Load() {
				t.Fatal("no machine started")
			}
			deadline := time.Now().Add(time.Minute)
			for e.hv.Running() > 0 && tc.prefix == "tpl-" || e.liveVMMachines() > 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%d machines run after the daemon stopped", e.hv.Running())
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// liveVMMachines counts the running machines of VMs other than "warm"'s.
func (e *fakeEnv) liveVMMachines() int {
	n := 0
	for _, c := range e.hv.Starts() {
		if strings.HasPrefix(c.ID, "vm-") && e.hv.MachineOf(c.ID) != nil {
			if v, err := e.st.GetVM(e.ctx, c.ID); err == nil && v.Name == "warm" {
				continue
			}
			n++
		}
	}
	return n
}
