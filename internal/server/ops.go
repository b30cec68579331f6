package server

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

func (s *Server) opVM(op func(*http.Request, string) (*vm.OpResult, error), name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		res, err := op(r, r.PathValue("id"))
		if err != nil {
			writeErr(w, err)
			return
		}
		out := s.toAPI(res.VM)
		out.Op = &api.OpStats{Name: name, TookMs: res.TookMs, PausedMs: res.PausedMs, Bytes: res.Bytes}
		writeJSON(w, 200, out)
	}
}

func (s *Server) snapshotVM(w http.ResponseWriter, r *http.Request) {
	var req api.SnapshotRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	sn, err := s.svc.Snapshot(r.Context(), r.PathValue("id"), req.Name)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.snapToAPI(sn))
}

func (s *Server) snapToAPI(sn *store.Snapshot) api.Snapshot {
	out := api.Snapshot{ID: sn.ID, Name: sn.Name, VMID: sn.VMID, VMName: sn.VMName, CPUs: sn.CPUs, MemoryMiB: sn.MemoryMiB,
		DiskBytes: sn.DiskBytes, Bytes: sn.Bytes, PausedMs: sn.PausedMs, CreatedAt: sn.CreatedAt, Image: imageName(sn.Image)}
	if sn.Node != "" {
		out.NodeID, out.Node = sn.Node, s.nodes.get(s, sn.Node).name
	}
	if !sn.StoredAt.IsZero() {
		at := sn.StoredAt
		out.StoredAt = &at
	}
	return out
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	sns, err := s.svc.Snapshots(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ListSnapshotsResponse{Snapshots: []api.Snapshot{}}
	for _, sn := range sns {
		out.Snapshots = append(out.Snapshots, s.snapToAPI(sn))
	}
	writeJSON(w, 200, out)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.svc.GetSnapshot(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, s.snapToAPI(sn))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if sn, err := s.svc.GetSnapshot(r.Context(), r.PathValue("id")); err == nil {
		if user := s.builds.Uses(r.Context(), sn.ID); user != "" {
			writeError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("snapshot %s belongs to %s; agentvm template rm removes it with its template", sn.Name, user))
			return
		}
	}
	if err := s.svc.DeleteSnapshot(r.Context(), r.PathValue("id")); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) forkVM(w http.ResponseWriter, r *http.Request) {
	req := api.ForkRequest{Count: 1}
	if !decodeJSON(w, r, &req) {
		return
	}
	if q := r.URL.Query().Get("count"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil {
			writeError(w, 400, api.CodeInvalid, "count must be a number")
			return
		}
		req.Count = n
	}
	res, err := s.svc.Fork(r.Context(), r.PathValue("id"), req.Count)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ForkResponse{Parent: s.toAPI(res.Parent), Children: []api.VM{}, ParentPauseMs: res.PausedMs, StateBytes: res.Bytes, TookMs: res.TookMs}
	for _, c := range res.Children {
		out.Children = append(out.Children, s.toAPI(c))
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) resizeVM(w http.ResponseWriter, r *http.Request) {
	var req api.ResizeRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	res, err := s.svc.Resize(r.Context(), r.PathValue("id"), vm.ResizeOptions{CPUs: req.CPUs, MemoryMiB: req.Memory.MiB(), DiskBytes: int64(req.Disk)})
	if err != nil {
		writeErr(w, err)
		return
	}
	out := s.toAPI(res.VM)
	out.Op = &api.OpStats{Name: "resize", Message: res.Message}
	writeJSON(w, 200, out)
}
