package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/objects"
)

// stash moves saved states between this node and the object store
// (Config.Objects): the background uploads of snapshots and suspended VMs,
// one per key, at most two at once, and the fetches that make stored files
// local, one at a time. It knows files, manifests and the object store, not
// VMs or records: what is stored when, and what a fetched state restores,
// is the service's (objects.go, vmstore.go).
type stash struct {
	o   *objects.Store // nil: no object store
	dir string         // <data dir>/objects: fetched files
	log *slog.Logger

	mu       sync.Mutex
	bg       context.Context // ends at close: no upload starts after it
	stop     context.CancelFunc
	storing  map[string]*upload
	uploads  sync.WaitGroup
	slots    chan struct{} // upload slots
	fetching chan struct{} // the one fetch turn
}

func newStash(o *objects.Store, dataDir string, log *slog.Logger) *stash {
	st := &stash{o: o, dir: filepath.Join(dataDir, "objects"), log: log, storing: map[string]*upload{},
		slots: make(chan struct{}, 2), fetching: make(chan struct{}, 1)}
	st.bg, st.stop = context.WithCancel(context.Background())
	return st
}

// close stops the uploads and waits for them to end.
func (st *stash) close() {
	st.mu.Lock()
	st.stop() // under mu: no upload starts after this
	st.mu.Unlock()
	st.uploads.Wait()
}

// statePath is where a fetched state whose files have these sums lives.
func (st *stash) statePath(m *storedState) string {
	ramSum := ""
	if m.RAM != nil {
		ramSum = m.RAM.SHA256
	}
	return filepath.Join(st.dir, "state-"+hashStrings(m.State.SHA256, ramSum))
}

// startUpload runs put in the background under key (a snapshot's id, or
// uploadKey of a VM's), retrying with backoff until it succeeds, fails
// with errNotStorable, or is stopped (stopUpload, close). One runs per key.
func (st *stash) startUpload(key string, put func(ctx context.Context) error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.bg.Err() != nil || st.storing[key] != nil {
		return // closing, or already being stored
	}
	ctx, cancel := context.WithCancel(st.bg)
	done := make(chan struct{})
	st.storing[key] = &upload{cancel: cancel, done: done}
	st.uploads.Add(1)
	go func() {
		defer func() {
			st.mu.Lock()
			delete(st.storing, key)
			st.mu.Unlock()
			cancel()
			close(done)
			st.uploads.Done()
		}()
		for try := 0; ; try++ {
			// At most two uploads at a time: a wave of suspends must not
			// take all of the disk's bandwidth.
			select {
			case st.slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			err := put(ctx)
			<-st.slots
			if err == nil || errors.Is(err, errNotStorable) || ctx.Err() != nil {
				if err != nil && ctx.Err() == nil {
					st.log.Warn("not stored in the object store", "what", key, "err", err)
				}
				return
			}
			wait := min(time.Duration(1<<min(try, 6))*time.Second, time.Minute)
			st.log.Warn("not stored in the object store; retrying", "what", key, "store", st.o, "err", err, "retry_in", wait)
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

// stopUpload stops the upload under key, if one runs, and waits for it to
// let go of the files.
func (st *stash) stopUpload(key string) {
	st.mu.Lock()
	u := st.storing[key]
	st.mu.Unlock()
	if u != nil {
		u.cancel()
		<-u.done
	}
}

// turn waits for this node's one fetch from the object store at a
// time (two fetches of the same state would write the same files), or
// gives up when ctx ends; release ends the turn.
func (st *stash) turn(ctx context.Context, what string) (release func(), err error) {
	select {
	case st.fetching <- struct{}{}:
		return func() { <-st.fetching }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %s: waiting for another fetch from the object store: %v", ErrUnavailable, what, ctx.Err())
	}
}

// put stores the disk chain whose top is top (with own, the files of
// it that are the VM's own, top last) and the state at state, and returns
// their manifest.
func (st *stash) put(ctx context.Context, top string, own []string, state string) (*storedState, error) {
	o := st.o
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

// manifest reads and checks the stored state called name, whose
// manifest's SHA-256 is sum, of a VM of that disk and memory.
func (st *stash) manifest(ctx context.Context, name, sum string, diskBytes, memMiB int64) (*storedState, error) {
	o := st.o
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
func (st *stash) fetchChain(ctx context.Context, m *storedState, diskBytes int64, privateTop string) (top string, layers []string, fetched int64, err error) {
	dir := st.dir
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
			if err := st.fetchFile(ctx, f, p, diskFileMax(diskBytes), fix); err != nil {
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
func (st *stash) fetchState(ctx context.Context, m *storedState, dst string, memMiB int64) (int64, error) {
	qemu.RemoveState(dst)
	fetched := m.State.Size
	if m.RAM != nil {
		fetched += m.RAM.Size
		if err := st.fetchFile(ctx, *m.RAM, dst+qemu.RAMSuffix, memFileMax(memMiB), nil); err != nil {
			return 0, err
		}
	}
	if err := st.fetchFile(ctx, m.State, dst, memFileMax(memMiB), nil); err != nil {
		qemu.RemoveState(dst)
		return 0, err
	}
	if err := qemu.SyncState(dst); err != nil {
		return 0, err
	}
	return fetched, nil
}

// fetchFile downloads f (at most max bytes) to p; fix, if not nil, adjusts
// the checked download before it takes p's name.
func (st *stash) fetchFile(ctx context.Context, f objects.File, p string, max int64, fix func(tmp string) error) error {
	tmp := p + ".fetch"
	defer os.Remove(tmp)
	if err := st.o.GetFile(ctx, f, tmp, max); err != nil {
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

// removePartial removes what fetches a stopped daemon did not finish.
func (st *stash) removePartial() {
	parts, _ := filepath.Glob(filepath.Join(st.dir, "*.fetch*"))
	for _, p := range parts {
		os.Remove(p)
	}
}
