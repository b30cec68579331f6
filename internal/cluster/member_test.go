package cluster

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/pgtest"
	"github.com/agentvm/agentvm/internal/store"
)

type record struct {
	mu      sync.Mutex
	fences  []string
	fenceAt []time.Time
	rejoins []int64
}

func (r *record) fence(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fences, r.fenceAt = append(r.fences, reason), append(r.fenceAt, time.Now())
}

func (r *record) rejoined(_ context.Context, n *store.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejoins = append(r.rejoins, n.Generation)
}

func (r *record) counts() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.fences), len(r.rejoins)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A member renews its lease; when the database stops answering it fences
// the node before the lease it last renewed runs out, joins again (a new
// generation) once the database is back, fences again when another
// process takes its node over, and leaves when it stops.
func TestMemberLeaseFenceRejoin(t *testing.T) {
	pg := pgtest.StartT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const ttl = 8 * time.Second
	r := &record{}
	m, err := Join(ctx, Config{Store: st, Node: store.Node{ID: "id-a", Name: "a", Address: "127.0.0.1:1"}, TTL: ttl,
		Fence: r.fence, Rejoined: r.rejoined, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if m.Node().Generation != 1 {
		t.Fatalf("generation %d", m.Node().Generation)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); m.Run(rctx) }()

	// A renewal moves the lease on.
	first, err := st.GetNode(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	var renewed *store.Node
	waitFor(t, "a renewal", func() bool {
		renewed, err = st.GetNode(ctx, "a")
		return err == nil && renewed.LeaseExpires.After(first.LeaseExpires)
	})

	if f, _ := r.counts(); f != 0 {
		t.Fatalf("fenced while the database answered: %v", r.fences)
	}
	// The database stops answering: the node fences itself in time.
	if err := pg.Freeze(); err != nil {
		t.Fatal(err)
	}
	frozeAt := time.Now()
	waitFor(t, "the fence", func() bool { f, _ := r.counts(); return f == 1 })
	r.mu.Lock()
	fencedAt, reason := r.fenceAt[0], r.fences[0]
	r.mu.Unlock()
	// The lease can run out no earlier than TTL after the last renewal
	// the database answered, which started before frozeAt.
	if latest := frozeAt.Add(ttl); !fencedAt.After(frozeAt) || !fencedAt.Before(latest) || !strings.Contains(reason, "could not be renewed") {
		t.Fatalf("fenced at %v (%q), the lease may have run out by %v", fencedAt, reason, latest)
	}
	if m.Fenced() == "" {
		t.Fatal("the member does not say it is fenced")
	}
	if err := pg.Thaw(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rejoin", func() bool { _, j := r.counts(); return j == 1 && m.Fenced() == "" })
	if g := m.Node().Generation; g != 2 {
		t.Fatalf("generation after the rejoin: %d", g)
	}

	// Another process joins as this node: this one has lost it.
	if _, err := st.JoinNode(ctx, &store.Node{ID: "id-a", Name: "a", Address: "127.0.0.1:2"}, ttl); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the fence of a lost lease", func() bool { f, _ := r.counts(); return f == 2 })
	r.mu.Lock()
	reason = r.fences[1]
	r.mu.Unlock()
	if !strings.Contains(reason, "lost") {
		t.Fatalf("reason: %q", reason)
	}
	waitFor(t, "the second rejoin", func() bool { _, j := r.counts(); return j == 2 && m.Fenced() == "" })
	if g := m.Node().Generation; g != 4 {
		t.Fatalf("generation: %d", g)
	}

	stop()
	<-done
	n, err := st.GetNode(ctx, "a")
	if err != nil || n.Alive {
		t.Fatalf("after leaving: %+v %v", n, err)
	}
}
