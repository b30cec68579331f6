package vm

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/store"
)

// What a daemon start finds and settles: QEMUs that ran on without it,
// operations it did not finish, and files no record names.

// Reconcile runs at start-up: it re-attaches to QEMU processes that kept running
// while the daemon was down, marks dead ones, and removes half-finished creates.
func (s *Service) Reconcile(ctx context.Context) error {
	vms, err := s.localVMs(ctx)
	if err != nil {
		return err
	}
	for _, v := range vms {
		s.reconcile(ctx, v)
	}
	// No QEMU runs for a VM unless the VM's record says it runs that one: a
	// QEMU left by an interrupted operation would hold the VM's disk lock
	// and make every later start or wake fail.
	if vms, err = s.localVMs(ctx); err != nil {
		return err
	}
	for _, v := range vms {
		keep := 0
		if live(v) {
			keep = v.PID
		}
		s.killStrays(v, keep)
	}
	s.removeOrphanSnapshots(ctx)
	s.removeMovedVMs(ctx)
	s.gcLayers(ctx)
	s.stash.removePartial()
	s.storeUnstored(ctx)
	return nil
}

// reconcile settles one VM of this node at start-up, under its lock.
func (s *Service) reconcile(ctx context.Context, v *store.VM) {
	h := s.hold(v, s.ops.lock(v.ID, "reconcile"))
	defer h.release()
	switch v.State {
	case store.StateSuspended, store.StateStopped, store.StateCrashed, store.StateError:
		// A wake or start the daemon did not finish: its QEMU (recorded or
		// not) goes, see killStrays in Reconcile.
	case store.StateCreating, store.StateDeleting, statePool:
		s.log.Info("removing unfinished VM", "vm", v.ID, "state", v.State)
		h.destroy(ctx)
	case store.StateRunning, store.StatePaused:
		qemu.RemoveState(s.suspendPath(v.ID) + ".tmp")
		if !s.hv.IsOurs(v.PID, v.ID) {
			if _, err := os.Stat(s.suspendPath(v.ID)); err == nil {
				// the daemon died between writing the suspend state and recording it
				v.PID = 0
				h.enter(ctx, store.StateSuspended)
				s.log.Info("finished an interrupted suspend", "vm", v.ID)
				return
			}
		}
		qemu.RemoveState(s.suspendPath(v.ID))
		if err := s.reattach(ctx, v); err != nil {
			s.log.Warn("cannot reattach", "vm", v.ID, "err", err)
			v.PID, v.ColdBoot, v.Error = 0, true, "lost while the daemon was down: "+err.Error()
			h.enter(ctx, store.StateCrashed)
			os.RemoveAll(s.paths(v.ID).Run)
		}
	}
}

// killStrays kills every QEMU of v except the one with pid keep, and waits
// (a few seconds at most) until they are gone and have let go of the disk.
func (s *Service) killStrays(v *store.VM, keep int) {
	for _, pid := range s.hv.FindOurs(v.ID) {
		if pid == keep {
			continue
		}
		s.log.Warn("killing a QEMU that no operation owns", "vm", v.ID, "pid", pid, "state", v.State)
		s.logEvent(v.ID, "killed QEMU pid %d left by an interrupted operation", pid)
		s.hv.Kill(pid)
		for deadline := time.Now().Add(5 * time.Second); s.hv.IsOurs(pid, v.ID) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// removeOrphanSnapshots deletes snapshot directories that no record owns: an
// interrupted snapshot, or a fork's temporary state.
func (s *Service) removeOrphanSnapshots(ctx context.Context) {
	snaps, err := s.store.ListSnapshots(ctx)
	if err != nil {
		return
	}
	owned := map[string]bool{}
	for _, sn := range snaps {
		owned[filepath.Dir(sn.State)] = true
	}
	dir := filepath.Join(s.cfg.DataDir, "snapshots")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if p := filepath.Join(dir, e.Name()); !owned[p] {
			s.log.Info("removing unfinished snapshot files", "dir", p)
			os.RemoveAll(p)
		}
	}
}

// removeMovedVMs deletes, in a cluster, the directories of VMs another
// node now runs (taken over while this node was lost, or moved by a
// drain): this node never runs them from those files again.
func (s *Service) removeMovedVMs(ctx context.Context) {
	if s.cfg.Node == "" {
		return
	}
	vms, err := s.store.ListVMs(ctx)
	if err != nil {
		return
	}
	for _, v := range vms {
		if v.Node == s.cfg.Node {
			continue
		}
		// A QEMU of this node's that ran on after its daemon died (the VM
		// was revived elsewhere meanwhile) is ended.
		s.killOwnQEMUs(v)
		p := s.paths(v.ID).Dir
		if _, err := os.Stat(p); err == nil {
			s.log.Info("removing the files of a VM another node runs now", "vm", v.ID, "node", v.Node)
			os.RemoveAll(p)
		}
	}
}

// killOwnQEMUs kills this node's QEMUs of VM v, and no other node's on
// the same host: theirs name this node's run dir in their command line.
func (s *Service) killOwnQEMUs(v *store.VM) {
	run := []byte("=" + s.paths(v.ID).Run + "/")
	for _, pid := range s.hv.FindOurs(v.ID) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Contains(b, run) {
			s.log.Warn("killing this node's QEMU of a VM another node runs now", "vm", v.ID, "pid", pid, "node", v.Node)
			s.hv.Kill(pid)
		}
	}
}

func (s *Service) reattach(ctx context.Context, v *store.VM) error {
	if !s.hv.IsOurs(v.PID, v.ID) {
		return fmt.Errorf("QEMU pid %d is gone", v.PID)
	}
	img, err := s.ImageNamed(ctx, v.Image) // its kernel
	if err != nil {
		return err
	}
	p := s.paths(v.ID)
	mc := s.machineConfig(v, p, img)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := s.hv.Attach(actx, mc, v.PID)
	if err != nil {
		return err
	}
	net, err := s.nets.open(v)
	if err != nil {
		m.Close()
		return err
	}
	if err := net.Attach(actx, p.Net); err != nil {
		m.Close()
		net.Close()
		return fmt.Errorf("re-attach network: %w", err)
	}
	in := &instance{id: v.ID, paths: p, machine: m, net: net}
	// A save interrupted by the daemon's death goes on inside QEMU and, when
	// it completes, leaves the guest stopped: end it first, then put the
	// guest back in the state the record says.
	if err := m.EndOutgoingMigration(actx); err != nil {
		s.log.Warn("cannot end an interrupted save", "vm", v.ID, "err", err)
	}
	if st, err := m.Status(actx); err == nil {
		var err error
		switch {
		case v.State == store.StateRunning && st != "running":
			// Stopped for a save (completed, or stop-and-copy cancelled
			// above) while the daemon died: the guest may have missed the
			// close of the dead daemon's connection.
			if err = m.Resume(actx); err == nil {
				bounceAgentChannel(p.Agent)
			}
		case v.State == store.StatePaused && st == "postmigrate":
			err = m.Repause(actx)
		}
		if err != nil {
			s.log.Warn("cannot restore the recorded state after an interrupted operation", "vm", v.ID, "status", st, "state", v.State, "err", err)
		} else if store.State(st) != v.State {
			s.log.Info("restored the recorded state after an interrupted operation", "vm", v.ID, "status", st, "state", v.State)
		}
	}
	// A snapshot or fork interrupted after it froze the disk: follow QEMU's real top.
	if top, err := m.DiskTop(actx); err == nil && top != "" && top != s.diskPath(v) {
		v.Layers, v.Disk = append(v.Layers, s.diskPath(v)), top
		s.store.UpdateVM(ctx, v)
		s.log.Info("recorded the disk top of an interrupted snapshot", "vm", v.ID, "top", top)
	}
	// A QEMU started by an earlier agentvm keeps its device set: its saves
	// must be restored with it.
	if l := s.hv.RunningLayout(v.PID); l != "" && l != layoutOf(v) {
		v.Layout = l
		s.store.UpdateVM(ctx, v)
	}
	// A memory grow interrupted before it was recorded: the restore command
	// line must plug what QEMU was asked for.
	if qemu.MaxHotplugMiB(layoutOf(v)) > 0 {
		if n, err := m.RequestedMemory(actx); err == nil && n != v.HotMemoryMiB {
			s.log.Info("recorded the memory of an interrupted resize", "vm", v.ID, "was", v.MemoryMiB, "memory_mib", v.MemoryMiB-v.HotMemoryMiB+n)
			v.MemoryMiB, v.HotMemoryMiB = v.MemoryMiB-v.HotMemoryMiB+n, n
			s.store.UpdateVM(ctx, v)
		}
	}
	// A CPU hot-add interrupted before it was recorded: the restore command
	// line must name the vCPUs QEMU really has.
	if n, err := m.PresentCPUs(actx); err == nil && n != v.CPUs {
		s.log.Info("recorded the vCPU count of an interrupted resize", "vm", v.ID, "was", v.CPUs, "cpus", n)
		v.CPUs = n
		s.store.UpdateVM(ctx, v)
	}
	if !s.setInstance(v.ID, in) {
		return fmt.Errorf("this node was fenced (%s)", s.fence.why())
	}
	s.setMachineOOMScore(v.PID, v.State) // a QEMU started by an older daemon had none
	go s.monitor(v.ID, in)
	s.log.Info("reattached", "vm", v.ID, "pid", v.PID)
	s.logEvent(v.ID, "daemon restarted: reattached to qemu pid %d", v.PID)
	return nil
}

// bounceAgentChannel opens and closes the host end of the guest agent's
// channel once the guest runs again after it was stopped for a save while
// the daemon was gone (a save that completed, or a stop-and-copy save that
// reattach cancelled: the failure of TestDaemonInterruptedLifecycle's
// "kill -9 50ms into snapshot" in a loaded CI run). The guest can miss the close of the dead daemon's
// connection (it happened while the guest was stopped for the save) and
// keep its old session, which then never answers a new host: a close it
// does see ends that session (after the agent's EOF debounce), so the next
// connection finds the agent listening for a handshake.
func bounceAgentChannel(sock string) {
	c, err := net.DialTimeout("unix", sock, 2*time.Second)
	if err != nil {
		return
	}
	time.Sleep(100 * time.Millisecond)
	c.Close()
	time.Sleep(400 * time.Millisecond) // longer than the agent's EOF debounce
}
