package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/objects"
	"github.com/agentvm/agentvm/internal/store"
)

// Suspended VMs in the object store (Config.Objects). After a suspend the
// node stores the VM's state and its whole disk chain in the background,
// holding the VM (a user operation stops the store and goes first), then
// records the manifest's SHA-256 on the VM (store.SetVMStored). Any later
// change of state makes that copy stale: enter clears it and deletes its
// manifest. When the VM's node is lost, the first node asked to act on
// the VM adopts it (store.AdoptVM: one statement, only while its node is
// lost and its stored state unchanged), fetches the state into its own
// data dir (the chain below the VM's writable top shared in
// <data dir>/objects, the top a private layer) and from then on runs it
// as its own: a wake restores it there with its processes and files.

// vmManifest names the manifest of VM id's suspended state of that hash.
func vmManifest(id, sum string) string { return "vms/" + id + "/" + sum[:16] }

// uploadKey is a VM's key in Service.storing (snapshots use their ids).
func uploadKey(vmID string) string { return "vm:" + vmID }

// storeSuspendedLater stores suspended VM v in the background, if there
// is an object store and a cluster to wake it elsewhere.
func (s *Service) storeSuspendedLater(v *store.VM) {
	if s.cfg.Objects == nil || s.cfg.Node == "" {
		return
	}
	s.stash.startUpload(uploadKey(v.ID), func(ctx context.Context) error { return s.storeSuspended(ctx, v.ID) })
}

// thenStore wraps the unlock of an operation that stopped VM id's upload
// (take): once the operation lets go, a VM still suspended and unstored
// here is stored again.
func (s *Service) thenStore(id string, unlock func()) func() {
	if s.cfg.Objects == nil || s.cfg.Node == "" {
		return unlock
	}
	return func() {
		unlock()
		s.storeSuspendedLater(&store.VM{ID: id})
	}
}

// storeSuspended stores VM id's suspended state, holding the VM.
func (s *Service) storeSuspended(ctx context.Context, id string) error {
	unlock, err := s.ops.wait(ctx, id, "store")
	if err != nil {
		return err
	}
	defer unlock()
	v, err := s.store.GetVMFresh(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil // deleted: nothing to store
	} else if err != nil {
		return err
	}
	if v.State != store.StateSuspended || v.Node != s.cfg.Node || v.StoredManifest != "" {
		return nil // it woke, moved or is stored: nothing to do
	}
	return s.storeSuspendedLocked(ctx, v)
}

// storeSuspendedLocked stores suspended VM v, whose lock the caller holds.
func (s *Service) storeSuspendedLocked(ctx context.Context, v *store.VM) error {
	state := s.suspendPath(v.ID)
	if _, err := os.Stat(state); err != nil {
		return fmt.Errorf("%w: its state file: %v", errNotStorable, err)
	}
	if mayBeTorn(v.SavedBy, qemu.BootID(), qemu.StateSynced(state)) {
		return fmt.Errorf("%w: its memory may have been lost in a host crash", errNotStorable)
	}
	start, top := time.Now(), s.diskPath(v)
	m, err := s.stash.put(ctx, top, append(append([]string{}, v.Layers...), top), state)
	if err != nil {
		return err
	}
	name, err := objects.ManifestSum(m)
	if err != nil {
		return err
	}
	sum, err := s.cfg.Objects.PutManifest(ctx, vmManifest(v.ID, name), m)
	if err != nil {
		return err
	}
	// The marker first: a crash between the two leaves a marker naming a
	// manifest the record does not, which is ignored; the other way round
	// would make this node fetch again the state it has.
	if err := os.WriteFile(s.storedMarker(v.ID), []byte(sum), 0o600); err != nil {
		return err
	}
	at := time.Now().UTC()
	if err := s.store.SetVMStored(ctx, v.ID, s.cfg.Node, sum, at); err != nil {
		s.cfg.Objects.DeleteManifest(context.WithoutCancel(ctx), vmManifest(v.ID, sum))
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("%w: %v", errNotStorable, err)
		}
		return err
	}
	v.StoredManifest, v.StoredAt = sum, at
	s.log.Info("suspended VM stored", "vm", v.ID, "store", s.cfg.Objects, "bytes", m.bytes(), "ms", time.Since(start).Milliseconds())
	return nil
}

// unstoreVM deletes the manifest of a stored state that no longer is the
// VM's (it woke, stopped or was deleted).
func (s *Service) unstoreVM(id, sum string) {
	if s.cfg.Objects == nil || sum == "" {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.cfg.Objects.DeleteManifest(ctx, vmManifest(id, sum)); err != nil {
			s.log.Warn("stale stored state not deleted from the object store", "vm", id, "err", err)
		}
	}()
}

// dropStored makes v's stored state no longer v's before v runs again
// here, in one statement only while v is still this node's with that
// state (a node that took v over meanwhile wins: ErrConflict). It returns
// undo, which gives the state back to v (a wake that failed), and done,
// which deletes its manifest (v runs).
func (s *Service) dropStored(ctx context.Context, v *store.VM) (undo, done func(), err error) {
	if v.StoredManifest == "" {
		return func() {}, func() {}, nil
	}
	stored, at := v.StoredManifest, v.StoredAt
	if err := s.store.ClearVMStored(ctx, v.ID, s.cfg.Node, stored); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, nil, fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return nil, nil, err
	}
	v.StoredManifest, v.StoredAt = "", time.Time{}
	undo = func() {
		if err := s.store.SetVMStored(context.Background(), v.ID, s.cfg.Node, stored, at); err == nil {
			v.StoredManifest, v.StoredAt = stored, at
		}
	}
	return undo, func() { s.unstoreVM(v.ID, stored) }, nil
}

// adoptable reports whether v, another node's VM, can be taken over here:
// it is suspended with its state stored, this node can restore that state
// (same QEMU, machine, CPU model and accelerator), and its node is lost.
func (s *Service) adoptable(ctx context.Context, v *store.VM) bool {
	if s.cfg.Objects == nil || v.Node == "" || v.Node == s.cfg.Node || v.State != store.StateSuspended || v.StoredManifest == "" {
		return false
	}
	if s.checkSuspendedState(v) != nil {
		return false // this node could not wake it: leave it to one that can
	}
	lost, err := s.cfg.nodeLost(ctx, v.Node)
	return err == nil && lost
}

// adopt makes v, a lost node's stored suspended VM, this node's.
func (s *Service) adopt(ctx context.Context, v *store.VM) error {
	if err := s.store.AdoptVM(ctx, v.ID, v.Node, s.cfg.Node, v.StoredManifest); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return err
	}
	s.log.Info("adopted a lost node's suspended VM", "vm", v.ID, "from", v.Node, "stored_at", v.StoredAt)
	s.logEvent(v.ID, "moved from lost node %s to node %s; its state stored %s ago comes from the object store", v.Node, s.cfg.Node,
		time.Since(v.StoredAt).Round(time.Second))
	v.Node = s.cfg.Node
	return nil
}

// storedMarker names the file beside a VM's suspend state that holds the
// hash of the stored manifest that state is (written by the store and by
// the fetch): a state file without the VM's current one is stale, say one
// left by an earlier stay of the VM on this node.
func (s *Service) storedMarker(id string) string { return s.suspendPath(id) + ".stored" }

// haveStored reports whether v's state here is its stored state.
func (s *Service) haveStored(v *store.VM) bool {
	b, err := os.ReadFile(s.storedMarker(v.ID))
	if err != nil || string(b) != v.StoredManifest {
		return false
	}
	_, err = os.Stat(s.suspendPath(v.ID))
	return err == nil
}

// fetchSuspended makes an adopted or moved VM's stored state local, if it
// is not: its disk chain and its state file (written last, then the
// marker). It holds the VM, so concurrent requests fetch it once.
func (s *Service) fetchSuspended(ctx context.Context, v *store.VM) error {
	if v.State != store.StateSuspended || v.StoredManifest == "" || s.haveStored(v) {
		return nil
	}
	if s.cfg.Objects == nil {
		return fmt.Errorf("%w: VM %s's state is in the object store, and this node has none (serve --objects)", ErrUnavailable, v.Name)
	}
	unlock, err := s.ops.wait(ctx, v.ID, "fetch")
	if err != nil {
		return err
	}
	defer unlock()
	cur, err := s.store.GetVMFresh(ctx, v.ID)
	if err != nil {
		return err
	}
	if cur.Node != s.cfg.Node || cur.State != store.StateSuspended || cur.StoredManifest == "" || s.haveStored(cur) {
		*v = *cur
		return nil // fetched, woken or moved meanwhile
	}
	*v = *cur
	release, err := s.stash.turn(ctx, "VM "+v.Name)
	if err != nil {
		return err
	}
	defer release()
	start := time.Now()
	m, err := s.stash.manifest(ctx, vmManifest(v.ID, v.StoredManifest), v.StoredManifest, v.DiskBytes, v.MemoryMiB)
	if err != nil {
		return fmt.Errorf("VM %s's stored state: %w", v.Name, err)
	}
	// Whatever an earlier stay of the VM here left is stale.
	os.RemoveAll(s.paths(v.ID).Dir)
	if err := os.MkdirAll(s.paths(v.ID).Dir, 0o700); err != nil {
		return err
	}
	top := s.newLayerPath(v.ID)
	top, layers, fetched, err := s.stash.fetchChain(ctx, m, v.DiskBytes, top)
	if err != nil {
		os.Remove(top)
		return fmt.Errorf("%w: VM %s's stored state: %v", ErrUnavailable, v.Name, err)
	}
	v.Disk, v.Layers = top, layers
	if err := s.store.UpdateVM(ctx, v); err != nil {
		return err
	}
	n, err := s.stash.fetchState(ctx, m, s.suspendPath(v.ID), v.MemoryMiB)
	if err != nil {
		return fmt.Errorf("%w: VM %s's stored state: %v", ErrUnavailable, v.Name, err)
	}
	if err := os.WriteFile(s.storedMarker(v.ID), []byte(v.StoredManifest), 0o600); err != nil {
		return err
	}
	s.log.Info("suspended VM fetched", "vm", v.ID, "store", s.cfg.Objects, "bytes", fetched+n, "ms", time.Since(start).Milliseconds())
	return nil
}

// MoveOut hands VM idOrName to node to (a drain): a running or paused VM
// is suspended, its state stored (now, if it was not), and the record
// moved in one conditional statement; node to fetches and wakes it when
// asked. It returns the VM as it was before (its state tells whether to
// wake it there).
func (s *Service) MoveOut(ctx context.Context, idOrName, to string) (*store.VM, error) {
	if s.cfg.Objects == nil || s.cfg.Node == "" {
		return nil, fmt.Errorf("%w: VMs move between nodes only in a cluster with an object store (serve --cluster --objects)", ErrConflict)
	}
	h, err := s.take(ctx, idOrName, "move")
	if err != nil {
		return nil, err
	}
	defer h.release()
	v := h.v
	before := *v
	switch v.State {
	case store.StateRunning, store.StatePaused:
		if _, err := h.suspend(ctx); err != nil {
			return nil, err
		}
	case store.StateSuspended:
	default:
		return nil, fmt.Errorf("%w: VM %s is %s: only running, paused and suspended VMs move (their memory goes with them)", ErrConflict, v.Name, v.State)
	}
	// A VM that ran and cannot go runs on here.
	stay := func(err error) (*store.VM, error) {
		if before.State == store.StateRunning {
			if werr := h.wake(context.WithoutCancel(ctx)); werr != nil {
				return nil, fmt.Errorf("%w; and its wake here failed too: %v", err, werr)
			}
		}
		return nil, err
	}
	if v.StoredManifest == "" {
		if err := s.storeSuspendedLocked(ctx, v); err != nil {
			return stay(fmt.Errorf("%w: VM %s stays here: storing its state failed: %v", ErrUnavailable, v.Name, err))
		}
	}
	if err := s.store.MoveVM(ctx, v.ID, s.cfg.Node, to, v.StoredManifest); err != nil {
		if errors.Is(err, store.ErrConflict) {
			err = fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return stay(err)
	}
	s.logEvent(v.ID, "moved to node %s (drain of node %s)", to, s.cfg.Node)
	s.log.Info("VM moved to another node", "vm", v.ID, "to", to)
	// Its files here are no one's now: its directory goes, its layers
	// with the next collection.
	os.RemoveAll(s.paths(v.ID).Dir)
	s.gcLayers(ctx)
	return &before, nil
}
