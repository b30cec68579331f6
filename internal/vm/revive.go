package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

// A lost node's VM without a stored state of its own (it was running or
// paused when its node was lost, or suspended and not yet stored) comes
// back from its newest stored snapshot: the first node asked to act on it
// takes it over (store.ReviveVM: one statement, only while its node is
// lost and the VM unchanged), fetches the snapshot and restores the VM
// from it with its id, name, address and identity. What the VM did after
// that snapshot is gone; its event log says so.

// LastStoredSnapshot is VM id's newest snapshot that is in the object
// store (nil: none).
func (s *Service) LastStoredSnapshot(ctx context.Context, id string) *store.Snapshot {
	snaps, err := s.store.ListSnapshots(ctx)
	if err != nil {
		return nil
	}
	var last *store.Snapshot
	for _, sn := range snaps {
		if sn.VMID == id && !sn.StoredAt.IsZero() && (last == nil || sn.CreatedAt.After(last.CreatedAt)) {
			last = sn
		}
	}
	return last
}

// revivable returns the snapshot v would come back from here: v is a lost
// node's VM with no stored state of its own, and this node can restore
// its newest stored snapshot.
func (s *Service) revivable(ctx context.Context, v *store.VM) *store.Snapshot {
	if s.cfg.Objects == nil || v.Node == "" || v.Node == s.cfg.Node || v.StoredManifest != "" {
		return nil
	}
	switch v.State {
	case store.StateRunning, store.StatePaused, store.StateSuspended, store.StateCrashed:
	default:
		return nil // stopped (its disk is not stored), being made or deleted
	}
	sn := s.LastStoredSnapshot(ctx, v.ID)
	if sn == nil {
		return nil
	}
	if _, err := s.snapshotRestoreLayout(sn); err != nil {
		return nil // another node may restore it
	}
	if lost, err := s.cfg.nodeLost(ctx, v.Node); err != nil || !lost {
		return nil
	}
	return sn
}

// revive takes v, a lost node's VM, over and restores it here from sn
// (revivable). Of concurrent requests, the one that loses the takeover
// gets ErrConflict once the winner is done.
func (s *Service) revive(ctx context.Context, v *store.VM, sn *store.Snapshot) error {
	// The lock is taken before the takeover, so that a request that loses
	// it waits for the restore (GetLocal).
	unlock, err := s.ops.wait(ctx, v.ID, "revive")
	if err != nil {
		return err
	}
	defer unlock()
	from, was := v.Node, v.State
	if err := s.store.ReviveVM(ctx, v.ID, from, s.cfg.Node, string(was)); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return err
	}
	v.Node, v.State, v.PID = s.cfg.Node, store.StateCrashed, 0
	age := time.Since(sn.CreatedAt).Round(time.Second)
	s.log.Info("reviving a lost node's VM from its snapshot", "vm", v.ID, "from", from, "was", was, "snapshot", sn.ID, "age", age)
	s.logEvent(v.ID, "taken over by node %s: node %s was lost while the VM was %s; it comes back from snapshot %s, taken %s ago (what it did since is gone)",
		s.cfg.Node, from, was, sn.Name, age)
	fail := func(err error) error {
		v.Error = "revive from snapshot " + sn.Name + ": " + err.Error()
		if uerr := s.store.UpdateVM(context.WithoutCancel(ctx), v); uerr != nil {
			s.log.Warn("record a failed revive", "vm", v.ID, "err", uerr)
		}
		return err
	}
	layout, err := s.snapshotRestoreLayout(sn)
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	frozen, layers, state, err := s.fetchSnapshot(ctx, sn)
	if err != nil {
		return fail(err)
	}
	// Whatever an earlier stay of the VM here left is stale.
	os.RemoveAll(s.paths(v.ID).Dir)
	v.CPUs, v.MemoryMiB, v.Layout, v.HotMemoryMiB = sn.CPUs, sn.MemoryMiB, layout, sn.HotMemoryMiB
	v.NextCPUs, v.NextMemoryMiB = 0, 0
	v.DiskBytes = max(v.DiskBytes, sn.DiskBytes)
	v.Source, v.Error = "snapshot "+sn.Name, ""
	if err := s.restoreState(ctx, v, frozen, layers, state, sn.DiskBytes); err != nil {
		s.killStrays(v, 0)
		return fail(err)
	}
	if err := s.enter(context.WithoutCancel(ctx), v, store.StateRunning); err != nil {
		if in := s.instance(v.ID); in != nil {
			in.kill()
			s.setInstance(v.ID, nil)
		}
		return fail(err)
	}
	s.log.Info("revived a lost node's VM", "vm", v.ID, "snapshot", sn.ID, "ms", time.Since(start).Milliseconds())
	return nil
}
