package store

import (
	"context"
	"maps"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
)

// The records every request reads to find its way (a VM by id or name,
// whether it is an E2B sandbox, its ports) are served from memory: a
// preview or envd request then reads the database only to authorize
// (tokens), not to route. The cache holds what the database says:
//
//   - Every write to a cached table through this Store empties it, after
//     the write (exec does it for every statement that names one, so no
//     write can forget to). A read stores what it read only if no write
//     began meanwhile (the generation is unchanged), so a read that raced a
//     write never stores the old row after the write emptied the cache.
//   - On SQLite this process is the only writer (the data dir's flock): the
//     cache always serves. On PostgreSQL other nodes write too: a trigger
//     on each cached table sends a notification (cacheNotice) at the commit
//     of every statement that writes it, which empties the cache of every
//     node listening, and the cache serves only while this node listens
//     (Listen), emptied when it starts listening. What another node wrote
//     can so show here a notification's delivery late (a millisecond or
//     so): that is for routing. What decides or changes a VM (which node
//     owns it, an operation's record, a sandbox's end) reads the database
//     (GetVMFresh, GetSandboxFresh), and the moves between nodes (adopt,
//     revive, move, forget) are conditional statements besides.
//
// Returned records are copies: callers change theirs freely.

// cacheNotice is the notification (on NotifyChannel) a write to a cached
// table sends on PostgreSQL; Listen empties the cache when it hears one and
// does not pass it on.
const cacheNotice = "store:changed"

// cachedTables names the tables whose rows the cache holds.
var cachedTables = regexp.MustCompile(`(?i)\b(vms|sandboxes|ports)\b`)

// cacheLimit bounds the cache: past it, it starts again empty (names that
// do not exist are never cached; this bounds what the existing ones take).
const cacheLimit = 20000

type readCache struct {
	mu        sync.Mutex
	gen       uint64
	local     bool // SQLite: this process is the only writer
	listening int  // PostgreSQL: Listen calls that listen now
	vms       map[string]*VM
	sandboxes map[string]*Sandbox // nil: the VM is no sandbox
	ports     map[string][]*Port
	reads     atomic.Int64 // statements that read the database (Reads)
}

func newReadCache(local bool) *readCache {
	c := &readCache{local: local}
	c.reset()
	return c
}

// reset empties the cache; mu is held (or the cache is new).
func (c *readCache) reset() {
	c.gen++
	c.vms = map[string]*VM{}
	c.sandboxes = map[string]*Sandbox{}
	c.ports = map[string][]*Port{}
}

// changed empties the cache after a write (or a notification of one).
func (c *readCache) changed() {
	c.mu.Lock()
	c.reset()
	c.mu.Unlock()
}

// begin starts a read: the generation to store under, and whether the
// cache may serve reads at all.
func (c *readCache) begin() (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen, c.local || c.listening > 0
}

// listen counts a Listen that starts (+1) or ends (-1) listening; either
// empties the cache.
func (c *readCache) listen(d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listening += d
	c.reset()
}

func (c *readCache) vm(key string) *VM {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := c.vms[key]; v != nil {
		return v.clone()
	}
	return nil
}

// putVM stores v under its id and its name, if no write began since gen.
func (c *readCache) putVM(gen uint64, v *VM) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if len(c.vms)+len(c.sandboxes)+len(c.ports) > cacheLimit {
		c.reset()
		return
	}
	v = v.clone()
	c.vms[v.ID] = v
	c.vms[v.Name] = v
}

func (c *readCache) sandbox(vmID string) (sb *Sandbox, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb, known = c.sandboxes[vmID]
	if sb != nil {
		sb = sb.clone()
	}
	return sb, known
}

func (c *readCache) putSandbox(gen uint64, vmID string, sb *Sandbox) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if sb != nil {
		sb = sb.clone()
	}
	c.sandboxes[vmID] = sb
}

func (c *readCache) portsOf(vmID string) ([]*Port, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps, ok := c.ports[vmID]
	return clonePorts(ps), ok
}

func (c *readCache) putPorts(gen uint64, vmID string, ps []*Port) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	c.ports[vmID] = clonePorts(ps)
}

// clone is a deep copy of v. TestVMClone fails when VM gains a field of a
// reference type this does not copy.
func (v *VM) clone() *VM {
	c := *v
	c.Labels, c.Env, c.Layers = maps.Clone(v.Labels), maps.Clone(v.Env), slices.Clone(v.Layers)
	if v.StartedAt != nil {
		t := *v.StartedAt
		c.StartedAt = &t
	}
	if v.SavedBy != nil {
		sb := *v.SavedBy
		c.SavedBy = &sb
	}
	if v.Egress != nil {
		e := *v.Egress
		e.Allow, e.AllowHost = slices.Clone(v.Egress.Allow), slices.Clone(v.Egress.AllowHost)
		c.Egress = &e
	}
	return &c
}

func (sb *Sandbox) clone() *Sandbox {
	c := *sb
	c.Metadata = maps.Clone(sb.Metadata)
	return &c
}

func clonePorts(ps []*Port) []*Port {
	if ps == nil {
		return nil
	}
	out := make([]*Port, len(ps))
	for i, p := range ps {
		c := *p
		out[i] = &c
	}
	return out
}

// wrote empties the cache after a write to a cached table. On PostgreSQL
// the write's own trigger tells every listening node, this one too
// (migration 10).
func (s *Store) wrote() { s.cache.changed() }

// vmExists reports whether a VM has id (from the cache when it holds it).
func (s *Store) vmExists(ctx context.Context, id string) bool {
	s.cache.mu.Lock()
	v := s.cache.vms[id]
	s.cache.mu.Unlock()
	if v != nil && v.ID == id {
		return true
	}
	var one int
	return s.queryRow(ctx, `SELECT 1 FROM vms WHERE id=?`, id).Scan(&one) == nil
}

// Reads counts the statements that read the database since it was opened
// (the cache's tests and benchmarks count what a request costs).
func (s *Store) Reads() int64 { return s.cache.reads.Load() }
