package vm

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentvm/agentvm/internal/store"
)

// A service on a cluster node (Config.Node set) runs only the VMs whose
// record names its node: it reconciles, applies policies to, suspends at
// shutdown and operates on those alone, lists all, and answers an
// operation on another node's VM with ErrOtherNode. When its lease may run
// out before it can renew it, the node fences itself (Fence): every VM it
// runs is killed and operations are refused until it has joined again
// (Unfence), so that no VM ever runs on two nodes.

// ErrOtherNode: the VM runs on another cluster node.
var ErrOtherNode = errors.New("the VM runs on another node")

// ours answers whether v runs on this node (always outside a cluster).
func (s *Service) ours(v *store.VM) error {
	if v.Node == s.cfg.Node {
		return nil
	}
	if v.Node == "" {
		return fmt.Errorf("%w: VM %s belongs to no node: it was made by a daemon outside the cluster, whose data dir holds it (start that daemon with --cluster to bring it in)", ErrOtherNode, v.Name)
	}
	return fmt.Errorf("%w: VM %s runs on node %s, not on this one (%s): send the request to that node (agentvm node ls shows its address)",
		ErrOtherNode, v.Name, v.Node, s.cfg.Node)
}

// nodeLost reports whether node id is another node, whose lease ran out.
func (c *Config) nodeLost(ctx context.Context, id string) (bool, error) {
	if id == "" || id == c.Node || c.NodeLost == nil {
		return false, nil
	}
	return c.NodeLost(ctx, id)
}

// snapshotHere refuses a snapshot whose files are in another node's data
// dir (ErrOtherNode).
func (s *Service) snapshotHere(sn *store.Snapshot) error {
	if sn.Node == s.cfg.Node {
		return nil
	}
	return fmt.Errorf("%w: snapshot %s is kept on node %s, not on this one (%s): send the request to that node", ErrOtherNode, sn.Name, sn.Node, s.cfg.Node)
}

// forgetLost deletes the record of a VM of a lost node: it runs nowhere
// (the node fenced itself before its lease ran out, or is gone), and its
// files are on that node's host, which removes what no record names if it
// comes back. Its exposures go, and the delete hooks run, as for any
// delete; this node's files are not touched.
func (s *Service) forgetLost(ctx context.Context, v *store.VM) error {
	if err := s.fence.check(); err != nil {
		return err
	}
	if err := s.store.ForgetVM(ctx, v.ID, v.Node); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return fmt.Errorf("%w: %v", ErrConflict, err)
		}
		return err
	}
	if err := s.store.DeletePorts(ctx, v.ID); err != nil {
		s.log.Warn("delete exposures of a lost node's VM", "vm", v.ID, "err", err)
	}
	s.unstoreVM(v.ID, v.StoredManifest)
	s.deleted(v.ID)
	s.log.Info("forgot a VM of a lost node", "vm", v.ID, "node", v.Node)
	return nil
}

// IsLocal reports whether v runs on this node.
func (s *Service) IsLocal(v *store.VM) bool { return s.ours(v) == nil }

// GetLocal is Get for a change to a VM: refused on a fenced node (before
// the store is read, which may be what is gone) and for another node's VM
// (ErrOtherNode).
func (s *Service) GetLocal(ctx context.Context, idOrName string) (*store.VM, error) {
	if err := s.fence.check(); err != nil {
		return nil, err
	}
	v, err := s.GetFresh(ctx, idOrName)
	if err != nil {
		return nil, err
	}
	// A lost node's suspended VM whose state is stored becomes this
	// node's (vmstore.go), and its state is fetched before it is used.
	if s.adoptable(ctx, v) {
		if err := s.adopt(ctx, v); err != nil {
			// A concurrent request here may have taken it over first.
			cur, gerr := s.GetFresh(ctx, v.ID)
			if gerr != nil || cur.Node != s.cfg.Node {
				return nil, err
			}
			v = cur
		}
	} else if sn := s.revivable(ctx, v); sn != nil {
		// A lost node's VM with no stored state of its own comes back
		// from its newest stored snapshot (revive.go).
		if err := s.revive(ctx, v, sn); err != nil {
			if !errors.Is(err, ErrConflict) {
				return nil, err
			}
			// A concurrent request here may have taken it over first
			// (its revive held the VM's lock until done).
			if v, err = s.GetFresh(ctx, v.ID); err != nil {
				return nil, err
			}
		}
	}
	if err := s.ours(v); err != nil {
		return nil, err
	}
	if err := s.fetchSuspended(ctx, v); err != nil {
		return nil, err
	}
	if err := s.ours(v); err != nil { // it moved while the fetch waited
		return nil, err
	}
	return v, nil
}

// localVMs lists the VMs of this node.
func (s *Service) localVMs(ctx context.Context) ([]*store.VM, error) {
	vms, err := s.store.ListVMs(ctx)
	if err != nil {
		return nil, err
	}
	out := vms[:0]
	for _, v := range vms {
		if v.Node == s.cfg.Node {
			out = append(out, v)
		}
	}
	return out, nil
}

// Fence kills every VM this node runs, at once and without a word to the
// store (which may be out of reach): the node could not renew its lease
// and another node may soon be given its VMs. Every machine gets SIGKILL
// before anything is torn down. Until Unfence, operations are refused
// with ErrUnavailable naming reason, and a machine an operation was
// starting is killed as it would be recorded (setInstance).
func (s *Service) Fence(reason string) {
	s.fence.raise(reason)
	ins := s.takeInstances()
	ids := make([]string, 0, len(ins))
	for _, in := range ins {
		in.expect()
		in.machine.Kill()
		ids = append(ids, in.id)
	}
	s.fence.kill(ids...)
	for _, in := range ins {
		in.kill() // networks and agent sessions
	}
	s.log.Error("fenced: every VM of this node killed", "reason", reason, "vms", len(ins))
}

// Unfence runs after the node has joined the cluster again. It records
// what the fences did, each VM under its operation lock (so after any
// operation that was under way): a VM recorded running or paused without
// a machine is crashed, with the reason, and a warm-pool VM deleted. Then
// it lets operations through again, unless a new fence came meanwhile.
func (s *Service) Unfence(ctx context.Context) error {
	s.fence.unfence.Lock()
	defer s.fence.unfence.Unlock()
	epoch, reason, ids := s.fence.pending()
	var errs []error
	for _, id := range ids {
		if err := s.recordFenced(ctx, id, reason); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err // still fenced; the next rejoin tries again
	}
	s.fence.lower(epoch, ids)
	return nil
}

// recordFenced records what a fence did to VM id.
func (s *Service) recordFenced(ctx context.Context, id, reason string) error {
	unlock := s.ops.lock(id, "unfence")
	defer unlock()
	v, err := s.store.GetVMFresh(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil // deleted meanwhile
	}
	if err != nil {
		return err
	}
	if s.instance(id) != nil {
		return nil // started again since
	}
	if v.Node != s.cfg.Node {
		return nil // another node took it over (revive.go): its record and QEMU are that node's
	}
	s.killStrays(v, 0)
	h := s.hold(v, unlock)
	switch {
	case v.State == statePool:
		h.destroy(ctx)
	case live(v):
		v.PID, v.ColdBoot, v.Error = 0, true, "killed by this node's fence: "+reason
		return h.enter(ctx, store.StateCrashed)
	}
	return nil
}

// CheckFenced refuses an operation while the node is fenced.
func (s *Service) CheckFenced() error { return s.fence.check() }
