package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/disk"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// shapeKey names what a restore of saved memory needs to match.
func (s *Service) shapeKey(cpus int, memMiB int64) string {
	return s.shapeKeyFor(qemu.DeviceSet, cpus, memMiB)
}

// snapshotLayout is the device set a snapshot was taken with, found from
// its key ("" when it was taken with another QEMU, accelerator or machine).
func (s *Service) snapshotLayout(sn *store.Snapshot) string {
	for _, ds := range []string{qemu.DeviceSet, qemu.CPUHotplugDeviceSet, qemu.LegacyDeviceSet} {
		if sn.Key == s.shapeKeyFor(ds, sn.CPUs, sn.MemoryMiB) {
			return ds
		}
	}
	return ""
}

// shapeKeyFor is the shape key with a given device set (snapshots taken
// by an earlier agentvm carry an earlier device set's).
func (s *Service) shapeKeyFor(deviceSet string, cpus int, memMiB int64) string {
	return hashStrings(s.cfg.QEMUVersion, qemu.MachineType, s.cfg.Accel, qemu.CPUModel(s.cfg.Accel), deviceSet,
		fmt.Sprint(cpus), fmt.Sprint(memMiB))
}

var (
	snapNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	snapIDRe   = regexp.MustCompile(`^snap-[0-9a-f]{12}$`)
)

// ValidateSnapshotName checks a snapshot name. Unlike a VM's it need not be
// a hostname: letters of both cases, '_' and '.' are fine (E2B's snapshot
// and template names use them), but not the form of a snapshot id.
func ValidateSnapshotName(n string) error {
	if !snapNameRe.MatchString(n) {
		return fmt.Errorf("%w: invalid snapshot name %q: use 1-128 letters, digits, '.', '_' and '-', starting with a letter or digit", ErrInvalid, n)
	}
	if snapIDRe.MatchString(n) {
		return fmt.Errorf("%w: invalid snapshot name %q: names of the form snap-<hex> are reserved for snapshot ids", ErrInvalid, n)
	}
	return nil
}

// snapshot captures a running or paused VM (memory, processes and disk).
func (s *Service) snapshot(ctx context.Context, idOrName, name string) (*store.Snapshot, error) {
	if name != "" {
		if err := ValidateSnapshotName(name); err != nil {
			return nil, err
		}
		if _, err := s.store.GetSnapshot(ctx, name); err == nil {
			return nil, fmt.Errorf("%w: a snapshot named %q already exists", ErrConflict, name)
		}
	}
	h, err := s.settled(ctx, idOrName, opSnapshot)
	if err != nil {
		return nil, err
	}
	defer h.release()
	v := h.v
	sn := &store.Snapshot{ID: "snap-" + randHex(6), Name: name, VMID: v.ID, VMName: v.Name, CPUs: v.CPUs, MemoryMiB: v.MemoryMiB,
		DiskBytes: v.DiskBytes, Env: v.Env, Image: v.Image, Key: s.shapeKeyFor(layoutOf(v), v.CPUs, v.MemoryMiB), CreatedAt: time.Now().UTC(), Node: s.cfg.Node}
	if sn.Name == "" {
		sn.Name = sn.ID
	}
	sn.Network, sn.Egress, sn.HotMemoryMiB, sn.SavedBy = v.Network, v.Egress, v.HotMemoryMiB, s.savedByHere(layoutOf(v))
	if v.Network != "" {
		if n, err := s.store.GetNetwork(ctx, v.Network); err == nil {
			sn.NetworkEgress = n.Egress
		}
	}
	dir := filepath.Join(s.cfg.DataDir, "snapshots", sn.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	sn.State = filepath.Join(dir, "state")
	frozen, res, err := h.capture(ctx, sn.State)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("snapshot %s: %w", v.Name, err)
	}
	sn.Disk, sn.Layers, sn.Bytes, sn.PausedMs = frozen, v.Layers, res.Bytes, res.Paused.Milliseconds()
	if err := s.store.CreateSnapshot(ctx, sn); err != nil {
		os.RemoveAll(dir)
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: a snapshot named %q already exists", ErrConflict, sn.Name)
		}
		return nil, err
	}
	s.syncSaved(v.ID, sn.State)
	s.storeSnapshotLater(sn)
	s.log.Info("state saved", "vm", v.ID, "op", "snapshot", "format", res.Format, "stream_bytes", res.Bytes, "disk_bytes", qemu.DiskUsage(sn.State), "paused_ms", sn.PausedMs)
	s.logEvent(v.ID, "snapshot %s: %d MiB of state (%s format, %d MiB on disk), guest paused %d ms", sn.Name, res.Bytes>>20, res.Format,
		qemu.DiskUsage(sn.State)>>20, sn.PausedMs)
	return sn, nil
}

// Snapshots lists snapshots.
func (s *Service) Snapshots(ctx context.Context) ([]*store.Snapshot, error) {
	return s.store.ListSnapshots(ctx)
}

// GetSnapshot finds a snapshot by id or name.
func (s *Service) GetSnapshot(ctx context.Context, idOrName string) (*store.Snapshot, error) {
	sn, err := s.store.GetSnapshot(ctx, idOrName)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: no snapshot named or with id %q", ErrNotFound, idOrName)
	}
	return sn, err
}

// snapLock guards a snapshot's files: restores read-lock them, deletion write-locks.
func (s *Service) snapLock(id string) *sync.RWMutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snapLocks == nil {
		s.snapLocks = map[string]*sync.RWMutex{}
	}
	l := s.snapLocks[id]
	if l == nil {
		l = &sync.RWMutex{}
		s.snapLocks[id] = l
	}
	return l
}

// DeleteSnapshot removes a snapshot; disk layers still used by VMs stay. A snapshot
// that a create is restoring right now gets a 409.
func (s *Service) DeleteSnapshot(ctx context.Context, idOrName string) error {
	sn, err := s.GetSnapshot(ctx, idOrName)
	if err != nil {
		return err
	}
	if err := s.snapshotHere(sn); err != nil {
		if lost, lerr := s.cfg.nodeLost(ctx, sn.Node); lerr != nil || !lost {
			return err
		}
		// Its files went with its node: the record and its stored copy
		// are left to go.
		if err := s.store.DeleteSnapshot(ctx, sn.ID); err != nil {
			return err
		}
		s.unstoreSnapshot(ctx, sn)
		return nil
	}
	s.stash.stopUpload(sn.ID) // a delete does not wait for an upload
	l := s.snapLock(sn.ID)
	if !l.TryLock() {
		return fmt.Errorf("%w: snapshot %s is being restored; retry when the create is done", ErrConflict, sn.Name)
	}
	defer l.Unlock()
	if err := s.store.DeleteSnapshot(ctx, sn.ID); err != nil {
		return err
	}
	s.unstoreSnapshot(ctx, sn)
	os.RemoveAll(filepath.Dir(sn.State))
	s.gcLayers(ctx)
	return nil
}

// createFrom makes a new VM from a snapshot: its processes and files, a fresh identity.
func (s *Service) createFrom(ctx context.Context, snap string, o CreateOptions) (*store.VM, bool, error) {
	if err := s.fence.check(); err != nil {
		return nil, false, err
	}
	if o.IdempotencyKey != "" {
		if v, err := s.store.GetVMByIdempotencyKey(ctx, o.IdempotencyKey); err == nil {
			return v, false, nil
		}
	}
	probe := o // Validate fills defaults; o keeps its zero values for the shape check
	if err := probe.Validate(); err != nil {
		return nil, false, err
	}
	if err := s.checkNetwork(ctx, o.Network); err != nil {
		return nil, false, err
	}
	sn, err := s.GetSnapshot(ctx, snap)
	if err != nil {
		return nil, false, err
	}
	local := s.snapshotHere(sn) == nil
	if !local && (s.cfg.Objects == nil || sn.StoredAt.IsZero()) {
		return nil, false, s.snapshotHere(sn)
	}
	if (o.CPUs != 0 && o.CPUs != sn.CPUs) || (o.MemoryMiB != 0 && o.MemoryMiB != sn.MemoryMiB) {
		return nil, false, fmt.Errorf("%w: snapshot %s was taken with %d vCPUs and %d MiB; a restore keeps that shape (resize after create)",
			ErrConflict, sn.Name, sn.CPUs, sn.MemoryMiB)
	}
	layout, err := s.snapshotRestoreLayout(sn)
	if err != nil {
		return nil, false, err
	}
	if local && mayBeTorn(sn.SavedBy, qemu.BootID(), qemu.StateSynced(sn.State)) {
		return nil, false, fmt.Errorf("%w: snapshot %s: %v; its memory cannot be trusted: delete it and take a new one", ErrConflict, sn.Name, errStateTorn)
	}
	// A VM made from a snapshot is never more open than the VM it copies:
	// unless told otherwise it joins that VM's network (if it still exists)
	// and keeps the policy that VM ran under, its network's included.
	networkGone := false
	if o.Network == "" && sn.Network != "" {
		if _, err := s.store.GetNetwork(ctx, sn.Network); err == nil {
			o.Network = sn.Network
		} else {
			networkGone = true
		}
	}
	if o.Egress == nil {
		o.Egress = sn.Egress
	}
	if o.Egress == nil && networkGone {
		o.Egress = sn.NetworkEgress
	}
	o.CPUs, o.MemoryMiB, o.Image = sn.CPUs, sn.MemoryMiB, sn.Image
	if o.DiskBytes == 0 {
		o.DiskBytes = sn.DiskBytes
	}
	if o.Env == nil {
		o.Env = sn.Env
	}
	if err := o.Validate(); err != nil {
		return nil, false, err
	}
	if o.DiskBytes < sn.DiskBytes {
		return nil, false, fmt.Errorf("%w: disk cannot be smaller than the snapshot's %d MiB", ErrInvalid, sn.DiskBytes>>20)
	}
	if err := s.admit(o.MemoryMiB, o.DiskBytes-sn.DiskBytes); err != nil {
		return nil, false, err
	}
	l := s.snapLock(sn.ID)
	l.RLock()
	defer l.RUnlock()
	if _, err := s.store.GetSnapshot(ctx, sn.ID); err != nil { // deleted meanwhile
		return nil, false, fmt.Errorf("%w: snapshot %s was deleted", ErrNotFound, sn.Name)
	}
	v, prev, err := s.insertRow(ctx, o)
	if err != nil || prev != nil {
		return prev, false, err
	}
	h := s.hold(v, s.ops.lock(v.ID, "create"))
	defer h.release()
	start := time.Now()
	v.Source, v.Layout, v.HotMemoryMiB = "snapshot "+sn.Name, layout, sn.HotMemoryMiB
	frozen, layers, state := sn.Disk, sn.Layers, sn.State
	if !local {
		if frozen, layers, state, err = s.fetchSnapshot(ctx, sn); err != nil {
			h.destroy(context.Background())
			return nil, false, err
		}
	}
	if err := h.restoreState(ctx, frozen, layers, state, sn.DiskBytes); err != nil {
		h.destroy(context.Background())
		return nil, false, err
	}
	return v, true, h.finishCreate(ctx, start)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// gcLayers deletes frozen disk layers no VM or snapshot uses any more.
func (s *Service) gcLayers(ctx context.Context) {
	used := map[string]bool{}
	// Pending layers first: one a capture records after this reads them
	// is in the listing below.
	s.pendingLayers.Range(func(k, _ any) bool {
		used[k.(string)] = true
		return true
	})
	vms, err := s.store.ListVMs(ctx)
	if err != nil {
		return
	}
	for _, v := range vms {
		used[s.diskPath(v)] = true
		for _, l := range v.Layers {
			used[l] = true
		}
	}
	snaps, err := s.store.ListSnapshots(ctx)
	if err != nil {
		return
	}
	for _, sn := range snaps {
		for _, l := range sn.Layers {
			used[l] = true
		}
	}
	s.layers().Collect(func(p string) bool { return used[p] }, time.Minute)
}

// flattenIfDeep streams a deep chain's layers into the VM's top in the background,
// so reads stay fast and unused layers can be collected. The VM's lock is held for
// the job: user lifecycle operations get a 409 until it is done.
func (s *Service) flattenIfDeep(v *store.VM) {
	if len(v.Layers) < disk.MaxLayers {
		return
	}
	go func() {
		defer s.ops.lock(v.ID, "flatten")() // after the operation that froze the layer

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		cur, err := s.store.GetVMFresh(ctx, v.ID)
		in := s.instance(v.ID)
		if err != nil || in == nil || len(cur.Layers) < disk.MaxLayers {
			return
		}
		base, err := disk.Backing(ctx, cur.Layers[0])
		if err != nil || base == "" {
			s.log.Warn("flatten: cannot read the chain's base", "vm", v.ID, "err", err)
			return
		}
		start := time.Now()
		if err := in.machine.Flatten(ctx, base); err != nil {
			s.log.Warn("flatten failed", "vm", v.ID, "err", err)
			return
		}
		n := len(cur.Layers)
		cur.Layers = nil
		if err := s.store.UpdateVM(ctx, cur); err != nil {
			return
		}
		s.logEvent(v.ID, "flattened %d disk layers in %d ms", n, time.Since(start).Milliseconds())
		s.gcLayers(ctx)
	}()
}

// layoutOf is the device set of v's machine. Records that name none were
// written before the virtio-mem device (qemu.DeviceSet names its layout
// explicitly).
func layoutOf(v *store.VM) string {
	if v.Layout == "" {
		return qemu.CPUHotplugDeviceSet
	}
	return v.Layout
}
