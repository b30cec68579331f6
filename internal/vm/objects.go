package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
	s.uploads.Add(1)
	go func() {
		defer s.uploads.Done()
		for try := 0; ; try++ {
			err := s.storeSnapshot(s.bg, sn)
			if err == nil || errors.Is(err, ErrNotFound) || s.bg.Err() != nil {
				return
			}
			wait := min(time.Duration(1<<min(try, 6))*time.Second, time.Minute)
			s.log.Warn("snapshot not stored in the object store; retrying", "snapshot", sn.ID, "store", s.cfg.Objects, "err", err, "retry_in", wait)
			select {
			case <-time.After(wait):
			case <-s.bg.Done():
				return
			}
		}
	}()
}

// storeSnapshot sends sn's files, then its manifest, and marks it stored.
func (s *Service) storeSnapshot(ctx context.Context, sn *store.Snapshot) error {
	l := s.snapLock(sn.ID)
	l.RLock()
	defer l.RUnlock()
	if _, err := s.store.GetSnapshot(ctx, sn.ID); err != nil {
		return ErrNotFound // deleted meanwhile
	}
	if mayBeTorn(sn.SavedBy, qemu.BootID(), qemu.StateSynced(sn.State)) {
		s.log.Warn("snapshot not stored: its memory may have been lost in a host crash", "snapshot", sn.ID)
		return ErrNotFound
	}
	start := time.Now()
	o := s.cfg.Objects
	var m storedState
	chain, err := disk.Chain(ctx, sn.Disk)
	if err != nil {
		return err
	}
	slices.Reverse(chain)
	for _, p := range chain {
		f, err := o.PutFile(ctx, p)
		if err != nil {
			return err
		}
		m.Chain = append(m.Chain, f)
		if slices.Contains(sn.Layers, p) || p == sn.Disk {
			m.Layers++
		}
	}
	if m.State, err = o.PutFile(ctx, sn.State); err != nil {
		return err
	}
	if _, err := os.Stat(sn.State + qemu.RAMSuffix); err == nil {
		ram, err := o.PutFile(ctx, sn.State+qemu.RAMSuffix)
		if err != nil {
			return err
		}
		m.RAM = &ram
	}
	if err := o.PutManifest(ctx, snapshotManifest(sn.ID), &m); err != nil {
		return err
	}
	if err := s.store.SetSnapshotStored(ctx, sn.ID, time.Now().UTC()); err != nil {
		o.DeleteManifest(context.WithoutCancel(ctx), snapshotManifest(sn.ID))
		return ErrNotFound
	}
	var bytes int64
	for _, f := range append(m.Chain, m.State) {
		bytes += f.Size
	}
	s.log.Info("snapshot stored", "snapshot", sn.ID, "store", o, "bytes", bytes, "ms", time.Since(start).Milliseconds())
	return nil
}

// storeUnstored stores this node's snapshots that a stopped daemon left
// unstored.
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
}

// fetchSnapshot makes sn's stored files local and returns the frozen top
// layer, the frozen layers and the state path to restore from.
func (s *Service) fetchSnapshot(ctx context.Context, sn *store.Snapshot) (frozen string, layers []string, state string, err error) {
	o := s.cfg.Objects
	if o == nil || sn.StoredAt.IsZero() {
		return "", nil, "", s.snapshotHere(sn)
	}
	s.fetchMu.Lock()
	defer s.fetchMu.Unlock()
	var m storedState
	if err := o.GetManifest(ctx, snapshotManifest(sn.ID), &m); err != nil {
		if errors.Is(err, objects.ErrNotFound) {
			return "", nil, "", fmt.Errorf("%w: snapshot %s: %v", ErrNotFound, sn.Name, err)
		}
		return "", nil, "", fmt.Errorf("%w: snapshot %s: %v", ErrUnavailable, sn.Name, err)
	}
	if len(m.Chain) == 0 || m.Layers < 1 || m.Layers > len(m.Chain) {
		return "", nil, "", fmt.Errorf("%w: snapshot %s: its manifest in %s is damaged (%d disk files, %d layers)", ErrUnavailable, sn.Name, o, len(m.Chain), m.Layers)
	}
	dir := filepath.Join(s.cfg.DataDir, "objects")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, "", err
	}
	start := time.Now()
	// A local copy is named by its content and everything below it (the
	// same layer over another base is another file).
	parent, key := "", ""
	for i, f := range m.Chain {
		key = hashStrings(key, f.SHA256)
		p := filepath.Join(dir, key+".qcow2")
		if _, err := os.Stat(p); err != nil {
			var fix func(string) error
			if parent != "" {
				below := parent
				fix = func(tmp string) error { return disk.Rebase(ctx, tmp, below) }
			}
			if err := s.fetchFile(ctx, f, p, fix); err != nil {
				return "", nil, "", fmt.Errorf("%w: snapshot %s: %v", ErrUnavailable, sn.Name, err)
			}
		}
		if i >= len(m.Chain)-m.Layers {
			layers = append(layers, p)
		}
		parent = p
	}
	state = filepath.Join(dir, "state-"+m.State.SHA256[:32])
	if !qemu.StateSynced(state) {
		qemu.RemoveState(state)
		if m.RAM != nil {
			if err := s.fetchFile(ctx, *m.RAM, state+qemu.RAMSuffix, nil); err != nil {
				return "", nil, "", fmt.Errorf("%w: snapshot %s: %v", ErrUnavailable, sn.Name, err)
			}
		}
		if err := s.fetchFile(ctx, m.State, state, nil); err != nil {
			qemu.RemoveState(state)
			return "", nil, "", fmt.Errorf("%w: snapshot %s: %v", ErrUnavailable, sn.Name, err)
		}
		if err := qemu.SyncState(state); err != nil {
			return "", nil, "", err
		}
	}
	s.log.Info("snapshot fetched", "snapshot", sn.ID, "store", o, "ms", time.Since(start).Milliseconds())
	return parent, layers, state, nil
}

// fetchFile downloads f to p; fix, if not nil, adjusts the checked
// download before it takes p's name.
func (s *Service) fetchFile(ctx context.Context, f objects.File, p string, fix func(tmp string) error) error {
	tmp := p + ".fetch"
	defer os.Remove(tmp)
	if err := s.cfg.Objects.GetFile(ctx, f, tmp); err != nil {
		return err
	}
	if fix != nil {
		if err := fix(tmp); err != nil {
			return err
		}
	}
	return os.Rename(tmp, p)
}

// unstoreSnapshot removes sn's manifest (its chunks stay: other snapshots
// may share them).
func (s *Service) unstoreSnapshot(ctx context.Context, sn *store.Snapshot) {
	if s.cfg.Objects == nil {
		return
	}
	if err := s.cfg.Objects.DeleteManifest(ctx, snapshotManifest(sn.ID)); err != nil {
		s.log.Warn("snapshot's manifest not deleted from the object store", "snapshot", sn.ID, "err", err)
	}
}
