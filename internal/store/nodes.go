package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ErrLeaseLost means a node's lease is no longer its own: another process
// joined as the node since (a newer generation), or the node was removed.
var ErrLeaseLost = errors.New("the node's lease is lost")

// ErrNoCluster means the store cannot hold a cluster (SQLite).
var ErrNoCluster = errors.New("a cluster needs a PostgreSQL store (serve --store postgres://...)")

// Node is a cluster member: a host running agentvm serve --cluster on the
// cluster's database.
type Node struct {
	ID      string `json:"id"`      // the node's data dir identity
	Name    string `json:"name"`    // unique in the cluster
	Address string `json:"address"` // where clients reach its API
	// PeerAddress is where other nodes reach it: its node-to-node
	// listener, TLS with certificates of the cluster's CA both ways.
	PeerAddress string `json:"peer_address"`
	// Generation grows by one at every join: a process holding an older
	// one has lost the node.
	Generation   int64     `json:"-"`
	LeaseExpires time.Time `json:"-"`
	JoinedAt     time.Time `json:"-"`
	// Alive says the lease had not run out at the database's clock when
	// the node was read; LeaseLeft is how long it had left (negative: how
	// long ago it ran out).
	Alive     bool          `json:"-"`
	LeaseLeft time.Duration `json:"-"`
	// Capacity and compatibility: what VMs the node can run and which
	// saved states it can restore.
	CPUs        int    `json:"cpus"`
	MemoryMiB   int64  `json:"memory_mib"`
	QEMUVersion string `json:"qemu_version"`
	MachineType string `json:"machine_type"`
	CPUModel    string `json:"cpu_model"`
	Accel       string `json:"accel"`
	// Draining: the node takes no new VMs and hands its VMs to others
	// (agentvm node drain), until it joins again.
	Draining bool `json:"draining,omitempty"`
}

func (s *Store) needCluster() error {
	if !s.pg {
		return ErrNoCluster
	}
	return nil
}

// JoinNode registers n (or registers it again after a restart or a lost
// lease) with a lease of ttl from the database's now, and returns the
// node with its new generation. A name held by another node id is refused
// with ErrConflict.
func (s *Store) JoinNode(ctx context.Context, n *Node, ttl time.Duration) (*Node, error) {
	if err := s.needCluster(); err != nil {
		return nil, err
	}
	if n.ID == "" || n.Name == "" {
		return nil, errors.New("a node needs an id and a name")
	}
	var gen int64
	var exp, joined time.Time
	err := s.queryRow(ctx, `INSERT INTO nodes (id, name, address, peer_address, generation, lease_expires, joined_at,
	cpus, memory_mib, qemu_version, machine_type, cpu_model, accel)
VALUES (?, ?, ?, ?, 1, now() + make_interval(secs => ?), now(), ?, ?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET name = excluded.name, address = excluded.address, peer_address = excluded.peer_address,
	generation = nodes.generation + 1, lease_expires = excluded.lease_expires, joined_at = excluded.joined_at,
	cpus = excluded.cpus, memory_mib = excluded.memory_mib, qemu_version = excluded.qemu_version,
	machine_type = excluded.machine_type, cpu_model = excluded.cpu_model, accel = excluded.accel, draining = false
RETURNING generation, lease_expires, joined_at`, n.ID, n.Name, n.Address, n.PeerAddress, ttl.Seconds(),
		n.CPUs, n.MemoryMiB, n.QEMUVersion, n.MachineType, n.CPUModel, n.Accel).Scan(&gen, &exp, &joined)
	if err != nil {
		if errors.Is(mapErr(err), ErrConflict) {
			return nil, fmt.Errorf("%w: another node is named %q", ErrConflict, n.Name)
		}
		return nil, err
	}
	out := *n
	out.Generation, out.LeaseExpires, out.JoinedAt, out.Alive, out.LeaseLeft = gen, exp, joined, true, ttl
	return &out, nil
}

// RenewLease extends the lease of node id at generation gen to ttl from
// the database's now and returns when it runs out; ErrLeaseLost when the
// node is at another generation, gone, or its lease has already run out
// (a lease that ran out is never brought back: the node joins again).
func (s *Store) RenewLease(ctx context.Context, id string, gen int64, ttl time.Duration) (time.Time, error) {
	if err := s.needCluster(); err != nil {
		return time.Time{}, err
	}
	var exp time.Time
	err := s.queryRow(ctx, `UPDATE nodes SET lease_expires = now() + make_interval(secs => ?)
WHERE id = ? AND generation = ? AND lease_expires > now() RETURNING lease_expires`, ttl.Seconds(), id, gen).Scan(&exp)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, ErrLeaseLost
	}
	return exp, err
}

// LeaveNode ends the lease of node id at generation gen now (a clean
// shutdown); the node stays listed, not alive.
func (s *Store) LeaveNode(ctx context.Context, id string, gen int64) error {
	if err := s.needCluster(); err != nil {
		return err
	}
	_, err := s.exec(ctx, `UPDATE nodes SET lease_expires = now() WHERE id = ? AND generation = ?`, id, gen)
	return err
}

// RemoveNode deletes a node that is not alive and has no VMs; ErrConflict
// while its lease runs or VMs are recorded on it (they would belong to
// no node).
func (s *Store) RemoveNode(ctx context.Context, idOrName string) error {
	if err := s.needCluster(); err != nil {
		return err
	}
	r, err := s.exec(ctx, `DELETE FROM nodes WHERE (id = ? OR name = ?) AND lease_expires <= now()
AND NOT EXISTS (SELECT 1 FROM vms WHERE vms.node_id = nodes.id)`, idOrName, idOrName)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		node, err := s.GetNode(ctx, idOrName)
		if err != nil {
			return err
		}
		if node.Alive {
			return fmt.Errorf("%w: node %s is alive (its lease runs): stop it first", ErrConflict, node.Name)
		}
		return fmt.Errorf("%w: VMs are recorded on node %s: delete them first", ErrConflict, node.Name)
	}
	return nil
}

// AdoptVMs records on node id the VMs (and snapshots) of no node, when owner is the data
// dir recorded as the database's owner (ClaimOwner): the VMs of the daemon
// that used the database before it became a cluster node. It returns how
// many it adopted.
func (s *Store) AdoptVMs(ctx context.Context, owner, id string) (int, error) {
	var have string
	err := s.queryRow(ctx, `SELECT value FROM meta WHERE key = 'owner'`).Scan(&have)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && have != owner) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	vms, err := s.ListVMs(ctx)
	if err != nil {
		return 0, err
	}
	// Its snapshots' files are in the same data dir.
	if _, err := s.exec(ctx, `UPDATE snapshots SET node_id = ? WHERE node_id = ''`, id); err != nil {
		return 0, err
	}
	n := 0
	for _, v := range vms {
		if v.Node != "" {
			continue
		}
		v.Node = id
		if err := s.UpdateVM(ctx, v); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// nodeLost is true in a statement while the node its argument names holds
// no lease that runs (it ran out, or the node is gone), by the database's
// clock.
const nodeLost = `NOT EXISTS (SELECT 1 FROM nodes WHERE id = ? AND lease_expires > now())`

// ForgetVM deletes the record of VM id of node, in one statement only
// while that node's lease has run out (or the node is gone): a node that
// comes back meanwhile keeps its VM (ErrConflict). SQLite has no leases:
// there it is a delete of that node's VM.
func (s *Store) ForgetVM(ctx context.Context, id, node string) error {
	q, args := `DELETE FROM vms WHERE id = ? AND node_id = ? AND `+nodeLost, []any{id, node, node}
	if !s.pg { // no leases outside a cluster
		q, args = `DELETE FROM vms WHERE id = ? AND node_id = ?`, args[:2]
	}
	r, err := s.exec(ctx, q, args...)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: VM %s is no longer a lost node's (its node is back, or it is gone)", ErrConflict, id)
	}
	return nil
}

// SetDraining marks node id draining (no new VMs go to it); a node that
// joins again is no longer draining.
func (s *Store) SetDraining(ctx context.Context, id string) error {
	if err := s.needCluster(); err != nil {
		return err
	}
	return s.updateOne(ctx, fmt.Errorf("%w: no node %q", ErrNotFound, id), `UPDATE nodes SET draining = true WHERE id = ?`, id)
}

// Room is a live node and the memory it has left for new VMs.
type Room struct {
	Node    string
	FreeMiB int64
	// Shared: a VM holding its memory there has the label value the
	// placement avoids (Avoid).
	Shared bool
}

// Avoid names a label value a new VM would rather not share a node with
// (anti-affinity); the zero value avoids nothing.
type Avoid struct{ Key, Value string }

// Rooms lists the live nodes with at least memMiB of memory not held by
// their VMs: first those where no such VM has avoid's label value, then
// the others, each the roomiest first. That is where a new VM may go
// (spread); the choice is advisory, CreateVM reserves.
func (s *Store) Rooms(ctx context.Context, memMiB int64, avoid Avoid) ([]Room, error) {
	if err := s.needCluster(); err != nil {
		return nil, err
	}
	rows, err := s.query(ctx, `SELECT n.id,
	n.memory_mib - `+heldMiB+` AS free,
	(?::text <> '' AND EXISTS (SELECT 1 FROM vms v WHERE v.node_id = n.id AND v.state IN `+holding+`
		AND (CASE WHEN v.labels = '' THEN NULL ELSE v.labels::jsonb ->> ?::text END) = ?::text)) AS shared
FROM nodes n WHERE n.lease_expires > now() AND NOT n.draining ORDER BY shared, free DESC, n.id`, avoid.Key, avoid.Key, avoid.Value)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Room
	for rows.Next() {
		var r Room
		if err := rows.Scan(&r.Node, &r.FreeMiB, &r.Shared); err != nil {
			return nil, err
		}
		if r.FreeMiB >= memMiB {
			out = append(out, r)
		}
	}
	return out, rows.Err()
}

// GetNode returns one node by id or name.
func (s *Store) GetNode(ctx context.Context, idOrName string) (*Node, error) {
	ns, err := s.nodes(ctx, `WHERE id = ? OR name = ?`, idOrName, idOrName)
	if err != nil {
		return nil, err
	}
	if len(ns) == 0 {
		return nil, fmt.Errorf("%w: no node %q", ErrNotFound, idOrName)
	}
	return ns[0], nil
}

// ListNodes returns every node, by name, with whether its lease runs at
// the database's now.
func (s *Store) ListNodes(ctx context.Context) ([]*Node, error) {
	return s.nodes(ctx, "")
}

func (s *Store) nodes(ctx context.Context, where string, args ...any) ([]*Node, error) {
	if err := s.needCluster(); err != nil {
		return nil, err
	}
	rows, err := s.query(ctx, `SELECT id, name, address, peer_address, cpus, memory_mib, qemu_version, machine_type, cpu_model, accel,
	generation, lease_expires, joined_at, EXTRACT(EPOCH FROM lease_expires - now())::float8, draining
FROM nodes `+where+` ORDER BY name`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Node
	for rows.Next() {
		var n Node
		var left float64
		if err := rows.Scan(&n.ID, &n.Name, &n.Address, &n.PeerAddress, &n.CPUs, &n.MemoryMiB, &n.QEMUVersion, &n.MachineType, &n.CPUModel, &n.Accel,
			&n.Generation, &n.LeaseExpires, &n.JoinedAt, &left, &n.Draining); err != nil {
			return nil, err
		}
		n.LeaseLeft = time.Duration(left * float64(time.Second))
		n.Alive = n.LeaseLeft > 0
		out = append(out, &n)
	}
	return out, rows.Err()
}
