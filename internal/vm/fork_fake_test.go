package vm

import (
	"os"
	"strings"
	"testing"
)

// TestForkChildThatRebootedIsRemade: a fork child whose guest came up from a
// fresh boot (a kernel that panicked on the restore reboots) is no copy of
// its parent. It is deleted and made again from a new capture.
func TestForkChildThatRebootedIsRemade(t *testing.T) {
	e := newFakeEnv(t)
	p := e.create("parent")
	e.machine(p).SetMemory("step 7")
	_, pg, err := e.s.Guest(e.ctx, "parent")
	if err != nil {
		t.Fatal(err)
	}
	want, err := pg.Info(e.ctx)
	if err != nil || want.BootID == "" {
		t.Fatalf("parent's guest info: %+v %v", want, err)
	}
	e.hv.RebootNextRestore()
	res, err := e.s.Fork(e.ctx, "parent", 1)
	if err != nil {
		t.Fatal(err)
	}
	c := res.Children[0]
	_, cg, err := e.s.Guest(e.ctx, c.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cg.Info(e.ctx); err != nil || got.BootID != want.BootID || e.machine(c).Memory() != "step 7" {
		t.Fatalf("child: %+v %v, memory %q; parent's boot id %s", got, err, e.machine(c).Memory(), want.BootID)
	}
	restores := 0
	for _, cfg := range e.hv.Starts() {
		if strings.Contains(cfg.Incoming, "fork-") {
			restores++
		}
	}
	if restores != 2 {
		t.Fatalf("%d child restores, want 2 (the rebooted one and its remake)", restores)
	}
	vms, err := e.s.List(e.ctx)
	if err != nil || len(vms) != 2 {
		t.Fatalf("after the fork: %d VMs (%v), want the parent and one child", len(vms), err)
	}
	b, err := os.ReadFile(e.s.paths(p.ID).Log)
	if err != nil {
		t.Fatal(err)
	}
	log := string(b)
	if !strings.Contains(log, "rebooted during its restore") || !strings.Contains(log, "capturing the parent again") {
		t.Fatalf("the parent's log does not tell of the rebooted child:\n%s", log)
	}
}
