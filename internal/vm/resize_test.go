package vm

import (
	"context"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// The CPU decisions that need no QEMU: what is recorded and what the
// caller is told.
func TestResizeCPUsDecisions(t *testing.T) {
	s := &Service{}
	ctx := context.Background()
	for _, c := range []struct {
		name            string
		vm              store.VM
		cpus            int
		wantCPUs, wantN int
		msg             string
	}{
		{"unchanged", store.VM{State: "running", CPUs: 2}, 0, 2, 0, ""},
		{"stopped: set now", store.VM{State: "stopped", CPUs: 2}, 4, 4, 0, "apply when the VM starts"},
		{"stopped with a pending change: the new count wins", store.VM{State: "stopped", CPUs: 2, NextCPUs: 8}, 4, 4, 0, "apply when the VM starts"},
		{"pending change cancelled", store.VM{State: "running", CPUs: 2, NextCPUs: 4}, 2, 2, 0, "cancelled"},
		{"paused: next start", store.VM{State: "paused", CPUs: 2}, 3, 2, 3, "added live only to a running VM"},
		{"fewer: next start", store.VM{State: "running", CPUs: 4}, 2, 4, 2, "never removed live"},
		{"legacy machine", store.VM{State: "running", CPUs: 1, Layout: qemu.LegacyDeviceSet}, 2, 1, 2, "earlier agentvm"},
	} {
		v := c.vm
		msgs, err := s.resizeCPUs(ctx, &v, c.cpus)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if v.CPUs != c.wantCPUs || v.NextCPUs != c.wantN || !strings.Contains(strings.Join(msgs, ";"), c.msg) || (c.msg == "") != (len(msgs) == 0) {
			t.Errorf("%s: cpus %d next %d msgs %q; want cpus %d next %d and %q", c.name, v.CPUs, v.NextCPUs, msgs, c.wantCPUs, c.wantN, c.msg)
		}
	}
}

func TestResizeMemoryDecisions(t *testing.T) {
	s := &Service{}
	v := store.VM{State: "running", MemoryMiB: 1024, NextMemoryMiB: 2048}
	if msgs := s.resizeMemory(&v, 1024); v.NextMemoryMiB != 0 || len(msgs) != 1 {
		t.Fatalf("cancel: %+v %q", v, msgs)
	}
	v = store.VM{State: "paused", MemoryMiB: 1024}
	if msgs := s.resizeMemory(&v, 512); v.MemoryMiB != 1024 || v.NextMemoryMiB != 512 || len(msgs) != 1 {
		t.Fatalf("live shrink: %+v %q", v, msgs)
	}
	v = store.VM{State: "stopped", MemoryMiB: 1024, NextMemoryMiB: 4096}
	if msgs := s.resizeMemory(&v, 512); v.MemoryMiB != 512 || v.NextMemoryMiB != 0 || len(msgs) != 1 {
		t.Fatalf("offline shrink: %+v %q", v, msgs)
	}
}
