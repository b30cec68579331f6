package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
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
	sn, err := s.store.LastStoredSnapshot(ctx, id)
	if err != nil {
		return nil
	}
	return sn
}

// revivable returns the snapshot v would come back from here: v is a lost
// node's VM with no stored state of its own, and this node can restore
// its newest stored snapshot.
func (s *Service) revivable(ctx context.Context, v *store.VM) *store.Snapshot {
	if s.cfg.Objects == nil || v.Node == "" || v.Node == s.cfg.Node || v.StoredManifest != "" {
		return nil
	}
	if !Revivable(v.State) {
		return nil
	}
	if lost, err := s.cfg.nodeLost(ctx, v.Node); err != nil || !lost {
		return nil
	}
	sn := s.LastStoredSnapshot(ctx, v.ID)
	if sn == nil {
		return nil
	}
	if _, err := s.snapshotRestoreLayout(sn); err != nil {
		return nil // another node may restore it
	}
	return sn
}

// Revivable reports whether a lost node's VM in state st (without a stored
// state of its own) comes back from its newest stored snapshot: it was
// running or paused, or suspended (and its state not yet stored). A
// stopped or crashed VM stays as it was; one being made or deleted too.
func Revivable(st store.State) bool {
	return slices.Contains(takeovers[opRevive].from, st)
}

// revive takes v, a lost node's VM, over and restores it here from sn
// (revivable). Of concurrent requests, the one that loses the takeover
// gets ErrConflict once the winner is done.
func (s *Service) revive(ctx context.Context, v *store.VM, sn *store.Snapshot) error {
	// The lock is taken before the takeover, so that a request that loses
	// it waits for the restore (GetLocal).
	unlock, err := s.ops.wait(ctx, v.ID, opRevive)
	if err != nil {
		return err
	}
	defer unlock()
	h := s.hold(v, unlock)
	from, was := v.Node, v.State
	if err := checkTakeover(opRevive, was, store.StateCrashed); err != nil {
		s.log.Error("revive", "vm", v.ID, "err", err)
		return err
	}
	if err := s.store.ReviveVM(ctx, v.ID, from, s.cfg.Node, string(was)); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return err
	}
	before := *v
	v.Node, v.State, v.PID = s.cfg.Node, store.StateCrashed, 0
	age := time.Since(sn.CreatedAt).Round(time.Second)
	s.log.Info("reviving a lost node's VM from its snapshot", "vm", v.ID, "from", from, "was", was, "snapshot", sn.ID, "age", age)
	// The fetch and restore go on if the caller leaves: a VM half-way
	// would be of no node that could finish it.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Minute)
	defer cancel()
	// A revive that fails gives the VM back to its lost node as it was,
	// for the next request (here or on another node) to try again.
	fail := func(err error) error {
		h.kill()
		s.killOwnQEMUs(v)
		os.RemoveAll(s.paths(v.ID).Dir)
		if gerr := checkTakeover(opGiveBack, store.StateCrashed, before.State); gerr != nil {
			s.log.Error("revive", "vm", v.ID, "err", gerr)
		} else if gerr := s.store.GiveBackVM(rctx, &before, s.cfg.Node); gerr != nil {
			s.log.Warn("give a VM whose revive failed back to its lost node", "vm", v.ID, "err", gerr)
		}
		*v = before
		s.log.Warn("revive from a snapshot failed", "vm", v.ID, "snapshot", sn.ID, "err", err)
		return fmt.Errorf("VM %s (its node %s is lost) could not be restored from snapshot %s: %w", v.Name, from, sn.Name, err)
	}
	layout, err := s.snapshotRestoreLayout(sn)
	if err != nil {
		return fail(err)
	}
	start := time.Now()
	frozen, layers, state, err := s.fetchSnapshot(rctx, sn)
	if err != nil {
		return fail(err)
	}
	// Whatever an earlier stay of the VM here left is stale.
	os.RemoveAll(s.paths(v.ID).Dir)
	// The VM takes the snapshot's shape; a size it had grown to since
	// comes back at its next start.
	if v.CPUs > sn.CPUs {
		v.NextCPUs = max(v.NextCPUs, v.CPUs)
	}
	if v.MemoryMiB > sn.MemoryMiB {
		v.NextMemoryMiB = max(v.NextMemoryMiB, v.MemoryMiB)
	}
	v.CPUs, v.MemoryMiB, v.Layout, v.HotMemoryMiB = sn.CPUs, sn.MemoryMiB, layout, sn.HotMemoryMiB
	v.DiskBytes = max(v.DiskBytes, sn.DiskBytes)
	v.SavedBy, v.ResumeOnStart, v.ColdBoot = nil, false, false
	v.Source, v.Error = "snapshot "+sn.Name, ""
	if err := h.restoreState(rctx, frozen, layers, state, sn.DiskBytes); err != nil {
		return fail(err)
	}
	if err := h.enter(rctx, store.StateRunning); err != nil {
		return fail(err)
	}
	s.logEvent(v.ID, "taken over by node %s: node %s was lost while the VM was %s; it came back from snapshot %s, taken %s ago (what it did since is gone)",
		s.cfg.Node, from, was, sn.Name, age)
	s.Event(v.ID, "revive", "node "+s.cfg.Node, "node %s was lost while the VM was %s: it came back on node %s from snapshot %s, taken %s ago (what it did since is gone)",
		from, was, s.cfg.Node, sn.Name, age)
	s.log.Info("revived a lost node's VM", "vm", v.ID, "snapshot", sn.ID, "ms", time.Since(start).Milliseconds())
	return nil
}
