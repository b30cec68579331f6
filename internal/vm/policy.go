package vm

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

// Restart policies.
const (
	RestartNever     = "never"
	RestartOnFailure = "on-failure"
	RestartAlways    = "always"
)

// ValidRestart reports whether r is a restart policy ("" = never).
func ValidRestart(r string) bool {
	return r == "" || r == RestartNever || r == RestartOnFailure || r == RestartAlways
}

// activity tracks, per VM, the last time anyone used it and how many
// long-lived uses (terminals, streams, SSH sessions, proxied requests) are
// open right now: an open one counts as activity all along. The Service
// embeds it: Touch and Hold are its API, for the front doors.
type activity struct {
	started time.Time // the daemon's start: no VM was used before it

	mu   sync.Mutex
	last map[string]time.Time
	open map[string]int
	// restarts: recent policy restarts per VM, for the back-off.
	restarts map[string][]time.Time
}

// Touch records activity on a VM now.
func (a *activity) Touch(id string) {
	a.mu.Lock()
	if a.last == nil {
		a.last = map[string]time.Time{}
	}
	a.last[id] = time.Now()
	a.mu.Unlock()
}

// Hold marks a long-lived use of a VM until the returned func is called.
func (a *activity) Hold(id string) func() {
	a.mu.Lock()
	if a.open == nil {
		a.open = map[string]int{}
	}
	a.open[id]++
	a.mu.Unlock()
	a.Touch(id)
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			a.open[id]--
			if a.open[id] <= 0 {
				delete(a.open, id)
			}
			a.mu.Unlock()
			a.Touch(id)
		})
	}
}

// idleFor is how long a VM has had no activity (0 while something is open).
func (a *activity) idleFor(v *store.VM) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.open[v.ID] > 0 {
		return 0
	}
	last, ok := a.last[v.ID]
	if !ok {
		// nothing since the daemon started: count from its start or the VM's
		last = a.started
		if v.StartedAt != nil && v.StartedAt.After(last) {
			last = *v.StartedAt
		}
	}
	return time.Since(last)
}

// RunPolicies applies idle timeouts and delete-after deadlines until ctx
// ends, checking every interval.
func (s *Service) RunPolicies(ctx context.Context, interval time.Duration) {
	every(ctx, interval, s.applyPolicies)
}

// policyOpTimeout bounds one policy action, so a VM whose suspend or delete
// waits on a stuck operation does not hold back the policies of the others.
const policyOpTimeout = 2 * time.Minute

func (s *Service) applyPolicies(ctx context.Context) {
	if s.fence.why() != "" {
		return
	}
	vms, err := s.localVMs(ctx)
	if err != nil {
		return
	}
	for _, v := range vms {
		if v.State == statePool {
			continue
		}
		octx, cancel := context.WithTimeout(ctx, policyOpTimeout)
		s.applyPolicy(octx, v)
		cancel()
	}
}

func (s *Service) applyPolicy(ctx context.Context, v *store.VM) {
	if v.DeleteAfterSec > 0 && time.Since(v.CreatedAt) > time.Duration(v.DeleteAfterSec)*time.Second {
		s.Event(v.ID, "policy", ActorSystem, "delete-after %s reached: deleting", time.Duration(v.DeleteAfterSec)*time.Second)
		if err := s.Delete(ctx, v.ID); err != nil {
			s.log.Warn("delete-after", "vm", v.ID, "err", err)
		}
		return
	}
	if v.IdleTimeoutSec <= 0 || (v.State != store.StateRunning && v.State != store.StatePaused) {
		return
	}
	idle := s.idleFor(v)
	if idle <= time.Duration(v.IdleTimeoutSec)*time.Second {
		return
	}
	if _, err := s.Suspend(ctx, v.ID); err != nil {
		s.log.Info("idle suspend skipped", "vm", v.ID, "err", err)
		return
	}
	s.Event(v.ID, "lifecycle", ActorIdlePolicy, "suspended after %s without activity", idle.Round(time.Second))
}

// every runs fn every interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn(ctx)
		}
	}
}

// SetPolicy changes a VM's idle timeout, delete-after and restart policy
// (nil leaves one unchanged).
func (s *Service) SetPolicy(ctx context.Context, idOrName string, idle, deleteAfter *time.Duration, restart *string) (*store.VM, error) {
	if restart != nil && !ValidRestart(*restart) {
		return nil, fmt.Errorf("%w: restart policy must be never, on-failure or always, got %q", ErrInvalid, *restart)
	}
	for _, d := range []*time.Duration{idle, deleteAfter} {
		if d != nil && *d < 0 {
			return nil, fmt.Errorf("%w: durations must not be negative", ErrInvalid)
		}
	}
	v, err := s.GetLocal(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	unlock := s.ops.lock(v.ID, "policy")
	defer unlock()
	if v, err = s.store.GetVMFresh(ctx, v.ID); err != nil {
		return nil, err
	}
	if idle != nil {
		v.IdleTimeoutSec = int64(idle.Seconds())
	}
	if deleteAfter != nil {
		v.DeleteAfterSec = int64(deleteAfter.Seconds())
	}
	if restart != nil {
		v.Restart = *restart
	}
	return v, s.store.UpdateVM(ctx, v)
}

// restartBackoff is how long to wait before the next policy restart of a
// VM that restarted n times in the last 10 minutes: 0, 2 s, 4 s ... 5 min.
func restartBackoff(n int) time.Duration {
	if n == 0 {
		return 0
	}
	d := time.Second << min(n, 9)
	return min(d, 5*time.Minute)
}

// restartAfter is how long the restart policy waits before it restarts VM
// id now (restartBackoff), and how many restarts it made in the last 10
// minutes before this one.
func (a *activity) restartAfter(id string) (time.Duration, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.restarts == nil {
		a.restarts = map[string][]time.Time{}
	}
	var recent []time.Time
	for _, t := range a.restarts[id] {
		if time.Since(t) < 10*time.Minute {
			recent = append(recent, t)
		}
	}
	wait := restartBackoff(len(recent))
	a.restarts[id] = append(recent, time.Now().Add(wait))
	return wait, len(recent)
}

// maybeRestart restarts a VM whose QEMU died, per its restart policy.
func (s *Service) maybeRestart(v *store.VM, crashed bool, reason string) {
	switch {
	case v.Restart == RestartAlways:
	case v.Restart == RestartOnFailure && crashed:
	default:
		return
	}
	wait, recent := s.activity.restartAfter(v.ID)
	s.Event(v.ID, "lifecycle", ActorRestartPolicy, "restart policy %s: restarting in %s (%s; %d restarts in the last 10 min)", v.Restart, wait, reason, recent)
	go func() {
		time.Sleep(wait)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cur, err := s.store.GetVMFresh(ctx, v.ID)
		if err != nil || (cur.State != store.StateCrashed && cur.State != store.StateStopped) {
			return // deleted or started by someone meanwhile
		}
		if _, err := s.Start(ctx, v.ID); err != nil {
			s.Event(v.ID, "lifecycle", ActorRestartPolicy, "restart failed: %v", err)
			return
		}
		s.Event(v.ID, "lifecycle", ActorRestartPolicy, "restarted from its disk")
	}()
}
