package e2b

import (
	"context"
	"os"
	"testing"

	"github.com/agentvm/agentvm/internal/pgtest"
	"github.com/agentvm/agentvm/internal/store"
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
	t.Run("sqlite", func(t *testing.T) { routingReadsNoStore(t, newFakeE2B(t)) })
	t.Run("postgres", func(t *testing.T) { routingReadsNoStore(t, newFakeE2BOn(t, pgtest.Database(t))) })
}

func routingReadsNoStore(t *testing.T, e *fakeE2B) {
	ctx := context.Background()
	id := e.create(t, `{"timeout":600}`).SandboxID
	route := func() *store.VM {
		t.Helper()
		v, err := e.svc.Get(ctx, id)
		if err != nil || !e.s.Owns(ctx, v) {
			t.Fatalf("get and owns: %v %+v", err, v)
		}
		v, ok := e.s.Reach(ctx, v)
		if !ok {
			t.Fatalf("reach: %+v", v)
		}
		if v, err = e.svc.Wake(ctx, v.ID); err != nil || v.State != store.StateRunning {
			t.Fatalf("wake: %v %+v", err, v)
		}
		return v
	}
	route()
	before := e.st.Reads()
	for range 10 {
		route()
	}
	if n := e.st.Reads() - before; n != 0 {
		t.Fatalf("ten routings read the database %d times, want 0", n)
	}
	// A suspend shows in the next routing (the suspend's own write empties
	// the cache): the sandbox is not reached (no autoResume) until a wake.
	if _, err := e.svc.Suspend(ctx, id); err != nil {
		t.Fatal(err)
	}
	if v, err := e.svc.Get(ctx, id); err != nil || v.State != store.StateSuspended {
		t.Fatalf("after a suspend: %v %+v", err, v)
	} else if _, ok := e.s.Reach(ctx, v); ok {
		t.Fatal("a suspended sandbox without autoResume was reached")
	}
	if v, err := e.svc.Wake(ctx, id); err != nil || v.State != store.StateRunning {
		t.Fatalf("wake: %v %+v", err, v)
	}
	route()
}
