package e2b

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// A sandbox's life: what its timeout does (expire), and the wakes that
// move its end (connect, AutoResume). They take the sandbox's life lock,
// so that the timeout loop never pauses a sandbox a wake has just given
// a new end, and concurrent requests share one wake.

// resumeRetry is how long a failed auto-resume is not tried again: a
// request anyone may send must not make the daemon retry a wake that
// cannot work (no memory, a lost state) on every request.
const resumeRetry = 30 * time.Second

type lives struct {
	mu     sync.Mutex
	locks  map[string]*sync.Mutex // by VM id
	failed map[string]time.Time   // VM id -> when its last auto-resume failed
}

// lock takes sandbox vmID's life lock.
func (l *lives) lock(vmID string) func() {
	l.mu.Lock()
	if l.locks == nil {
		l.locks, l.failed = map[string]*sync.Mutex{}, map[string]time.Time{}
	}
	m := l.locks[vmID]
	if m == nil {
		m = &sync.Mutex{}
		l.locks[vmID] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// forget drops a deleted sandbox's entries.
func (l *lives) forget(vmID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.locks, vmID)
	delete(l.failed, vmID)
}

// failedRecently reports whether vmID's auto-resume failed within
// resumeRetry; fail records a failure and reports whether it is news.
func (l *lives) failedRecently(vmID string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.failed[vmID]
	return ok && time.Since(t) < resumeRetry
}

func (l *lives) fail(vmID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed == nil {
		l.failed = map[string]time.Time{}
	}
	l.failed[vmID] = time.Now()
}

// extendEnd gives sandbox sb at least d more from now: an end only ever
// moves later here (a shorter one is the admin's, through setTimeout),
// and a sandbox without one keeps none.
func (s *Server) extendEnd(ctx context.Context, sb *store.Sandbox, d time.Duration) error {
	end := time.Now().Add(d)
	if d <= 0 || sb.EndAt.IsZero() || !end.After(sb.EndAt) {
		return nil
	}
	if err := s.cfg.Store.SetSandboxEnd(ctx, sb.VMID, end); err != nil {
		return err
	}
	sb.EndAt = end
	return nil
}

// pausing reports whether sb's timeout is pausing it: E2B's answers call
// such a sandbox paused at once, so its envd and ports are not reached
// either, though the suspend may still be under way.
func pausing(sb *store.Sandbox) bool {
	return sb.AutoPause && !sb.EndAt.IsZero() && time.Now().After(sb.EndAt)
}

// Reach returns sandbox v ready to serve a request to it (its envd or a
// port), or false when the sandbox is paused, or being paused by its
// timeout, and was not created with autoResume: then only connect resumes
// it. With autoResume the request wakes it, as E2B's proxy does, and it
// runs for at least its timeout again. Anyone who may send the request
// may wake it, as its ports are public; a wake that failed is not tried
// again for resumeRetry.
func (s *Server) Reach(ctx context.Context, v *store.VM) (*store.VM, bool) {
	sb, err := s.cfg.Store.GetSandbox(ctx, v.ID)
	if err != nil {
		return v, v.State == store.StateRunning
	}
	if v.State == store.StateRunning && !pausing(sb) {
		return v, true
	}
	switch {
	case !sb.AutoResume || s.lives.failedRecently(v.ID):
		return v, false
	case v.State != store.StateRunning && v.State != store.StateSuspended && v.State != store.StatePaused:
		return v, false
	}
	defer s.lives.lock(v.ID)()
	cur, err := s.cfg.VMs.GetFresh(ctx, v.ID)
	if err != nil {
		return v, false
	}
	if sb, err = s.cfg.Store.GetSandboxFresh(ctx, v.ID); err != nil {
		return v, false
	}
	switch cur.State {
	case store.StateRunning:
		// Woken by another request meanwhile, or its timeout has not
		// paused it yet: it is resumed as it stands.
		if pausing(sb) {
			s.extendEnd(ctx, sb, sb.Timeout)
		}
		return cur, true
	case store.StateSuspended, store.StatePaused:
	default:
		return cur, false
	}
	// The wake outlives a client that gives up waiting: the next one
	// finds the sandbox running.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(vm.WithActor(ctx, "e2b auto-resume")), 3*time.Minute)
	defer cancel()
	woke, err := s.cfg.VMs.Wake(wctx, v.ID)
	if err != nil || woke.State != store.StateRunning {
		s.lives.fail(v.ID)
		s.log.Warn("e2b: auto-resume failed; not tried again for "+resumeRetry.String(), "vm", v.ID, "err", err)
		return v, false
	}
	// Its timeout counts from now (the lock keeps the timeout loop off
	// until the new end is written).
	s.extendEnd(wctx, sb, sb.Timeout)
	return woke, true
}

// expire applies sandbox sb's timeout, which had passed when the loop
// listed it: it is deleted, or paused with autoPause (suspended, or
// stopped when the pause is filesystem-only). A paused or stopped sandbox
// does not time out: it keeps its end, which the wake that resumes it
// moves.
func (s *Server) expire(ctx context.Context, sb *store.Sandbox) {
	defer s.lives.lock(sb.VMID)()
	v, err := s.cfg.VMs.GetFresh(ctx, sb.VMID)
	if errors.Is(err, vm.ErrNotFound) {
		s.cfg.Store.DeleteSandbox(ctx, sb.VMID) // its VM is gone
		return
	} else if err != nil {
		return // the next tick tries again
	}
	// The list may be old by now: a wake may have given it a new end.
	if sb, err = s.cfg.Store.GetSandboxFresh(ctx, sb.VMID); err != nil || sb.EndAt.IsZero() || sb.EndAt.After(time.Now()) {
		return
	}
	switch {
	case v.State == store.StateSuspended || v.State == store.StatePaused || v.State == store.StateStopped:
		return
	case sb.AutoPause && v.State != store.StateRunning:
		return // crashed, or busy: the next tick sees
	}
	ctx = vm.WithActor(ctx, "e2b timeout")
	switch {
	case sb.AutoPause && sb.PauseDisk:
		// Filesystem-only: agentvm's stop; connect boots it from its disk.
		if _, err := s.cfg.VMs.Stop(ctx, sb.VMID); err != nil {
			s.log.Warn("e2b: filesystem-only auto-pause at timeout failed", "vm", sb.VMID, "err", err)
		}
	case sb.AutoPause:
		if _, err := s.cfg.VMs.Suspend(ctx, sb.VMID); err != nil {
			s.log.Warn("e2b: auto-pause at timeout failed", "vm", sb.VMID, "err", err)
		}
	default:
		if err := s.cfg.VMs.Delete(ctx, sb.VMID); err != nil {
			s.log.Warn("e2b: delete at timeout failed", "vm", sb.VMID, "err", err)
		}
	}
}
