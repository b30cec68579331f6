package qemu

import "context"

// precopyAbortsOnPlugged reports whether a live (precopy) save would abort
// this QEMU: under TCG, QEMU 10.0.2 fails the assertion `block ==
// qemu_get_ram_block(end - 1)` in tlb_reset_dirty_range_all
// (system/physmem.c) during a precopy of a machine with memory plugged
// through its virtio-mem device, in both state formats, while the same
// machine with nothing plugged saves live, and a stopped save (suspend, or
// a snapshot of a paused VM) works plugged or not. Such a machine saves by
// stop-and-copy. A plugged size that cannot be read counts as plugged.
// With KVM that code is not used (it asserts tcg_enabled).
func (m *Machine) precopyAbortsOnPlugged(ctx context.Context) bool {
	if m.cfg.Accel != "tcg" || MaxHotplugMiB(m.cfg.Layout) == 0 {
		return false
	}
	n, err := m.memProperty(ctx, "size")
	return err != nil || n > 0
}
