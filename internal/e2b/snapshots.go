package e2b

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/builder"
	"github.com/agentvm/agentvm/internal/image"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// Snapshots (E2B's templates other than base) and forks.

type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request, p *auth.Principal) {
	v, _, ok := s.sandboxOf(w, r, p)
	if !ok {
		return
	}
	var req struct {
		Name   string `json:"name"`
		Memory *bool  `json:"memory"`
	}
	if !decode(w, r, &req) {
		return
	}
	if req.Memory != nil && !*req.Memory {
		apiError(w, http.StatusBadRequest, "filesystem-only snapshots are not supported: agentvm snapshots keep memory and processes")
		return
	}
	name := req.Name
	if name == "" {
		name = "snap" + newSandboxID()[1:13]
	}
	if err := vm.ValidateSnapshotName(name); err != nil {
		vmError(w, err)
		return
	}
	sn, err := s.cfg.VMs.Snapshot(r.Context(), v.ID, name)
	if err != nil {
		vmError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotInfo{SnapshotID: sn.Name, Names: []string{sn.Name}})
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	q := r.URL.Query()
	sns, err := s.cfg.VMs.Snapshots(r.Context())
	if err != nil {
		apiError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	var srcID string
	if id := q.Get("sandboxID"); id != "" {
		v, err := s.cfg.VMs.Get(r.Context(), id)
		if err != nil {
			writeJSON(w, http.StatusOK, []snapshotInfo{})
			return
		}
		srcID = v.ID
	}
	limit := maxListLimit
	if l := q.Get("limit"); l != "" {
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 || limit > maxListLimit {
			apiError(w, http.StatusBadRequest, "limit must be between 1 and %d", maxListLimit)
			return
		}
	}
	sort.Slice(sns, func(i, j int) bool { return sns[i].Name < sns[j].Name })
	after := q.Get("nextToken")
	out := []snapshotInfo{}
	for _, sn := range sns {
		if (srcID != "" && sn.VMID != srcID) || (q.Get("name") != "" && sn.Name != q.Get("name")) || sn.Name <= after {
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", out[len(out)-1].SnapshotID)
			break
		}
		out = append(out, snapshotInfo{SnapshotID: sn.Name, Names: []string{sn.Name}})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	id := r.PathValue("id")
	if _, err := image.Resolve(id); err == nil {
		apiError(w, http.StatusBadRequest, "template %q is a built-in image and cannot be deleted", id)
		return
	}
	if c, err := builder.Canonical(id); err == nil { // NAME:default is NAME
		id = c
	}
	cancelled := s.tpl != nil && s.tpl.Cancel(id, 2*time.Minute) // E2B deletes a template while it builds
	// E2B's template goes with all its builds: its latest, then its tags (a
	// tag's own id, NAME:TAG, removes that tag). A build another template
	// is built on stops it there (409), the ones before it gone.
	var builds []*store.Template
	if s.tpl != nil && !strings.Contains(id, ":") {
		builds, _ = s.tpl.Tags(r.Context(), id) // the name's record first (Ref sorts before Ref:tag)
	} else if t, ok := s.builtTemplate(r.Context(), id); ok && s.tpl != nil {
		builds = []*store.Template{t}
	}
	if len(builds) > 0 {
		for _, t := range builds {
			if err := s.tpl.Delete(r.Context(), t.Name); err != nil {
				templateError(w, err)
				return
			}
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if cancelled { // a first build, ended: nothing else to delete
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if sn, err := s.cfg.VMs.GetSnapshot(r.Context(), id); err == nil && s.tpl != nil {
		if user := s.tpl.Uses(r.Context(), sn.ID); user != "" {
			apiError(w, http.StatusConflict, "snapshot %s belongs to %s; delete the template instead", sn.Name, user)
			return
		}
	}
	if err := s.cfg.VMs.DeleteSnapshot(r.Context(), id); err != nil {
		vmError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateAlias is GET /templates/aliases/{alias}: whether a template of
// that name exists (a built-in image, a template built from a Dockerfile,
// or an agentvm snapshot).
func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request, alias string) {
	if c, err := builder.Canonical(alias); err == nil { // NAME:default is NAME
		alias = c
	}
	if _, err := image.Resolve(alias); err != nil {
		_, terr := s.cfg.Store.GetTemplate(r.Context(), alias)
		if _, err := s.cfg.VMs.GetSnapshot(r.Context(), alias); err != nil && terr != nil {
			apiError(w, http.StatusNotFound, "template %q not found", alias)
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": alias, "public": false})
}

type forkResult struct {
	Sandbox *sandbox `json:"sandbox,omitempty"`
	Error   *apiErr  `json:"error,omitempty"`
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request, p *auth.Principal) {
	v, sb, ok := s.sandboxOf(w, r, p)
	if !ok {
		return
	}
	var req struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if !decode(w, r, &req) {
		return
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > 20 {
		apiError(w, http.StatusBadRequest, "count must be between 1 and 20, got %d", count)
		return
	}
	d, err := timeoutOf(req.Timeout, defaultTimeout)
	if err != nil {
		apiError(w, http.StatusBadRequest, "%v", err)
		return
	}
	res, err := s.cfg.VMs.ForkWith(r.Context(), v.ID, vm.ForkOptions{Count: count, Name: newSandboxID})
	if err != nil {
		vmError(w, err)
		return
	}
	out := make([]forkResult, 0, len(res.Children))
	for _, c := range res.Children {
		csb := &store.Sandbox{VMID: c.ID, TemplateID: sb.TemplateID, Metadata: sb.Metadata, AutoPause: sb.AutoPause,
			PauseDisk: sb.PauseDisk, AutoResume: sb.AutoResume, PrivateTraffic: sb.PrivateTraffic, Timeout: d, CreatedAt: time.Now().UTC()}
		if d > 0 {
			csb.EndAt = time.Now().Add(d)
		}
		if err := s.cfg.Store.PutSandbox(r.Context(), csb); err != nil {
			s.cfg.VMs.Delete(context.Background(), c.ID)
			out = append(out, forkResult{Error: &apiErr{Code: http.StatusInternalServerError, Message: "record sandbox: " + err.Error()}})
			continue
		}
		sbx := s.sandboxJSON(c, csb, p)
		out = append(out, forkResult{Sandbox: &sbx})
	}
	writeJSON(w, http.StatusCreated, out)
}
