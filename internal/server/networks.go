package server

import (
	"net/http"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

func (s *Server) networkRoutes(mux patternMux) {
	mux.HandleFunc("POST /v1/networks", admin(s.createNetwork))
	mux.HandleFunc("GET /v1/networks", admin(s.listNetworks))
	mux.HandleFunc("GET /v1/networks/{name}", admin(s.getNetwork))
	mux.HandleFunc("DELETE /v1/networks/{name}", admin(s.deleteNetwork))
	mux.HandleFunc("POST /v1/networks/{name}/egress", admin(s.setNetworkEgress))
	mux.HandleFunc("POST /v1/vms/{id}/network", admin(s.attachNetwork))
	mux.HandleFunc("POST /v1/vms/{id}/egress", admin(s.setEgress))
	mux.HandleFunc("DELETE /v1/vms/{id}/egress", admin(s.clearEgress))
}

func (s *Server) networkToAPI(r *http.Request, n *store.Network) api.NetworkInfo {
	out := api.NetworkInfo{Name: n.Name, Egress: (*api.Egress)(n.Egress), CreatedAt: n.CreatedAt, VMs: []string{}}
	if ms, err := s.svc.Networks().Members(r.Context(), n.Name); err == nil {
		for _, m := range ms {
			out.VMs = append(out.VMs, m.Name)
		}
	}
	return out
}

func (s *Server) createNetwork(w http.ResponseWriter, r *http.Request) {
	var req api.CreateNetworkRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	n, err := s.svc.Networks().Create(r.Context(), req.Name, (*store.Egress)(req.Egress))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.networkToAPI(r, n))
}

func (s *Server) listNetworks(w http.ResponseWriter, r *http.Request) {
	ns, err := s.store.ListNetworks(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ListNetworksResponse{Networks: []api.NetworkInfo{}}
	for _, n := range ns {
		out.Networks = append(out.Networks, s.networkToAPI(r, n))
	}
	writeJSON(w, 200, out)
}

func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) {
	n, err := s.store.GetNetwork(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, http.StatusNotFound, api.CodeNotFound, "no network "+r.PathValue("name"))
		return
	}
	writeJSON(w, 200, s.networkToAPI(r, n))
}

func (s *Server) deleteNetwork(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.Networks().Delete(r.Context(), r.PathValue("name")); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setNetworkEgress(w http.ResponseWriter, r *http.Request) {
	var e api.Egress
	if !decodeJSON(w, r, &e) {
		return
	}
	n, err := s.svc.Networks().SetEgress(r.Context(), r.PathValue("name"), (*store.Egress)(&e))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, s.networkToAPI(r, n))
}

func (s *Server) attachNetwork(w http.ResponseWriter, r *http.Request) {
	var req api.AttachNetworkRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	v, err := s.svc.SetNetwork(r.Context(), r.PathValue("id"), req.Network)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, s.toAPI(v))
}

func (s *Server) setEgress(w http.ResponseWriter, r *http.Request) {
	var e api.Egress
	if !decodeJSON(w, r, &e) {
		return
	}
	v, err := s.svc.SetEgress(r.Context(), r.PathValue("id"), (*store.Egress)(&e))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, s.toAPI(v))
}

func (s *Server) clearEgress(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.SetEgress(r.Context(), r.PathValue("id"), nil)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, s.toAPI(v))
}
