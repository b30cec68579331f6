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
	s.startUpload(sn.ID, func(ctx context.Context) error { return s.storeSnapshot(ctx, sn) })
}

// startUpload runs put in the background under key (a snapshot's id, or
// uploadKey of a VM's), retrying with backoff until it succeeds, fails
// with errNotStorable, or is stopped (stopStoring, Close). One runs per key.
func (s *Service) startUpload(key string, put func(ctx context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bg.Err() != nil || s.storing[key] != nil {
		return // closing, or already being stored
	}
	ctx, cancel := context.WithCancel(s.bg)
	done := make(chan struct{})
	s.storing[key] = &upload{cancel: cancel, done: done}
	s.uploads.Add(1)
	go func() {
		defer func() {
			s.mu.Lock()
			delete(s.storing, key)
			s.mu.Unlock()
			cancel()
			close(done)
			s.uploads.Done()
		}()
		for try := 0; ; try++ {
			// At most two uploads at a time: a wave of suspends must not
			// take all of the disk's bandwidth.
			select {
			case s.uploadSlots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			err := put(ctx)
			<-s.uploadSlots
			if err == nil || errors.Is(err, errNotStorable) || ctx.Err() != nil {
				if err != nil && ctx.Err() == nil {
					s.log.Warn("not stored in the object store", "what", key, "err", err)
				}
				return
			}
			wait := min(time.Duration(1<<min(try, 6))*time.Second, time.Minute)
			s.log.Warn("not stored in the object store; retrying", "what", key, "store", s.cfg.Objects, "err", err, "retry_in", wait)
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return
			}
		}
	}()
}

// upload is a snapshot or suspended VM being stored: cancel stops it,
// done closes when it has.
type upload struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// stopStoring stops the upload under key, if one runs, and waits for it to
// let go of the files.
func (s *Service) stopStoring(key string) {
	s.mu.Lock()
	u := s.storing[key]
	s.mu.Unlock()
	if u != nil {
		u.cancel()
		<-u.done
	}
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
	m, err := s.putState(ctx, sn.Disk, sn.Layers, sn.State)
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

// putState stores the disk chain whose top is top (with own, the files of
// it that are the VM's own, top last) and the state at state, and returns
// their manifest.
func (s *Service) putState(ctx context.Context, top string, own []string, state string) (*storedState, error) {
	o := s.cfg.Objects
	var m storedState
	chain, err := disk.Chain(ctx, top)
	if err != nil {
		return nil, err
	}
	slices.Reverse(chain)
	for _, p := range chain {
		f, err := o.PutFile(ctx, p)
		if err != nil {
			return nil, err
		}
		m.Chain = append(m.Chain, f)
		if slices.Contains(own, p) {
			m.Layers++
		}
	}
	if m.Layers != len(own) || chain[len(chain)-1] != top {
		return nil, fmt.Errorf("%w: its disk chain %v does not end in its %d layers %v", errNotStorable, chain, len(own), own)
	}
	if m.State, err = o.PutFile(ctx, state); err != nil {
		return nil, err
	}
	if _, err := os.Stat(state + qemu.RAMSuffix); err == nil {
		ram, err := o.PutFile(ctx, state+qemu.RAMSuffix)
		if err != nil {
			return nil, err
		}
		m.RAM = &ram
	}
	return &m, nil
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
	release, err := s.fetchTurn(ctx, "snapshot "+sn.Name)
	if err != nil {
		return "", nil, "", err
	}
	defer release()
	start := time.Now()
	m, err := s.getManifest(ctx, snapshotManifest(sn.ID), sn.StoredManifest, sn.DiskBytes, sn.MemoryMiB)
	if err != nil {
		return "", nil, "", fmt.Errorf("snapshot %s: %w", sn.Name, err)
	}
	frozen, layers, fetched, err := s.fetchChain(ctx, m, sn.DiskBytes, "")
	if err != nil {
		return "", nil, "", fmt.Errorf("%w: snapshot %s: %v", ErrUnavailable, sn.Name, err)
	}
	ramSum := ""
	if m.RAM != nil {
		ramSum = m.RAM.SHA256
	}
	state = filepath.Join(s.cfg.DataDir, "objects", "state-"+hashStrings(m.State.SHA256, ramSum))
	if !qemu.StateSynced(state) {
		n, err := s.fetchState(ctx, m, state, sn.MemoryMiB)
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

// fetchTurn waits for this node's one fetch from the object store at a
// time (two fetches of the same state would write the same files), or
// gives up when ctx ends; release ends the turn.
func (s *Service) fetchTurn(ctx context.Context, what string) (release func(), err error) {
	select {
	case s.fetching <- struct{}{}:
		return func() { <-s.fetching }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %s: waiting for another fetch from the object store: %v", ErrUnavailable, what, ctx.Err())
	}
}

// getManifest reads and checks the stored state called name, whose
// manifest's SHA-256 is sum, of a VM of that disk and memory.
func (s *Service) getManifest(ctx context.Context, name, sum string, diskBytes, memMiB int64) (*storedState, error) {
	o := s.cfg.Objects
	var m storedState
	if err := o.GetManifest(ctx, name, sum, &m); err != nil {
		if errors.Is(err, objects.ErrNotFound) {
			return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
		}
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if err := m.check(diskBytes, memMiB); err != nil {
		return nil, fmt.Errorf("%w: its manifest in %s is damaged: %v", ErrUnavailable, o, err)
	}
	return &m, nil
}

// fetchChain makes m's disk chain local: the files below the last into
// <data dir>/objects (shared, named by their content and all below
// them), the last there too, or to privateTop when that is set (a VM's
// writable top). It returns the top, the layers (m's own files, without
// a private top) and how many bytes it downloaded.
func (s *Service) fetchChain(ctx context.Context, m *storedState, diskBytes int64, privateTop string) (top string, layers []string, fetched int64, err error) {
	dir := filepath.Join(s.cfg.DataDir, "objects")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, 0, err
	}
	parent, key := "", ""
	for i, f := range m.Chain {
		key = hashStrings(key, f.SHA256)
		p := filepath.Join(dir, key+".qcow2")
		last := i == len(m.Chain)-1
		if last && privateTop != "" {
			p = privateTop
		}
		if _, err := os.Stat(p); err != nil {
			below := parent
			fix := func(tmp string) error { return disk.Rebase(ctx, tmp, below) }
			fetched += f.Size
			if err := s.fetchFile(ctx, f, p, diskFileMax(diskBytes), fix); err != nil {
				return "", nil, 0, err
			}
		}
		if i >= len(m.Chain)-m.Layers && !(last && privateTop != "") {
			layers = append(layers, p)
		}
		parent = p
	}
	return parent, layers, fetched, nil
}

// fetchState downloads m's state (and RAM file) to dst, synced, the state
// file last: one found at dst is whole.
func (s *Service) fetchState(ctx context.Context, m *storedState, dst string, memMiB int64) (int64, error) {
	qemu.RemoveState(dst)
	fetched := m.State.Size
	if m.RAM != nil {
		fetched += m.RAM.Size
		if err := s.fetchFile(ctx, *m.RAM, dst+qemu.RAMSuffix, memFileMax(memMiB), nil); err != nil {
			return 0, err
		}
	}
	if err := s.fetchFile(ctx, m.State, dst, memFileMax(memMiB), nil); err != nil {
		qemu.RemoveState(dst)
		return 0, err
	}
	if err := qemu.SyncState(dst); err != nil {
		return 0, err
	}
	return fetched, nil
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

// fetchFile downloads f (at most max bytes) to p; fix, if not nil, adjusts
// the checked download before it takes p's name.
func (s *Service) fetchFile(ctx context.Context, f objects.File, p string, max int64, fix func(tmp string) error) error {
	tmp := p + ".fetch"
	defer os.Remove(tmp)
	if err := s.cfg.Objects.GetFile(ctx, f, tmp, max); err != nil {
		return err
	}
	if fix != nil {
		if err := fix(tmp); err != nil {
			return err
		}
		if err := syncFile(tmp); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, p); err != nil {
		return err
	}
	return syncFile(filepath.Dir(p))
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

// removePartialFetches removes what fetches a stopped daemon did not finish.
func (s *Service) removePartialFetches() {
	parts, _ := filepath.Glob(filepath.Join(s.cfg.DataDir, "objects", "*.fetch*"))
	for _, p := range parts {
		os.Remove(p)
	}
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
