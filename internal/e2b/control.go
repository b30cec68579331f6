package e2b

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/builder"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// The E2B control plane: sandboxes are VMs named with E2B-style ids,
// templates are images ("base", "code-interpreter-v1") or agentvm snapshots, pause is
// suspend to disk, fork is agentvm's live fork. Errors are always
// {"code": <status>, "message": "..."}: the JS SDK reads the body's code,
// the Python SDK the status.

const (
	defaultTimeout = 300 * time.Second
	maxTimeout     = 30 * 24 * time.Hour
	baseTemplate   = "base"
	clientID       = "agentvm"
	maxListLimit   = 1000
	maxMetadata    = 64
)

// Routes registers the control plane on mux (outside agentvm's own auth:
// these calls authenticate with X-API-KEY).
func (s *Server) Routes(mux *http.ServeMux) {
	h := func(admin bool, fn func(w http.ResponseWriter, r *http.Request, p *auth.Principal)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			p, ok := r.Context().Value(callerKey{}).(*auth.Principal)
			if !ok {
				var err error
				if p, err = s.cfg.Tokens.Authenticate(r.Context(), r.Header.Get("X-API-KEY")); err != nil {
					apiError(w, http.StatusUnauthorized, "invalid API key: send X-API-KEY with an agentvm token (agentvm token create --e2b)")
					return
				}
			}
			if admin && !p.Admin {
				apiError(w, http.StatusForbidden, "this call needs the admin key; a key scoped to one sandbox reads and connects only to that sandbox")
				return
			}
			actor := "e2b admin"
			if p.TokenID != "" {
				actor = "e2b " + p.TokenID
			}
			r = r.WithContext(vm.WithActor(r.Context(), actor))
			if id := r.PathValue("id"); id != "" && !ok && s.cfg.Forward != nil && strings.Contains(r.Pattern, "sandboxes/{id}") {
				// A sandbox another node runs is served there (which checks
				// the caller's rights again).
				if v, err := s.cfg.VMs.Get(r.Context(), id); err == nil && v.Name == id && s.cfg.Forward(w, r, p, v) {
					return
				}
			}
			fn(w, r, p)
		}
	}
	mux.HandleFunc("POST /sandboxes", h(true, s.create))
	mux.HandleFunc("POST /v2/sandboxes", h(true, s.create))
	mux.HandleFunc("GET /sandboxes", h(true, s.list))
	mux.HandleFunc("GET /v2/sandboxes", h(true, s.list))
	mux.HandleFunc("GET /sandboxes/{id}", h(false, s.info))
	mux.HandleFunc("DELETE /sandboxes/{id}", h(true, s.kill))
	mux.HandleFunc("POST /sandboxes/{id}/timeout", h(true, s.setTimeout)) // it can end the sandbox
	mux.HandleFunc("POST /sandboxes/{id}/pause", h(true, s.pause))
	mux.HandleFunc("POST /sandboxes/{id}/connect", h(false, s.connect))
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", h(false, s.connect))
	mux.HandleFunc("POST /sandboxes/{id}/resume", h(false, s.connect))
	mux.HandleFunc("GET /sandboxes/{id}/metrics", h(false, s.metrics))
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", h(true, s.snapshot))
	mux.HandleFunc("GET /snapshots", h(true, s.listSnapshots))
	mux.HandleFunc("DELETE /templates/{id}", h(true, s.deleteTemplate))
	// GET /templates/aliases/{alias} and GET /templates/{id}/tags share a pattern.
	mux.HandleFunc("GET /templates/{id}/{sub}", h(true, func(w http.ResponseWriter, r *http.Request, p *auth.Principal) {
		switch {
		case r.PathValue("id") == "aliases":
			s.templateAlias(w, r, r.PathValue("sub"))
		case r.PathValue("sub") == "tags":
			s.listTags(w, r, p)
		default:
			apiError(w, http.StatusNotFound, "no such route")
		}
	}))
	s.templateRoutes(mux, h)
	mux.HandleFunc("POST /sandboxes/{id}/fork", h(true, s.fork))
}

type apiErr struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func apiError(w http.ResponseWriter, status int, format string, args ...any) {
	if status == http.StatusServiceUnavailable || status >= 500 {
		// The Python SDK retries these, POSTs included, unless told not to:
		// a create may have been half done.
		w.Header().Set("Should-Retry", "false")
	}
	writeJSON(w, status, apiErr{Code: status, Message: fmt.Sprintf(format, args...)})
}

// vmError answers with the status of a vm error.
func vmError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, vm.ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, vm.ErrNotFound), errors.Is(err, store.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, vm.ErrConflict), errors.Is(err, store.ErrConflict):
		status = http.StatusConflict
	case errors.Is(err, vm.ErrInsufficient):
		status = http.StatusTooManyRequests
	case errors.Is(err, vm.ErrUnavailable), errors.Is(err, store.ErrUnreachable):
		status = http.StatusServiceUnavailable
	case errors.Is(err, auth.ErrForbidden):
		status = http.StatusForbidden
	}
	apiError(w, status, "%s", err.Error())
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		apiError(w, http.StatusBadRequest, "read body: %v", err)
		return false
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return true
	}
	if err := json.Unmarshal(b, v); err != nil {
		apiError(w, http.StatusBadRequest, "invalid JSON body: %v", err)
		return false
	}
	return true
}

// sandboxOf resolves the {id} of a request to an E2B sandbox the caller may
// see; it answers the request itself when there is none.
func (s *Server) sandboxOf(w http.ResponseWriter, r *http.Request, p *auth.Principal) (*store.VM, *store.Sandbox, bool) {
	id := r.PathValue("id")
	v, err := s.cfg.VMs.Get(r.Context(), id)
	var sb *store.Sandbox
	if err == nil { // the control plane reads what it may change from the database
		sb, err = s.cfg.Store.GetSandboxFresh(r.Context(), v.ID)
	}
	if err != nil || v.Name != id {
		apiError(w, http.StatusNotFound, "sandbox %q not found", id)
		return nil, nil, false
	}
	if err := p.Can(v.ID, ""); err != nil {
		apiError(w, http.StatusNotFound, "sandbox %q not found (the key is scoped to another sandbox)", id)
		return nil, nil, false
	}
	// A sandbox's answers carry its envd token, which runs anything as any
	// user: a scoped key needs exec, with no user limit.
	if mayUseEnvd(p, v.ID) != nil {
		apiError(w, http.StatusForbidden, "this key may not use sandbox %q: it needs the exec permission and no user limit (envd runs commands as any user)", id)
		return nil, nil, false
	}
	return v, sb, true
}

type createRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AutoPause           bool              `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *switchJSON       `json:"autoResume"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Secure              *bool             `json:"secure"`
	// Not supported: refused when set, rather than silently ignored.
	MCP          json.RawMessage `json:"mcp"`
	Network      json.RawMessage `json:"network"`
	IAM          json.RawMessage `json:"iam"`
	VolumeMounts json.RawMessage `json:"volumeMounts"`
}

// switchJSON is E2B's {"enabled": bool}.
type switchJSON struct {
	Enabled bool `json:"enabled"`
}

func present(m json.RawMessage) bool {
	s := strings.TrimSpace(string(m))
	return s != "" && s != "null" && s != "{}" && s != "[]"
}

// networkOf reads a create's network rules: allowPublicTraffic: false makes
// the sandbox's ports answer only with its traffic access token; egress
// rules are refused (allow_internet_access and agentvm's egress policies
// are what there is).
func networkOf(raw json.RawMessage) (privateTraffic bool, err error) {
	if !present(raw) {
		return false, nil
	}
	var n struct {
		AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
		AllowOut           json.RawMessage `json:"allowOut"`
		DenyOut            json.RawMessage `json:"denyOut"`
		MaskRequestHost    json.RawMessage `json:"maskRequestHost"`
		Rules              json.RawMessage `json:"rules"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&n); err != nil {
		return false, fmt.Errorf("network: %v", err)
	}
	switch {
	case present(n.AllowOut) || present(n.DenyOut):
		return false, errors.New("network.allowOut and network.denyOut are not supported by agentvm's E2B API: use allow_internet_access, or agentvm's egress policies")
	case present(n.MaskRequestHost) && string(n.MaskRequestHost) != `""`:
		return false, errors.New("network.maskRequestHost is not supported by agentvm's E2B API")
	case present(n.Rules):
		return false, errors.New("network.rules (transforms of outgoing requests) are not supported by agentvm's E2B API")
	}
	return n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic, nil
}

func timeoutOf(sec *int64, def time.Duration) (time.Duration, error) {
	if sec == nil {
		return def, nil
	}
	if *sec < 0 || time.Duration(*sec)*time.Second > maxTimeout {
		return 0, fmt.Errorf("timeout must be between 0 and %d seconds, got %d", int64(maxTimeout/time.Second), *sec)
	}
	return time.Duration(*sec) * time.Second, nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, p *auth.Principal) {
	var req createRequest
	if !decode(w, r, &req) {
		return
	}
	autoResume := req.AutoResume != nil && req.AutoResume.Enabled
	pauseDisk := req.AutoPauseMemory != nil && !*req.AutoPauseMemory
	privateTraffic, err := networkOf(req.Network)
	if err != nil {
		apiError(w, http.StatusBadRequest, "%v", err)
		return
	}
	switch {
	case present(req.MCP):
		apiError(w, http.StatusBadRequest, "mcp gateways are not supported by agentvm")
		return
	case present(req.IAM):
		apiError(w, http.StatusBadRequest, "iam tokens are not supported by agentvm")
		return
	case present(req.VolumeMounts):
		apiError(w, http.StatusBadRequest, "volumes are not supported by agentvm")
		return
	case pauseDisk && !req.AutoPause:
		apiError(w, http.StatusBadRequest, "autoPauseMemory: false is only allowed with autoPause: true")
		return
	case autoResume && !req.AutoPause:
		apiError(w, http.StatusBadRequest, "autoResume can only be enabled with autoPause: true (the timeout must pause the sandbox)")
		return
	case autoResume && pauseDisk:
		apiError(w, http.StatusBadRequest, "autoResume cannot be combined with autoPauseMemory: false: a filesystem-only pause reboots the sandbox, so only connect resumes it")
		return
	}
	timeout, err := timeoutOf(req.Timeout, defaultTimeout)
	if err != nil {
		apiError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if len(req.Metadata) > maxMetadata {
		apiError(w, http.StatusBadRequest, "at most %d metadata entries", maxMetadata)
		return
	}
	for k, v := range req.Metadata {
		if len(k) == 0 || len(k) > 256 || len(v) > 1024 {
			apiError(w, http.StatusBadRequest, "metadata keys are 1-256 bytes and values at most 1024 bytes (key %q)", k)
			return
		}
	}
	tmpl := req.TemplateID
	if tmpl == "" {
		tmpl = baseTemplate
	}
	if c, err := builder.Canonical(tmpl); err == nil { // NAME:default is NAME
		tmpl = c
	}
	o := vm.CreateOptions{Name: newSandboxID(), Env: req.EnvVars}
	if h := r.Header.Get("Idempotency-Key"); h != "" {
		o.IdempotencyKey = "e2b:" + h
	}
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
		o.Egress = &store.Egress{Mode: "deny"}
	}
	var v *store.VM
	if img, ierr := image.Resolve(tmpl); ierr == nil {
		// base, default, code-interpreter and code-interpreter-v1 are images.
		o.Image = img
		v, _, err = s.cfg.VMs.Create(r.Context(), o)
	} else if t, terr := s.cfg.Store.GetTemplate(r.Context(), tmpl); terr == nil {
		// A template built from a Dockerfile: its machine, its ENV under the sandbox's.
		o.Env = t.EnvWith(o.Env)
		v, _, err = s.cfg.VMs.CreateFrom(r.Context(), t.SnapshotID, o)
	} else {
		if _, gerr := s.cfg.VMs.GetSnapshot(r.Context(), tmpl); gerr != nil {
			apiError(w, http.StatusNotFound, "template %q not found: use %q, %q, a template built with agentvm template build, or the name of an agentvm snapshot", tmpl, baseTemplate, "code-interpreter-v1")
			return
		}
		v, _, err = s.cfg.VMs.CreateFrom(r.Context(), tmpl, o)
	}
	if err != nil {
		vmError(w, err)
		return
	}
	sb := &store.Sandbox{VMID: v.ID, TemplateID: tmpl, Metadata: req.Metadata, AutoPause: req.AutoPause,
		PauseDisk: pauseDisk, AutoResume: autoResume, PrivateTraffic: privateTraffic, Timeout: timeout, CreatedAt: time.Now().UTC()}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if timeout > 0 {
		sb.EndAt = time.Now().Add(timeout)
	}
	if err := s.cfg.Store.PutSandbox(r.Context(), sb); err != nil {
		s.cfg.VMs.Delete(context.Background(), v.ID) // nothing half made
		apiError(w, http.StatusInternalServerError, "record sandbox: %v", err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxJSON(v, sb, p))
}

// sandbox is the answer of create, connect and fork.
type sandbox struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
	// TrafficAccessToken opens the servers on the sandbox's loopback
	// through its preview host (the code interpreter, DevTools); the
	// code-interpreter SDKs send it on every call.
	TrafficAccessToken string `json:"trafficAccessToken"`
	Domain             string `json:"domain,omitempty"`
	Alias              string `json:"alias,omitempty"`
}

// sandboxJSON is the answer for caller p, whose key the envd token is bound to.
func (s *Server) sandboxJSON(v *store.VM, sb *store.Sandbox, p *auth.Principal) sandbox {
	return sandbox{TemplateID: sb.TemplateID, SandboxID: v.Name, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: s.envdToken(v.ID, p), TrafficAccessToken: s.trafficToken(v.ID, p), Domain: s.cfg.Domain}
}

type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// detail is GET /sandboxes/{id}; listed items are the same less the
// token and domain.
type detail struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int64             `json:"memoryMB"`
	DiskSizeMB      int64             `json:"diskSizeMB"`
	State           string            `json:"state"`
	Metadata        map[string]string `json:"metadata"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          string            `json:"domain,omitempty"`
	Lifecycle       *lifecycle        `json:"lifecycle,omitempty"`
}

// paused reports whether a VM counts as a paused sandbox. E2B knows only
// running and paused, so every state but running is paused (a stopped or
// crashed VM is started again by connect).
func paused(v *store.VM) bool { return v.State != store.StateRunning }

func (s *Server) detailJSON(v *store.VM, sb *store.Sandbox, p *auth.Principal) detail {
	full := p != nil
	d := detail{TemplateID: sb.TemplateID, SandboxID: v.Name, ClientID: clientID, StartedAt: v.CreatedAt, EndAt: sb.EndAt,
		EnvdVersion: EnvdVersion, CPUCount: v.CPUs, MemoryMB: v.MemoryMiB, DiskSizeMB: v.DiskBytes >> 20,
		State: "running", Metadata: sb.Metadata}
	if v.StartedAt != nil {
		d.StartedAt = *v.StartedAt
	}
	if sb.EndAt.IsZero() {
		d.EndAt = d.StartedAt.Add(maxTimeout) // no end: far away
	}
	// A sandbox past its end with autoPause is paused, even while the
	// suspend is still under way (E2B answers so at once).
	if paused(v) || (sb.AutoPause && !sb.EndAt.IsZero() && time.Now().After(sb.EndAt)) {
		d.State = "paused"
	}
	if d.Metadata == nil {
		d.Metadata = map[string]string{}
	}
	if full {
		d.EnvdAccessToken, d.Domain = s.envdToken(v.ID, p), s.cfg.Domain
		d.Lifecycle = &lifecycle{OnTimeout: "kill", AutoResume: sb.AutoResume}
		if sb.AutoPause {
			d.Lifecycle.OnTimeout = "pause"
		}
	}
	return d
}

func (s *Server) info(w http.ResponseWriter, r *http.Request, p *auth.Principal) {
	v, sb, ok := s.sandboxOf(w, r, p)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, s.detailJSON(v, sb, p))
}

// metadataFilter parses the list's metadata query: a form-encoded string
// whose keys and values are escaped once more.
func metadataFilter(q string) (map[string]string, error) {
	if q == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for k, vs := range vals {
		uk, err := url.QueryUnescape(k)
		if err != nil {
			return nil, err
		}
		uv, err := url.QueryUnescape(vs[0])
		if err != nil {
			return nil, err
		}
		out[uk] = uv
	}
	return out, nil
}

var nextTokenRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,200}$`)

func (s *Server) list(w http.ResponseWriter, r *http.Request, _ *auth.Principal) {
	q := r.URL.Query()
	filter, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		apiError(w, http.StatusBadRequest, "bad metadata filter: %v", err)
		return
	}
	states := map[string]bool{}
	for _, st := range strings.Split(q.Get("state"), ",") {
		switch st = strings.TrimSpace(st); st {
		case "":
		case "running", "paused":
			states[st] = true
		default:
			apiError(w, http.StatusBadRequest, "unknown state %q: use running or paused", st)
			return
		}
	}
	limit := maxListLimit
	if l := q.Get("limit"); l != "" {
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 || limit > maxListLimit {
			apiError(w, http.StatusBadRequest, "limit must be between 1 and %d", maxListLimit)
			return
		}
	}
	asc := false
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		asc = true
	default:
		apiError(w, http.StatusBadRequest, "order must be asc or desc")
		return
	}
	var startedAfter time.Time
	if v := q.Get("startedAfter"); v != "" {
		if startedAfter, err = time.Parse(time.RFC3339Nano, v); err != nil {
			apiError(w, http.StatusBadRequest, "startedAfter must be an RFC 3339 time: %v", err)
			return
		}
	}
	template := q.Get("template")
	after := ""
	if t := q.Get("nextToken"); t != "" {
		b, err := base64.RawURLEncoding.DecodeString(t)
		if !nextTokenRe.MatchString(t) || err != nil {
			apiError(w, http.StatusBadRequest, "bad nextToken")
			return
		}
		after = string(b)
	}
	sbs, err := s.cfg.Store.ListSandboxes(r.Context())
	if err != nil {
		apiError(w, http.StatusInternalServerError, "%v", err)
		return
	}
	type item struct {
		d   detail
		key string // newest first: the record's creation, then the id
	}
	var items []item
	for _, sb := range sbs {
		v, err := s.cfg.VMs.Get(r.Context(), sb.VMID)
		if err != nil {
			continue
		}
		d := s.detailJSON(v, sb, nil)
		if len(states) > 0 && !states[d.State] {
			continue
		}
		if !matches(sb.Metadata, filter) || (template != "" && sb.TemplateID != template) || sb.CreatedAt.Before(startedAfter) {
			continue
		}
		items = append(items, item{d, fmt.Sprintf("%020d:%s", sb.CreatedAt.UnixNano(), d.SandboxID)})
	}
	// By start (the sandbox's creation: it never changes, unlike the VM's
	// start after a resume) and id, so that the cursor (the last key
	// returned) splits the order cleanly.
	sort.Slice(items, func(i, j int) bool { return (items[i].key > items[j].key) != asc })
	if after != "" {
		i := sort.Search(len(items), func(i int) bool { return (items[i].key < after) != asc && items[i].key != after })
		items = items[i:]
	}
	if len(items) > limit {
		items = items[:limit]
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(items[limit-1].key)))
	}
	out := make([]detail, len(items))
	for i, it := range items {
		out[i] = it.d
	}
	writeJSON(w, http.StatusOK, out)
}

func matches(md, filter map[string]string) bool {
	for k, v := range filter {
		if md[k] != v {
			return false
		}
	}
	return true
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request, p *auth.Principal) {
	v, _, ok := s.sandboxOf(w, r, p)
	if !ok {
		return
	}
	if err := s.cfg.VMs.Delete(r.Context(), v.ID); err != nil {
		vmError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, p *auth.Principal) {
	v, _, ok := s.sandboxOf(w, r, p)
	if !ok {
		return
	}
	var req struct {
		Timeout *int64 `json:"timeout"`
	}
	if !decode(w, r, &req) {
		return
	}
	if req.Timeout == nil {
		apiError(w, http.StatusBadRequest, "timeout (seconds) is required")
		return
	}
	d, err := timeoutOf(req.Timeout, 0)
	if err != nil {
		apiError(w, http.StatusBadRequest, "%v", err)
		return
	}
	// The new timeout is also the life an auto-resume gives it later;
	// a zero one (end now) keeps the one it had for that.
	if d == 0 {
		err = s.cfg.Store.SetSandboxEnd(r.Context(), v.ID, time.Now())
	} else {
		err = s.cfg.Store.SetSandboxTimeout(r.Context(), v.ID, time.Now().Add(d), d)
	}
	if err != nil {
		vmError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, p *auth.Principal) {
	v, _, ok := s.sandboxOf(w, r, p)
	if !ok {
		return
	}
	var req struct {
		Memory *bool `json:"memory"`
	}
	if !decode(w, r, &req) {
		return
	}
	if v.State == store.StateSuspended || v.State == store.StatePaused || v.State == store.StateStopped {
		apiError(w, http.StatusConflict, "sandbox %q is already paused", v.Name)
		return
	}
	if req.Memory != nil && !*req.Memory {
		// A filesystem-only pause is agentvm's stop: the disk is kept,
		// memory and processes are not; connect starts it again.
		if _, err := s.cfg.VMs.Stop(r.Context(), v.ID); err != nil {
			vmError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if _, err := s.cfg.VMs.Suspend(r.Context(), v.ID); err != nil {
		vmError(w, err)
		return
	}
	// A paused sandbox does not time out (expire skips it) and keeps its
	// end: the connect that resumes it extends that.
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request, p *auth.Principal) {
	v, sb, ok := s.sandboxOf(w, r, p)
	if !ok {
		return
	}
	var req struct {
		Timeout *int64 `json:"timeout"`
		// Memory false resumes a paused sandbox by a boot from its disk
		// (the SDKs' on_resume "reboot"): its memory state is dropped.
		Memory *bool `json:"memory"`
	}
	if !decode(w, r, &req) {
		return
	}
	d, err := timeoutOf(req.Timeout, defaultTimeout)
	if err != nil {
		apiError(w, http.StatusBadRequest, "%v", err)
		return
	}
	// Under the sandbox's life lock: the timeout loop must not pause it
	// between its wake and its new end.
	defer s.lives.lock(v.ID)()
	if v, err = s.cfg.VMs.GetFresh(r.Context(), v.ID); err != nil {
		vmError(w, err)
		return
	}
	// A sandbox its timeout is pausing was answered paused at once
	// (pausing), and the timeout loop may not have reached it yet: a
	// filesystem-only pause that has not happened happens now, so that the
	// resume boots it from its disk as the caller was promised.
	if cur, err := s.cfg.Store.GetSandboxFresh(r.Context(), v.ID); err == nil && pausing(cur) && cur.PauseDisk && v.State == store.StateRunning {
		if v, err = s.cfg.VMs.Stop(vm.WithActor(r.Context(), "e2b timeout"), v.ID); err != nil {
			vmError(w, err)
			return
		}
	}
	if req.Memory != nil && !*req.Memory && (v.State == store.StateSuspended || v.State == store.StatePaused) {
		if v, err = s.cfg.VMs.Stop(r.Context(), v.ID); err != nil {
			vmError(w, err)
			return
		}
	}
	status := http.StatusOK
	switch v.State {
	case store.StateRunning:
	case store.StateStopped, store.StateCrashed:
		// After a filesystem-only pause (or a crash): a boot from its disk.
		if v, err = s.cfg.VMs.Start(r.Context(), v.ID); err != nil {
			vmError(w, err)
			return
		}
		status = http.StatusCreated
	default:
		if v, err = s.cfg.VMs.Wake(r.Context(), v.ID); err != nil {
			vmError(w, err)
			return
		}
		status = http.StatusCreated
	}
	// Connect only ever extends an end: a sandbox without one keeps none,
	// and a shorter timeout than what is left changes nothing (a scoped
	// key must not shorten a life, which only kill and the timeout
	// endpoint, both the admin's, may do).
	if sb, err = s.cfg.Store.GetSandboxFresh(r.Context(), v.ID); err != nil {
		vmError(w, err)
		return
	}
	if err := s.extendEnd(r.Context(), sb, d); err != nil {
		vmError(w, err)
		return
	}
	writeJSON(w, status, s.sandboxJSON(v, sb, p))
}
