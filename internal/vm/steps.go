package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

// The steps user operations are made of, beside the launch (launch.go) and
// the held VM's own (held.go): a new VM's row made and finished
// (insertRow, finishCreate), its running state captured to a file with a
// frozen disk layer (capture) and restored from one (restoreState), the
// host's room checked (admit), and every trace removed (destroy). Create,
// fork, snapshot, suspend and wake are short compositions of them.

// admit refuses an operation the host cannot hold (room), and logs and
// counts each refusal (AdmissionRefusals, /metrics).
func (s *Service) admit(memMiB, diskGrowth int64) error {
	err := s.room(memMiB, diskGrowth)
	var short *shortOf
	if errors.As(err, &short) {
		s.refusals[short.disk].Add(1)
		s.log.Warn("refused: the host is short of "+short.what(), "err", err)
	}
	return err
}

// room checks that guest RAM fits in available memory (with headroom for
// QEMU itself) and disk growth in free disk space. Running VMs count by what
// they use (they are part of MemAvailable already); nothing is reserved, so
// operations checked at the same moment may all pass.
func (s *Service) room(memMiB, diskGrowth int64) error {
	avail, err := memAvailableMiB()
	if err == nil && memMiB+128 > avail {
		return &shortOf{fmt.Errorf("%w: %d MiB of memory requested but the host has only %d MiB available", ErrInsufficient, memMiB, avail), 0}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.cfg.DataDir, &st); err == nil {
		free := int64(st.Bavail) * st.Bsize
		if diskGrowth+(512<<20) > free {
			return &shortOf{fmt.Errorf("%w: disk needs %d MiB more than the image but %s has only %d MiB free", ErrInsufficient, diskGrowth>>20, s.cfg.DataDir, free>>20), 1}
		}
	}
	return nil
}

// shortOf is room's refusal: of memory (disk 0) or of disk (1).
type shortOf struct {
	error
	disk int
}

func (e *shortOf) Unwrap() error { return e.error }

func (e *shortOf) what() string {
	if e.disk == 1 {
		return "disk"
	}
	return "memory"
}

// AdmissionRefusals counts the operations admit refused since the start,
// for want of memory and of disk.
func (s *Service) AdmissionRefusals() (memory, disk int64) {
	return s.refusals[0].Load(), s.refusals[1].Load()
}

func memAvailableMiB() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "MemAvailable:") {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimPrefix(line, "MemAvailable:")), &kb)
			return kb >> 10, nil
		}
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}

// insertRow claims a name, idempotency key and network for a new VM in state
// "creating". If the idempotency key was used before, it returns that VM as prev.
func (s *Service) insertRow(ctx context.Context, o CreateOptions) (v, prev *store.VM, err error) {
	if err := s.fence.check(); err != nil {
		return nil, nil, err
	}
	id := "vm-" + randHex(6)
	state := store.StateCreating
	if o.pool {
		o.Name, state = "pool-"+id, statePool
	}
	if o.Name == "" {
		o.Name = id
	}
	v = &store.VM{ID: id, Name: o.Name, State: state, CPUs: o.CPUs, MemoryMiB: o.MemoryMiB, DiskBytes: o.DiskBytes,
		Labels: o.Labels, Env: o.Env, IdempotencyKey: o.IdempotencyKey, MachineID: randHex(16), CreatedAt: time.Now().UTC(),
		Network: o.Network, Egress: o.Egress, IdleTimeoutSec: int64(o.IdleTimeout.Seconds()), DeleteAfterSec: int64(o.DeleteAfter.Seconds()),
		Restart: o.Restart, Image: o.Image, Node: s.cfg.Node}
	// The row goes in first so the name and idempotency key are claimed; a retry
	// racing with us sees a conflict instead of making a second VM.
	for attempt := 0; ; attempt++ {
		if v.NetIndex, err = s.store.FreeNetIndex(ctx); err != nil {
			return nil, nil, err
		}
		if v.NetIndex > network.MaxSubnetIndex {
			return nil, nil, fmt.Errorf("%w: all %d VM networks are in use (one per VM, made or suspended or stopped; the nodes of a cluster share them): delete VMs to make room", ErrInsufficient, network.MaxSubnetIndex)
		}
		err = s.store.CreateVM(ctx, v)
		if err == nil {
			return v, nil, nil
		}
		if errors.Is(err, store.ErrNodeFull) {
			return nil, nil, fmt.Errorf("%w: %v", ErrInsufficient, err)
		}
		if errors.Is(err, store.ErrConflict) {
			if o.IdempotencyKey != "" {
				if prev, e := s.store.GetVMByIdempotencyKey(ctx, o.IdempotencyKey); e == nil {
					return nil, prev, nil
				}
			}
			if _, e := s.store.GetVMFresh(ctx, o.Name); e == nil {
				return nil, nil, fmt.Errorf("%w: a VM named %q already exists", ErrConflict, o.Name)
			}
			if attempt < 5 {
				continue // network index taken by a concurrent create
			}
		}
		return nil, nil, err
	}
}

// finishCreate records a successful create; on failure the VM is destroyed.
func (h *held) finishCreate(ctx context.Context, start time.Time) error {
	s, v := h.s, h.v
	v.CreateMs = time.Since(start).Milliseconds()
	if err := h.enter(ctx, store.StateRunning); err != nil {
		h.destroy(context.Background())
		return err
	}
	from := "template " + v.Template
	if v.Source != "" {
		from = v.Source
	}
	s.log.Info("vm created", "vm", v.ID, "name", v.Name, "ms", v.CreateMs, "from", from)
	s.logEvent(v.ID, "created %s from %s in %d ms (qemu pid %d, accel %s, %d vCPU, %d MiB, ip %s)",
		v.Name, from, v.CreateMs, v.PID, s.cfg.Accel, v.CPUs, v.MemoryMiB, s.nets.config(v.NetIndex).GuestIP())
	return nil
}

// destroy removes every trace of a VM: process, files, sockets, row.
func (h *held) destroy(ctx context.Context) {
	s, v := h.s, h.v
	if in := s.instance(v.ID); in != nil {
		h.kill()
	} else if s.hv.IsOurs(v.PID, v.ID) {
		s.hv.Kill(v.PID)
		for i := 0; i < 100 && s.hv.IsOurs(v.PID, v.ID); i++ {
			time.Sleep(20 * time.Millisecond)
		}
	}
	s.killStrays(v, 0)
	p := s.paths(v.ID)
	os.RemoveAll(p.Run)
	os.RemoveAll(p.Dir)
	if v.Disk != "" {
		os.Remove(v.Disk)
	}
	s.store.DeleteVM(ctx, v.ID)
	// Exposures and domains go with the VM whoever deleted it: a domain left
	// behind would stay pinned to a dead VM.
	if err := s.store.DeletePorts(ctx, v.ID); err != nil {
		s.log.Warn("delete exposures of a deleted VM", "vm", v.ID, "err", err)
	}
	s.gcLayers(ctx)
	s.deleted(v.ID)
}

// deleted drops a deleted VM's operation lock entry and runs the delete
// hooks, outside the VM's lock: closing a TCP exposure waits for its
// connections, which may be queued on that lock in a wake.
func (s *Service) deleted(id string) {
	s.mu.Lock()
	hooks := append([]func(string){}, s.onDelete...)
	s.mu.Unlock()
	s.ops.forget(id)
	for _, fn := range hooks {
		go fn(id)
	}
}

// capture saves a running or paused VM's memory to statePath and freezes its disk
// at the same instant; the VM goes on (or stays paused) on a new writable top.
// It returns the frozen layer.
func (h *held) capture(ctx context.Context, statePath string) (frozen string, res qemu.SaveResult, err error) {
	s, v := h.s, h.v
	in, err := h.attached()
	if err != nil {
		return "", res, err
	}
	frozen, newTop, commit, abort, err := h.prepareFreeze(ctx, in)
	if err != nil {
		return "", res, err
	}
	defer abort() // a no-op once committed
	freeze := func() error { return commit(ctx) }
	if v.State == store.StatePaused {
		res, err = in.machine.SaveStopped(ctx, statePath, s.captureFormat())
		if err == nil {
			err = freeze()
		}
		if rerr := in.machine.Repause(ctx); rerr != nil && err == nil {
			err = rerr
		}
	} else {
		res, err = in.machine.SaveLive(ctx, statePath, s.captureFormat(), freeze)
	}
	if err != nil {
		// The partial state goes first: on a full data dir it holds the
		// space the guests' disk writes wait for.
		qemu.RemoveState(statePath)
		s.resumeStoppedOnFullDisk(v.ID)
		// If the freeze happened before a later step failed, QEMU writes to
		// newTop now; if not, abort (deferred) removes it.
		if top, qerr := in.machine.DiskTop(context.Background()); qerr == nil && top == newTop {
			h.recordFreeze(ctx, frozen, newTop)
		}
		return "", res, s.noSpace(crashedDuring(in, v, err))
	}
	if err := h.recordFreeze(ctx, frozen, newTop); err != nil {
		return "", res, err
	}
	s.flattenIfDeep(v)
	return frozen, res, nil
}

// prepareFreeze makes ready a freeze of the VM's disk top under a new
// layer (qemu.Machine.PrepareFreeze) and returns the top to be frozen and
// the new one. No record names newTop until the freeze is recorded: the
// layer collector leaves it alone until abort, which the caller defers (a
// no-op for the file once committed).
func (h *held) prepareFreeze(ctx context.Context, in *instance) (frozen, newTop string, commit func(context.Context) error, abort func(), err error) {
	s, v := h.s, h.v
	frozen, newTop = s.diskPath(v), s.newLayerPath(v.ID)
	s.pendingLayers.Store(newTop, struct{}{})
	commit, qabort, err := in.machine.PrepareFreeze(ctx, newTop)
	if err != nil {
		s.pendingLayers.Delete(newTop)
		return "", "", nil, nil, s.noSpace(crashedDuring(in, v, fmt.Errorf("prepare the disk's new top: %w", err)))
	}
	return frozen, newTop, commit, func() { qabort(); s.pendingLayers.Delete(newTop) }, nil
}

// recordFreeze records that the VM's disk writes go to newTop over the
// frozen layer, whatever the caller's context does now (QEMU writes
// there already).
func (h *held) recordFreeze(ctx context.Context, frozen, newTop string) error {
	v := h.v
	v.Layers, v.Disk = append(append([]string{}, v.Layers...), frozen), newTop
	return h.s.store.UpdateVM(context.WithoutCancel(ctx), v)
}

// restoreState starts the VM from a saved memory state on a new overlay over frozen.
func (h *held) restoreState(ctx context.Context, frozen string, layers []string, state string, baseDisk int64) error {
	s, v := h.s, h.v
	img, err := s.ImageNamed(ctx, v.Image) // its kernel
	if err != nil {
		return err
	}
	p := s.paths(v.ID)
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return err
	}
	os.MkdirAll(p.Run, 0o700)
	v.Disk, v.Layers = s.newLayerPath(v.ID), append([]string{}, layers...)
	if err := s.store.UpdateVM(ctx, v); err != nil {
		return err
	}
	mc := s.machineConfig(v, p, img)
	mc.Incoming = state
	return h.launchOnOverlay(ctx, frozen, mc, launchOpts{agentTimeout: 60 * time.Second, baseDisk: baseDisk, identity: identityNew})
}
