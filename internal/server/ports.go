package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

func (s *Server) portRoutes(mux patternMux) {
	mux.HandleFunc("POST /v1/vms/{id}/ports", admin(s.exposePort))
	mux.HandleFunc("GET /v1/vms/{id}/ports", s.scoped("", s.listPorts))
	mux.HandleFunc("DELETE /v1/vms/{id}/ports/{port}", admin(s.unexposePort))
	mux.HandleFunc("POST /v1/domains", admin(s.addDomain))
	mux.HandleFunc("GET /v1/domains", admin(s.listDomains))
	mux.HandleFunc("DELETE /v1/domains/{domain}", admin(s.deleteDomain))
}

func (s *Server) portToAPI(v *store.VM, p *store.Port) api.Port {
	out := api.Port{Port: p.Port, Kind: p.Kind, Public: p.Public, CreatedAt: p.CreatedAt}
	if p.Kind == "http" && s.proxy != nil {
		out.URL = s.proxy.URL(v.Name, p.Port)
	}
	if p.Kind == "tcp" {
		out.Host = net.JoinHostPort(p.HostAddr, strconv.Itoa(p.HostPort))
	}
	return out
}

func (s *Server) vmPorts(ctx context.Context, v *store.VM) []api.Port {
	ps, err := s.store.ListPorts(ctx, v.ID)
	if err != nil || len(ps) == 0 {
		return nil
	}
	out := make([]api.Port, 0, len(ps))
	for _, p := range ps {
		out = append(out, s.portToAPI(v, p))
	}
	return out
}

func (s *Server) exposePort(w http.ResponseWriter, r *http.Request) {
	var req api.ExposeRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	if req.Port < 1 || req.Port > 65535 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("port must be between 1 and 65535, got %d", req.Port))
		return
	}
	v, err := s.svc.GetLocal(r.Context(), r.PathValue("id")) // exposures live on the VM's node
	if err != nil {
		writeErr(w, err)
		return
	}
	p := &store.Port{VMID: v.ID, Port: req.Port, Kind: "http", Public: req.Public, CreatedAt: time.Now().UTC()}
	if req.TCP {
		if req.Public {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "--public applies to HTTP previews; a TCP exposure is reachable by whoever can reach its host address")
			return
		}
		if req.HostPort < 0 || req.HostPort > 65535 {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("host_port must be between 0 and 65535, got %d", req.HostPort))
			return
		}
		addr := req.HostAddr
		if addr == "" {
			addr = "127.0.0.1"
		}
		if net.ParseIP(addr) == nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("host_addr must be an IP address, got %q", addr))
			return
		}
		if s.proxy == nil {
			writeError(w, http.StatusConflict, api.CodeConflict, "the preview proxy is disabled (--proxy-listen \"\")")
			return
		}
		if s.isOwnPort(addr, req.HostPort) {
			writeError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("%s:%d is one of agentvm's own ports", addr, req.HostPort))
			return
		}
		bound, err := s.proxy.ExposeTCP(v.ID, req.Port, net.JoinHostPort(addr, strconv.Itoa(req.HostPort)))
		if err != nil {
			writeError(w, http.StatusConflict, api.CodeConflict, err.Error())
			return
		}
		h, ps, _ := net.SplitHostPort(bound)
		p.Kind, p.HostAddr = "tcp", h
		p.HostPort, _ = strconv.Atoi(ps)
	} else if req.HostPort != 0 || req.HostAddr != "" {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "host_port and host_addr apply to TCP exposures (tcp: true)")
		return
	}
	if err := s.store.PutPort(r.Context(), p); err != nil {
		if p.Kind == "tcp" {
			s.proxy.UnexposeTCP(v.ID, p.Port)
		}
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.portToAPI(v, p))
}

// isOwnPort reports whether addr:port is the API, SSH or proxy listener.
func (s *Server) isOwnPort(addr string, port int) bool {
	if port == 0 {
		return false
	}
	for _, a := range []string{s.Addr(), s.SSHAddr(), s.ProxyAddr()} {
		if _, p, err := net.SplitHostPort(a); err == nil && p == strconv.Itoa(port) {
			return true
		}
	}
	return false
}

func (s *Server) listPorts(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ListPortsResponse{Ports: s.vmPorts(r.Context(), v)}
	if out.Ports == nil {
		out.Ports = []api.Port{}
	}
	writeJSON(w, 200, out)
}

func (s *Server) unexposePort(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.GetLocal(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "port must be between 1 and 65535")
		return
	}
	kind := r.URL.Query().Get("kind")
	if kind == "" {
		kind = "http"
	}
	if kind != "http" && kind != "tcp" {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "kind must be http or tcp")
		return
	}
	if err := s.store.DeletePort(r.Context(), v.ID, port, kind); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("port %d of %s is not exposed (%s)", port, v.Name, kind))
			return
		}
		writeErr(w, err)
		return
	}
	if kind == "tcp" && s.proxy != nil {
		s.proxy.UnexposeTCP(v.ID, port)
	}
	w.WriteHeader(http.StatusNoContent)
}

var domainRe = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func (s *Server) addDomain(w http.ResponseWriter, r *http.Request) {
	var req api.Domain
	if !decodeJSON(w, r, &req) {
		return
	}
	req.Domain = strings.TrimSuffix(strings.ToLower(req.Domain), ".")
	if !domainRe.MatchString(req.Domain) || len(req.Domain) > 253 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("%q is not a valid domain name", req.Domain))
		return
	}
	if s.proxy != nil && strings.HasSuffix(req.Domain, "."+s.proxy.Domain()) {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("names under .%s are preview hosts already", s.proxy.Domain()))
		return
	}
	if req.Port < 1 || req.Port > 65535 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("port must be between 1 and 65535, got %d", req.Port))
		return
	}
	v, err := s.svc.Get(r.Context(), req.VM)
	if err != nil {
		writeErr(w, err)
		return
	}
	d := &store.Domain{Domain: req.Domain, VMID: v.ID, Port: req.Port, CreatedAt: time.Now().UTC()}
	if err := s.store.PutDomain(r.Context(), d); err != nil {
		if errors.Is(err, store.ErrConflict) {
			writeError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf("%s is mapped to another VM", req.Domain))
			return
		}
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, api.Domain{Domain: d.Domain, VM: v.ID, Port: d.Port, CreatedAt: d.CreatedAt})
}

func (s *Server) listDomains(w http.ResponseWriter, r *http.Request) {
	ds, err := s.store.ListDomains(r.Context(), "")
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ListDomainsResponse{Domains: []api.Domain{}}
	for _, d := range ds {
		out.Domains = append(out.Domains, api.Domain{Domain: d.Domain, VM: d.VMID, Port: d.Port, CreatedAt: d.CreatedAt})
	}
	writeJSON(w, 200, out)
}

func (s *Server) deleteDomain(w http.ResponseWriter, r *http.Request) {
	if err := s.store.DeleteDomain(r.Context(), strings.ToLower(r.PathValue("domain"))); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			writeError(w, http.StatusNotFound, api.CodeNotFound, "no domain "+r.PathValue("domain"))
			return
		}
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// restoreTCPExposures re-opens the TCP listeners recorded in the store.
func (s *Server) restoreTCPExposures(ctx context.Context) {
	ps, err := s.store.ListPorts(ctx, "")
	if err != nil {
		s.log.Warn("list exposures", "err", err)
		return
	}
	for _, p := range ps {
		if p.Kind != "tcp" {
			continue
		}
		if v, err := s.svc.Get(ctx, p.VMID); err != nil || !s.svc.IsLocal(v) {
			continue // another cluster node's VM opens its own
		}
		if _, err := s.proxy.ExposeTCP(p.VMID, p.Port, net.JoinHostPort(p.HostAddr, strconv.Itoa(p.HostPort))); err != nil {
			s.log.Warn("re-open TCP exposure", "vm", p.VMID, "port", p.Port, "host", p.HostAddr, "host_port", p.HostPort, "err", err)
		}
	}
}
