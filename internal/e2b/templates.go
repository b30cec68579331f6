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
	"slices"
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
	// Tag names the build ref (NAME or NAME:TAG) NAME:TAG for each tag.
	Tag(ctx context.Context, ref string, tags []string) (*store.Template, error)
	// Tags lists the builds of name: its latest and its tagged ones.
	Tags(ctx context.Context, name string) ([]*store.Template, error)
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
	s.ageUploads(time.Now())
}

// uploadsKept is how long an upload no build has asked for stays: the SDK
// asks for each COPY's files at every build (filesLink, which marks them
// used) and uploads them again when they are gone.
const uploadsKept = 7 * 24 * time.Hour

// ageUploads removes the uploads no build asked for in uploadsKept.
func (s *Server) ageUploads(now time.Time) {
	ents, _ := os.ReadDir(s.filesDir)
	for _, e := range ents {
		if !hashRe.MatchString(e.Name()) {
			continue
		}
		if info, err := e.Info(); err == nil && now.Sub(info.ModTime()) > uploadsKept {
			if os.Remove(filepath.Join(s.filesDir, e.Name())) == nil {
				s.log.Info("e2b template files removed: unused for a week", "hash", e.Name())
			}
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
	tags         []string // the build's tags besides the name
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
	mu   sync.Mutex
	m    map[string]*e2bBuild
	aged time.Time // the uploads' last ageing
}

// ageDue reports whether the uploads were last aged an hour ago or more
// (and notes that they are now).
func (tb *templateBuilds) ageDue() bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if time.Since(tb.aged) < time.Hour {
		return false
	}
	tb.aged = time.Now()
	return true
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
	mux.HandleFunc("POST /templates/{id}", h(true, noRebuild))
	mux.HandleFunc("POST /templates/tags", h(true, s.assignTags))
	mux.HandleFunc("DELETE /templates/tags", h(true, s.removeTags))
}

// noRebuild answers E2B's v1 rebuild (the CLI's, from e2b.toml).
func noRebuild(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	apiError(w, http.StatusBadRequest, "the v1 template rebuild is not supported by agentvm: build with the Template SDK (Template.build), or agentvm template build")
}

// assignTags is POST /templates/tags: the build target (NAME or NAME:TAG)
// gets the tags.
func (s *Server) assignTags(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	var req struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if !decode(w, r, &req) {
		return
	}
	if s.tpl == nil {
		apiError(w, http.StatusBadRequest, "template builds are off on this server")
		return
	}
	t, err := s.tpl.Tag(r.Context(), req.Target, req.Tags)
	if err != nil {
		templateError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": buildIDOf(t), "tags": req.Tags})
}

// removeTags is DELETE /templates/tags: NAME:TAG goes for each tag.
func (s *Server) removeTags(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	var req struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if !decode(w, r, &req) {
		return
	}
	if s.tpl == nil {
		apiError(w, http.StatusBadRequest, "template builds are off on this server")
		return
	}
	name, _, err := builder.SplitRef(req.Name)
	if err != nil || len(req.Tags) == 0 {
		apiError(w, http.StatusBadRequest, "name is a template's name and tags are at least one tag")
		return
	}
	for _, tag := range req.Tags {
		if err := builder.ValidateTag(tag); err != nil {
			templateError(w, err)
			return
		}
		if builder.Ref(name, tag) == name {
			apiError(w, http.StatusBadRequest, "tag %q is the template's latest build: delete the template to remove it", tag)
			return
		}
	}
	for _, tag := range req.Tags {
		if err := s.tpl.Delete(r.Context(), builder.Ref(name, tag)); err != nil {
			templateError(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// listTags is GET /templates/{id}/tags: the template's builds by tag
// ("default" is its latest).
func (s *Server) listTags(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	if s.tpl == nil {
		apiError(w, http.StatusBadRequest, "template builds are off on this server")
		return
	}
	ts, err := s.tpl.Tags(r.Context(), r.PathValue("id"))
	if err != nil {
		templateError(w, err)
		return
	}
	if len(ts) == 0 {
		apiError(w, http.StatusNotFound, "template %q not found", r.PathValue("id"))
		return
	}
	out := []map[string]any{}
	for _, t := range ts {
		tag := "default"
		if _, tg, ok := strings.Cut(t.Name, ":"); ok {
			tag = tg
		}
		out = append(out, map[string]any{"tag": tag, "buildID": buildIDOf(t), "createdAt": t.BuiltAt})
	}
	writeJSON(w, http.StatusOK, out)
}

// buildIDOf is the build id E2B's SDK sees for a template's build: a UUID
// made from its machine's snapshot (the same for every tag on it).
func buildIDOf(t *store.Template) string {
	h := sha256.Sum256([]byte("e2b-build:" + t.SnapshotID))
	x := hex.EncodeToString(h[:16])
	return x[:8] + "-" + x[8:12] + "-4" + x[13:16] + "-a" + x[17:20] + "-" + x[20:32]
}

// templateError answers a builder's error with its status.
func templateError(w http.ResponseWriter, err error) {
	msg := err.Error()
	for _, e := range []error{builder.ErrInvalid, builder.ErrNotFound, builder.ErrConflict} {
		msg = strings.TrimPrefix(msg, e.Error()+": ")
	}
	switch {
	case errors.Is(err, builder.ErrNotFound):
		apiError(w, http.StatusNotFound, "%s", msg)
	case errors.Is(err, builder.ErrConflict):
		apiError(w, http.StatusConflict, "%s", msg)
	case errors.Is(err, builder.ErrInvalid):
		apiError(w, http.StatusBadRequest, "%s", msg)
	default:
		apiError(w, http.StatusInternalServerError, "%s", msg)
	}
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
	ref := req.Name
	if ref == "" {
		ref = req.Alias
	}
	name, tag, err := builder.SplitRef(ref)
	if err != nil {
		templateError(w, err)
		return
	}
	tags := []string{}
	for _, t := range append(req.Tags, tag) {
		if t == "" || slices.Contains(tags, t) {
			continue
		}
		if err := builder.ValidateTag(t); err != nil {
			templateError(w, err)
			return
		}
		tags = append(tags, t)
	}
	if req.CPUCount < 0 || req.CPUCount > 64 || req.MemoryMB < 0 {
		apiError(w, http.StatusBadRequest, "cpuCount is 1-64 and memoryMB positive")
		return
	}
	b := &e2bBuild{id: newUUID(), template: name, tags: tags, cpus: req.CPUCount, memMiB: req.MemoryMB, created: time.Now(), status: "waiting"}
	if !s.builds.add(b) {
		apiError(w, http.StatusTooManyRequests, "%d template builds are under way or waiting for their steps; try again when one has ended", maxBuildsKept)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"templateID": name, "buildID": b.id, "public": false,
		"aliases": []string{name}, "names": []string{name}, "tags": tags})
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
	if err == nil { // used: kept another week
		now := time.Now()
		os.Chtimes(s.filePath(hash), now, now)
	}
	if s.builds.ageDue() {
		go s.ageUploads(time.Now())
	}
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
		CPUs: b.cpus, MemoryMiB: b.memMiB, ForceFromLine: tr.forceLine, Tags: b.tags, RegistryAuth: tr.auth}
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
