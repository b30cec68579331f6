package vm

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// A VM's life beside its saves (pause.go, snapshot.go, fork.go): stop,
// start from its disk, delete, and the monitor that records an exit nobody
// asked for.

// stop shuts the VM down (ACPI power button, then quit, then kill); its disk is kept.
func (s *Service) stop(ctx context.Context, idOrName string) (*store.VM, error) {
	h, err := s.take(ctx, idOrName, opStop)
	if err != nil {
		return nil, err
	}
	defer h.release()
	v := h.v
	if done(opStop, v) {
		return v, nil // stopping twice is a no-op
	}
	if err := checkTransition(opStop, v); err != nil {
		return nil, err
	}
	qemu.RemoveState(s.suspendPath(v.ID)) // a suspended VM's saved memory is dropped; its disk stays
	h.shutdown(ctx, 30*time.Second)
	os.RemoveAll(s.paths(v.ID).Run)
	v.PID, v.ColdBoot = 0, true
	s.logEvent(v.ID, "stopped")
	return v, h.enter(ctx, table[opStop].to)
}

// start cold-boots a stopped VM from its own disk; a paused or suspended VM is
// resumed or woken instead.
func (s *Service) start(ctx context.Context, idOrName string) (*store.VM, error) {
	if v, err := s.GetFresh(ctx, idOrName); err == nil && (v.State == store.StatePaused || v.State == store.StateSuspended) {
		return s.Wake(ctx, v.ID)
	}
	h, err := s.take(ctx, idOrName, opStart)
	if err != nil {
		return nil, err
	}
	defer h.release()
	v := h.v
	if done(opStart, v) {
		return v, nil
	}
	if err := checkTransition(opStart, v); err != nil {
		return nil, err
	}
	if v.NextCPUs != 0 {
		v.CPUs, v.NextCPUs = v.NextCPUs, 0
	}
	if v.NextMemoryMiB != 0 {
		v.MemoryMiB, v.NextMemoryMiB = v.NextMemoryMiB, 0
	}
	if err := s.admit(v.MemoryMiB, 0); err != nil {
		return nil, err
	}
	img, err := s.ImageNamed(ctx, v.Image) // its kernel
	if err != nil {
		return nil, err
	}
	p := s.paths(v.ID)
	os.MkdirAll(p.Run, 0o700)
	mc := s.machineConfig(v, p, img)
	if err := h.launch(ctx, mc, launchOpts{agentTimeout: s.cfg.BootTimeout, baseDisk: v.DiskBytes, identity: identitySame, growFS: true}); err != nil {
		v.PID, v.Error = 0, "start failed: "+err.Error()
		h.enter(ctx, store.StateStopped)
		return nil, err
	}
	v.ColdBoot = true
	if err := h.enter(ctx, table[opStart].to); err != nil {
		// A QEMU the record does not name would be killed by the next
		// start anyway: end it now.
		h.kill()
		return nil, fmt.Errorf("start %s: record it running: %w", v.Name, err)
	}
	s.logEvent(v.ID, "started (qemu pid %d)", v.PID)
	return v, nil
}

// remove removes a VM in any settled state.
func (s *Service) remove(ctx context.Context, idOrName string) error {
	v, err := s.GetFresh(ctx, idOrName)
	if err != nil {
		return err
	}
	s.stash.stopUpload(uploadKey(v.ID)) // a delete does not wait for an upload
	unlock, err := s.ops.wait(ctx, v.ID, "delete")
	if err != nil {
		return err
	}
	defer unlock()
	if v, err = s.GetFresh(ctx, v.ID); err != nil { // deleted while we waited
		return err
	}
	h := s.hold(v, unlock)
	if err := s.ours(v); err != nil {
		lost, lerr := s.cfg.nodeLost(ctx, v.Node)
		if lerr != nil {
			return fmt.Errorf("%w: is node %s lost? %v", ErrUnavailable, v.Node, lerr)
		}
		if !lost {
			return err
		}
		return s.forgetLost(ctx, v)
	}
	if err := s.fence.check(); err != nil {
		return err
	}
	if err := checkTransition(opDelete, v); err != nil {
		return err
	}
	if err := h.enter(ctx, table[opDelete].during); err != nil {
		return err
	}
	h.destroy(ctx)
	s.log.Info("vm deleted", "vm", v.ID)
	return nil
}

// opExitHandling is the lock holder's name while monitor records an exit.
const opExitHandling = "exit handling"

// monitor records an exit the service did not cause: a guest power-off is
// "stopped", anything else "crashed".
func (s *Service) monitor(id string, in *instance) {
	<-in.machine.Done()
	if in.expectingExit() {
		return
	}
	unlock := s.ops.lock(id, opExitHandling)
	defer unlock()
	if s.instance(id) != in {
		return
	}
	select { // every event sent before the exit has been read
	case <-in.machine.EventsDone():
	case <-time.After(2 * time.Second):
	}
	clean, reason := in.machine.CleanExit()
	in.detach()
	s.setInstance(id, nil)
	v, err := s.store.GetVMFresh(context.Background(), id)
	if err != nil {
		return
	}
	h := s.hold(v, unlock)
	if v.State == statePool {
		h.destroy(context.Background())
		return
	}
	to := store.StateCrashed
	v.PID, v.ColdBoot, v.Error = 0, true, "QEMU exited unexpectedly"+qemu.LogTail(s.paths(id).Log)
	if clean && reason != "host-error" {
		to, v.Error = store.StateStopped, ""
	}
	h.enter(context.Background(), to)
	os.RemoveAll(s.paths(id).Run)
	why := reason
	if why == "" {
		why = "QEMU died"
		if st := in.machine.ExitStatus(); st != "" {
			why = "QEMU " + st
		}
	}
	s.Event(id, "lifecycle", ActorSystem, "QEMU exited: %s (%s)", v.State, why)
	s.log.Warn("vm exited", "vm", id, "state", v.State, "reason", why)
	s.maybeRestart(v, v.State == store.StateCrashed, why)
}
