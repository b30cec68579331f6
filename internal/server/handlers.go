package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/proxy"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])[:10]
}

func (s *Server) routes() http.Handler {
	h, _ := s.router()
	return h
}

// patternMux is a ServeMux that lists the patterns registered through it:
// openapi_test.go checks them against api/openapi.yaml.
type patternMux struct {
	*http.ServeMux
	patterns *[]string
}

func (m patternMux) Handle(pattern string, h http.Handler) {
	*m.patterns = append(*m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m patternMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	*m.patterns = append(*m.patterns, pattern)
	m.ServeMux.HandleFunc(pattern, h)
}

// router is the API's handler and the patterns it serves (E2B's API, on the
// same listener, is another product's and is not listed).
func (s *Server) router() (http.Handler, []string) {
	var patterns []string
	mux := patternMux{http.NewServeMux(), &patterns}
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		h := api.Health{Status: "ok", Version: Version, Accel: s.accel, WarmPool: s.svc.PoolReady(), SSH: s.SSHAddr()}
		if s.proxy != nil {
			h.Proxy, h.Domain, h.ProxyTLS = s.proxy.Addr(), s.proxy.Domain(), s.proxy.Scheme() == "https"
		}
		writeJSON(w, 200, h)
	})
	if s.e2b != nil {
		s.e2b.Routes(mux.ServeMux) // E2B's API, authenticated by X-API-KEY
	}
	// The local CA's certificate (public) that clients trust for --tls auto.
	mux.HandleFunc("GET /v1/tls/ca", func(w http.ResponseWriter, r *http.Request) {
		b, err := os.ReadFile(filepath.Join(s.cfg.DataDir, proxy.CAFile))
		if err != nil || !s.cfg.TLSAuto {
			writeError(w, http.StatusNotFound, api.CodeNotFound, "no local CA: the server does not run with --tls auto")
			return
		}
		w.Header().Set("Content-Type", "application/x-pem-file")
		w.Write(b)
	})
	// Hosted git (git's smart HTTP protocol), with git's own credentials.
	mux.HandleFunc("/git/", s.serveGit)
	authed := patternMux{http.NewServeMux(), &patterns}
	authed.HandleFunc("POST /v1/vms", admin(s.createVM))
	authed.HandleFunc("GET /v1/vms", admin(s.listVMs))
	authed.HandleFunc("GET /v1/vms/{id}", s.scoped("", s.getVM))
	authed.HandleFunc("DELETE /v1/vms/{id}", admin(s.deleteVM))
	authed.HandleFunc("POST /v1/vms/{id}/start", admin(s.startVM))
	authed.HandleFunc("POST /v1/vms/{id}/stop", admin(s.stopVM))
	authed.HandleFunc("POST /v1/vms/{id}/exec", s.scoped(api.PermExec, s.execVM))
	authed.HandleFunc("GET /v1/vms/{id}/logs", admin(s.logsVM))
	authed.HandleFunc("POST /v1/vms/{id}/pause", admin(s.opVM(func(r *http.Request, id string) (*vm.OpResult, error) { return s.svc.Pause(r.Context(), id) }, "pause")))
	authed.HandleFunc("POST /v1/vms/{id}/resume", admin(s.opVM(func(r *http.Request, id string) (*vm.OpResult, error) { return s.svc.Resume(r.Context(), id) }, "resume")))
	authed.HandleFunc("POST /v1/vms/{id}/suspend", admin(s.opVM(func(r *http.Request, id string) (*vm.OpResult, error) { return s.svc.Suspend(r.Context(), id) }, "suspend")))
	authed.HandleFunc("POST /v1/vms/{id}/snapshot", admin(s.snapshotVM))
	authed.HandleFunc("POST /v1/vms/{id}/fork", admin(s.forkVM))
	authed.HandleFunc("POST /v1/vms/{id}/resize", admin(s.resizeVM))
	authed.HandleFunc("GET /v1/snapshots", admin(s.listSnapshots))
	authed.HandleFunc("GET /v1/snapshots/{id}", admin(s.getSnapshot))
	authed.HandleFunc("DELETE /v1/snapshots/{id}", admin(s.deleteSnapshot))
	authed.HandleFunc("GET /v1/vms/{id}/tcp/{port}", s.scoped(api.PermExec, s.tcpVM))
	authed.HandleFunc("GET /v1/vms/{id}/diff", s.scoped(api.PermFiles, s.diffVM))
	authed.HandleFunc("POST /v1/templates/{name}/build", admin(s.buildTemplate))
	authed.HandleFunc("GET /v1/templates", admin(s.listTemplates))
	authed.HandleFunc("GET /v1/templates/{name}", admin(s.getTemplate))
	authed.HandleFunc("DELETE /v1/templates/{name}", admin(s.deleteTemplate))
	authed.HandleFunc("POST /v1/templates/{name}/tags", admin(s.tagTemplate))
	authed.HandleFunc("POST /v1/templates/prune", admin(s.pruneTemplates))
	authed.HandleFunc("GET /v1/nodes", admin(s.listNodes))
	authed.HandleFunc("DELETE /v1/nodes/{node}", admin(s.removeNode))
	authed.HandleFunc("POST /v1/nodes/{node}/drain", admin(s.drainNode))
	authed.HandleFunc("POST /v1/tokens", admin(s.createToken))
	authed.HandleFunc("GET /v1/tokens", admin(s.listTokens))
	authed.HandleFunc("DELETE /v1/tokens/{id}", admin(s.revokeToken))
	authed.HandleFunc("GET /v1/ssh", s.sshInfo)
	// Events carry every caller's command lines (the admin's too, secrets in
	// arguments included): only tokens that run programs in the VM, and so
	// can see its processes anyway, read them; a preview link does not.
	authed.HandleFunc("GET /v1/vms/{id}/events", s.scopedAny(auth.RunPerms, s.listEvents))
	authed.HandleFunc("POST /v1/vms/{id}/policy", admin(s.setPolicy))
	authed.HandleFunc("GET /metrics", admin(s.serveMetrics))
	// the guest agent's own profiles, e.g. .../debug/pprof/profile?seconds=10
	authed.HandleFunc("GET /v1/vms/{id}/debug/pprof/{name}", admin(s.relayGuest("/debug/pprof/{name}", "")))
	s.portRoutes(authed)
	s.networkRoutes(authed)
	s.repoRoutes(authed)
	s.recordingRoutes(authed)
	s.serviceRoutes(authed)
	s.fileRoutes(authed)
	s.termRoutes(authed)
	s.codeRoutes(authed)
	s.displayRoutes(authed)
	s.consoleRoutes(mux, authed)
	authed.Handle("/mcp", s.mcpHandler())
	authed.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, api.CodeNotFound, fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	s.authed = authed
	mux.Handle("/", s.auth(authed))
	return mux, patterns
}

func (s *Server) toAPI(v *store.VM) api.VM {
	out := api.VM{ID: v.ID, Name: v.Name, State: api.State(v.State), CPUs: v.CPUs, MemoryMiB: v.MemoryMiB, DiskBytes: v.DiskBytes,
		Labels: v.Labels, Env: v.Env, PID: v.PID, Accel: s.accel, Template: v.Template, Error: v.Error,
		CreatedAt: v.CreatedAt, StartedAt: v.StartedAt, CreateMs: v.CreateMs, Source: v.Source, NextCPUs: v.NextCPUs, NextMemoryMiB: v.NextMemoryMiB}
	sub := network.SubnetForIndex(v.NetIndex)
	cfg := network.Config{Subnet: sub}
	out.Subnet, out.Gateway, out.IP = sub.String(), cfg.Gateway().String(), cfg.GuestIP().String()
	out.Ports = s.vmPorts(context.Background(), v)
	out.Network, out.Egress = v.Network, (*api.Egress)(v.Egress)
	out.IdleTimeoutSec, out.DeleteAfterSec, out.Restart = v.IdleTimeoutSec, v.DeleteAfterSec, v.Restart
	out.Image = imageName(v.Image)
	out.StateBytes = s.svc.StateBytes(v)
	if v.Node != "" {
		n := s.nodes.get(s, v.Node)
		out.NodeID, out.Node, out.NodeLost = v.Node, n.name, !n.alive
	}
	if out.NodeLost && v.StoredAt.IsZero() && vm.Revivable(v.State) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if sn := s.svc.LastStoredSnapshot(ctx, v.ID); sn != nil {
			out.RevivesFrom = &api.RevivePoint{Snapshot: sn.Name, TakenAt: sn.CreatedAt}
		}
		cancel()
	}
	if !v.StoredAt.IsZero() {
		at := v.StoredAt
		out.StoredAt = &at
	}
	return out
}

// decodeJSON reads a JSON body strictly; a bad body is a 400 with the reason.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && err != io.EOF {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "invalid JSON body: "+err.Error())
		return false
	}
	return true
}

// createOptions maps a create request onto the VM service's options; key is
// the idempotency key (the header's, else the body's).
func createOptions(req *api.CreateVMRequest, key string) vm.CreateOptions {
	return vm.CreateOptions{
		Name: req.Name, CPUs: req.CPUs, MemoryMiB: req.Memory.MiB(), DiskBytes: int64(req.Disk),
		Labels: req.Labels, Env: req.Env, IdempotencyKey: key, Network: req.Network, Egress: (*store.Egress)(req.Egress),
		IdleTimeout: time.Duration(req.IdleTimeout), DeleteAfter: time.Duration(req.DeleteAfter), Restart: req.Restart,
		Image: req.Image,
	}
}

func (s *Server) createVM(w http.ResponseWriter, r *http.Request) {
	var req api.CreateVMRequest
	var body []byte
	if s.peers != nil { // keep the body: the create may go to another node (placement.go)
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "invalid JSON body: "+err.Error())
			return
		}
		body, r.Body = b, io.NopCloser(bytes.NewReader(b))
	}
	if !decodeJSON(w, r, &req) {
		return
	}
	if err := s.fromTemplate(r.Context(), &req); err != nil {
		writeErr(w, err)
		return
	}
	key := req.IdempotencyKey
	if h := r.Header.Get("Idempotency-Key"); h != "" {
		key = h
	}
	if req.AntiAffinity != "" {
		if _, ok := req.Labels[req.AntiAffinity]; !ok {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("anti_affinity names one of the VM's labels: the VM has no label %q", req.AntiAffinity))
			return
		}
		if req.From != "" {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "anti_affinity does not go with from: a VM made from a snapshot goes to the node that keeps the snapshot")
			return
		}
	}
	var repo, branch, repoDir string
	if req.Repo != "" || req.RepoDir != "" {
		var err error
		if req.Repo == "" {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "repo_dir needs repo")
			return
		}
		if repo, branch, repoDir, err = repoSpec(req.Repo, req.RepoDir); err == nil {
			err = s.repos.HasBranch(r.Context(), repo, branch)
		}
		if err != nil {
			writeErr(w, err)
			return
		}
	}
	if req.From == "" || req.Image == "" {
		if s.placeCreate(w, r, &req, key, body) {
			return
		}
	}
	opts := createOptions(&req, key)
	create := s.svc.Create
	if req.From != "" && req.Image != "" {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "image and from are exclusive: a VM made from a snapshot has the snapshot's image")
		return
	}
	if req.From != "" {
		create = func(ctx context.Context, o vm.CreateOptions) (*store.VM, bool, error) {
			return s.svc.CreateFrom(ctx, req.From, o)
		}
	}
	v, created, err := create(r.Context(), opts)
	if err != nil {
		writeErr(w, err)
		return
	}
	if created && req.NoRecord {
		if err := s.rec.SetEnabled(v.ID, false); err != nil {
			s.log.Warn("turn a new VM's recording off", "vm", v.ID, "err", err)
		}
	}
	if created && repo != "" {
		if err := s.cloneRepo(r.Context(), actor(r), v.ID, repo, branch, repoDir); err != nil {
			// No VM without the clone it was asked for.
			if derr := s.svc.Delete(context.WithoutCancel(r.Context()), v.ID); derr != nil {
				s.log.Warn("delete a VM whose repository clone failed", "vm", v.ID, "err", derr)
			}
			writeErr(w, err)
			return
		}
	}
	status := http.StatusOK // an idempotent replay returns the existing VM
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.toAPI(v))
}

func (s *Server) listVMs(w http.ResponseWriter, r *http.Request) {
	vms, err := s.svc.List(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ListVMsResponse{VMs: []api.VM{}}
	sel := r.URL.Query()["label"]
	for _, v := range vms {
		if matchLabels(v.Labels, sel) {
			out.VMs = append(out.VMs, s.toAPI(v))
		}
	}
	writeJSON(w, 200, out)
}

func matchLabels(have map[string]string, sel []string) bool {
	for _, kv := range sel {
		k, val, _ := strings.Cut(kv, "=")
		if got, ok := have[k]; !ok || (val != "" && got != val) {
			return false
		}
	}
	return true
}

func (s *Server) getVM(w http.ResponseWriter, r *http.Request) {
	get := s.svc.Get
	if w := r.URL.Query().Get("wake"); w == "1" || w == "true" {
		get = s.svc.Wake
	}
	v, err := get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	out := s.toAPI(v)
	if principal(r).CanAny(v.ID, auth.RunPerms...) != nil {
		redactEnv(&out)
	}
	writeJSON(w, 200, out)
}

// redactedValue replaces the values of a VM's environment for tokens that
// may not see them.
const redactedValue = "[redacted]"

// redactEnv hides a VM's environment values (API keys, as a rule) from a
// token that cannot run programs in the VM (see auth.RunPerms): a preview or
// files token must not be a way to read the secrets handed to the VM. The
// names stay, so a client can still tell which variables are set.
func redactEnv(v *api.VM) {
	if len(v.Env) == 0 {
		return
	}
	env := make(map[string]string, len(v.Env))
	for k := range v.Env {
		env[k] = redactedValue
	}
	v.Env = env
}

func (s *Server) deleteVM(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	// The cascade (tokens, exposures, domains, listeners) runs in the VM
	// service, for every way a VM goes (see forgetDeletedVM).
	if err := s.svc.Delete(r.Context(), v.ID); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) startVM(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.Start(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, s.toAPI(v))
}

func (s *Server) stopVM(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.Stop(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, s.toAPI(v))
}

func (s *Server) logsVM(w http.ResponseWriter, r *http.Request) {
	rc, err := s.svc.Logs(r.Context(), r.PathValue("id"), 4<<20)
	if err != nil {
		writeErr(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.Copy(w, rc)
}

// imageName is the API's name of a VM's image ("" in the store is the default).
func imageName(stored string) string {
	if stored == "" {
		return image.Default
	}
	return stored
}
