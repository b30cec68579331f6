package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/cluster"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// Cluster mode (serve --cluster): this daemon is a node of the cluster
// whose database is the PostgreSQL store. It joins with its data dir's
// identity, runs only the VMs recorded on it, renews its lease and fences
// itself (every VM killed) when it cannot (internal/cluster).

// clusterNode is what this host tells the cluster about itself.
func (s *Server) clusterNode(id, qemuVersion string) (store.Node, error) {
	name := s.cfg.NodeName
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return store.Node{}, fmt.Errorf("--node-name: %w", err)
		}
		name = h
	}
	if err := vm.ValidateName(name); err != nil {
		return store.Node{}, fmt.Errorf("--node-name %q: %w", name, err)
	}
	addr := s.cfg.Advertise
	if addr == "" {
		addr = s.ln.Addr().String()
	}
	total, _, _ := meminfo()
	return store.Node{ID: id, Name: name, Address: addr, CPUs: runtime.NumCPU(), MemoryMiB: total >> 20,
		QEMUVersion: qemuVersion, MachineType: qemu.MachineType, CPUModel: qemu.CPUModel(s.accel), Accel: s.accel}, nil
}

// joinCluster joins before the VMs are reconciled, and keeps the lease
// from then on (leaveCluster ends it): a slow start-up must not let it
// run out unwatched. The VMs of the daemon that used this database before
// it became a cluster (this data dir, the recorded owner) join this node.
func (s *Server) joinCluster(ctx context.Context, n store.Node) error {
	m, err := cluster.Join(ctx, cluster.Config{Store: s.store, Node: n, TTL: s.cfg.LeaseTTL, Log: s.log,
		Fence: s.svc.Fence,
		Rejoined: func(ctx context.Context, _ *store.Node) {
			if err := s.svc.Unfence(ctx); err != nil {
				s.log.Error("record the fence's effects; the node stays fenced", "err", err)
			}
		}})
	if err != nil {
		return err
	}
	s.member = m
	mctx, stop := context.WithCancel(context.Background())
	s.memberStop, s.memberDone = stop, make(chan struct{})
	go func() { defer close(s.memberDone); m.Run(mctx) }()
	if k, err := s.store.AdoptVMs(ctx, n.ID, n.ID); err != nil {
		return fmt.Errorf("bring this data dir's VMs into the cluster: %w", err)
	} else if k > 0 {
		s.log.Info("this data dir's VMs joined its node", "vms", k)
	}
	return nil
}

// hearNodes listens for what the other nodes tell (revokes and deletes
// whose connections may be open here) until ctx ends; after every
// (re)start of listening it ends what it missed meanwhile.
func (s *Server) hearNodes(ctx context.Context) {
	resync := func() {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := s.tokens.Resync(rctx); err != nil {
			s.log.Warn("check tracked tokens against the store", "err", err)
		}
	}
	wait := time.Second
	for ctx.Err() == nil {
		start := time.Now()
		err := s.store.Listen(ctx, resync, resync, s.tokens.Heard)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			wait = time.Second // it listened a while: not the same outage
		}
		s.log.Warn("listening to the other nodes failed; again soon", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// broadcast is auth's SetBroadcast: a NOTIFY to the other nodes, bounded
// in time (the revoke it reports is already done) and logged when it fails.
func (s *Server) broadcast(ctx context.Context, msg string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := s.store.Notify(ctx, msg)
	if err != nil {
		s.log.Warn("tell the other nodes; they catch up within a minute", "msg", msg, "err", err)
	}
	return err
}

// nodeLost is vm.Config.NodeLost: node id's lease ran out, or the node
// was removed.
func (s *Server) nodeLost(ctx context.Context, id string) (bool, error) {
	n, err := s.store.GetNode(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return !n.Alive, nil
}

// leaveCluster stops renewing the lease and gives it up (once).
func (s *Server) leaveCluster() {
	if s.memberStop == nil {
		return
	}
	s.memberStop()
	<-s.memberDone
	s.memberStop = nil
}

func (s *Server) nodeToAPI(n *store.Node) api.Node {
	return api.Node{ID: n.ID, Name: n.Name, Address: n.Address, PeerAddress: n.PeerAddress, Generation: n.Generation, Alive: n.Alive,
		LeaseExpires: n.LeaseExpires.UTC(), LeaseLeftMs: n.LeaseLeft.Milliseconds(), JoinedAt: n.JoinedAt.UTC(),
		Self: s.member != nil && s.member.Node().ID == n.ID,
		CPUs: n.CPUs, MemoryMiB: n.MemoryMiB, QEMUVersion: n.QEMUVersion, MachineType: n.MachineType, CPUModel: n.CPUModel, Accel: n.Accel, Draining: n.Draining}
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	ns, err := s.store.ListNodes(r.Context())
	if errors.Is(err, store.ErrNoCluster) {
		writeError(w, http.StatusConflict, api.CodeConflict, "this agentvm is not a cluster node: start it with serve --cluster --store postgres://...")
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ListNodesResponse{Nodes: []api.Node{}}
	for _, n := range ns {
		out.Nodes = append(out.Nodes, s.nodeToAPI(n))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) removeNode(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("node")
	err := s.store.RemoveNode(r.Context(), ref)
	switch {
	case errors.Is(err, store.ErrNoCluster):
		writeError(w, http.StatusConflict, api.CodeConflict, "this agentvm is not a cluster node")
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no node %q", ref))
	case errors.Is(err, store.ErrConflict):
		writeError(w, http.StatusConflict, api.CodeConflict, strings.TrimPrefix(err.Error(), store.ErrConflict.Error()+": "))
	case err != nil:
		writeErr(w, err)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// nodeSummary is what a VM listing shows of a node.
type nodeSummary struct {
	name  string
	alive bool
	peer  string // its peer listener's address
}

// nodeSummaries maps node ids to names and liveness (nil outside a cluster).
func (s *Server) nodeSummaries(ctx context.Context) map[string]nodeSummary {
	if s.member == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ns, err := s.store.ListNodes(ctx)
	if err != nil {
		return nil
	}
	out := make(map[string]nodeSummary, len(ns))
	for _, n := range ns {
		out[n.ID] = nodeSummary{n.Name, n.Alive, n.PeerAddress}
	}
	return out
}

// nodeCache holds the nodes for VM listings, read again from the store
// at most every two seconds (outside its lock: concurrent readers may
// each read it once).
type nodeCache struct {
	mu    sync.Mutex
	nodes map[string]nodeSummary
	at    time.Time
}

// invalidate makes the next reader read the nodes again.
func (c *nodeCache) invalidate() {
	c.mu.Lock()
	c.at = time.Time{}
	c.mu.Unlock()
}

// lookup returns node id as get does, and whether it is known; a node
// the cache does not have makes it read the nodes again (a node that
// just joined).
func (c *nodeCache) lookup(s *Server, id string) (nodeSummary, bool) {
	c.mu.Lock()
	n, ok := c.nodes[id]
	c.mu.Unlock()
	if ok {
		return c.get(s, id), true
	}
	if m := s.nodeSummaries(context.Background()); m != nil {
		c.mu.Lock()
		c.nodes, c.at = m, time.Now()
		n, ok = m[id]
		c.mu.Unlock()
	}
	return n, ok
}

// get returns node id's name (the id when unknown) and whether it is
// alive (a node this one does not know of counts as alive: nothing says
// it is gone).
func (c *nodeCache) get(s *Server, id string) nodeSummary {
	c.mu.Lock()
	stale := time.Since(c.at) > 2*time.Second
	if stale {
		c.at = time.Now() // one reader refreshes; the others use what is there
	}
	c.mu.Unlock()
	if stale {
		if m := s.nodeSummaries(context.Background()); m != nil {
			c.mu.Lock()
			c.nodes = m
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.nodes[id]; ok {
		return n
	}
	return nodeSummary{name: id, alive: true}
}
