// Package cluster makes a daemon a node of a cluster whose state is in
// PostgreSQL. A node joins (which gives it a new generation), renews its
// lease, judged by the database's clock, and fences itself (its VMs
// killed) before a lease it could not renew can run out: another node may
// then be given its VMs, and none may ever run twice. After a fence it
// joins again, with a new generation, and says so (Rejoined).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

// DefaultTTL is the lease length when Config.TTL is 0.
const DefaultTTL = 15 * time.Second

// Config configures a member.
type Config struct {
	Store *store.Store
	Node  store.Node // ID and Name required; Generation is the store's
	// TTL is the lease length: renewed every TTL/3, the node fences itself
	// TTL/4 before a lease it last renewed could run out.
	TTL time.Duration
	// Fence kills every VM of the node; it must return quickly and not
	// need the store.
	Fence func(reason string)
	// Rejoined runs (in its own goroutine: the lease is renewed meanwhile,
	// and may be lost again) after the node joined again following a fence.
	Rejoined func(ctx context.Context, n *store.Node)
	Log      *slog.Logger
}

// Member is this daemon's membership.
type Member struct {
	cfg Config

	mu       sync.Mutex
	node     store.Node
	deadline time.Time // fence at this local time unless the lease is renewed first
	fenced   string    // why the node is fenced ("": it is not)
	lastErr  error     // the last failed renewal

	wg sync.WaitGroup // Rejoined calls under way
}

// Join registers the node and returns its membership; Run keeps it.
func Join(ctx context.Context, cfg Config) (*Member, error) {
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Fence == nil {
		return nil, errors.New("cluster: no fence")
	}
	m := &Member{cfg: cfg}
	start := time.Now()
	n, err := cfg.Store.JoinNode(ctx, &cfg.Node, cfg.TTL)
	if err != nil {
		return nil, fmt.Errorf("join the cluster as %s: %w", cfg.Node.Name, err)
	}
	m.node, m.deadline = *n, m.fenceAt(start)
	cfg.Log.Info("joined the cluster", "node", n.Name, "id", n.ID, "generation", n.Generation, "lease_s", cfg.TTL.Seconds())
	return m, nil
}

// fenceAt is when to fence after a renewal (or join) that started at
// start: the database set the lease to run out TTL after a moment later
// than start, so this is TTL/4 before the lease could run out.
func (m *Member) fenceAt(start time.Time) time.Time { return start.Add(m.cfg.TTL - m.cfg.TTL/4) }

// Node returns the node as last joined.
func (m *Member) Node() store.Node {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.node
}

// Fenced says why the node is fenced ("": it is not).
func (m *Member) Fenced() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fenced
}

// Run renews the lease until ctx ends, then gives it up (a clean leave).
// A watchdog fences the node when the deadline passes without a renewal,
// however long a renewal hangs.
func (m *Member) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.watch(ctx) }()
	every := m.cfg.TTL / 3
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			m.wg.Wait()
			m.leave()
			return
		case <-t.C:
		}
		if m.Fenced() != "" {
			m.rejoin(ctx)
		} else {
			m.renew(ctx)
		}
		t.Reset(every)
	}
}

func (m *Member) renew(ctx context.Context) {
	n := m.Node()
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, m.cfg.TTL/3)
	_, err := m.cfg.Store.RenewLease(rctx, n.ID, n.Generation, m.cfg.TTL)
	cancel()
	m.mu.Lock()
	if m.fenced != "" || ctx.Err() != nil || m.node.Generation != n.Generation {
		m.mu.Unlock()
		return // fenced or joined again meanwhile
	}
	if err == nil {
		m.deadline, m.lastErr = m.fenceAt(start), nil
		m.mu.Unlock()
		return
	}
	if m.lastErr == nil {
		m.cfg.Log.Warn("cannot renew the node's lease", "err", err, "fence_in", time.Until(m.deadline).Round(time.Millisecond))
	}
	m.lastErr = err
	why := ""
	if errors.Is(err, store.ErrLeaseLost) {
		why = fmt.Sprintf("the lease of generation %d was lost: it ran out, another process joined as this node, or the node was removed", n.Generation)
		m.fenced = why
	}
	m.mu.Unlock()
	if why != "" {
		m.fence(why)
	}
}

// watch fences the node once its deadline has passed.
func (m *Member) watch(ctx context.Context) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		why := ""
		m.mu.Lock()
		if m.fenced == "" && time.Now().After(m.deadline) {
			last := "no renewal"
			if m.lastErr != nil {
				last = m.lastErr.Error()
			}
			why = fmt.Sprintf("the lease could not be renewed in time (%s)", last)
			m.fenced = why
		}
		m.mu.Unlock()
		if why != "" {
			m.fence(why)
		}
	}
}

// fence fences the node: m.fenced is already set, so nothing renews the
// lease of the generation it gave up.
func (m *Member) fence(reason string) {
	m.cfg.Log.Error("fencing this node: its lease may run out", "reason", reason)
	m.cfg.Fence(reason)
}

// rejoin joins again after a fence, with a new generation.
func (m *Member) rejoin(ctx context.Context) {
	start := time.Now()
	jctx, cancel := context.WithTimeout(ctx, m.cfg.TTL/3)
	n, err := m.cfg.Store.JoinNode(jctx, &m.cfg.Node, m.cfg.TTL)
	cancel()
	if err != nil {
		return
	}
	// The new lease is watched at once: if it cannot be renewed while
	// Rejoined runs, the node fences again (and Rejoined's work is undone
	// by that fence, see vm.Service.Unfence).
	m.mu.Lock()
	m.node, m.deadline, m.lastErr, m.fenced = *n, m.fenceAt(start), nil, ""
	m.mu.Unlock()
	m.cfg.Log.Info("joined the cluster again after a fence", "node", n.Name, "generation", n.Generation)
	if m.cfg.Rejoined != nil {
		m.wg.Add(1)
		go func() { defer m.wg.Done(); m.cfg.Rejoined(ctx, n) }()
	}
}

// leave gives the lease up at once, so the cluster sees the node gone.
func (m *Member) leave() {
	n := m.Node()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.cfg.Store.LeaveNode(ctx, n.ID, n.Generation); err != nil {
		m.cfg.Log.Warn("leave the cluster", "err", err)
	}
}
