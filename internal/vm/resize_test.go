package vm

import (
	"context"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/image"
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
		msgs, err := s.hold(&v, func() {}).resizeCPUs(ctx, c.cpus)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if v.CPUs != c.wantCPUs || v.NextCPUs != c.wantN || !strings.Contains(strings.Join(msgs, ";"), c.msg) || (c.msg == "") != (len(msgs) == 0) {
			t.Errorf("%s: cpus %d next %d msgs %q; want cpus %d next %d and %q", c.name, v.CPUs, v.NextCPUs, msgs, c.wantCPUs, c.wantN, c.msg)
		}
	}
}

// The memory decisions that need no QEMU: what is recorded, what is left
// for the next start, and how much the virtio-mem device must plug.
func TestResizeMemoryDecisions(t *testing.T) {
	ds3 := qemu.DeviceSet
	for _, c := range []struct {
		name                   string
		vm                     store.VM
		mib                    int64
		wantMem, wantNext, hot int64 // the record after the decision
		plug                   int64
		msg                    string
	}{
		{"unchanged", store.VM{State: "running", MemoryMiB: 1024, Layout: ds3}, 0, 1024, 0, 0, 0, ""},
		{"pending change cancelled", store.VM{State: "running", MemoryMiB: 1024, NextMemoryMiB: 2048, Layout: ds3}, 1024, 1024, 0, 0, 0, "cancelled"},
		{"running: grown live", store.VM{State: "running", MemoryMiB: 1024, Layout: ds3}, 4096, 1024, 0, 0, 3072, ""},
		{"grown before: plug counts from the boot memory", store.VM{State: "running", MemoryMiB: 2048, HotMemoryMiB: 1024, Layout: ds3}, 4096, 2048, 0, 1024, 3072, ""},
		{"odd size: a whole block", store.VM{State: "running", MemoryMiB: 1024, Layout: ds3}, 1025, 1024, 0, 0, 2, ""},
		{"up to the device", store.VM{State: "running", MemoryMiB: 1024, Layout: ds3}, 1024 + qemu.HotplugMemoryMiB, 1024, 0, 0, qemu.HotplugMemoryMiB, ""},
		{"beyond the device: next start", store.VM{State: "running", MemoryMiB: 1024, Layout: ds3}, 1026 + qemu.HotplugMemoryMiB, 1024, 1026 + qemu.HotplugMemoryMiB, 0, 0, "up to 17408 MiB"},
		{"shrink while running: next start", store.VM{State: "running", MemoryMiB: 2048, HotMemoryMiB: 1024, Layout: ds3}, 1024, 2048, 1024, 1024, 0, "never removed live"},
		{"paused: next start", store.VM{State: "paused", MemoryMiB: 1024, Layout: ds3}, 2048, 1024, 2048, 0, 0, "only to a running VM"},
		{"machine of an earlier agentvm", store.VM{State: "running", MemoryMiB: 1024}, 2048, 1024, 2048, 0, 0, "earlier agentvm"},
		{"legacy machine", store.VM{State: "running", MemoryMiB: 1024, Layout: qemu.LegacyDeviceSet}, 2048, 1024, 2048, 0, 0, "earlier agentvm"},
		{"stopped: set now, all boot memory", store.VM{State: "stopped", MemoryMiB: 2048, HotMemoryMiB: 1024, NextMemoryMiB: 4096, Layout: ds3}, 512, 512, 0, 0, 0, "applies when the VM starts"},
	} {
		v := c.vm
		plug, msgs := decideMemory(&v, c.mib)
		if v.MemoryMiB != c.wantMem || v.NextMemoryMiB != c.wantNext || v.HotMemoryMiB != c.hot || plug != c.plug ||
			!strings.Contains(strings.Join(msgs, ";"), c.msg) || (c.msg == "") != (len(msgs) == 0) {
			t.Errorf("%s: memory %d next %d hot %d plug %d msgs %q; want %d %d %d %d and %q",
				c.name, v.MemoryMiB, v.NextMemoryMiB, v.HotMemoryMiB, plug, msgs, c.wantMem, c.wantNext, c.hot, c.plug, c.msg)
		}
	}
}

// A VM's device set and memory reach QEMU's command line: records without
// a layout are from before virtio-mem, and a grown VM restores with its
// boot memory as RAM and the rest plugged.
func TestMachineConfigLayoutAndMemory(t *testing.T) {
	s := &Service{cfg: Config{Accel: "tcg"}}
	for _, c := range []struct {
		vm         store.VM
		layout     string
		boot, plug int64
	}{
		{store.VM{MemoryMiB: 1024}, qemu.CPUHotplugDeviceSet, 1024, 0},
		{store.VM{MemoryMiB: 1024, Layout: qemu.LegacyDeviceSet}, qemu.LegacyDeviceSet, 1024, 0},
		{store.VM{MemoryMiB: 4096, HotMemoryMiB: 3072, Layout: qemu.DeviceSet}, qemu.DeviceSet, 1024, 3072},
	} {
		mc := s.machineConfig(&c.vm, paths{}, &image.Image{})
		if mc.Layout != c.layout || mc.MemoryMiB != c.boot || mc.PluggedMiB != c.plug {
			t.Errorf("%+v: layout %q memory %d plugged %d", c.vm, mc.Layout, mc.MemoryMiB, mc.PluggedMiB)
		}
	}
	// snapshots name their device set through their key
	for _, ds := range []string{qemu.DeviceSet, qemu.CPUHotplugDeviceSet, qemu.LegacyDeviceSet} {
		sn := &store.Snapshot{CPUs: 2, MemoryMiB: 1024, Key: s.shapeKeyFor(ds, 2, 1024)}
		if got := s.snapshotLayout(sn); got != ds {
			t.Errorf("snapshot of %s: layout %q", ds, got)
		}
	}
	if got := s.snapshotLayout(&store.Snapshot{CPUs: 2, MemoryMiB: 1024, Key: "other"}); got != "" {
		t.Errorf("foreign snapshot: layout %q", got)
	}
}
