package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// OpResult reports how long an operation interrupted the guest.
type OpResult struct {
	VM       *store.VM
	PausedMs int64 // guest vCPUs stopped, where that applies
	Bytes    int64 // state bytes written, where that applies
	TookMs   int64
}

// pause freezes a running VM's vCPUs; memory stays in RAM.
func (s *Service) pause(ctx context.Context, idOrName string) (*OpResult, error) {
	v, err := s.GetFresh(ctx, idOrName)
	if err == nil && done(opPause, v) {
		return &OpResult{VM: v}, nil
	}
	h, err := s.settled(ctx, idOrName, opPause)
	if err != nil {
		return nil, err
	}
	defer h.release()
	in, err := h.attached()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := in.machine.Pause(ctx); err != nil {
		return nil, err
	}
	s.logEvent(h.v.ID, "paused")
	err = h.enter(ctx, table[opPause].to)
	return &OpResult{VM: h.v, TookMs: time.Since(start).Milliseconds()}, err
}

// resume continues a paused VM.
func (s *Service) resume(ctx context.Context, idOrName string) (*OpResult, error) {
	v, err := s.GetFresh(ctx, idOrName)
	if err == nil && done(opResume, v) {
		return &OpResult{VM: v}, nil
	}
	h, err := s.settled(ctx, idOrName, opResume)
	if err != nil {
		return nil, err
	}
	defer h.release()
	start := time.Now()
	if err := h.resume(ctx); err != nil {
		return nil, err
	}
	return &OpResult{VM: h.v, TookMs: time.Since(start).Milliseconds()}, nil
}

// resume continues the held VM, which is paused.
func (h *held) resume(ctx context.Context) error {
	in, err := h.attached()
	if err != nil {
		return err
	}
	if err := in.machine.Resume(ctx); err != nil {
		return err
	}
	h.s.logEvent(h.v.ID, "resumed")
	return h.enter(ctx, table[opResume].to)
}

func (s *Service) suspendPath(id string) string {
	return filepath.Join(s.paths(id).Dir, "suspend.state")
}

// suspend writes the VM's memory and device state to disk and ends its QEMU process,
// freeing its RAM. The next request wakes it where it was.
func (s *Service) suspend(ctx context.Context, idOrName string) (*OpResult, error) {
	v, err := s.GetFresh(ctx, idOrName)
	if err == nil && done(opSuspend, v) {
		return &OpResult{VM: v}, nil
	}
	h, err := s.settled(ctx, idOrName, opSuspend)
	if err != nil {
		return nil, err
	}
	defer h.release()
	return h.suspend(ctx)
}

// suspend saves the held VM, running or paused, and ends its machine.
func (h *held) suspend(ctx context.Context) (*OpResult, error) {
	s, v := h.s, h.v
	in, err := h.attached()
	if err != nil {
		return nil, err
	}
	path := s.suspendPath(v.ID)
	tmp := path + ".tmp"
	qemu.RemoveState(tmp)
	start := time.Now()
	res, err := in.machine.SaveStopped(ctx, tmp, s.suspendFormat())
	if err == nil {
		err = qemu.RenameState(tmp, path)
	}
	if err != nil {
		qemu.RemoveState(tmp)
		if v.State == store.StateRunning {
			in.machine.Resume(context.Background()) // leave it as it was
		} else {
			in.machine.Repause(context.Background())
		}
		s.resumeStoppedOnFullDisk(v.ID)
		return nil, fmt.Errorf("suspend %s: %w", v.Name, s.noSpace(crashedDuring(in, v, err)))
	}
	h.quit(in)
	os.RemoveAll(s.paths(v.ID).Run)
	v.PID, v.SavedBy = 0, s.savedByHere(layoutOf(v))
	s.syncSaved(v.ID, path)
	s.log.Info("state saved", "vm", v.ID, "op", "suspend", "format", res.Format, "stream_bytes", res.Bytes, "disk_bytes", qemu.DiskUsage(path), "ms", time.Since(start).Milliseconds())
	s.logEvent(v.ID, "suspended: %d MiB of state (%s format, %d MiB on disk) in %d ms", res.Bytes>>20, res.Format,
		qemu.DiskUsage(path)>>20, time.Since(start).Milliseconds())
	// QEMU is gone: the record says so whatever the caller does (enter's
	// write outlives the request: a client hanging up here once left a VM
	// listed running without a QEMU until the next daemon start).
	err = h.enter(ctx, table[opSuspend].to)
	if err == nil {
		s.storeSuspendedLater(v)
	}
	return &OpResult{VM: v, PausedMs: res.Paused.Milliseconds(), Bytes: res.Bytes, TookMs: time.Since(start).Milliseconds()}, err
}

// noSpace makes a save that failed for lack of disk space a 507 that says so.
func (s *Service) noSpace(err error) error {
	if err != nil && (errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "No space left on device")) {
		return fmt.Errorf("%w: not enough disk space: %s filled up while the memory state was written (%v); nothing was kept, free some space and retry",
			ErrInsufficient, s.cfg.DataDir, err)
	}
	return err
}

// crashedDuring says so when an operation failed because its QEMU died
// under it, and what to do.
func crashedDuring(in *instance, v *store.VM, err error) error {
	if err == nil {
		return nil
	}
	err = in.machine.ExitedDuringSave(err)
	select {
	case <-in.machine.Done():
		return fmt.Errorf("%w; %s crashed (its disk is intact): start it with: agentvm start %s", err, v.Name, v.Name)
	default:
		return err
	}
}

// resumeStoppedOnFullDisk runs after a failed save has removed its partial
// state. QEMU stops a guest whose disk write fails for lack of space (run
// state "io-error") rather than fail the write; a save that filled the data
// dir stops that way the VM it saves and any other running VM that wrote to
// its disk meanwhile. With the space back, cont retries those writes and the
// guest runs on. The caller holds self's lock; other VMs busy with an
// operation are left to it.
func (s *Service) resumeStoppedOnFullDisk(self string) {
	s.mu.Lock()
	ins := make(map[string]*instance, len(s.instances))
	for id, in := range s.instances {
		ins[id] = in
	}
	s.mu.Unlock()
	for id, in := range ins {
		unlock := func() {}
		if id != self {
			l, err := s.ops.try(id, id, "resume after a full disk")
			if err != nil {
				continue
			}
			unlock = l
		}
		func() {
			defer unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			v, err := s.store.GetVMFresh(ctx, id)
			if err != nil || (v.State != store.StateRunning && v.State != statePool) || s.instance(id) != in {
				return
			}
			if st, err := in.machine.Status(ctx); err != nil || st != "io-error" {
				return
			}
			if err := in.machine.Resume(ctx); err != nil {
				s.log.Warn("cannot resume a guest stopped on a full disk", "vm", id, "err", err)
				return
			}
			s.log.Warn("resumed a guest QEMU had stopped on a full disk", "vm", id)
			s.logEvent(id, "resumed: QEMU had stopped the guest when a disk write found the data dir full")
		}()
	}
}

// errStateTorn: the host restarted before a saved state reached the disk.
var errStateTorn = errors.New("the host restarted before the saved state reached its disk")

// wake restores the held VM, which is suspended, from its state file.
func (h *held) wake(ctx context.Context) error {
	s, v := h.s, h.v
	if err := s.admit(v.MemoryMiB, 0); err != nil {
		return err
	}
	img, err := s.ImageNamed(ctx, v.Image) // its kernel
	if err != nil {
		return err
	}
	p := s.paths(v.ID)
	os.MkdirAll(p.Run, 0o700)
	_, err = qemu.ReadStateInfo(s.suspendPath(v.ID))
	if err == nil && mayBeTorn(v.SavedBy, qemu.BootID(), qemu.StateSynced(s.suspendPath(v.ID))) {
		err = errStateTorn
	}
	if err != nil && (os.IsNotExist(err) || errors.Is(err, qemu.ErrRAMFileLost) || errors.Is(err, errStateTorn)) {
		// Without its memory state the VM can only boot from its disk,
		// which keeps everything but the processes: say so, and let start
		// do it.
		v.PID, v.ColdBoot = 0, true
		v.Error = "memory state lost (" + err.Error() + "); start boots it from its disk"
		h.enter(ctx, store.StateStopped)
		s.logEvent(v.ID, "wake impossible: %s", v.Error)
		return fmt.Errorf("%w: VM %s lost its memory state; its disk is intact: start it with: agentvm start %s", ErrConflict, v.Name, v.Name)
	}
	if err := s.checkSuspendedState(v); err != nil {
		err = fmt.Errorf("wake %s: %w; the state stays on disk (agentvm stop %s discards it, and start then boots the VM from its disk)", v.Name, err, v.Name)
		v.Error = err.Error()
		s.store.UpdateVM(context.Background(), v)
		return err
	}
	s.killStrays(v, 0) // a QEMU of an interrupted wake would hold the disk
	// It is about to run here: its stored copy must never wake elsewhere,
	// even if this daemon dies before it records the VM running.
	undoStored, dropped, err := s.dropStored(ctx, v)
	if err != nil {
		return err
	}
	mc := s.machineConfig(v, p, img)
	mc.Incoming = s.suspendPath(v.ID)
	mc.EagerRAM = true // its own memory: the VM's later saves stay cheap
	start := time.Now()
	// A restore that cannot finish (a state stream that never ends) must
	// not hold the VM, and everyone queued behind its lock, for ever.
	lctx, cancel := context.WithTimeout(ctx, wakeTimeout)
	defer cancel()
	err = h.launch(lctx, mc, launchOpts{agentTimeout: 60 * time.Second, baseDisk: v.DiskBytes, identity: identityClock})
	if ce := (*crashError)(nil); errors.As(err, &ce) && ce.unstarted && lctx.Err() == nil {
		// QEMU died loading the state or at the cont that would have run
		// the guest (QEMU 10.0.2 segfaulted so, once in hundreds): the
		// guest never ran, its disk is as the suspend left it, and the
		// state file is intact. Once more in a fresh QEMU.
		s.log.Warn("wake crashed: qemu exited in its start; retrying once in a fresh qemu", "vm", v.ID, "state", mc.Incoming, "err", err)
		s.Event(v.ID, "lifecycle", ActorSystem, "wake from %s crashed in QEMU's start (%v); retrying once in a fresh QEMU", mc.Incoming, err)
		s.killStrays(v, 0)
		err = h.launch(lctx, mc, launchOpts{agentTimeout: 60 * time.Second, baseDisk: v.DiskBytes, identity: identityClock})
	}
	if err != nil {
		s.killStrays(v, 0)
		v.PID, v.Error = 0, "wake failed: "+err.Error() // still suspended
		s.store.UpdateVM(context.Background(), v)
		undoStored()
		return err
	}
	// The state file goes only once the VM is recorded running: a daemon
	// that dies in between still finds a suspended VM with its state. The
	// write does not depend on the caller staying: a running QEMU the
	// record does not name would be killed by the next wake.
	v.SavedBy = nil // it described the state this wake consumed
	if err := h.enter(ctx, table[opWake].to); err != nil {
		h.kill()
		s.killStrays(v, 0)
		v.PID = 0
		undoStored()
		return fmt.Errorf("wake %s: record it running: %w", v.Name, err)
	}
	// A QEMU that maps the state's RAM file keeps it until it exits.
	qemu.RemoveState(s.suspendPath(v.ID))
	os.Remove(s.storedMarker(v.ID))
	dropped()
	s.logEvent(v.ID, "woke from suspend in %d ms (qemu pid %d)", time.Since(start).Milliseconds(), v.PID)
	return nil
}

// wakeTimeout bounds a whole wake: the restore of a large state under TCG
// on a busy host takes tens of seconds, never minutes.
const wakeTimeout = 3 * time.Minute

// Wake brings a paused or suspended VM back to running; concurrent callers share
// one wake (they queue on the VM's lock and find it running).
func (s *Service) Wake(ctx context.Context, idOrName string) (*store.VM, error) {
	// A VM that runs here needs nothing, and its record in the read cache
	// is exact: while it runs here only this node writes it (another takes
	// a VM over only from a lost node, which has killed its machines).
	// So routing a request to it reads no database.
	if v, err := s.Get(ctx, idOrName); err == nil && v.State == store.StateRunning && v.Node == s.cfg.Node &&
		s.instance(v.ID) != nil && !s.ops.isBusy(v.ID) && s.fence.why() == "" {
		return v, nil
	}
	v, err := s.GetLocal(ctx, idOrName)
	if err != nil || (v.State != store.StatePaused && v.State != store.StateSuspended && !s.ops.isBusy(v.ID)) {
		return v, err
	}
	// Paused, suspended, or an operation (say a suspend) is under way: queue
	// behind it; an upload of its suspended state stops.
	s.stash.stopUpload(uploadKey(v.ID))
	unlock := s.ops.lock(v.ID, "wake")
	defer unlock()
	if v, err = s.GetFresh(ctx, v.ID); err != nil {
		return nil, err
	}
	h := s.hold(v, unlock)
	switch v.State {
	case store.StatePaused:
		err = h.resume(ctx)
	case store.StateSuspended:
		err = h.wake(ctx)
	}
	return v, err
}

// SuspendAll suspends every running or paused VM for a host shutdown, marking them to
// be woken at the next start; a VM that cannot be suspended in time is stopped cleanly.
func (s *Service) SuspendAll(ctx context.Context) {
	vms, err := s.localVMs(ctx)
	if err != nil {
		return
	}
	for _, v := range vms {
		if v.State != store.StateRunning && v.State != store.StatePaused {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := s.Suspend(sctx, v.ID)
		cancel()
		if err != nil {
			s.log.Warn("suspend at shutdown failed; stopping", "vm", v.ID, "err", err)
			sctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			s.Stop(sctx, v.ID)
			cancel()
			continue
		}
		res.VM.ResumeOnStart = true
		s.store.UpdateVM(ctx, res.VM)
		s.log.Info("suspended for shutdown", "vm", v.ID, "ms", res.TookMs)
	}
}

// WakeMarked wakes the VMs suspended by SuspendAll at the previous shutdown.
func (s *Service) WakeMarked(ctx context.Context) {
	vms, err := s.localVMs(ctx)
	if err != nil {
		return
	}
	for _, v := range vms {
		if v.State != store.StateSuspended || !v.ResumeOnStart {
			continue
		}
		if w, err := s.Wake(ctx, v.ID); err != nil {
			s.log.Warn("wake after restart failed", "vm", v.ID, "err", err)
		} else {
			w.ResumeOnStart = false
			s.store.UpdateVM(ctx, w)
			s.log.Info("woke after restart", "vm", v.ID)
		}
	}
}
