package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/pgtest"
)

// A clone shares nothing a caller could change with the cached record,
// and a new field of a reference type fails here until clone copies it.
func TestVMClone(t *testing.T) {
	copied := map[string]bool{"Labels": true, "Env": true, "Layers": true, "StartedAt": true, "SavedBy": true, "Egress": true}
	typ := reflect.TypeOf(VM{})
	for i := range typ.NumField() {
		f := typ.Field(i)
		switch f.Type.Kind() {
		case reflect.Map, reflect.Slice, reflect.Pointer, reflect.Interface, reflect.Chan, reflect.Func:
			if !copied[f.Name] {
				t.Errorf("VM.%s is a %s: copy it in VM.clone and list it here", f.Name, f.Type)
			}
		}
	}
	now := time.Now()
	v := &VM{ID: "vm1", Name: "a", Labels: map[string]string{"k": "v"}, Env: map[string]string{"E": "1"},
		Layers: []string{"l1"}, StartedAt: &now, SavedBy: &SavedBy{QEMU: "10.0.2"},
		Egress: &Egress{Mode: "allow", Allow: []string{"x.example"}, AllowHost: []int{80}}}
	c := v.clone()
	if !reflect.DeepEqual(c, v) {
		t.Fatalf("clone differs: %+v", c)
	}
	c.Labels["k"], c.Env["E"], c.Layers[0] = "changed", "changed", "changed"
	*c.StartedAt = time.Time{}
	c.SavedBy.QEMU, c.Egress.Allow[0], c.Egress.AllowHost[0] = "changed", "changed", 1
	if v.Labels["k"] != "v" || v.Env["E"] != "1" || v.Layers[0] != "l1" || !v.StartedAt.Equal(now) ||
		v.SavedBy.QEMU != "10.0.2" || v.Egress.Allow[0] != "x.example" || v.Egress.AllowHost[0] != 80 {
		t.Fatalf("changing the clone changed the original: %+v", v)
	}
}

func tempSQLite(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// reads runs fn and returns how many statements it read the database with.
func reads(s *Store, fn func()) int64 {
	before := s.Reads()
	fn()
	return s.Reads() - before
}

// The routing reads are served from memory once read, and every write
// shows in the next read.
func TestReadCache(t *testing.T) {
	ctx := context.Background()
	s := tempSQLite(t)
	v := &VM{ID: "vm1", Name: "web", State: StateRunning, CPUs: 1, MemoryMiB: 512, NetIndex: 1, Env: map[string]string{"A": "1"}, CreatedAt: time.Now().UTC()}
	if err := s.CreateVM(ctx, v); err != nil {
		t.Fatal(err)
	}
	get := func(ref string) *VM {
		t.Helper()
		got, err := s.GetVM(ctx, ref)
		if err != nil {
			t.Fatalf("get %s: %v", ref, err)
		}
		return got
	}
	get("web")
	if n := reads(s, func() { get("web"); get("vm1") }); n != 0 {
		t.Fatalf("cached VM by name and id: %d reads", n)
	}
	// A caller's copy is its own.
	mine := get("vm1")
	mine.Env["A"], mine.State = "changed", StateStopped
	if got := get("vm1"); got.Env["A"] != "1" || got.State != StateRunning {
		t.Fatalf("a caller's change reached the cache: %+v", got)
	}
	// A write shows at once, under the new name; the old name is gone.
	mine = get("vm1")
	mine.Name, mine.State = "web2", StatePaused
	if err := s.UpdateVM(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if got := get("web2"); got.State != StatePaused {
		t.Fatalf("after an update: %+v", got)
	}
	if _, err := s.GetVM(ctx, "web"); err == nil {
		t.Fatal("the old name still resolves")
	}
	// Names that do not exist are read each time and never stored.
	for i := range 3 {
		if n := reads(s, func() { s.GetVM(ctx, fmt.Sprintf("nope-%d", i)) }); n == 0 {
			t.Fatal("a name that does not exist was answered from the cache")
		}
	}
	if n := len(s.cache.vms); n != 2 {
		t.Fatalf("the cache holds %d keys, want 2 (one VM by id and name)", n)
	}

	// Sandboxes: whether a VM is one is cached either way, and changes show.
	if _, err := s.GetSandbox(ctx, "vm1"); err != ErrNotFound {
		t.Fatalf("no sandbox yet: %v", err)
	}
	if n := reads(s, func() { s.GetSandbox(ctx, "vm1") }); n != 0 {
		t.Fatalf("a VM that is no sandbox: %d reads", n)
	}
	if err := s.PutSandbox(ctx, &Sandbox{VMID: "vm1", TemplateID: "base", Metadata: map[string]string{"m": "1"}, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	sb, err := s.GetSandbox(ctx, "vm1")
	if err != nil || sb.TemplateID != "base" {
		t.Fatalf("after create: %v %+v", err, sb)
	}
	end := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if err := s.SetSandboxEnd(ctx, "vm1", end); err != nil {
		t.Fatal(err)
	}
	if n := reads(s, func() { sb, err = s.GetSandbox(ctx, "vm1") }); n == 0 || !sb.EndAt.Equal(end) {
		t.Fatalf("after a new end: %d reads, %+v", n, sb)
	}
	if _, err := s.GetSandbox(ctx, "not-a-vm"); err != ErrNotFound {
		t.Fatal(err)
	}
	if _, known := s.cache.sandbox("not-a-vm"); known {
		t.Fatal("a VM that does not exist was cached as no sandbox")
	}

	// Ports.
	if ps, _ := s.ListPorts(ctx, "vm1"); len(ps) != 0 {
		t.Fatalf("ports: %+v", ps)
	}
	if n := reads(s, func() { s.ListPorts(ctx, "vm1") }); n != 0 {
		t.Fatalf("cached ports: %d reads", n)
	}
	if err := s.PutPort(ctx, &Port{VMID: "vm1", Port: 8000, Kind: "http", Public: true, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if ps, _ := s.ListPorts(ctx, "vm1"); len(ps) != 1 || !ps[0].Public {
		t.Fatalf("after expose: %+v", ps)
	}
	if err := s.DeleteVM(ctx, "vm1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetVM(ctx, "vm1"); err == nil {
		t.Fatal("a deleted VM still resolves")
	}
}

// Readers racing writers never leave an old row in the cache: once the
// writes are done, every read sees the last one.
func TestReadCacheRaces(t *testing.T) {
	ctx := context.Background()
	s := tempSQLite(t)
	if err := s.CreateVM(ctx, &VM{ID: "vm1", Name: "web", State: StateRunning, CPUs: 1, MemoryMiB: 512, NetIndex: 1, CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	const writes = 200
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					s.GetVM(ctx, "web")
				}
			}
		}()
	}
	for i := 1; i <= writes; i++ {
		v, err := s.GetVM(ctx, "vm1")
		if err != nil {
			t.Fatal(err)
		}
		v.CPUs = i
		if err := s.UpdateVM(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	for range 3 {
		if v, err := s.GetVM(ctx, "web"); err != nil || v.CPUs != writes {
			t.Fatalf("after the writes: %v cpus %d, want %d", err, v.CPUs, writes)
		}
	}
}

// On PostgreSQL other nodes write too: the cache serves only while the
// store listens to them, and another store's write (another node's) shows
// once its notification arrives; a store that does not listen reads the
// database every time.
func TestReadCachePostgresFollowsOtherNodes(t *testing.T) {
	dsn := pgtest.Database(t)
	a, err := Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	if err := a.CreateVM(ctx, &VM{ID: "vm1", Name: "web", State: StateRunning, CPUs: 1, MemoryMiB: 512, NetIndex: 1, CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	b.GetVM(ctx, "web")
	if n := reads(b, func() { b.GetVM(ctx, "web") }); n == 0 {
		t.Fatal("a PostgreSQL store that does not listen answered from its cache")
	}

	// Only the notifications may empty the cache here, not the catch-up
	// after a quiet listenIdle.
	idle := listenIdle
	listenIdle = time.Hour
	defer func() { listenIdle = idle }()
	lctx, stop := context.WithCancel(ctx)
	listening, ended := make(chan struct{}), make(chan error, 1)
	go func() {
		ended <- b.Listen(lctx, func() { close(listening) }, nil, func(msg string) {})
	}()
	select {
	case <-listening:
	case err := <-ended:
		t.Fatalf("listen: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("not listening after a minute")
	}
	b.GetVM(ctx, "web")
	b.ListPorts(ctx, "vm1")
	b.GetSandbox(ctx, "vm1")
	if n := reads(b, func() { b.GetVM(ctx, "web"); b.GetVM(ctx, "vm1"); b.ListPorts(ctx, "vm1"); b.GetSandbox(ctx, "vm1") }); n != 0 {
		t.Fatalf("routing reads of a listening store read the database %d times, want 0", n)
	}

	v, _ := a.GetVM(ctx, "vm1")
	v.State = StateSuspended
	if err := a.UpdateVM(ctx, v); err != nil {
		t.Fatal(err)
	}
	waitCache(t, "the other node's suspend", func() bool { got, err := b.GetVM(ctx, "web"); return err == nil && got.State == StateSuspended })
	if err := a.PutPort(ctx, &Port{VMID: "vm1", Port: 8080, Kind: "http", Public: true, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	waitCache(t, "the other node's exposure", func() bool { ps, err := b.ListPorts(ctx, "vm1"); return err == nil && len(ps) == 1 })
	if err := a.DeleteVM(ctx, "vm1"); err != nil {
		t.Fatal(err)
	}
	waitCache(t, "the other node's delete", func() bool { _, err := b.GetVM(ctx, "web"); return errors.Is(err, ErrNotFound) })

	// The listening connection dies (a failover, a firewall): Listen ends
	// and the cache stops serving.
	defer stop()
	if _, err := a.db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if err == nil {
			t.Fatal("Listen ended without an error when its connection was terminated")
		}
	case <-time.After(time.Minute):
		t.Fatal("Listen still runs a minute after its connection was terminated")
	}
	if err := a.CreateVM(ctx, &VM{ID: "vm2", Name: "web2", State: StateRunning, CPUs: 1, MemoryMiB: 512, NetIndex: 2, CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	b.GetVM(ctx, "web2")
	if n := reads(b, func() { b.GetVM(ctx, "web2") }); n == 0 {
		t.Fatal("a store whose listening connection died still answered from its cache")
	}
}

// waitCache waits (generously) for another node's write to show.
func waitCache(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not show in 30 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A read that began before a write does not store what it read: it may
// be the row the write replaced.
func TestReadCacheStaleFill(t *testing.T) {
	c := newReadCache(true)
	gen, on := c.begin()
	if !on {
		t.Fatal("a SQLite store's cache is off")
	}
	c.changed() // a write lands while the read is under way
	c.putVM(gen, &VM{ID: "vm1", Name: "web", State: StateRunning})
	c.putSandbox(gen, "vm1", nil)
	c.putPorts(gen, "vm1", nil)
	if c.vm("vm1") != nil {
		t.Fatal("a read that raced a write stored its row")
	}
	if _, known := c.sandbox("vm1"); known {
		t.Fatal("a read that raced a write stored its sandbox")
	}
	if _, ok := c.portsOf("vm1"); ok {
		t.Fatal("a read that raced a write stored its ports")
	}
	gen, _ = c.begin()
	c.putVM(gen, &VM{ID: "vm1", Name: "web"})
	if c.vm("web") == nil {
		t.Fatal("a read with no write meanwhile was not stored")
	}
}
