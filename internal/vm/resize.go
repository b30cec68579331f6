package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"

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

// Resize grows a VM. The disk grows online (block_resize, then the guest grows its
// filesystem), vCPUs are hot-added to a running VM up to qemu.MaxCPUs; other CPU
// changes and memory changes of a running VM apply at its next start. Shrinking
// the disk is refused.
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
	// Asking for the current size cancels a change pending for the next start.
	if o.CPUs != 0 && o.CPUs == v.CPUs && v.NextCPUs != 0 {
		v.NextCPUs = 0
		msgs = append(msgs, "the pending CPU change is cancelled")
	}
	if o.MemoryMiB != 0 && o.MemoryMiB == v.MemoryMiB && v.NextMemoryMiB != 0 {
		v.NextMemoryMiB = 0
		msgs = append(msgs, "the pending memory change is cancelled")
	}
	if (o.CPUs != 0 && o.CPUs != v.CPUs) || (o.MemoryMiB != 0 && o.MemoryMiB != v.MemoryMiB) {
		if o.MemoryMiB != 0 {
			if err := s.admit(o.MemoryMiB-v.MemoryMiB, 0); err != nil && o.MemoryMiB > v.MemoryMiB {
				return nil, err
			}
		}
		if live {
			if o.CPUs > v.CPUs && v.State == "running" && o.CPUs <= qemu.MaxCPUsFor(v.Layout, v.CPUs) {
				if err := s.growCPUs(ctx, v, o.CPUs); err != nil {
					return nil, err
				}
				if v.NextCPUs != 0 && v.NextCPUs <= v.CPUs {
					v.NextCPUs = 0
				}
				msgs = append(msgs, fmt.Sprintf("%d vCPUs online now (hot-added)", v.CPUs))
			} else if o.CPUs != 0 && o.CPUs != v.CPUs {
				v.NextCPUs = o.CPUs
				why := fmt.Sprintf("vCPUs are added live only to a running VM, up to %d", qemu.MaxCPUsFor(v.Layout, v.CPUs))
				switch {
				case o.CPUs < v.CPUs:
					why = "vCPUs are never removed live"
				case v.Layout == qemu.LegacyDeviceSet:
					why = "this VM's machine was started by an earlier agentvm, without room for more vCPUs"
				}
				msgs = append(msgs, "the CPU count applies at the next start (stop and start the VM): "+why)
			}
			if o.MemoryMiB != 0 && o.MemoryMiB != v.MemoryMiB {
				v.NextMemoryMiB = o.MemoryMiB
				msgs = append(msgs, "memory changes apply at the next start (stop and start the VM)")
			}
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

// growCPUs hot-adds vCPUs to a running VM and brings them online in the
// guest. The record follows QEMU after every added vCPU: a later restore
// starts QEMU with exactly the vCPUs it had (see qemu.AddCPUs).
func (s *Service) growCPUs(ctx context.Context, v *store.VM, want int) error {
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
