package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

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
	Network       string  `json:"network,omitempty"`
	Egress        *Egress `json:"egress,omitempty"`
	NetworkEgress *Egress `json:"network_egress,omitempty"`
	// HotMemoryMiB is the part of MemoryMiB plugged live through virtio-mem.
	HotMemoryMiB int64 `json:"hot_memory_mib,omitempty"`
	// SavedBy is the QEMU that wrote the state (nil in snapshots taken
	// before it was recorded).
	SavedBy *SavedBy `json:"saved_by,omitempty"`
	// Node is the cluster node whose data dir holds the snapshot's files
	// ("" outside a cluster).
	Node string `json:"node,omitempty"`
	// StoredAt is when its files were all in the object store, from where
	// any compatible node can restore it (zero: only its node has them).
	StoredAt time.Time `json:"stored_at,omitempty"`
	// StoredManifest is the SHA-256 of its manifest in the object store:
	// a fetch trusts the bucket's contents only through it.
	StoredManifest string `json:"stored_manifest,omitempty"`
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

// snapshotCols are the snapshots table's columns, the key first.
const snapshotCols = snapshotCols6 + `, stored_at, stored_manifest`

// snapshotCols6 are the columns of snapshots at schema 6, when the records
// were copied into columns (fillColumns).
const snapshotCols6 = `id, name, vm_id, vm_name, cpus, memory_mib, disk_bytes, env, disk, layers, state_file, bytes, paused_ms, shape_key, image, created_at, network, egress, network_egress, hot_memory_mib, saved_by, node_id`

var snapshotQ = queriesFor("snapshots", snapshotCols)

func snapshotArgs(sn *Snapshot) []any {
	return []any{sn.ID, sn.Name, sn.VMID, sn.VMName, sn.CPUs, sn.MemoryMiB, sn.DiskBytes, jsonText(sn.Env), sn.Disk, jsonText(sn.Layers),
		sn.State, sn.Bytes, sn.PausedMs, sn.Key, sn.Image, nanos(sn.CreatedAt), sn.Network, jsonText(sn.Egress), jsonText(sn.NetworkEgress),
		sn.HotMemoryMiB, jsonText(sn.SavedBy), sn.Node, nanos(sn.StoredAt), sn.StoredManifest}
}

func scanSnapshot(sc scanner) (*Snapshot, error) {
	var sn Snapshot
	var env, layers, egress, netEgress, savedBy string
	var created, stored int64
	err := sc.Scan(&sn.ID, &sn.Name, &sn.VMID, &sn.VMName, &sn.CPUs, &sn.MemoryMiB, &sn.DiskBytes, &env, &sn.Disk, &layers,
		&sn.State, &sn.Bytes, &sn.PausedMs, &sn.Key, &sn.Image, &created, &sn.Network, &egress, &netEgress,
		&sn.HotMemoryMiB, &savedBy, &sn.Node, &stored, &sn.StoredManifest)
	if err != nil {
		return nil, err
	}
	sn.CreatedAt, sn.StoredAt = fromNanos(created), fromNanos(stored)
	if err := jsonCols("snapshot "+sn.ID, env, &sn.Env, layers, &sn.Layers, egress, &sn.Egress, netEgress, &sn.NetworkEgress, savedBy, &sn.SavedBy); err != nil {
		return nil, err
	}
	return &sn, nil
}

// CreateSnapshot inserts a snapshot; ErrConflict if its name is taken.
func (s *Store) CreateSnapshot(ctx context.Context, sn *Snapshot) error {
	_, err := s.exec(ctx, snapshotQ.insert, snapshotArgs(sn)...)
	return mapErr(err)
}

// GetSnapshot finds a snapshot by id or name.
func (s *Store) GetSnapshot(ctx context.Context, idOrName string) (*Snapshot, error) {
	sn, err := scanSnapshot(s.queryRow(ctx, snapshotQ.list+` WHERE id=? OR name=? ORDER BY (id=?) DESC LIMIT 1`, idOrName, idOrName, idOrName))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return sn, err
}

// ListSnapshots returns all snapshots, oldest first.
func (s *Store) ListSnapshots(ctx context.Context) ([]*Snapshot, error) {
	rows, err := s.query(ctx, snapshotQ.list+` ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// SetSnapshotStored records that snapshot id's files are all in the object
// store, under the manifest whose SHA-256 is manifest; ErrNotFound if the
// snapshot is gone.
func (s *Store) SetSnapshotStored(ctx context.Context, id string, at time.Time, manifest string) error {
	return s.updateOne(ctx, ErrNotFound, `UPDATE snapshots SET stored_at=?, stored_manifest=? WHERE id=?`, nanos(at), manifest, id)
}

// DeleteSnapshot removes a snapshot record.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := s.exec(ctx, `DELETE FROM snapshots WHERE id=?`, id)
	return err
}
