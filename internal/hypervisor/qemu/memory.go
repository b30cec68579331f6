package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// HotplugMemoryMiB is how much memory a running VM can grow by: every
// machine of DeviceSet has a virtio-mem device of this size on top of its
// boot memory, empty until a resize plugs some of it. Only guest physical
// address space is set aside; the host backs what the guest has plugged.
const HotplugMemoryMiB = 16 << 10

// MemoryBlockMiB is the virtio-mem block size: memory grows in steps of it.
const MemoryBlockMiB = 2

// memDevice is the id of the virtio-mem device (its QOM path is
// /machine/peripheral/<id>).
const memDevice = "vmem0"

// MaxHotplugMiB is how much memory a machine of the given layout
// (Config.Layout) can have plugged: nothing without the virtio-mem device.
func MaxHotplugMiB(layout string) int64 {
	if layout == "" || layout == DeviceSet {
		return HotplugMemoryMiB
	}
	return 0
}

// memorySize is the -m option: the boot memory, and room for the virtio-mem
// device in the layouts that have one.
func (c Config) memorySize() string {
	if n := MaxHotplugMiB(c.Layout); n > 0 {
		return fmt.Sprintf("%dM,maxmem=%dM", c.MemoryMiB, c.MemoryMiB+n)
	}
	return fmt.Sprintf("%dM", c.MemoryMiB)
}

// memoryDeviceArgs adds the virtio-mem device and its memory. The state of
// a VM that grew loads into a machine started with the same device plugged
// as far (PluggedMiB): the size and the block size are checked on load.
func (c Config) memoryDeviceArgs() []string {
	n := MaxHotplugMiB(c.Layout)
	if n == 0 {
		return nil
	}
	backend := fmt.Sprintf("memory-backend-ram,id=%sram,size=%dM", memDevice, n)
	if noReserve() {
		backend += ",reserve=off"
	}
	return []string{
		"-object", backend,
		"-device", fmt.Sprintf("virtio-mem-pci,id=%s,memdev=%sram,node=0,block-size=%dM,requested-size=%dM",
			memDevice, memDevice, MemoryBlockMiB, c.PluggedMiB),
	}
}

// noReserve reports whether the virtio-mem memory can be mapped without
// reserving swap for all of it (not under strict overcommit, where QEMU
// refuses reserve=off).
var noReserve = sync.OnceValue(func() bool {
	b, err := os.ReadFile("/proc/sys/vm/overcommit_memory")
	return err == nil && strings.TrimSpace(string(b)) != "2"
})

// SetPluggedMemory asks the guest to bring the virtio-mem device to mib
// plugged (a multiple of MemoryBlockMiB). The guest's driver plugs the
// memory on its own; WaitPlugged waits for it.
func (m *Machine) SetPluggedMemory(ctx context.Context, mib int64) error {
	_, err := m.qmp.Execute(ctx, "qom-set", map[string]any{
		"path": "/machine/peripheral/" + memDevice, "property": "requested-size", "value": mib << 20})
	return err
}

// memProperty reads a size property of the virtio-mem device, in MiB.
func (m *Machine) memProperty(ctx context.Context, prop string) (int64, error) {
	raw, err := m.qmp.Execute(ctx, "qom-get", map[string]any{"path": "/machine/peripheral/" + memDevice, "property": prop})
	if err != nil {
		return 0, err
	}
	var n uint64
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, fmt.Errorf("qom-get %s: %w", prop, err)
	}
	return int64(n >> 20), nil
}

// RequestedMemory is the size the virtio-mem device was last asked for, in MiB.
func (m *Machine) RequestedMemory(ctx context.Context) (int64, error) {
	return m.memProperty(ctx, "requested-size")
}

// WaitPlugged waits until the guest has plugged mib through the virtio-mem
// device, or ctx ends. It returns the plugged size it saw last.
func (m *Machine) WaitPlugged(ctx context.Context, mib int64) (int64, error) {
	for {
		n, err := m.memProperty(ctx, "size")
		if err != nil || n == mib {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-m.done:
			return n, fmt.Errorf("qemu exited")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
