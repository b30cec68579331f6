package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// ForkResult is the outcome of a live fork.
type ForkResult struct {
	Parent   *store.VM
	Children []*store.VM
	PausedMs int64 // how long the parent's vCPUs were stopped
	Bytes    int64
	TookMs   int64
}

// ForkOptions are the inputs of a fork.
type ForkOptions struct {
	Count int
	// Name names a child; nil: <parent>-fork-<6 hex digits>.
	Name func() string
}

// forkAttempts bounds how often Fork captures the parent again for the
// children that failed their check.
const forkAttempts = 3

// fork copies a running VM into count new running VMs (memory, processes, disk);
// the parent keeps running. Each child gets its own identity and copy-on-write disk.
// A child that does not come up as a healthy copy of its parent (see held.check)
// is deleted and made again from a new capture of the parent; after forkAttempts
// captures the fork fails and leaves no child behind. The parent is only captured.
func (s *Service) fork(ctx context.Context, idOrName string, fo ForkOptions) (*ForkResult, error) {
	if err := s.fence.check(); err != nil {
		return nil, err
	}
	count := fo.Count
	if count < 1 || count > 32 {
		return nil, fmt.Errorf("%w: count must be between 1 and 32, got %d", ErrInvalid, count)
	}
	parent, err := s.settled(ctx, idOrName, opFork)
	if err != nil {
		return nil, err
	}
	if err := s.admit(parent.v.MemoryMiB*int64(count), 0); err != nil {
		parent.release()
		return nil, err
	}
	start := time.Now()
	out := &ForkResult{Parent: parent.v}
	children := make([]*store.VM, count)
	var errs []error
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			if parent, err = s.relockParent(ctx, out.Parent.ID); err != nil {
				errs = append(errs, err)
				break
			}
			out.Parent = parent.v
		}
		var retry bool
		errs, retry = parent.forkOnce(ctx, children, out, fo.Name)
		if len(errs) == 0 || !retry || attempt == forkAttempts || ctx.Err() != nil {
			break
		}
		s.log.Warn("fork: children failed; capturing the parent again", "vm", out.Parent.ID, "attempt", attempt+1, "err", errors.Join(errs...))
		s.logEvent(out.Parent.ID, "fork: %d of %d children failed (%v); capturing the parent again (attempt %d of %d)",
			len(errs), count, errors.Join(errs...), attempt+1, forkAttempts)
	}
	if err := errors.Join(errs...); err != nil {
		for _, c := range children {
			if c != nil {
				s.Delete(context.Background(), c.ID)
			}
		}
		return nil, fmt.Errorf("fork %s: %w", out.Parent.Name, err)
	}
	out.Children, out.TookMs = children, time.Since(start).Milliseconds()
	return out, nil
}

// forkOnce captures the held parent (releasing it once the capture is taken) and
// restores a checked child into every empty slot of children. It returns the
// errors of the slots it left empty, and whether another capture may fill them.
func (h *held) forkOnce(ctx context.Context, children []*store.VM, out *ForkResult, nameFn func() string) ([]error, bool) {
	s, parent := h.s, h.v
	dir := filepath.Join(s.cfg.DataDir, "snapshots", "fork-"+randHex(6))
	os.MkdirAll(dir, 0o700)
	defer os.RemoveAll(dir) // children have loaded the state when we return
	state := filepath.Join(dir, "state")
	frozen, res, err := h.capture(ctx, state)
	var want *guest.Info
	if err == nil {
		want = h.parentInfo(ctx)
	}
	h.release() // the parent runs on; children only need the state file and frozen layer
	if err != nil {
		return []error{err}, false
	}
	missing := 0
	for _, c := range children {
		if c == nil {
			missing++
		}
	}
	s.log.Info("state saved", "vm", parent.ID, "op", "fork", "format", res.Format, "stream_bytes", res.Bytes, "disk_bytes", qemu.DiskUsage(state), "paused_ms", res.Paused.Milliseconds())
	s.logEvent(parent.ID, "forked x%d: %d MiB of state (%s format), parent paused %d ms", missing, res.Bytes>>20, res.Format, res.Paused.Milliseconds())
	out.PausedMs += res.Paused.Milliseconds()
	out.Bytes = res.Bytes
	errs := make([]error, len(children))
	retry := make([]bool, len(children))
	var wg sync.WaitGroup
	for i := range children {
		if children[i] != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("%s-fork-%s", truncate(parent.Name, 40), randHex(3))
			if nameFn != nil {
				name = nameFn()
			}
			o := CreateOptions{Name: name, CPUs: parent.CPUs,
				MemoryMiB: parent.MemoryMiB, DiskBytes: parent.DiskBytes, Labels: parent.Labels, Env: parent.Env,
				Network: parent.Network, Egress: parent.Egress, Restart: parent.Restart, Image: parent.Image,
				IdleTimeout: time.Duration(parent.IdleTimeoutSec) * time.Second}
			v, _, err := s.insertRow(ctx, o)
			if err != nil {
				errs[i] = err
				return
			}
			child := s.hold(v, s.ops.lock(v.ID, "create"))
			defer child.release()
			t0 := time.Now()
			v.Source, v.Layout, v.HotMemoryMiB = "fork of "+parent.Name, parent.Layout, parent.HotMemoryMiB
			err = child.restoreState(ctx, frozen, parent.Layers, state, parent.DiskBytes)
			if err == nil {
				err = child.check(ctx, want)
			}
			if err != nil {
				s.log.Warn("fork child failed", "vm", v.ID, "parent", parent.ID, "err", err)
				child.destroy(context.Background())
				errs[i], retry[i] = err, true
				return
			}
			if err := child.finishCreate(ctx, t0); err != nil {
				errs[i] = err
				return
			}
			s.mu.Lock()
			hooks := append([]func(string, string){}, s.onFork...)
			s.mu.Unlock()
			for _, fn := range hooks {
				fn(parent.ID, v.ID)
			}
			children[i] = v
		}()
	}
	wg.Wait()
	var failed []error
	again := true
	for i, err := range errs {
		if err != nil {
			failed = append(failed, err)
			again = again && retry[i]
		}
	}
	return failed, again
}

// relockParent takes the parent's lock again for another capture. It waits
// for whoever holds it now (a flatten that the last capture started) instead
// of failing with a conflict, but not forever.
func (s *Service) relockParent(ctx context.Context, id string) (*held, error) {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	unlock, err := s.ops.wait(wctx, id, "fork")
	if err != nil {
		return nil, err
	}
	v, err := s.GetFresh(ctx, id)
	if err == nil {
		err = checkTransition(opFork, v)
	}
	if err != nil {
		unlock()
		return nil, err
	}
	return s.hold(v, unlock), nil
}

// parentInfo asks the parent's agent who its guest is (boot id, kernel taint),
// right after a capture: what every child restored from it must still be.
// nil when the agent does not answer (the children are then not checked).
func (h *held) parentInfo(ctx context.Context) *guest.Info {
	s, parent := h.s, h.v
	in := s.instance(parent.ID)
	if in == nil || parent.State == store.StatePaused {
		// A paused guest's agent cannot answer: waiting for it would hold
		// the parent's lock for the whole timeout.
		return nil
	}
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := in.guestClient(ictx)
	if err == nil {
		var info *guest.Info
		if info, err = c.Info(ictx); err == nil {
			return info
		}
	}
	s.log.Warn("fork: parent agent did not say who its guest is; children are not checked", "vm", parent.ID, "err", err)
	return nil
}

// check makes sure a restored fork child runs its parent's kernel, alive: its
// guest's boot id must be the parent's (a kernel that panicked on the restore
// reboots, and its agent answers again from a fresh boot, every process gone)
// and the kernel must not have oopsed since the parent's state was taken.
// A child that passes has already taken its identity (the handshake and the
// identity push of the launch).
func (h *held) check(ctx context.Context, want *guest.Info) error {
	s, v := h.s, h.v
	if want == nil {
		return nil
	}
	in := s.instance(v.ID)
	if in == nil {
		return fmt.Errorf("%w: fork child %s is not attached", ErrUnavailable, v.Name)
	}
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := in.guestClient(ictx)
	if err != nil {
		return err
	}
	got, err := c.Info(ictx)
	if err != nil {
		return fmt.Errorf("fork child %s: guest info: %w", v.Name, err)
	}
	logf := s.paths(v.ID).Log
	if want.BootID != "" && got.BootID != want.BootID {
		return fmt.Errorf("fork child %s rebooted during its restore (boot id %s, the parent's is %s)%s",
			v.Name, got.BootID, want.BootID, qemu.LogTail(logf))
	}
	if got.Tainted&^want.Tainted&guest.TaintDie != 0 {
		return fmt.Errorf("fork child %s: guest kernel oopsed during the restore (taint %#x)%s", v.Name, got.Tainted, qemu.LogTail(logf))
	}
	return nil
}
