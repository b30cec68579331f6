package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/objects"
	"github.com/agentvm/agentvm/internal/pgtest"
	"github.com/agentvm/agentvm/internal/store"
)

// The cluster side of the service on fake machines: two nodes, each a
// Service with its own data dir and fake hypervisor (its own host), on one
// PostgreSQL store and one object store, as `serve --cluster --objects`
// runs them. What moves between them goes through the object store only.

// memBucket is an in-memory objects.Bucket that counts reads and can be
// told to fail them.
type memBucket struct {
	mu       sync.Mutex
	objs     map[string][]byte
	gets     int
	failGets error
}

func (b *memBucket) Put(_ context.Context, key string, data []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.objs[key] = append([]byte(nil), data...)
	return nil
}

func (b *memBucket) Get(_ context.Context, key string, max int64) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failGets != nil {
		return nil, b.failGets
	}
	b.gets++
	d, ok := b.objs[key]
	if !ok {
		return nil, fmt.Errorf("%w: %s", objects.ErrNotFound, key)
	}
	if int64(len(d)) > max {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", key, len(d), max)
	}
	return append([]byte(nil), d...), nil
}

func (b *memBucket) Size(_ context.Context, key string) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok := b.objs[key]
	if !ok {
		return 0, fmt.Errorf("%w: %s", objects.ErrNotFound, key)
	}
	return int64(len(d)), nil
}

func (b *memBucket) Delete(_ context.Context, key string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.objs, key)
	return nil
}

func (b *memBucket) String() string { return "mem://test" }

func (b *memBucket) reads() int { b.mu.Lock(); defer b.mu.Unlock(); return b.gets }

func (b *memBucket) failReads(err error) { b.mu.Lock(); b.failGets = err; b.mu.Unlock() }

// keys returns the stored keys that start with prefix.
func (b *memBucket) keys(prefix string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for k := range b.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

type clusterEnv struct {
	t      *testing.T
	dsn    string
	st     *store.Store // the test's own view of the database (it does not listen: never cached)
	bucket *memBucket
	a, b   *fakeEnv
}

func newClusterEnv(t *testing.T) *clusterEnv {
	t.Helper()
	skipWithoutFakeMachines(t)
	dsn := pgtest.Database(t)
	st, err := store.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c := &clusterEnv{t: t, dsn: dsn, st: st, bucket: &memBucket{objs: map[string][]byte{}}}
	objs := objects.New(c.bucket)
	c.a, c.b = c.node("node-a", objs), c.node("node-b", objs)
	return c
}

// node starts node id: a service of its own on a store of its own that
// listens to the other nodes (so its read cache serves, as a cluster
// node's does), on the shared database and object store, with its own
// data dir, image cache and fake host.
func (c *clusterEnv) node(id string, o *objects.Store) *fakeEnv {
	return c.nodeWith(id, o, nil)
}

// nodeWith is node whose service reads through wrap(its store).
func (c *clusterEnv) nodeWith(id string, o *objects.Store, wrap func(*store.Store) Store) *fakeEnv {
	t := c.t
	t.Helper()
	c.setLease(id, time.Hour)
	st, err := store.Open(c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	lctx, stop := context.WithCancel(context.Background())
	listening, ended := make(chan struct{}), make(chan error, 1)
	go func() { ended <- st.Listen(lctx, func() { close(listening) }, nil, func(string) {}) }()
	t.Cleanup(func() { stop(); <-ended; st.Close() })
	select {
	case <-listening:
	case err := <-ended:
		t.Fatalf("listen: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("not listening after a minute")
	}
	return newFakeEnvOn(t, st, t.TempDir(), func(e *fakeEnv) {
		e.cfg.Node, e.cfg.Objects = id, o
		e.cfg.NodeLost = func(ctx context.Context, n string) (bool, error) {
			node, err := st.GetNode(ctx, n)
			if errors.Is(err, store.ErrNotFound) {
				return true, nil
			}
			if err != nil {
				return false, err
			}
			return !node.Alive, nil
		}
		if wrap != nil {
			e.vst = wrap(st)
		}
	})
}

// setLease gives node id a lease of ttl from now (negative: run out).
func (c *clusterEnv) setLease(id string, ttl time.Duration) {
	c.t.Helper()
	if _, err := c.st.JoinNode(context.Background(), &store.Node{ID: id, Name: id, CPUs: 64, MemoryMiB: 1 << 20,
		QEMUVersion: "10.0.2", Accel: "tcg"}, ttl); err != nil {
		c.t.Fatal(err)
	}
}

// lose makes node e lost, as a node that cannot renew its lease does: it
// fences itself (its VMs are killed, and it takes no more operations), and
// its lease runs out.
func (c *clusterEnv) lose(e *fakeEnv) {
	c.t.Helper()
	e.s.Fence("the test took its lease")
	c.setLease(e.cfg.Node, -time.Second)
}

// waitFor polls cond (generously) until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// onlyUnder fails unless every file of v's disk chain is under dir.
func onlyUnder(t *testing.T, v *store.VM, dir string) {
	t.Helper()
	chain, err := disk.Chain(context.Background(), v.Disk)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range chain {
		if !strings.HasPrefix(p, dir+"/") {
			t.Fatalf("%s's disk chain %v has %s, outside this node's data dir %s", v.Name, chain, p, dir)
		}
	}
}

// A snapshot taken on one node is stored in the background and restores on
// another node from the object store alone: its memory and a disk chain
// fetched into that node's data dir; a second create fetches nothing again.
// A manifest damaged in the store is refused, not restored.
func TestSnapshotRestoresOnAnotherNode(t *testing.T) {
	c := newClusterEnv(t)
	v := c.a.create("box")
	c.a.machine(v).SetMemory("memory of box on node-a")
	sn, err := c.a.s.Snapshot(c.a.ctx, "box", "snap")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the snapshot to be stored", func() bool {
		got, err := c.st.GetSnapshot(context.Background(), sn.ID)
		return err == nil && !got.StoredAt.IsZero()
	})
	if len(c.bucket.keys("manifests/snapshots/")) != 1 {
		t.Fatalf("manifests in the store: %v", c.bucket.keys("manifests/snapshots/"))
	}

	cp, _, err := c.b.s.CreateFrom(c.b.ctx, "snap", CreateOptions{Name: "copy"})
	if err != nil {
		t.Fatalf("create from node-a's snapshot on node-b: %v", err)
	}
	if cp.Node != "node-b" || cp.State != store.StateRunning {
		t.Fatalf("copy: node %s, state %s", cp.Node, cp.State)
	}
	if got := c.b.machine(cp).Memory(); got != "memory of box on node-a" {
		t.Fatalf("the copy's memory: %q", got)
	}
	onlyUnder(t, cp, c.b.cfg.DataDir)
	if out := c.b.exec("copy", "echo up"); out != "up\n" {
		t.Fatalf("exec in the copy: %q", out)
	}

	reads := c.bucket.reads()
	if _, _, err := c.b.s.CreateFrom(c.b.ctx, "snap", CreateOptions{Name: "copy2"}); err != nil {
		t.Fatal(err)
	}
	if n := c.bucket.reads() - reads; n > 1 { // the manifest, read again; nothing else
		t.Fatalf("a second create from the fetched snapshot read %d objects", n)
	}

	// A manifest replaced in the store fails its SHA-256; one whose sum
	// the database records too (say, written by a broken node) fails its
	// own checks before it names a file. Neither leaves a VM.
	os.RemoveAll(filepath.Join(c.b.cfg.DataDir, "objects"))
	for _, k := range c.bucket.keys("manifests/snapshots/") {
		c.bucket.Put(context.Background(), k, []byte(`{"state":{"size":1,"sha256":"00","chunks":[]},"chain":[],"layers":0}`))
	}
	if _, _, err := c.b.s.CreateFrom(c.b.ctx, "snap", CreateOptions{Name: "copy3"}); err == nil || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a create from a replaced manifest: %v", err)
	}
	empty := objects.File{SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"} // of no bytes
	bad := storedState{State: empty}                                                                  // no disk chain
	sum, err := c.a.cfg.Objects.PutManifest(context.Background(), snapshotManifest(sn.ID), &bad)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.st.SetSnapshotStored(context.Background(), sn.ID, time.Now(), sum); err != nil {
		t.Fatal(err)
	}
	_, _, err = c.b.s.CreateFrom(c.b.ctx, "snap", CreateOptions{Name: "copy3"})
	if err == nil || !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("a create from a recorded but malformed manifest: %v", err)
	}
	if _, err := c.b.s.Get(c.b.ctx, "copy3"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the failed creates left a VM behind: %v", err)
	}
}

// A suspended VM of a node that is lost is adopted by the node asked about
// it: while its node lives it is that node's (ErrOtherNode); once its lease
// runs out, the other node takes it over, fetches its stored state and
// wakes it with the memory it was suspended with.
func TestSuspendedVMMovesToAnotherNodeWhenItsNodeIsLost(t *testing.T) {
	c := newClusterEnv(t)
	v := c.a.create("box")
	c.a.machine(v).SetMemory("suspended on node-a")
	if _, err := c.a.s.Suspend(c.a.ctx, "box"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the suspended VM to be stored", func() bool {
		got, err := c.st.GetVM(context.Background(), v.ID)
		return err == nil && got.StoredManifest != ""
	})
	if _, err := c.b.s.GetLocal(c.b.ctx, "box"); !errors.Is(err, ErrOtherNode) {
		t.Fatalf("node-b asked about node-a's VM while node-a lives: %v", err)
	}

	c.lose(c.a)
	got, err := c.b.s.GetLocal(c.b.ctx, "box")
	if err != nil {
		t.Fatalf("node-b asked about a lost node's stored VM: %v", err)
	}
	if got.Node != "node-b" || got.State != store.StateSuspended {
		t.Fatalf("adopted: node %s, state %s", got.Node, got.State)
	}
	woke, err := c.b.s.Wake(c.b.ctx, "box")
	if err != nil {
		t.Fatalf("wake on node-b: %v", err)
	}
	if m := c.b.machine(woke).Memory(); m != "suspended on node-a" {
		t.Fatalf("the woken VM's memory: %q", m)
	}
	onlyUnder(t, woke, c.b.cfg.DataDir)
	if out := c.b.exec("box", "echo up"); out != "up\n" {
		t.Fatalf("exec after the move: %q", out)
	}
	waitFor(t, "the woken VM's stored state to be deleted", func() bool { return len(c.bucket.keys("manifests/vms/")) == 0 })
}

// A running VM of a lost node with no stored state of its own comes back on
// the node asked about it from its newest stored snapshot, through the
// state machine's takeover moves. A revive whose fetch fails gives the VM
// back to its lost node as it was, and the next request revives it.
func TestRunningVMRevivesFromItsNewestStoredSnapshot(t *testing.T) {
	c := newClusterEnv(t)
	v := c.a.create("box")
	for _, mem := range []string{"first", "second"} {
		c.a.machine(v).SetMemory(mem)
		sn, err := c.a.s.Snapshot(c.a.ctx, "box", "snap-"+mem)
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "snapshot "+sn.Name+" to be stored", func() bool {
			got, err := c.st.GetSnapshot(context.Background(), sn.ID)
			return err == nil && !got.StoredAt.IsZero()
		})
		time.Sleep(10 * time.Millisecond) // distinct creation times
	}
	c.a.machine(v).SetMemory("after the last snapshot")
	c.lose(c.a)

	c.bucket.failReads(errors.New("the object store is unreachable"))
	if _, err := c.b.s.GetLocal(c.b.ctx, "box"); err == nil {
		t.Fatal("a revive whose fetch failed succeeded")
	}
	back, err := c.st.GetVM(context.Background(), v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if back.Node != "node-a" || back.State != store.StateRunning {
		t.Fatalf("after the failed revive: node %s, state %s (want node-a, running)", back.Node, back.State)
	}

	c.bucket.failReads(nil)
	got, err := c.b.s.GetLocal(c.b.ctx, "box")
	if err != nil {
		t.Fatalf("revive: %v", err)
	}
	if got.Node != "node-b" || got.State != store.StateRunning || got.Source != "snapshot snap-second" {
		t.Fatalf("revived: node %s, state %s, source %q", got.Node, got.State, got.Source)
	}
	if m := c.b.machine(got).Memory(); m != "second" {
		t.Fatalf("the revived VM's memory: %q (want the newest snapshot's)", m)
	}
	onlyUnder(t, got, c.b.cfg.DataDir)
	evs, err := c.b.s.Events(c.b.ctx, v.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ev := range evs {
		found = found || ev.Type == "revive"
	}
	if !found {
		t.Fatal("no revive event")
	}
}

// staleReads is a node's store whose cached read (GetVM) answers a VM's
// record as it was when frozen, as a read cache that has not heard of
// another node's write yet does; the node's own writes of it end that, as
// they empty its cache; GetVMFresh reads the database.
type staleReads struct {
	*store.Store
	mu     sync.Mutex
	frozen map[string]*store.VM // by id and by name
}

func (s *staleReads) GetVM(ctx context.Context, idOrName string) (*store.VM, error) {
	s.mu.Lock()
	v := s.frozen[idOrName]
	s.mu.Unlock()
	if v != nil {
		c := *v
		return &c, nil
	}
	return s.Store.GetVM(ctx, idOrName)
}

func (s *staleReads) freeze(v *store.VM) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := *v
	s.frozen[v.ID], s.frozen[v.Name] = &c, &c
}

func (s *staleReads) thaw(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.frozen[id]; v != nil {
		delete(s.frozen, v.ID)
		delete(s.frozen, v.Name)
	}
}

func (s *staleReads) UpdateVM(ctx context.Context, v *store.VM) error {
	s.thaw(v.ID)
	return s.Store.UpdateVM(ctx, v)
}

// A drain moves a VM to another node, which wakes it at once: the node it
// moved to must not act on its cached record of the VM (another node's,
// before the move) that has not yet heard of the move.
func TestMovedVMWakesOnItsNewNodeAtOnce(t *testing.T) {
	c := newClusterEnv(t)
	var stale *staleReads
	c.b = c.nodeWith("node-c", c.a.cfg.Objects, func(st *store.Store) Store {
		stale = &staleReads{Store: st, frozen: map[string]*store.VM{}}
		return stale
	})
	v := c.a.create("box")
	c.a.machine(v).SetMemory("memory of box")
	before, err := c.st.GetVMFresh(context.Background(), v.ID)
	if err != nil {
		t.Fatal(err)
	}
	stale.freeze(before) // node-c's cache: node-a's running VM
	if _, err := c.a.s.MoveOut(c.a.ctx, "box", "node-c"); err != nil {
		t.Fatalf("move: %v", err)
	}
	woke, err := c.b.s.Wake(c.b.ctx, "box")
	if err != nil {
		t.Fatalf("wake on node-c right after the move: %v", err)
	}
	if woke.Node != "node-c" || woke.State != store.StateRunning || c.b.machine(woke).Memory() != "memory of box" {
		t.Fatalf("after the move: node %s, state %s", woke.Node, woke.State)
	}
}
