package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/objects"
	"github.com/agentvm/agentvm/internal/store"
)

// Snapshots in the object store (Config.Objects). After a snapshot is
// taken its node stores its files in the background: the memory state
// (and its RAM file), and every file of its disk chain down to the base
// image, whose chunks are shared by every snapshot of that image and sent
// once. The manifest goes last, then the record's stored_at: a snapshot
// is restorable elsewhere only once all of it is stored. Another node that
// is asked to create from it fetches what it lacks into <data dir>/objects
// (the disk chain, re-pointed at the local copies, and the state), and
// restores from there; what it fetched stays as a cache for the next.

// storedState is the manifest of a stored state.
type storedState struct {
	State objects.File  `json:"state"`
	RAM   *objects.File `json:"ram,omitempty"` // the page format's RAM file
	// Chain is the disk chain, base first; its last Layers files are the
	// frozen layers of the VM (the rest are the image or template below).
	Chain  []objects.File `json:"chain"`
	Layers int            `json:"layers"`
}

func snapshotManifest(id string) string { return "snapshots/" + id }

// storeSnapshotLater stores sn in the background, if there is an object
// store; a daemon that stops first stores it when it starts again.
func (s *Service) storeSnapshotLater(sn *store.Snapshot) {
	if s.cfg.Objects == nil {
		return
	}
	s.stash.startUpload(sn.ID, func(ctx context.Context) error { return s.storeSnapshot(ctx, sn) })
}

// errNotStorable: a snapshot or suspended VM that no retry will store (it
// is gone, its files are, or its memory may be torn).
var errNotStorable = errors.New("cannot be stored")

// storeSnapshot sends sn's files, then its manifest, and marks it stored.
func (s *Service) storeSnapshot(ctx context.Context, sn *store.Snapshot) error {
	l := s.snapLock(sn.ID)
	l.RLock()
	defer l.RUnlock()
	if _, err := s.store.GetSnapshot(ctx, sn.ID); errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: it was deleted", errNotStorable)
	} else if err != nil {
		return err
	}
	if mayBeTorn(sn.SavedBy, qemu.BootID(), qemu.StateSynced(sn.State)) {
		return fmt.Errorf("%w: its memory may have been lost in a host crash", errNotStorable)
	}
	if _, err := os.Stat(sn.State); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: its state file is gone: %v", errNotStorable, err)
	}
	start, o := time.Now(), s.cfg.Objects
	m, err := s.stash.put(ctx, sn.Disk, sn.Layers, sn.State)
	if err != nil {
		return err
	}
	sum, err := o.PutManifest(ctx, snapshotManifest(sn.ID), m)
	if err != nil {
		return err
	}
	if err := s.store.SetSnapshotStored(ctx, sn.ID, time.Now().UTC(), sum); errors.Is(err, store.ErrNotFound) {
		o.DeleteManifest(context.WithoutCancel(ctx), snapshotManifest(sn.ID))
		return fmt.Errorf("%w: it was deleted", errNotStorable)
	} else if err != nil {
		return err
	}
	s.log.Info("snapshot stored", "snapshot", sn.ID, "store", o, "bytes", m.bytes(), "ms", time.Since(start).Milliseconds())
	return nil
}

// bytes is the size of the files m names.
func (m *storedState) bytes() int64 {
	n := m.State.Size
	for _, f := range m.Chain {
		n += f.Size
	}
	if m.RAM != nil {
		n += m.RAM.Size
	}
	return n
}

// storeUnstored stores this node's snapshots and suspended VMs that a
// stopped daemon left unstored.
func (s *Service) storeUnstored(ctx context.Context) {
	if s.cfg.Objects == nil {
		return
	}
	snaps, err := s.store.ListSnapshots(ctx)
	if err != nil {
		s.log.Warn("cannot list snapshots to store", "err", err)
		return
	}
	for _, sn := range snaps {
		if sn.Node == s.cfg.Node && sn.StoredAt.IsZero() {
			s.storeSnapshotLater(sn)
		}
	}
	vms, err := s.localVMs(ctx)
	if err != nil {
		return
	}
	for _, v := range vms {
		if v.State == store.StateSuspended && v.StoredManifest == "" {
			s.storeSuspendedLater(v)
		}
	}
}

// fetchSnapshot makes sn's stored files local and returns the frozen top
// layer, the frozen layers and the state path to restore from.
func (s *Service) fetchSnapshot(ctx context.Context, sn *store.Snapshot) (frozen string, layers []string, state string, err error) {
	o := s.cfg.Objects
	if o == nil || sn.StoredAt.IsZero() {
		return "", nil, "", s.snapshotHere(sn)
	}
	release, err := s.stash.turn(ctx, "snapshot "+sn.Name)
	if err != nil {
		return "", nil, "", err
	}
	defer release()
	start := time.Now()
	m, err := s.stash.manifest(ctx, snapshotManifest(sn.ID), sn.StoredManifest, sn.DiskBytes, sn.MemoryMiB)
	if err != nil {
		return "", nil, "", fmt.Errorf("snapshot %s: %w", sn.Name, err)
	}
	frozen, layers, fetched, err := s.stash.fetchChain(ctx, m, sn.DiskBytes, "")
	if err != nil {
		return "", nil, "", fmt.Errorf("%w: snapshot %s: %v", ErrUnavailable, sn.Name, err)
	}
	state = s.stash.statePath(m)
	if !qemu.StateSynced(state) {
		n, err := s.stash.fetchState(ctx, m, state, sn.MemoryMiB)
		if err != nil {
			return "", nil, "", fmt.Errorf("%w: snapshot %s: %v", ErrUnavailable, sn.Name, err)
		}
		fetched += n
	}
	if fetched > 0 {
		s.log.Info("snapshot fetched", "snapshot", sn.ID, "store", s.cfg.Objects, "bytes", fetched, "ms", time.Since(start).Milliseconds())
	} else {
		s.log.Info("snapshot found fetched before", "snapshot", sn.ID)
	}
	return frozen, layers, state, nil
}

// The largest files a manifest may name: a disk chain's qcow2 files hold
// at most the disk and their metadata, a state at most the memory and the
// devices' state.
func diskFileMax(diskBytes int64) int64 { return diskBytes + diskBytes/8 + 256<<20 }
func memFileMax(memMiB int64) int64     { return memMiB<<20 + 256<<20 }

// maxChain bounds a stored disk chain: a VM's frozen layers are flattened
// at disk.MaxLayers, and a template and an image lie below them.
const maxChain = 4 * disk.MaxLayers

// check says what is wrong with a manifest read from the object store, if
// anything, before any of it names a file or a key.
func (m *storedState) check(diskBytes, memMiB int64) error {
	if len(m.Chain) == 0 || len(m.Chain) > maxChain || m.Layers < 1 || m.Layers > len(m.Chain) {
		return fmt.Errorf("%d disk files, %d of them layers", len(m.Chain), m.Layers)
	}
	for _, f := range m.Chain {
		if err := f.Check(diskFileMax(diskBytes)); err != nil {
			return err
		}
	}
	if m.RAM != nil {
		if err := m.RAM.Check(memFileMax(memMiB)); err != nil {
			return err
		}
	}
	return m.State.Check(memFileMax(memMiB))
}

// syncFile flushes a file (or a directory's entries) to the disk.
func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// unstoreSnapshot removes sn's manifest, if it has one (its chunks stay:
// other snapshots may share them).
func (s *Service) unstoreSnapshot(ctx context.Context, sn *store.Snapshot) {
	if s.cfg.Objects == nil {
		return
	}
	if err := s.cfg.Objects.DeleteManifest(ctx, snapshotManifest(sn.ID)); err != nil {
		s.log.Warn("snapshot's manifest not deleted from the object store", "snapshot", sn.ID, "err", err)
	}
}
