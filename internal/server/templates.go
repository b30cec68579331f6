package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/builder"
	"github.com/agentvm/agentvm/internal/store"
)

// buildTemplate builds a template from a Dockerfile: the body is a tar of
// the build context; the answer streams the build's progress as JSON
// lines, its last line the template or the error. A request refused
// before the build starts (a Dockerfile that does not parse, a missing
// COPY source) gets a plain error status instead.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name, tag, err := builder.SplitRef(r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	req := builder.Request{Name: name, Context: r.Body, Dockerfile: q.Get("dockerfile"), Spec: q.Get("spec"), BuildArgs: map[string]string{}, Tags: q["tag"]}
	if tag != "" {
		req.Tags = append(req.Tags, tag)
	}
	for _, kv := range q["build_arg"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("build_arg %q: use NAME=VALUE", kv))
			return
		}
		req.BuildArgs[k] = v
	}
	if req.NoCache, err = boolParam(q, "no_cache"); err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	if v := q.Get("cpus"); v != "" {
		if req.CPUs, err = strconv.Atoi(v); err != nil || req.CPUs < 1 {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "cpus: a positive number")
			return
		}
	}
	for _, p := range []struct {
		name string
		to   *int64
	}{{"memory", &req.MemoryMiB}, {"disk", &req.DiskBytes}} {
		if v := q.Get(p.name); v != "" {
			var sz api.Size
			if err := sz.UnmarshalJSON([]byte(strconv.Quote(v))); err != nil {
				writeError(w, http.StatusBadRequest, api.CodeInvalid, p.name+": "+err.Error())
				return
			}
			*p.to = int64(sz)
			if p.name == "memory" {
				*p.to = sz.MiB()
			}
		}
	}
	if v := q.Get("timeout"); v != "" {
		if req.Timeout, err = time.ParseDuration(v); err != nil || req.Timeout <= 0 {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "timeout: a positive duration such as 30m (the whole build's limit; default 2h)")
			return
		}
	}
	if v := q.Get("ready_timeout"); v != "" {
		if req.ReadyTimeout, err = time.ParseDuration(v); err != nil || req.ReadyTimeout <= 0 {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, "ready_timeout: a positive duration such as 90s or 10m")
			return
		}
	}
	if v := r.Header.Get(api.RegistryAuthHeader); v != "" {
		raw, err := base64.StdEncoding.DecodeString(v)
		user, pass, ok := strings.Cut(string(raw), ":")
		if err != nil || !ok || user == "" {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, api.RegistryAuthHeader+": base64 of username:password")
			return
		}
		req.RegistryAuth = &builder.RegistryAuth{Username: user, Password: pass}
	}
	// The context is read as the build starts: a client that sends it
	// slowly holds the template's name an hour at most.
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(time.Hour))
	st := &buildStream{w: w}
	t, err := s.builds.Build(r.Context(), req, st.send)
	if err != nil {
		if !st.started {
			writeErr(w, err)
			return
		}
		be := &api.BuildErr{Code: api.CodeInternal, Message: err.Error()}
		var se *builder.StepError
		if errors.As(err, &se) {
			be = &api.BuildErr{Code: "step_failed", Message: se.Error(), Step: se.Step, Line: se.Line, Instruction: se.Instruction, ExitCode: se.ExitCode, Output: se.Output}
		}
		st.write(api.BuildEvent{Error: be})
		s.log.Info("template build failed", "template", req.Name, "err", err)
		return
	}
	out := s.templateAPI(r.Context(), t, false)
	st.send(builder.Event{})
	st.write(api.BuildEvent{Template: &out})
}

// buildStream sends a build's events as JSON lines, the header with the
// first.
type buildStream struct {
	w       http.ResponseWriter
	started bool
}

func (b *buildStream) send(e builder.Event) {
	if !b.started {
		b.started = true
		b.w.Header().Set("Content-Type", "application/x-ndjson")
		b.w.Header().Set("X-Content-Type-Options", "nosniff")
		b.w.WriteHeader(http.StatusOK)
	}
	if e == (builder.Event{}) {
		return
	}
	b.write(api.BuildEvent{Step: e.Step, Of: e.Of, Instruction: e.Instruction, Cached: e.Cached, Log: e.Log})
}

func (b *buildStream) write(e api.BuildEvent) {
	line, _ := json.Marshal(e)
	// A client that stops reading does not hold the build: its write fails
	// after a minute, and the stream's later lines go nowhere.
	http.NewResponseController(b.w).SetWriteDeadline(time.Now().Add(time.Minute))
	b.w.Write(append(line, '\n'))
	if f, ok := b.w.(http.Flusher); ok {
		f.Flush()
	}
}

func boolParam(q map[string][]string, name string) (bool, error) {
	v := ""
	if vs := q[name]; len(vs) > 0 {
		v = vs[0]
	}
	switch v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	}
	return false, fmt.Errorf("%s: true or false, not %q", name, v)
}

func (s *Server) templateAPI(ctx context.Context, t *store.Template, full bool) api.BuiltTemplate {
	out := api.BuiltTemplate{Name: t.Name, Snapshot: t.SnapshotID, Base: t.Base, Steps: t.Steps, Start: t.Start, Ready: t.Ready, Env: t.Env,
		Workdir: t.Workdir, User: t.User, Expose: t.Expose, BuildMs: t.BuildMs, CreatedAt: t.CreatedAt, BuiltAt: t.BuiltAt}
	if sn, err := s.svc.GetSnapshot(ctx, t.SnapshotID); err == nil {
		out.Snapshot, out.CPUs, out.MemoryMiB, out.DiskBytes, out.StateBytes = sn.Name, sn.CPUs, sn.MemoryMiB, sn.DiskBytes, sn.Bytes
	}
	if full {
		out.Dockerfile, out.BuildLog = t.Dockerfile, t.BuildLog
	}
	return out
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	ts, err := s.builds.List(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ListTemplatesResponse{Templates: []api.BuiltTemplate{}}
	for _, t := range ts {
		out.Templates = append(out.Templates, s.templateAPI(r.Context(), t, false))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.builds.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.templateAPI(r.Context(), t, true))
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if err := s.builds.Delete(r.Context(), r.PathValue("name")); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// tagTemplate gives a template's build (NAME or NAME:TAG) more tags.
func (s *Server) tagTemplate(w http.ResponseWriter, r *http.Request) {
	var req api.TagTemplateRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	t, err := s.builds.Tag(r.Context(), r.PathValue("name"), req.Tags)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.templateAPI(r.Context(), t, false))
}

func (s *Server) pruneTemplates(w http.ResponseWriter, r *http.Request) {
	n, err := s.builds.Prune(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.PruneTemplatesResponse{Removed: n})
}

// fromTemplate turns a create's template into the snapshot it restores
// and the environment it adds.
func (s *Server) fromTemplate(ctx context.Context, req *api.CreateVMRequest) error {
	if req.Template == "" {
		return nil
	}
	if req.From != "" || req.Image != "" {
		return fmt.Errorf("%w: template goes without from and image: a VM made from a template has its image", builder.ErrInvalid)
	}
	t, err := s.builds.Get(ctx, req.Template)
	if err != nil {
		return err
	}
	req.From, req.Env = t.SnapshotID, t.EnvWith(req.Env)
	return nil
}
