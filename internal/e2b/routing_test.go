package e2b

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/pgtest"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// Routing a request to a running sandbox (the proxy's VM lookup, Owns,
// Reach, and the VM service's wake check that envd's Guest starts with)
// reads the database only the first time: then it is served from the
// store's read cache, and a change shows at once. On PostgreSQL too, while
// the node listens to the others (as every cluster node does).
func TestRoutingReadsNoStore(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { routingReadsNoStore(t, filepath.Join(t.TempDir(), "db"), false) })
	t.Run("postgres", func(t *testing.T) { routingReadsNoStore(t, pgtest.Database(t), true) })
}

func routingReadsNoStore(t *testing.T, dsn string, listen bool) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if listen {
		lctx, stop := context.WithCancel(ctx)
		listening, ended := make(chan struct{}), make(chan error, 1)
		go func() { ended <- st.Listen(lctx, func() { close(listening) }, nil, func(string) {}) }()
		defer func() { stop(); <-ended }()
		select {
		case <-listening:
		case err := <-ended:
			t.Fatalf("listen: %v", err)
		}
	}
	run, err := os.MkdirTemp("", "avm-e2b-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(run)
	svc, err := vm.New(vm.Config{DataDir: dir, RunDir: run, CacheDir: filepath.Join(dir, "cache")}, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateVM(ctx, &store.VM{ID: "vm1", Name: "isbx1", State: store.StateRunning, CPUs: 1, MemoryMiB: 512, NetIndex: 1, CreatedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutSandbox(ctx, &store.Sandbox{VMID: "vm1", TemplateID: "base", EndAt: time.Now().Add(time.Hour), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	s := New(Config{VMs: svc, Store: st})
	route := func() *store.VM {
		t.Helper()
		v, err := svc.Get(ctx, "isbx1")
		if err != nil || !s.Owns(ctx, v) {
			t.Fatalf("get and owns: %v %+v", err, v)
		}
		v, ok := s.Reach(ctx, v)
		if !ok {
			t.Fatalf("reach: %+v", v)
		}
		if v, err = svc.Wake(ctx, v.ID); err != nil || v.State != store.StateRunning {
			t.Fatalf("wake: %v %+v", err, v)
		}
		return v
	}
	route()
	before := st.Reads()
	for range 10 {
		route()
	}
	if n := st.Reads() - before; n != 0 {
		t.Fatalf("ten routings read the database %d times, want 0", n)
	}
	// A pause shows in the next routing.
	v, _ := st.GetVM(ctx, "vm1")
	v.State = store.StateSuspended
	if err := st.UpdateVM(ctx, v); err != nil {
		t.Fatal(err)
	}
	if got, _ := svc.Get(ctx, "isbx1"); got.State != store.StateSuspended {
		t.Fatalf("after a suspend: %+v", got)
	}
}
