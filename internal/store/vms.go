package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// VM is the persisted record of one VM.
type VM struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	State          State             `json:"state"`
	CPUs           int               `json:"cpus"`
	MemoryMiB      int64             `json:"memory_mib"`
	DiskBytes      int64             `json:"disk_bytes"`
	Labels         map[string]string `json:"labels,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	NetIndex       int               `json:"net_index"`
	PID            int               `json:"pid,omitempty"`
	Template       string            `json:"template,omitempty"`
	MachineID      string            `json:"machine_id,omitempty"`
	Error          string            `json:"error,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	StartedAt      *time.Time        `json:"started_at,omitempty"`
	CreateMs       int64             `json:"create_ms,omitempty"`
	// Image is the image the VM was made from ("" is the default image).
	Image string `json:"image,omitempty"`
	// ColdBoot is set once the VM has been booted from its disk (after a stop):
	// its RAM is no longer the template's.
	ColdBoot bool `json:"cold_boot,omitempty"`
	// Disk is the writable top of the VM's disk chain; empty means vms/<id>/disk.qcow2.
	Disk string `json:"disk,omitempty"`
	// Layers are the frozen disk layers (under <data dir>/layers) this VM's chain uses.
	Layers []string `json:"layers,omitempty"`
	// Source is the snapshot or parent VM a VM was made from, if any.
	Source string `json:"source,omitempty"`
	// Layout is the QEMU device set of the VM's running or saved state
	// (qemu.Config.Layout): "" is qemu.CPUHotplugDeviceSet, the one of
	// records written before the device sets were named here.
	Layout string `json:"layout,omitempty"`
	// HotMemoryMiB is the part of MemoryMiB plugged live through the
	// virtio-mem device (a restore needs it; a boot from disk folds it
	// into the boot memory).
	HotMemoryMiB int64 `json:"hot_memory_mib,omitempty"`
	// SavedBy is the QEMU that wrote a suspended VM's state (nil for
	// states written before it was recorded).
	SavedBy *SavedBy `json:"saved_by,omitempty"`
	// NextCPUs and NextMemoryMiB, when set, apply at the next start.
	NextCPUs      int   `json:"next_cpus,omitempty"`
	NextMemoryMiB int64 `json:"next_memory_mib,omitempty"`
	// ResumeOnStart marks a VM the server suspended at its own shutdown.
	ResumeOnStart bool `json:"resume_on_start,omitempty"`
	// IdleTimeoutSec suspends the VM after that long without activity, and
	// DeleteAfterSec deletes it that long after its creation (0 = never).
	IdleTimeoutSec int64 `json:"idle_timeout_s,omitempty"`
	DeleteAfterSec int64 `json:"delete_after_s,omitempty"`
	// Restart is the restart policy: never (default), on-failure, always.
	Restart string `json:"restart,omitempty"`
	// Network is the private network the VM is on ("" = none).
	Network string `json:"network,omitempty"`
	// Egress is the VM's own egress policy (nil = its network's, else public).
	Egress *Egress `json:"egress,omitempty"`
	// Node is the id of the cluster node the VM runs on ("" outside a cluster).
	Node string `json:"node,omitempty"`
	// StoredAt and StoredManifest: a suspended VM whose state (memory and
	// whole disk chain) is in the object store under the manifest of that
	// SHA-256, from where another node can wake it once its node is lost.
	// Any change of state makes them stale; the VM service clears them.
	StoredAt       time.Time `json:"stored_at,omitempty"`
	StoredManifest string    `json:"stored_manifest,omitempty"`
}

// vmCols are the vms table's columns, the key first; vmArgs and scanVM
// follow their order. The JSON tags of VM are the form of the records
// before migration 6 (fillColumns reads them).
const vmCols = vmCols6 + `, stored_at, stored_manifest`

// vmCols6 are the columns of vms at schema 6 (see snapshotCols6).
const vmCols6 = `id, name, state, cpus, memory_mib, disk_bytes, labels, env, net_index, pid, template, machine_id, error, idempotency_key, created_at, started_at, create_ms, image, cold_boot, disk, layers, source, layout, hot_memory_mib, saved_by, next_cpus, next_memory_mib, resume_on_start, idle_timeout_s, delete_after_s, restart, network, egress, node_id`

var vmQ = queriesFor("vms", vmCols)

func vmArgs(v *VM) []any {
	return []any{v.ID, v.Name, string(v.State), v.CPUs, v.MemoryMiB, v.DiskBytes, jsonText(v.Labels), jsonText(v.Env),
		v.NetIndex, v.PID, v.Template, v.MachineID, v.Error, nullable(v.IdempotencyKey), nanos(v.CreatedAt), nullNanos(v.StartedAt),
		v.CreateMs, v.Image, v.ColdBoot, v.Disk, jsonText(v.Layers), v.Source, v.Layout, v.HotMemoryMiB, jsonText(v.SavedBy),
		v.NextCPUs, v.NextMemoryMiB, v.ResumeOnStart, v.IdleTimeoutSec, v.DeleteAfterSec, v.Restart, v.Network, jsonText(v.Egress), v.Node,
		nanos(v.StoredAt), v.StoredManifest}
}

func scanVM(sc scanner) (*VM, error) {
	var v VM
	var state, labels, env, layers, savedBy, egress string
	var key sql.NullString
	var created, stored int64
	var started sql.NullInt64
	err := sc.Scan(&v.ID, &v.Name, &state, &v.CPUs, &v.MemoryMiB, &v.DiskBytes, &labels, &env,
		&v.NetIndex, &v.PID, &v.Template, &v.MachineID, &v.Error, &key, &created, &started,
		&v.CreateMs, &v.Image, &v.ColdBoot, &v.Disk, &layers, &v.Source, &v.Layout, &v.HotMemoryMiB, &savedBy,
		&v.NextCPUs, &v.NextMemoryMiB, &v.ResumeOnStart, &v.IdleTimeoutSec, &v.DeleteAfterSec, &v.Restart, &v.Network, &egress, &v.Node,
		&stored, &v.StoredManifest)
	if err != nil {
		return nil, err
	}
	v.State, v.IdempotencyKey = State(state), key.String
	v.CreatedAt, v.StartedAt, v.StoredAt = fromNanos(created), fromNullNanos(started), fromNanos(stored)
	if err := jsonCols("vm "+v.ID, labels, &v.Labels, env, &v.Env, layers, &v.Layers, savedBy, &v.SavedBy, egress, &v.Egress); err != nil {
		return nil, err
	}
	return &v, nil
}

// ErrNodeFull refuses a VM its cluster node has no room for.
var ErrNodeFull = errors.New("the node has no room for the VM")

// holding lists the states in which a VM holds its memory on its node.
const holding = `('creating', 'running', 'paused', 'pool')`

// heldMiB is the SQL for the memory the VMs of node n.id hold there (the
// query names its nodes row n).
const heldMiB = `COALESCE((SELECT SUM(v.memory_mib) FROM vms v WHERE v.node_id = n.id AND v.state IN ` + holding + `), 0)`

// CreateVM inserts a new VM; ErrConflict if its name, idempotency key or
// network index is taken. A VM of a cluster node is a reservation of that
// node's memory: in one transaction, with the node's row locked so that
// concurrent creates on it take turns, the memory of the VMs holding
// theirs there plus this one's must fit in the node's (ErrNodeFull).
func (s *Store) CreateVM(ctx context.Context, v *VM) error {
	if !s.pg || v.Node == "" {
		_, err := s.exec(ctx, vmQ.insert, vmArgs(v)...)
		return mapErr(err)
	}
	args := vmArgs(v)
	if badText(args) {
		return ErrBadText
	}
	var tx *sql.Tx
	err := s.retry(ctx, func() (err error) {
		tx, err = s.db.BeginTx(ctx, nil)
		return err
	})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var capacity, used int64
	err = tx.QueryRowContext(ctx, rebind(`SELECT memory_mib FROM nodes WHERE id = ? FOR UPDATE`), v.Node).Scan(&capacity)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if err == nil && capacity > 0 {
		// A statement of its own, after the lock: one that took the lock
		// and summed too would sum what it saw before it waited for the
		// lock, and miss the create that held it.
		if err := tx.QueryRowContext(ctx, rebind(`SELECT `+heldMiB+` FROM nodes n WHERE n.id = ?`), v.Node).Scan(&used); err != nil {
			return err
		}
		if used+v.MemoryMiB > capacity {
			return fmt.Errorf("%w: %d MiB asked, %d of its %d MiB are held by its VMs", ErrNodeFull, v.MemoryMiB, used, capacity)
		}
	}
	if _, err := tx.ExecContext(ctx, rebind(vmQ.insert), args...); err != nil {
		return mapErr(err)
	}
	err = tx.Commit()
	s.wrote()
	return err
}

// UpdateVM replaces a VM's record.
func (s *Store) UpdateVM(ctx context.Context, v *VM) error {
	r, err := s.exec(ctx, vmQ.update, updateArgs(vmArgs(v))...)
	if err != nil {
		return mapErr(err)
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// DeleteVM removes a VM's record.
func (s *Store) DeleteVM(ctx context.Context, id string) error {
	_, err := s.exec(ctx, `DELETE FROM vms WHERE id=?`, id)
	return err
}

func (s *Store) one(ctx context.Context, where string, arg any) (*VM, error) {
	v, err := scanVM(s.queryRow(ctx, vmQ.list+` WHERE `+where, arg))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return v, err
}

// GetVM finds a VM by id, or by name (from the read cache when it may:
// for routing; see GetVMFresh).
func (s *Store) GetVM(ctx context.Context, idOrName string) (*VM, error) {
	return s.getVM(ctx, idOrName, true)
}

// GetVMFresh is GetVM from the database (on PostgreSQL; on SQLite the
// cache is exact and serves it too): for what decides or changes the
// VM (its node, an operation's record), which on PostgreSQL must see
// another node's write at once (cache.go).
func (s *Store) GetVMFresh(ctx context.Context, idOrName string) (*VM, error) {
	return s.getVM(ctx, idOrName, false)
}

func (s *Store) getVM(ctx context.Context, idOrName string, fromCache bool) (*VM, error) {
	gen, cached := s.cache.begin()
	if cached && (fromCache || !s.pg) { // on SQLite, this process the only writer, the cache is exact
		if v := s.cache.vm(idOrName); v != nil {
			return v, nil
		}
	}
	v, err := s.one(ctx, `id=?`, idOrName)
	if errors.Is(err, ErrNotFound) {
		v, err = s.one(ctx, `name=?`, idOrName)
	}
	if err == nil && cached {
		s.cache.putVM(gen, v)
	}
	return v, err
}

// GetVMByIdempotencyKey finds the VM created with key.
func (s *Store) GetVMByIdempotencyKey(ctx context.Context, key string) (*VM, error) {
	return s.one(ctx, `idempotency_key=?`, key)
}

// ListVMs returns all VMs, oldest first.
func (s *Store) ListVMs(ctx context.Context) ([]*VM, error) {
	rows, err := s.query(ctx, vmQ.list+` ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*VM
	for rows.Next() {
		v, err := scanVM(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// FreeNetIndex returns the smallest network index not used by any VM.
func (s *Store) FreeNetIndex(ctx context.Context) (int, error) {
	rows, err := s.query(ctx, `SELECT net_index FROM vms ORDER BY net_index`)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	next := 1
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return 0, err
		}
		if i == next {
			next++
		} else if i > next {
			break
		}
	}
	return next, rows.Err()
}
