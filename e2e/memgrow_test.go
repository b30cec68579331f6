package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

// memTotalMiB is the guest's MemTotal.
func memTotalMiB(t *testing.T, s *testenv.Server, ctx context.Context, vm string) int {
	t.Helper()
	var mib int
	out := s.Exec(ctx, vm, "awk '/^MemTotal:/ {print int($2/1024)}' /proc/meminfo").Stdout
	if _, err := fmtSscan(out, &mib); err != nil {
		t.Fatalf("MemTotal of %s: %q", vm, out)
	}
	return mib
}

// waitMemTotal waits until the guest's MemTotal is at least min MiB.
func waitMemTotal(t *testing.T, s *testenv.Server, ctx context.Context, vm string, min int) int {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got := memTotalMiB(t, s, ctx, vm)
		if got >= min {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: MemTotal %d MiB, want at least %d", vm, got, min)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Memory grows live through virtio-mem, and the grown VM keeps its memory
// (size and contents) across suspend/wake, snapshot + create --from, fork
// and a boot from disk.
func TestMemoryGrowLive(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s.CreateVM(ctx, api.CreateVMRequest{Name: "mem", Memory: 512 << 20})
	before := memTotalMiB(t, s, ctx, "mem")

	r, err := s.Client.ResizeVM(ctx, "mem", api.ResizeRequest{Memory: 1536 << 20})
	if err != nil || r.MemoryMiB != 1536 || r.NextMemoryMiB != 0 || r.Op == nil || !strings.Contains(r.Op.Message, "grown live") {
		t.Fatalf("grow memory: %v %+v", err, r)
	}
	grown := waitMemTotal(t, s, ctx, "mem", before+1000)
	t.Logf("MemTotal %d MiB -> %d MiB", before, grown)
	if got, _ := s.Client.GetVM(ctx, "mem"); got.MemoryMiB != 1536 {
		t.Fatalf("record after the grow: %+v", got)
	}
	// shrinking waits for the next start; asking for the current size cancels it
	r, err = s.Client.ResizeVM(ctx, "mem", api.ResizeRequest{Memory: 1 << 30})
	if err != nil || r.MemoryMiB != 1536 || r.NextMemoryMiB != 1024 || !strings.Contains(r.Op.Message, "never removed live") {
		t.Fatalf("shrink a running VM: %v %+v", err, r)
	}
	if r, err = s.Client.ResizeVM(ctx, "mem", api.ResizeRequest{Memory: 1536 << 20}); err != nil || r.NextMemoryMiB != 0 || !strings.Contains(r.Op.Message, "cancelled") {
		t.Fatalf("cancel the shrink: %v %+v", err, r)
	}

	// Fill more memory than the VM booted with, so part of it sits in the
	// plugged memory, and check it after every restore (a tmpfs of its own:
	// /dev/shm was sized from the boot memory).
	fill := s.Exec(ctx, "mem", "mkdir -p /run/fill && mount -t tmpfs -o size=1G fill /run/fill && "+
		"yes agentvm-memory | head -c 700M > /run/fill/data && md5sum < /run/fill/data")
	if fill.ExitCode != 0 || len(fill.Stdout) < 32 {
		t.Fatalf("fill: %+v", fill)
	}
	sum := fill.Stdout
	check := func(vm string) {
		t.Helper()
		if got := memTotalMiB(t, s, ctx, vm); got < grown-16 || got > grown+16 {
			t.Fatalf("%s: MemTotal %d MiB, the grown VM had %d MiB", vm, got, grown)
		}
		if got := s.Exec(ctx, vm, "md5sum < /run/fill/data").Stdout; got != sum {
			t.Fatalf("%s: memory contents changed: %q, want %q", vm, got, sum)
		}
		if v, err := s.Client.GetVM(ctx, vm); err != nil || v.MemoryMiB != 1536 {
			t.Fatalf("%s: record %v %+v", vm, err, v)
		}
	}

	// suspend and wake
	if _, err := s.Client.SuspendVM(ctx, "mem"); err != nil {
		t.Fatal(err)
	}
	check("mem")

	// snapshot and create --from
	if _, err := s.Client.Snapshot(ctx, "mem", "memsnap"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "memcopy", From: "memsnap"}); err != nil {
		t.Fatal(err)
	}
	check("memcopy")
	// the restored machine has the same room: it grows again
	if r, err := s.Client.ResizeVM(ctx, "memcopy", api.ResizeRequest{Memory: 2 << 30}); err != nil || r.MemoryMiB != 2048 || !strings.Contains(r.Op.Message, "grown live") {
		t.Fatalf("grow the restored VM: %v %+v", err, r)
	}
	waitMemTotal(t, s, ctx, "memcopy", grown+500)

	// fork
	res, err := s.Client.Fork(ctx, "mem", 1)
	if err != nil || len(res.Children) != 1 {
		t.Fatalf("fork: %v %+v", err, res)
	}
	check(res.Children[0].Name)
	check("mem")

	// a boot from disk makes the grown memory boot memory
	if _, err := s.Client.StopVM(ctx, "mem"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.StartVM(ctx, "mem"); err != nil {
		t.Fatal(err)
	}
	booted := memTotalMiB(t, s, ctx, "mem")
	if booted < grown-64 {
		t.Fatalf("MemTotal after a boot from disk: %d MiB, the grown VM had %d MiB", booted, grown)
	}
	if r, err := s.Client.ResizeVM(ctx, "mem", api.ResizeRequest{Memory: 2 << 30}); err != nil || r.MemoryMiB != 2048 || !strings.Contains(r.Op.Message, "grown live") {
		t.Fatalf("grow after a boot from disk: %v %+v", err, r)
	}
	waitMemTotal(t, s, ctx, "mem", booted+500)
}
