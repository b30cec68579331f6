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
	return fmt.Errorf("%w: VM %s runs on node %s, not on this one (%s): send the request to that node (agentvm node ls shows its address)",
		ErrOtherNode, v.Name, v.Node, s.cfg.Node)
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
// and another node may soon be given its VMs. Until Unfence, operations
// are refused with ErrUnavailable naming reason.
func (s *Service) Fence(reason string) {
	s.mu.Lock()
	s.fenced = reason
	s.mu.Unlock()
	ins := s.takeInstances()
	for _, in := range ins {
		in.kill()
	}
	s.log.Error("fenced: every VM of this node killed", "reason", reason, "vms", len(ins))
}

// Unfence runs after the node has joined the cluster again: it records
// what the fence did (each VM it killed is crashed, with the reason) and
// lets operations through again.
func (s *Service) Unfence(ctx context.Context) error {
	if err := s.Reconcile(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	s.fenced = ""
	s.mu.Unlock()
	return nil
}

// checkFenced refuses an operation while the node is fenced.
func (s *Service) checkFenced() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fenced != "" {
		return fmt.Errorf("%w: this node stopped its VMs and takes no operations until it is back in the cluster (%s)", ErrUnavailable, s.fenced)
	}
	return nil
}

func (s *Service) fenceReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fenced
}
