package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// ResizeOptions are the new sizes; zero keeps a value.
type ResizeOptions struct {
	CPUs      int
	MemoryMiB int64
	DiskBytes int64
}

// ResizeResult says what changed now and what waits for the next start.
type ResizeResult struct {
	VM      *store.VM
	Message string
}

// resize grows a VM. The disk grows online (block_resize, then the guest grows its
// filesystem), vCPUs are hot-added to a running VM up to qemu.MaxCPUs and memory
// is plugged into it up to qemu.HotplugMemoryMiB more than it booted with; other
// CPU and memory changes of a running VM apply at its next start. Shrinking the
// disk is refused.
func (s *Service) resize(ctx context.Context, idOrName string, o ResizeOptions) (*ResizeResult, error) {
	if o.CPUs == 0 && o.MemoryMiB == 0 && o.DiskBytes == 0 {
		return nil, fmt.Errorf("%w: nothing to resize: give cpus, memory or disk", ErrInvalid)
	}
	if o.CPUs < 0 || o.CPUs > MaxCPUs {
		return nil, fmt.Errorf("%w: cpus must be between 1 and %d", ErrInvalid, MaxCPUs)
	}
	if o.MemoryMiB != 0 && o.MemoryMiB < MinMemoryMiB {
		return nil, fmt.Errorf("%w: memory must be at least %d MiB", ErrInvalid, MinMemoryMiB)
	}
	// A suspended or paused VM is woken: its filesystem grows and vCPUs
	// are added online, which needs the guest running.
	if _, err := s.Wake(ctx, idOrName); err != nil {
		return nil, err
	}
	h, err := s.settled(ctx, idOrName, opResize)
	if err != nil {
		return nil, err
	}
	defer h.release()
	v := h.v
	if o.DiskBytes != 0 && o.DiskBytes < v.DiskBytes {
		return nil, fmt.Errorf("%w: shrinking the disk is not supported (it is %d MiB, asked for %d MiB)", ErrInvalid, v.DiskBytes>>20, o.DiskBytes>>20)
	}
	// Everything that can refuse does so before anything changes.
	if mem, disk := max(o.MemoryMiB-v.MemoryMiB, 0), max(o.DiskBytes-v.DiskBytes, 0); mem > 0 || disk > 0 {
		if err := s.admit(mem, disk); err != nil {
			return nil, err
		}
	}
	var msgs []string
	if o.DiskBytes > v.DiskBytes {
		msg, err := h.growDisk(ctx, o.DiskBytes)
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, msg)
	}
	m, err := h.resizeCPUs(ctx, o.CPUs)
	if err != nil {
		return nil, err
	}
	msgs = append(msgs, m...)
	m, err = h.resizeMemory(ctx, o.MemoryMiB)
	if err != nil {
		return nil, err
	}
	msgs = append(msgs, m...)
	if len(msgs) == 0 {
		msgs = append(msgs, "nothing changed")
	}
	s.logEvent(v.ID, "resize: %s", strings.Join(msgs, "; "))
	return &ResizeResult{VM: v, Message: strings.Join(msgs, "; ")}, s.store.UpdateVM(ctx, v)
}

// live reports whether v has a QEMU running its guest (running or paused).
func live(v *store.VM) bool { return v.State == store.StateRunning || v.State == store.StatePaused }

// growDisk grows v's disk to size: online through QEMU and the guest, or
// offline with qemu-img.
func (h *held) growDisk(ctx context.Context, size int64) (string, error) {
	s, v := h.s, h.v
	msg := "disk grown; the filesystem grows at the next start"
	if live(v) {
		in, err := s.attached(v)
		if err != nil {
			return "", err
		}
		if err := in.machine.BlockResize(ctx, size); err != nil {
			return "", fmt.Errorf("grow disk: %w", err)
		}
		msg = "disk grown; the filesystem grows when the VM resumes"
		if v.State == store.StateRunning {
			c, err := in.guestClient(ctx)
			if err == nil {
				err = c.SetIdentity(ctx, guest.Identity{DiskResize: true})
			}
			if err != nil {
				return "", fmt.Errorf("grow the guest filesystem: %w", err)
			}
			msg = "disk and filesystem grown online"
		}
	} else {
		if err := disk.Resize(ctx, s.diskPath(v), size); err != nil {
			return "", fmt.Errorf("grow disk: %w", err)
		}
	}
	v.DiskBytes = size
	return msg, nil
}

// resizeCPUs sets v's vCPU count (0: unchanged): hot-added to a running VM
// when it can be, else recorded for the next start.
func (h *held) resizeCPUs(ctx context.Context, cpus int) ([]string, error) {
	v := h.v
	switch {
	case cpus == 0:
		return nil, nil
	case cpus == v.CPUs && v.NextCPUs != 0: // asking for the current size cancels a pending change
		v.NextCPUs = 0
		return []string{"the pending CPU change is cancelled"}, nil
	case cpus == v.CPUs:
		return nil, nil
	case !live(v):
		v.CPUs, v.NextCPUs = cpus, 0
		return []string{"CPUs set; they apply when the VM starts"}, nil
	case cpus > v.CPUs && v.State == store.StateRunning && cpus <= qemu.MaxCPUsFor(v.Layout, v.CPUs):
		if err := h.growCPUs(ctx, cpus); err != nil {
			return nil, err
		}
		if v.NextCPUs != 0 && v.NextCPUs <= v.CPUs {
			v.NextCPUs = 0
		}
		return []string{fmt.Sprintf("%d vCPUs online now (hot-added)", v.CPUs)}, nil
	}
	v.NextCPUs = cpus
	why := fmt.Sprintf("vCPUs are added live only to a running VM, up to %d", qemu.MaxCPUsFor(v.Layout, v.CPUs))
	switch {
	case cpus < v.CPUs:
		why = "vCPUs are never removed live"
	case v.Layout == qemu.LegacyDeviceSet:
		why = "this VM's machine was started by an earlier agentvm, without room for more vCPUs"
	}
	return []string{"the CPU count applies at the next start (stop and start the VM): " + why}, nil
}

// resizeMemory sets v's memory (0: unchanged): at once for a VM that is not
// running; grown live through the virtio-mem device of a running VM when
// there is room; else at its next start.
func (h *held) resizeMemory(ctx context.Context, mib int64) ([]string, error) {
	v := h.v
	plug, msgs := decideMemory(v, mib)
	if plug == 0 {
		return msgs, nil
	}
	msg, err := h.growMemory(ctx, plug)
	if err != nil {
		return nil, err
	}
	if v.MemoryMiB != mib {
		msg += fmt.Sprintf(" (rounded up to a multiple of %d MiB)", qemu.MemoryBlockMiB)
	}
	return []string{msg}, nil
}

// decideMemory records what needs no QEMU, or returns how much memory the
// virtio-mem device of the running v must have plugged (0: nothing to plug).
func decideMemory(v *store.VM, mib int64) (plug int64, msgs []string) {
	switch {
	case mib == 0:
		return 0, nil
	case mib == v.MemoryMiB && v.NextMemoryMiB != 0:
		v.NextMemoryMiB = 0
		return 0, []string{"the pending memory change is cancelled"}
	case mib == v.MemoryMiB:
		return 0, nil
	case !live(v):
		// The next start boots from disk with all of it as boot memory.
		v.MemoryMiB, v.NextMemoryMiB, v.HotMemoryMiB = mib, 0, 0
		return 0, []string{"memory set; it applies when the VM starts"}
	}
	boot, room := v.MemoryMiB-v.HotMemoryMiB, qemu.MaxHotplugMiB(layoutOf(v))
	plug = (mib - boot + qemu.MemoryBlockMiB - 1) / qemu.MemoryBlockMiB * qemu.MemoryBlockMiB
	if mib > v.MemoryMiB && v.State == store.StateRunning && plug <= room {
		return plug, nil
	}
	v.NextMemoryMiB = mib
	why := fmt.Sprintf("memory is added live only to a running VM, up to %d MiB", boot+room)
	switch {
	case mib < v.MemoryMiB:
		why = "memory is never removed live"
	case room == 0:
		why = "this VM's machine was started by an earlier agentvm, without room for more memory"
	}
	return 0, []string{"the memory size applies at the next start (stop and start the VM): " + why}
}

// growMemoryWait bounds how long a resize waits for the guest to plug the
// memory it was given.
const growMemoryWait = 2 * time.Minute

// growMemory asks the running v's virtio-mem device for plug MiB and waits
// until the guest has plugged them (it onlines them itself:
// memhp_default_state=online). The record follows QEMU as soon as it is
// asked: a later restore starts QEMU with that much plugged.
func (h *held) growMemory(ctx context.Context, plug int64) (string, error) {
	s, v := h.s, h.v
	in, err := s.attached(v)
	if err != nil {
		return "", err
	}
	if err := in.machine.SetPluggedMemory(ctx, plug); err != nil {
		return "", fmt.Errorf("grow memory: %w", err)
	}
	v.MemoryMiB, v.HotMemoryMiB, v.NextMemoryMiB = v.MemoryMiB-v.HotMemoryMiB+plug, plug, 0
	if err := s.store.UpdateVM(ctx, v); err != nil {
		return "", err
	}
	wctx, cancel := context.WithTimeout(ctx, growMemoryWait)
	defer cancel()
	if got, err := in.machine.WaitPlugged(wctx, plug); err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return fmt.Sprintf("memory set to %d MiB, but so far the guest has plugged only %d of the %d MiB added to its boot memory (%v); it plugs the rest when it can",
			v.MemoryMiB, got, plug, err), nil
	}
	return fmt.Sprintf("%d MiB of memory online now (grown live)", v.MemoryMiB), nil
}

// growCPUs hot-adds vCPUs to a running VM and brings them online in the
// guest. The record follows QEMU after every added vCPU: a later restore
// starts QEMU with exactly the vCPUs it had (see qemu.AddCPUs).
func (h *held) growCPUs(ctx context.Context, want int) error {
	s, v := h.s, h.v
	in, err := s.attached(v)
	if err != nil {
		return err
	}
	for v.CPUs < want {
		n, err := in.machine.AddCPUs(ctx, v.CPUs+1)
		if n > v.CPUs {
			v.CPUs = n
			if uerr := s.store.UpdateVM(ctx, v); uerr != nil && err == nil {
				err = uerr
			}
		}
		if err != nil {
			return fmt.Errorf("add vCPUs: %w", err)
		}
	}
	c, err := in.guestClient(ctx)
	if err != nil {
		return fmt.Errorf("bring the new vCPUs online: %w", err)
	}
	// The kernel registers a hot-added CPU asynchronously and leaves it
	// offline (Debian has no auto-online rule): online each one as it shows up.
	script := fmt.Sprintf(`for i in $(seq 300); do
  for f in /sys/devices/system/cpu/cpu[0-9]*/online; do [ "$(cat $f)" = 0 ] && echo 1 > $f 2>/dev/null; done
  [ "$(getconf _NPROCESSORS_ONLN)" -ge %d ] && exit 0
  sleep 0.1
done
echo "only $(getconf _NPROCESSORS_ONLN) of %d vCPUs came online" >&2; exit 1`, want, want)
	var errb strings.Builder
	st, err := c.Run(ctx, guest.ExecRequest{Shell: script, TimeoutMS: 60_000}, nil, io.Discard, &errb)
	if err == nil && st.ExitCode != 0 {
		err = errors.New(strings.TrimSpace(errb.String()))
	}
	if err != nil {
		return fmt.Errorf("bring the new vCPUs online: %w", err)
	}
	return nil
}
