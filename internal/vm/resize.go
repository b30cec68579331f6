package vm

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/agentvm/agentvm/internal/guest"
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

// Resize grows a VM. The disk grows online (block_resize, then the guest grows its
// filesystem). CPU and memory changes of a running VM apply at its next start
// (no hotplug in the pinned machine yet); shrinking is refused.
func (s *Service) Resize(ctx context.Context, idOrName string, o ResizeOptions) (*ResizeResult, error) {
	if o.CPUs == 0 && o.MemoryMiB == 0 && o.DiskBytes == 0 {
		return nil, fmt.Errorf("%w: nothing to resize: give cpus, memory or disk", ErrInvalid)
	}
	if o.CPUs < 0 || o.CPUs > MaxCPUs {
		return nil, fmt.Errorf("%w: cpus must be between 1 and %d", ErrInvalid, MaxCPUs)
	}
	if o.MemoryMiB != 0 && o.MemoryMiB < MinMemoryMiB {
		return nil, fmt.Errorf("%w: memory must be at least %d MiB", ErrInvalid, MinMemoryMiB)
	}
	if _, err := s.Wake(ctx, idOrName); err != nil { // a suspended VM is woken to grow online
		return nil, err
	}
	v, unlock, err := s.settled(ctx, idOrName, "resize")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if o.DiskBytes != 0 && o.DiskBytes < v.DiskBytes {
		return nil, fmt.Errorf("%w: shrinking the disk is not supported (it is %d MiB, asked for %d MiB)", ErrInvalid, v.DiskBytes>>20, o.DiskBytes>>20)
	}
	live := v.State == "running" || v.State == "paused"
	var msgs []string
	if o.DiskBytes > v.DiskBytes {
		if err := s.admit(0, o.DiskBytes-v.DiskBytes); err != nil {
			return nil, err
		}
		if live {
			in, err := s.attached(v)
			if err != nil {
				return nil, err
			}
			if err := in.machine.BlockResize(ctx, o.DiskBytes); err != nil {
				return nil, fmt.Errorf("grow disk: %w", err)
			}
			if v.State == "paused" {
				msgs = append(msgs, "disk grown; the filesystem grows when the VM resumes")
			} else {
				c, err := in.guestClient(ctx)
				if err == nil {
					err = c.SetIdentity(ctx, guest.Identity{DiskResize: true})
				}
				if err != nil {
					return nil, fmt.Errorf("grow the guest filesystem: %w", err)
				}
				msgs = append(msgs, "disk and filesystem grown online")
			}
		} else {
			out, err := exec.CommandContext(ctx, "qemu-img", "resize", "-q", s.diskPath(v), fmt.Sprint(o.DiskBytes)).CombinedOutput()
			if err != nil {
				return nil, fmt.Errorf("grow disk: %v: %s", err, strings.TrimSpace(string(out)))
			}
			msgs = append(msgs, "disk grown; the filesystem grows at the next start")
		}
		v.DiskBytes = o.DiskBytes
	}
	if (o.CPUs != 0 && o.CPUs != v.CPUs) || (o.MemoryMiB != 0 && o.MemoryMiB != v.MemoryMiB) {
		if o.MemoryMiB != 0 {
			if err := s.admit(o.MemoryMiB-v.MemoryMiB, 0); err != nil && o.MemoryMiB > v.MemoryMiB {
				return nil, err
			}
		}
		if live {
			if o.CPUs != 0 {
				v.NextCPUs = o.CPUs
			}
			if o.MemoryMiB != 0 {
				v.NextMemoryMiB = o.MemoryMiB
			}
			msgs = append(msgs, "CPU and memory changes apply at the next start (stop and start the VM)")
		} else {
			if o.CPUs != 0 {
				v.CPUs = o.CPUs
			}
			if o.MemoryMiB != 0 {
				v.MemoryMiB = o.MemoryMiB
			}
			msgs = append(msgs, "CPUs and memory set; they apply when the VM starts")
		}
	}
	if len(msgs) == 0 {
		msgs = append(msgs, "nothing changed")
	}
	s.logEvent(v.ID, "resize: %s", strings.Join(msgs, "; "))
	return &ResizeResult{VM: v, Message: strings.Join(msgs, "; ")}, s.store.UpdateVM(ctx, v)
}
