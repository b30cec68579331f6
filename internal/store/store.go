// Package store persists agentvm's metadata (VMs, snapshots, tokens, port
// exposures and domains, private networks, events) in SQLite or
// PostgreSQL, with numbered schema migrations (migrate.go, migrate_pg.go).
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
)

var (
	// ErrNotFound means no row matched.
	ErrNotFound = errors.New("not found")
	// ErrConflict means a unique field (name, idempotency key) is taken.
	ErrConflict = errors.New("conflict")
)

// VM is the persisted record of one VM.
type VM struct {
	ID             string            `json:"id"`
	Name           string            `json:"name"`
	State          api.State         `json:"state"`
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
	Egress *api.Egress `json:"egress,omitempty"`
	// Node is the id of the cluster node the VM runs on ("" outside a cluster).
	Node string `json:"node,omitempty"`
}

// Snapshot is a saved VM: memory and device state plus a frozen disk chain.
type Snapshot struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	VMID      string            `json:"vm_id"`
	VMName    string            `json:"vm_name"`
	CPUs      int               `json:"cpus"`
	MemoryMiB int64             `json:"memory_mib"`
	DiskBytes int64             `json:"disk_bytes"`
	Env       map[string]string `json:"env,omitempty"`
	Disk      string            `json:"disk"`   // frozen top layer
	Layers    []string          `json:"layers"` // every frozen layer of its chain
	State     string            `json:"state"`  // migration stream file
	Bytes     int64             `json:"bytes"`
	PausedMs  int64             `json:"paused_ms"`
	Key       string            `json:"key"`             // machine shape key: restores need the same
	Image     string            `json:"image,omitempty"` // the VM's image ("" is the default)
	CreatedAt time.Time         `json:"created_at"`
	// Network and Egress are the private network and the VM's own egress
	// policy when it was taken; NetworkEgress is that network's policy
	// then, which a VM made from the snapshot takes as its own only when
	// the network no longer exists (while it does, the network's current
	// policy applies, as it does to the VM).
	Network       string      `json:"network,omitempty"`
	Egress        *api.Egress `json:"egress,omitempty"`
	NetworkEgress *api.Egress `json:"network_egress,omitempty"`
	// HotMemoryMiB is the part of MemoryMiB plugged live through virtio-mem.
	HotMemoryMiB int64 `json:"hot_memory_mib,omitempty"`
	// SavedBy is the QEMU that wrote the state (nil in snapshots taken
	// before it was recorded).
	SavedBy *SavedBy `json:"saved_by,omitempty"`
}

// SavedBy names what wrote a saved memory and device state. QEMU loads the
// states of older versions of the same machine type, CPU model and device
// set (forward migration), never those of newer ones.
type SavedBy struct {
	QEMU      string `json:"qemu"` // e.g. "7.2.22"
	Machine   string `json:"machine"`
	Accel     string `json:"accel"`
	CPUModel  string `json:"cpu_model"`
	DeviceSet string `json:"device_set"`
	// HostBoot is the host's boot id at the save: states are synced to disk
	// after the save (qemu.SyncState), so one from an earlier boot that was
	// never synced may have lost writes in a host crash.
	HostBoot string `json:"host_boot,omitempty"`
}

// Store is the metadata store, in SQLite or PostgreSQL (backend.go).
type Store struct {
	db *sql.DB
	pg bool // PostgreSQL: $n placeholders
	// eventMu orders event inserts: a follower reads events by increasing
	// seq, and two PostgreSQL transactions could commit their sequence
	// numbers out of order (SQLite has one writer anyway).
	eventMu sync.Mutex
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// CreateVM inserts a new VM; ErrConflict if its name, idempotency key or network index is taken.
func (s *Store) CreateVM(ctx context.Context, v *VM) error {
	data, _ := json.Marshal(v)
	_, err := s.exec(ctx, `INSERT INTO vms (id, name, idempotency_key, net_index, state, node_id, created_at, data) VALUES (?,?,?,?,?,?,?,?)`,
		v.ID, v.Name, nullable(v.IdempotencyKey), v.NetIndex, v.State, v.Node, v.CreatedAt.UnixNano(), string(data))
	return mapErr(err)
}

// UpdateVM replaces a VM's record.
func (s *Store) UpdateVM(ctx context.Context, v *VM) error {
	data, _ := json.Marshal(v)
	r, err := s.exec(ctx, `UPDATE vms SET name=?, idempotency_key=?, net_index=?, state=?, node_id=?, data=? WHERE id=?`,
		v.Name, nullable(v.IdempotencyKey), v.NetIndex, v.State, v.Node, string(data), v.ID)
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
	var data string
	err := s.queryRow(ctx, `SELECT data FROM vms WHERE `+where, arg).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var v VM
	if err := json.Unmarshal([]byte(data), &v); err != nil {
		return nil, fmt.Errorf("decode vm: %w", err)
	}
	return &v, nil
}

// GetVM finds a VM by id, or by name.
func (s *Store) GetVM(ctx context.Context, idOrName string) (*VM, error) {
	v, err := s.one(ctx, `id=?`, idOrName)
	if errors.Is(err, ErrNotFound) {
		return s.one(ctx, `name=?`, idOrName)
	}
	return v, err
}

// GetVMByIdempotencyKey finds the VM created with key.
func (s *Store) GetVMByIdempotencyKey(ctx context.Context, key string) (*VM, error) {
	return s.one(ctx, `idempotency_key=?`, key)
}

// ListVMs returns all VMs, oldest first.
func (s *Store) ListVMs(ctx context.Context) ([]*VM, error) {
	rows, err := s.query(ctx, `SELECT data FROM vms ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*VM
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		var v VM
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			return nil, fmt.Errorf("decode vm: %w", err)
		}
		out = append(out, &v)
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

// CreateSnapshot inserts a snapshot; ErrConflict if its name is taken.
func (s *Store) CreateSnapshot(ctx context.Context, sn *Snapshot) error {
	data, _ := json.Marshal(sn)
	_, err := s.exec(ctx, `INSERT INTO snapshots (id, name, created_at, data) VALUES (?,?,?,?)`,
		sn.ID, sn.Name, sn.CreatedAt.UnixNano(), string(data))
	return mapErr(err)
}

// GetSnapshot finds a snapshot by id or name.
func (s *Store) GetSnapshot(ctx context.Context, idOrName string) (*Snapshot, error) {
	var data string
	err := s.queryRow(ctx, `SELECT data FROM snapshots WHERE id=? OR name=? ORDER BY (id=?) DESC LIMIT 1`, idOrName, idOrName, idOrName).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var sn Snapshot
	return &sn, json.Unmarshal([]byte(data), &sn)
}

// ListSnapshots returns all snapshots, oldest first.
func (s *Store) ListSnapshots(ctx context.Context) ([]*Snapshot, error) {
	rows, err := s.query(ctx, `SELECT data FROM snapshots ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Snapshot
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		var sn Snapshot
		if err := json.Unmarshal([]byte(data), &sn); err != nil {
			return nil, err
		}
		out = append(out, &sn)
	}
	return out, rows.Err()
}

// DeleteSnapshot removes a snapshot record.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := s.exec(ctx, `DELETE FROM snapshots WHERE id=?`, id)
	return err
}
