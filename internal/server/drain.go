package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

// drainNode serves POST /v1/nodes/{node}/drain: the node named marks
// itself draining (placement passes it by) and hands each running, paused
// or suspended VM to the roomiest other node that runs the same QEMU,
// machine, CPU model and accelerator: it suspends the VM, stores its state
// in the object store, moves the record (store.MoveVM), and asks that node
// to wake it when it was running (a paused VM arrives suspended). A VM
// that cannot go stays, running again if it ran. A drain sent to another node is passed
// to it. Stopped VMs stay: they have no memory to carry, and their disks
// are not stored.
func (s *Server) drainNode(w http.ResponseWriter, r *http.Request) {
	if s.member == nil {
		writeError(w, http.StatusConflict, api.CodeConflict, "this agentvm is not a cluster node")
		return
	}
	ctx, ref := r.Context(), r.PathValue("node")
	n, err := s.store.GetNode(ctx, ref)
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no node %q", ref))
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	self := s.member.Node()
	if !n.Alive {
		writeError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("node %s is lost: nothing runs there to drain; its suspended VMs whose state was stored are taken over by the node next asked to act on them", n.Name))
		return
	}
	if n.ID != self.ID {
		peer := s.otherLiveNode(n.ID)
		if peer == nil || forwarded(r) {
			writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, fmt.Sprintf("node %s cannot be reached from here", n.Name))
			return
		}
		resp, err := s.peers.send(ctx, peer, r, nil, principal(r))
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, fmt.Sprintf("node %s did not answer: %v", n.Name, err))
			return
		}
		relay(w, resp)
		return
	}
	// Nothing is marked before it is known that VMs can move at all.
	if s.cfg.Objects == "" {
		writeError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("node %s has no object store: a drain moves VMs through one (serve --objects)", self.Name))
		return
	}
	if err := s.store.SetDraining(ctx, self.ID); err != nil {
		writeErr(w, err)
		return
	}
	vms, err := s.store.ListVMs(ctx)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.DrainResponse{Node: self.Name, VMs: []api.DrainedVM{}}
	for _, v := range vms {
		if v.Node != self.ID || v.State == store.StatePool {
			continue
		}
		out.VMs = append(out.VMs, s.drainVM(r, &self, v))
	}
	writeJSON(w, http.StatusOK, out)
}

// drainVM moves v from this node (self) to another, and wakes it there if
// it was running.
func (s *Server) drainVM(r *http.Request, self *store.Node, v *store.VM) api.DrainedVM {
	ctx := r.Context()
	res := api.DrainedVM{ID: v.ID, Name: v.Name, State: api.State(v.State)}
	switch v.State {
	case store.StateRunning, store.StatePaused, store.StateSuspended:
	default:
		res.Error = fmt.Sprintf("it is %s: only running, paused and suspended VMs move (stop is not a state whose memory goes along)", v.State)
		return res
	}
	target, err := s.drainTarget(ctx, self, v.MemoryMiB)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	before, err := s.svc.MoveOut(ctx, v.ID, target.ID)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	res.To, res.State = target.Name, api.StateSuspended
	if before.State != store.StateRunning {
		return res // a paused VM arrives suspended: it wakes when used
	}
	// It ran here: it runs there.
	wake, err := http.NewRequestWithContext(ctx, http.MethodGet, "/v1/vms/"+url.PathEscape(v.ID)+"?wake=1", nil)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	resp, err := s.peers.send(ctx, target, wake, nil, principal(r))
	if err != nil {
		res.Error = fmt.Sprintf("moved to %s, suspended; its wake there failed: %v", target.Name, err)
		return res
	}
	if resp.StatusCode != http.StatusOK {
		res.Error = fmt.Sprintf("moved to %s, suspended; its wake there failed (%d): %s", target.Name, resp.StatusCode, peerAnswer(resp, 4<<10))
		return res
	}
	resp.Body.Close()
	res.State = api.StateRunning
	return res
}

// drainTarget is the roomiest live node, other than self and not
// draining, that can restore what self saves.
func (s *Server) drainTarget(ctx context.Context, self *store.Node, memMiB int64) (*store.Node, error) {
	rooms, err := s.store.Rooms(ctx, memMiB, store.Avoid{})
	if err != nil {
		return nil, err
	}
	nodes, err := s.store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	like := map[string]bool{}
	saves := store.SavedBy{QEMU: self.QEMUVersion, Machine: self.MachineType, CPUModel: self.CPUModel, Accel: self.Accel}
	for _, n := range nodes {
		like[n.ID] = n.ID != self.ID && restores(n, saves)
	}
	for _, room := range rooms {
		if !like[room.Node] {
			continue
		}
		if peer := s.otherLiveNode(room.Node); peer != nil {
			return peer, nil
		}
	}
	return nil, fmt.Errorf("no other live node with %d MiB free runs QEMU %s (%s, %s) as this one does", memMiB, self.QEMUVersion, self.MachineType, self.Accel)
}
