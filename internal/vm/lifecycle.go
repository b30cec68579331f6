package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/hypervisor/qemu"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

// Get finds a VM by id or name, from the store's read cache when it may:
// for routing and for answers. What decides or changes a VM reads it with
// GetFresh.
func (s *Service) Get(ctx context.Context, idOrName string) (*store.VM, error) {
	return s.get(ctx, idOrName, s.store.GetVM)
}

// GetFresh is Get from the database (store.GetVMFresh): on PostgreSQL
// another node's write shows in it at once.
func (s *Service) GetFresh(ctx context.Context, idOrName string) (*store.VM, error) {
	return s.get(ctx, idOrName, s.store.GetVMFresh)
}

func (s *Service) get(ctx context.Context, idOrName string, read func(context.Context, string) (*store.VM, error)) (*store.VM, error) {
	v, err := read(ctx, idOrName)
	if err == nil && v.State == statePool {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: no VM named or with id %q", ErrNotFound, idOrName)
	}
	return v, err
}

// List returns all VMs (not the warm pool).
func (s *Service) List(ctx context.Context) ([]*store.VM, error) {
	vms, err := s.store.ListVMs(ctx)
	out := vms[:0]
	for _, v := range vms {
		if v.State != statePool {
			out = append(out, v)
		}
	}
	return out, err
}

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

// Guest returns the agent session of a running VM, resuming a paused VM and waking
// a suspended one first.
func (s *Service) Guest(ctx context.Context, idOrName string) (*store.VM, *guest.Client, error) {
	v, err := s.Wake(ctx, idOrName)
	if err != nil {
		return nil, nil, err
	}
	if err := checkTransition(opExec, v); err != nil {
		return nil, nil, err
	}
	in := s.instance(v.ID)
	if in == nil {
		return nil, nil, fmt.Errorf("%w: VM %s is %s but not attached", ErrUnavailable, v.Name, v.State)
	}
	c, err := in.guestClient(ctx)
	return v, c, err
}

// DialGuest opens a TCP connection to port inside a running VM through its virtual network.
func (s *Service) DialGuest(ctx context.Context, idOrName string, port int) (net.Conn, error) {
	v, err := s.Wake(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	if err := checkTransition(opExec, v); err != nil {
		return nil, err
	}
	in, err := s.attached(v)
	if err != nil {
		return nil, err
	}
	c, err := in.net.DialGuest(ctx, port)
	if errors.Is(err, network.ErrRefused) {
		return nil, fmt.Errorf("%w: %w: %w: connect to port %d on the address of %s: %w", ErrUnavailable, ErrGuestDial, ErrNoListener, port, v.Name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w: connect to port %d in %s: %w", ErrUnavailable, ErrGuestDial, port, v.Name, err)
	}
	return c, nil
}

// Logs returns the VM log (serial console and QEMU output), at most its last maxBytes.
func (s *Service) Logs(ctx context.Context, idOrName string, maxBytes int64) (io.ReadCloser, error) {
	v, err := s.Get(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(s.paths(v.ID).Log)
	if err != nil {
		return nil, fmt.Errorf("%w: no log for %s yet", ErrNotFound, v.Name)
	}
	if st, err := f.Stat(); err == nil && st.Size() > maxBytes {
		f.Seek(st.Size()-maxBytes, io.SeekStart)
	}
	return f, nil
}

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

// DialPort connects to a TCP port inside a VM, waking it first: through
// its virtual network to the guest's address, or, when nothing listens
// there (a server bound to the guest's loopback, as dev servers often are),
// through the guest agent from inside the guest.
func (s *Service) DialPort(ctx context.Context, idOrName string, port int) (net.Conn, error) {
	c, err := s.DialGuest(ctx, idOrName, port)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, network.ErrRefused) {
		return nil, err
	}
	_, gc, gerr := s.Guest(ctx, idOrName)
	if gerr != nil {
		return nil, err
	}
	c, lerr := gc.DialTCP(ctx, "127.0.0.1", port)
	if lerr != nil {
		return nil, fmt.Errorf("%w: %w: connect to port %d: connection refused (nothing listens on it, on the guest address or its loopback)", ErrUnavailable, ErrNoListener, port)
	}
	return c, nil
}
