package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/builder"
	"github.com/agentvm/agentvm/internal/store"
)

// E2B's Template SDK (Template.build, buildInBackground, getBuildStatus,
// exists): a build is requested (POST /v3/templates), the files of each
// COPY uploaded once per hash through a signed link, the steps sent
// (POST /v2/templates/{id}/builds/{build}), and the status polled with
// its logs. The steps become the Dockerfile they mean (e2bsteps.go) and
// agentvm's builder builds it: a template of the requested name, cached
// step by step, saved with its start command running.

// Templates is what the E2B layer needs of agentvm's template builder.
type Templates interface {
	Build(ctx context.Context, req builder.Request, out func(builder.Event)) (*store.Template, error)
	Delete(ctx context.Context, name string) error
	// Uses names the template or cached step a snapshot belongs to ("" for none).
	Uses(ctx context.Context, snapID string) string
	// Cancel ends a build of name under way and waits for it to clean up.
	Cancel(name string, wait time.Duration) bool
}

// SetTemplates turns on template builds, keeping uploaded files in dir
// (where uploads a stopped daemon left unfinished are removed).
func (s *Server) SetTemplates(t Templates, dir string) {
	s.tpl, s.filesDir = t, dir
	if parts, _ := filepath.Glob(filepath.Join(dir, "*.part-*")); len(parts) > 0 {
		for _, p := range parts {
			os.Remove(p)
		}
	}
}

const (
	maxUploadBytes  = 4 << 30
	uploadLinkTTL   = time.Hour
	maxBuildsKept   = 200
	maxBuildEntries = 20_000
	maxBuildLog     = 4 << 20 // bytes of log entries kept per build
)

var hashRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

// e2bBuild is a build the SDK requested, from the request to its end.
type e2bBuild struct {
	id, template string
	cpus         int
	memMiB       int64
	created      time.Time

	mu        sync.Mutex
	status    string // waiting, building, ready, error
	entries   []logEntry
	logBytes  int
	truncated bool
	reason    *buildReason
}

type logEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

type buildReason struct {
	Message string `json:"message"`
	Step    string `json:"step,omitempty"`
}

func (b *e2bBuild) log(level, step, msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.entries) == maxBuildEntries || b.logBytes+len(msg) > maxBuildLog {
		if !b.truncated {
			b.truncated = true
			b.entries = append(b.entries, logEntry{Timestamp: time.Now().UTC(), Level: "warn", Message: "(more log lines were dropped; agentvm template inspect --log shows the end)"})
		}
		return
	}
	b.logBytes += len(msg)
	b.entries = append(b.entries, logEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg, Step: step})
}

type templateBuilds struct {
	mu sync.Mutex
	m  map[string]*e2bBuild
}

func (tb *templateBuilds) add(b *e2bBuild) bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.m == nil {
		tb.m = map[string]*e2bBuild{}
	}
	for id, x := range tb.m { // a build whose steps never came, past its upload links' life
		x.mu.Lock()
		stale := x.status == "waiting" && time.Since(x.created) > 2*uploadLinkTTL
		x.mu.Unlock()
		if stale {
			delete(tb.m, id)
		}
	}
	if len(tb.m) >= maxBuildsKept { // forget the oldest ended build
		var oldest *e2bBuild
		for _, x := range tb.m {
			x.mu.Lock()
			ended := x.status == "ready" || x.status == "error"
			x.mu.Unlock()
			if ended && (oldest == nil || x.created.Before(oldest.created)) {
				oldest = x
			}
		}
		if oldest == nil {
			return false // every build kept is under way
		}
		delete(tb.m, oldest.id)
	}
	tb.m[b.id] = b
	return true
}

func (tb *templateBuilds) get(id string) *e2bBuild {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.m[id]
}

func newUUID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func (s *Server) templateRoutes(mux *http.ServeMux, h func(bool, func(http.ResponseWriter, *http.Request, *auth.Principal)) http.HandlerFunc) {
	for _, route := range []string{"POST /templates", "POST /v2/templates", "POST /v3/templates"} {
		mux.HandleFunc(route, h(true, s.requestBuild))
	}
	mux.HandleFunc("GET /templates/{id}/files/{hash}", h(true, s.filesLink))
	for _, route := range []string{"POST /templates/{id}/builds/{build}", "POST /v2/templates/{id}/builds/{build}"} {
		mux.HandleFunc(route, h(true, s.startBuild))
	}
	mux.HandleFunc("GET /templates/{id}/builds/{build}/status", h(true, s.buildStatus))
	// The upload carries no API key: its link is signed (filesLink).
	mux.HandleFunc("PUT /e2b/template-files/{hash}", s.upload)
	for _, route := range []string{"POST /templates/{id}", "POST /templates/tags", "DELETE /templates/tags"} {
		mux.HandleFunc(route, h(true, noTemplateTags))
	}
}

// noTemplateTags answers E2B's tag routes and its v1 rebuild.
func noTemplateTags(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	apiError(w, http.StatusBadRequest, "template tags are not supported by agentvm: a template has one build, its name's; build it again under the same name to replace it")
}

func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	if s.tpl == nil {
		apiError(w, http.StatusBadRequest, "template builds are off on this server")
		return
	}
	var req struct {
		Name          string   `json:"name"`
		Alias         string   `json:"alias"` // before the SDK's 2.11
		Tags          []string `json:"tags"`
		CPUCount      int      `json:"cpuCount"`
		MemoryMB      int64    `json:"memoryMB"`
		MinFreeDiskMB int64    `json:"minFreeDiskMb"`
	}
	if !decode(w, r, &req) {
		return
	}
	name := req.Name
	if name == "" {
		name = req.Alias
	}
	if n, tag, ok := strings.Cut(name, ":"); ok {
		if tag != "" && tag != "default" {
			apiError(w, http.StatusBadRequest, "template %q: tags are not supported by agentvm (name the template %q)", name, n)
			return
		}
		name = n
	}
	if len(req.Tags) > 0 {
		apiError(w, http.StatusBadRequest, "template tags are not supported by agentvm (tags %v)", req.Tags)
		return
	}
	if err := builder.ValidateName(name); err != nil {
		apiError(w, http.StatusBadRequest, "%s", strings.TrimPrefix(err.Error(), builder.ErrInvalid.Error()+": "))
		return
	}
	if req.CPUCount < 0 || req.CPUCount > 64 || req.MemoryMB < 0 {
		apiError(w, http.StatusBadRequest, "cpuCount is 1-64 and memoryMB positive")
		return
	}
	b := &e2bBuild{id: newUUID(), template: name, cpus: req.CPUCount, memMiB: req.MemoryMB, created: time.Now(), status: "waiting"}
	if !s.builds.add(b) {
		apiError(w, http.StatusTooManyRequests, "%d template builds are under way or waiting for their steps; try again when one has ended", maxBuildsKept)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"templateID": name, "buildID": b.id, "public": false,
		"aliases": []string{name}, "names": []string{name}, "tags": []string{}})
}

// uploadSig signs an upload link for hash until expires.
func (s *Server) uploadSig(hash string, expires int64) string {
	m := hmac.New(sha256.New, s.cfg.Key)
	fmt.Fprintf(m, "template-files:%s:%d", hash, expires)
	return hex.EncodeToString(m.Sum(nil))
}

func (s *Server) filePath(hash string) string { return filepath.Join(s.filesDir, hash) }

// filesLink is GET /templates/{id}/files/{hash}: whether the files of a
// COPY are here already, and where to upload them.
func (s *Server) filesLink(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	hash := r.PathValue("hash")
	if !hashRe.MatchString(hash) || s.tpl == nil {
		apiError(w, http.StatusBadRequest, "a files hash is 64 lowercase hex digits")
		return
	}
	_, err := os.Stat(s.filePath(hash))
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	exp := time.Now().Add(uploadLinkTTL).Unix()
	url := fmt.Sprintf("%s://%s/e2b/template-files/%s?expires=%d&sig=%s", scheme, r.Host, hash, exp, s.uploadSig(hash, exp))
	writeJSON(w, http.StatusCreated, map[string]any{"present": err == nil, "url": url})
}

// upload is the PUT of a signed link: a COPY's files, a tar (gzip or not).
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	hash := r.PathValue("hash")
	exp, err := strconv.ParseInt(r.URL.Query().Get("expires"), 10, 64)
	if s.tpl == nil || !hashRe.MatchString(hash) || err != nil || time.Now().Unix() > exp ||
		!hmac.Equal([]byte(r.URL.Query().Get("sig")), []byte(s.uploadSig(hash, exp))) {
		apiError(w, http.StatusForbidden, "this upload link is not valid (or has expired): ask GET /templates/{id}/files/{hash} for another")
		return
	}
	if _, err := os.Stat(s.filePath(hash)); err == nil { // uploaded: kept as it is
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return
	}
	if err := os.MkdirAll(s.filesDir, 0o700); err != nil {
		apiError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	tmp, err := os.CreateTemp(s.filesDir, hash+".part-*")
	if err != nil {
		apiError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	defer os.Remove(tmp.Name())
	n, err := tmp.ReadFrom(http.MaxBytesReader(w, r.Body, maxUploadBytes))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		apiError(w, http.StatusBadRequest, "upload of %s: %v (at most %d GiB)", hash, err, maxUploadBytes>>30)
		return
	}
	if err := os.Link(tmp.Name(), s.filePath(hash)); err != nil && !os.IsExist(err) { // never over another upload
		apiError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	s.log.Info("e2b template files uploaded", "hash", hash, "bytes", n)
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
}

func (s *Server) buildOf(w http.ResponseWriter, r *http.Request) *e2bBuild {
	b := s.builds.get(r.PathValue("build"))
	if b == nil || b.template != r.PathValue("id") {
		apiError(w, http.StatusNotFound, "build %s of template %s not found (builds are kept in memory: a restarted server forgets them)", r.PathValue("build"), r.PathValue("id"))
		return nil
	}
	return b
}

// startBuild is POST /v2/templates/{id}/builds/{build}: the steps. The
// build runs on after the answer; its status tells how it goes.
func (s *Server) startBuild(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	b := s.buildOf(w, r)
	if b == nil {
		return
	}
	var spec buildSpec
	if !decode(w, r, &spec) {
		return
	}
	tr, err := translate(&spec, func(name string) string {
		if t, ok := s.builtTemplate(r.Context(), name); ok {
			return t.User
		}
		return ""
	})
	if err != nil {
		apiError(w, http.StatusBadRequest, "%v", err)
		return
	}
	for _, h := range tr.hashes {
		if _, err := os.Stat(s.filePath(h)); err != nil {
			apiError(w, http.StatusBadRequest, "the files of a COPY step (hash %s) were not uploaded", h)
			return
		}
	}
	b.mu.Lock()
	if b.status != "waiting" {
		b.mu.Unlock()
		apiError(w, http.StatusConflict, "build %s was started already", b.id)
		return
	}
	b.status = "building"
	b.mu.Unlock()
	go s.runBuild(b, tr, spec.Force)
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusAccepted)
}

func (s *Server) runBuild(b *e2bBuild, tr *translated, force bool) {
	b.log("info", "", fmt.Sprintf("Building template %s (build %s)", b.template, b.id))
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tr.writeContext(pw, s.filePath)) }()
	req := builder.Request{Name: b.template, Context: pr, Dockerfile: builder.HiddenDockerfile, NoCache: force,
		CPUs: b.cpus, MemoryMiB: b.memMiB, ForceFromLine: tr.forceLine}
	_, err := s.tpl.Build(context.Background(), req, func(e builder.Event) {
		switch {
		case e.Instruction != "":
			mark := ""
			if e.Cached {
				mark = " (cached)"
			}
			b.log("info", "", fmt.Sprintf("[%d/%d] %s%s", e.Step, e.Of, e.Instruction, mark))
		case e.Log != "":
			b.log("info", "", strings.TrimRight(e.Log, "\n"))
		}
	})
	pr.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		reason := &buildReason{Message: strings.TrimPrefix(err.Error(), builder.ErrInvalid.Error()+": ")}
		var se *builder.StepError
		var le *builder.LineError
		if errors.As(err, &se) {
			reason.Step = tr.stepOf(se.Line)
		} else if errors.As(err, &le) {
			reason.Step = tr.stepOf(le.Line)
		}
		b.status, b.reason = "error", reason
		b.entries = append(b.entries, logEntry{Timestamp: time.Now().UTC(), Level: "error", Message: reason.Message, Step: reason.Step})
		s.log.Info("e2b template build failed", "template", b.template, "build", b.id, "err", err)
		return
	}
	b.status = "ready"
	b.entries = append(b.entries, logEntry{Timestamp: time.Now().UTC(), Level: "info", Message: "Template " + b.template + " built"})
}

// buildStatus is GET /templates/{id}/builds/{build}/status: the status and
// the log entries from logsOffset (at most limit, default 100).
func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	b := s.buildOf(w, r)
	if b == nil {
		return
	}
	q := r.URL.Query()
	offset, limit := 0, 100
	if v := q.Get("logsOffset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			apiError(w, http.StatusBadRequest, "logsOffset: a number >= 0")
			return
		}
		offset = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			apiError(w, http.StatusBadRequest, "limit: 1-1000")
			return
		}
		limit = n
	}
	b.mu.Lock()
	var page []logEntry
	if offset < len(b.entries) {
		page = append(page, b.entries[offset:min(len(b.entries), offset+limit)]...)
	}
	out := map[string]any{"templateID": b.template, "buildID": b.id, "status": b.status}
	if b.reason != nil {
		out["reason"] = b.reason
	}
	b.mu.Unlock()
	logs := make([]string, len(page))
	for i, e := range page {
		logs[i] = e.Timestamp.Format(time.RFC3339) + " " + e.Message
	}
	if page == nil {
		page = []logEntry{}
	}
	out["logs"], out["logEntries"] = logs, page
	writeJSON(w, http.StatusOK, out)
}

// builtTemplate is a template built from a Dockerfile or by the SDK.
func (s *Server) builtTemplate(ctx context.Context, name string) (*store.Template, bool) {
	t, err := s.cfg.Store.GetTemplate(ctx, name)
	return t, err == nil
}
