package e2b

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/guest/guesttest"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// envdVMs is the VM service as envd needs it: one sandbox whose agent is a
// fake, and the events it records.
type envdVMs struct {
	VMs
	g       *guest.Client
	mu      sync.Mutex
	events  []string
	state   store.State // "" is running
	calls   []string
	wakeErr error
	getErr  error // what Get and GetFresh answer, if set
}

func (f *envdVMs) Guest(ctx context.Context, ref string) (*store.VM, *guest.Client, error) {
	return &store.VM{ID: ref}, f.g, nil
}

func (f *envdVMs) Event(vmID, typ, actor, format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, typ+" "+actor+" "+format)
}

type envdHarness struct {
	s      *Server
	tokens *auth.Service
	vms    *envdVMs
	url    string
	vm     *store.VM
}

// newEnvdHarness serves envd for sandbox vm1 over a fake agent whose
// process starts stream until the request ends.
func newEnvdHarness(t *testing.T) *envdHarness {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	agent := http.NewServeMux()
	agent.HandleFunc("POST "+guest.PathProcs, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte(`{"type":"start","pid":7}` + "\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	h := &envdHarness{tokens: auth.New(st, "admin-secret"), vms: &envdVMs{g: guesttest.Agent(t, agent)}, vm: &store.VM{ID: "vm1", Name: "sb1"}}
	h.s = New(Config{VMs: h.vms, Store: st, Tokens: h.tokens, Key: []byte("key")})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.s.Envd(w, r, h.vm) }))
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

func (h *envdHarness) key(t *testing.T, vmID string, req api.CreateTokenRequest) *auth.Principal {
	t.Helper()
	tok, err := h.tokens.Create(context.Background(), vmID, req)
	if err != nil {
		t.Fatal(err)
	}
	p, err := h.tokens.Authenticate(context.Background(), tok.Secret)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// principal asks the proxy's Principal about a request for a port of vm1
// carrying tok in header hdr (none when hdr is ""): the principal, or the
// status it answered with.
func (h *envdHarness) principal(hdr, tok string) (*auth.Principal, int) {
	r := httptest.NewRequest("GET", "/", nil)
	if hdr != "" {
		r.Header.Set(hdr, tok)
	}
	w := httptest.NewRecorder()
	p, ok := Proxy{h.s}.Principal(w, r, h.vm)
	if !ok {
		return nil, w.Code
	}
	return p, 0
}

func (h *envdHarness) health(t *testing.T, tok string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", h.url+"/health", nil)
	req.Header.Set("X-Access-Token", tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestEnvdTokenBoundToKey(t *testing.T) {
	h := newEnvdHarness(t)
	ctx := context.Background()
	a := h.key(t, "vm1", api.CreateTokenRequest{Allow: []string{api.PermExec}})
	tokA := h.s.envdToken("vm1", a)
	if code := h.health(t, tokA); code != http.StatusNoContent {
		t.Fatalf("a live exec key's envd token: %d", code)
	}
	if code := h.health(t, h.s.envdToken("vm1", auth.Admin)); code != http.StatusNoContent {
		t.Fatalf("the admin's envd token: %d", code)
	}
	// The token of one sandbox opens no other, and the old form (an HMAC
	// of the VM id alone) and forgeries are refused.
	if code := h.health(t, h.s.envdToken("vm2", a)); code != http.StatusUnauthorized {
		t.Fatalf("another sandbox's token: %d", code)
	}
	mac := tokA[strings.Index(tokA, ".")+1:]
	for _, bad := range []string{"", mac, "admin." + mac, a.TokenID + ".x", "nokey." + h.s.mac(purposeEnvd, "vm1", "nokey")} {
		if code := h.health(t, bad); code != http.StatusUnauthorized {
			t.Fatalf("token %q: %d", bad, code)
		}
	}
	// A key with a user limit, or without exec, never gets envd.
	for _, req := range []api.CreateTokenRequest{{Allow: []string{api.PermExec}, User: "user"}, {Allow: []string{api.PermPreview, api.PermFiles}}} {
		p := h.key(t, "vm1", req)
		if code := h.health(t, h.s.envdToken("vm1", p)); code != http.StatusForbidden {
			t.Fatalf("%+v: %d", req, code)
		}
	}
	// Revoking the key ends its envd token, and a stream it opened before.
	body := envelope(0, `{"process":{"cmd":"/bin/sleep","args":["1000"]}}`)
	req, _ := http.NewRequest("POST", h.url+"/process.Process/Start", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("X-Access-Token", tokA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.Peek(5); err != nil { // the start event
		t.Fatalf("stream: %v", err)
	}
	if err := h.tokens.Revoke(ctx, a.TokenID); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, br) // until the stream ends
		ended <- err
	}()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("a stream opened with a revoked key's envd token is still open")
	}
	if code := h.health(t, tokA); code != http.StatusUnauthorized {
		t.Fatalf("after revoke: %d", code)
	}
	h.vms.mu.Lock()
	defer h.vms.mu.Unlock()
	if len(h.vms.events) != 1 || !strings.HasPrefix(h.vms.events[0], "exec token:"+a.TokenID) {
		t.Fatalf("events: %q", h.vms.events)
	}
}

func TestSignedURLsDieWithTheirKey(t *testing.T) {
	h := newEnvdHarness(t)
	a := h.key(t, "vm1", api.CreateTokenRequest{Allow: []string{api.PermExec}})
	sign := func(p *auth.Principal, op string) *http.Request {
		q := url.Values{"path": {"/home/user/x"}, "username": {"user"}}
		q.Set("signature", signature("/home/user/x", op, "user", h.s.envdToken("vm1", p), 0))
		method := "GET"
		if op == "write" {
			method = "POST"
		}
		return httptest.NewRequest(method, "/files?"+q.Encode(), nil)
	}
	// Past its expiry: refused in envd's words, which the SDKs' tests compare.
	past := time.Now().Add(-time.Minute).Unix()
	q := url.Values{"path": {"/home/user/x"}, "username": {"user"}, "signature_expiration": {strconv.FormatInt(past, 10)}}
	q.Set("signature", signature("/home/user/x", "read", "user", h.s.envdToken("vm1", a), past))
	_, err := h.s.signer(httptest.NewRequest("GET", "/files?"+q.Encode(), nil), "vm1")
	rec := httptest.NewRecorder()
	envdAuthError(rec, err)
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), `"message":"signature is already expired"`) {
		t.Fatalf("an expired signature: %d %s", rec.Code, rec.Body)
	}
	for _, p := range []*auth.Principal{a, auth.Admin} {
		if got, err := h.s.signer(sign(p, "read"), "vm1"); err != nil || got.TokenID != p.TokenID {
			t.Fatalf("signed by %q: %v %v", p.TokenID, got, err)
		}
	}
	// A read signature does not write.
	r := sign(a, "read")
	r.Method = "POST"
	if _, err := h.s.signer(r, "vm1"); err == nil {
		t.Fatal("a read signature wrote")
	}
	if err := h.tokens.Revoke(context.Background(), a.TokenID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.s.signer(sign(a, "read"), "vm1"); err == nil {
		t.Fatal("a revoked key's signed URL still works")
	}
}

func (f *envdVMs) Get(ctx context.Context, ref string) (*store.VM, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.getErr != nil {
		return nil, f.getErr
	}
	st := f.state
	if st == "" {
		st = store.StateRunning
	}
	return &store.VM{ID: "vm1", Name: "sb1", State: st}, nil
}

func (f *envdVMs) GetFresh(ctx context.Context, ref string) (*store.VM, error) {
	return f.Get(ctx, ref)
}

func (f *envdVMs) set(op string, st store.State) (*store.VM, error) {
	f.mu.Lock()
	f.calls, f.state = append(f.calls, op), st
	f.mu.Unlock()
	return f.Get(context.Background(), "vm1")
}

func (f *envdVMs) Stop(ctx context.Context, ref string) (*store.VM, error) {
	return f.set("stop", store.StateStopped)
}
func (f *envdVMs) Start(ctx context.Context, ref string) (*store.VM, error) {
	return f.set("start", store.StateRunning)
}
func (f *envdVMs) Suspend(ctx context.Context, ref string) (*vm.OpResult, error) {
	_, err := f.set("suspend", store.StateSuspended)
	return &vm.OpResult{}, err
}
func (f *envdVMs) Wake(ctx context.Context, ref string) (*store.VM, error) {
	if f.wakeErr != nil {
		f.mu.Lock()
		f.calls = append(f.calls, "wake")
		f.mu.Unlock()
		return nil, f.wakeErr
	}
	return f.set("wake", store.StateRunning)
}

// A filesystem-only pause (memory: false) is a stop, and connect boots the
// sandbox from its disk; a pause with memory suspends, and connect wakes.
func TestPauseWithoutMemory(t *testing.T) {
	h := newEnvdHarness(t)
	if err := h.s.cfg.Store.PutSandbox(context.Background(), &store.Sandbox{VMID: "vm1", TemplateID: "base", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	call := func(fn func(http.ResponseWriter, *http.Request, *auth.Principal), body string) int {
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		r.SetPathValue("id", "sb1")
		w := httptest.NewRecorder()
		fn(w, r, auth.Admin)
		return w.Code
	}
	if code := call(h.s.pause, `{"memory":false}`); code != http.StatusNoContent {
		t.Fatalf("pause without memory: %d", code)
	}
	if code := call(h.s.connect, `{"timeout":60}`); code != http.StatusCreated {
		t.Fatalf("connect after it: %d", code)
	}
	if code := call(h.s.pause, `{}`); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	if code := call(h.s.connect, `{"timeout":60}`); code != http.StatusCreated {
		t.Fatalf("connect after it: %d", code)
	}
	if code := call(h.s.pause, `{}`); code != http.StatusNoContent {
		t.Fatalf("pause: %d", code)
	}
	// A connect without memory (on_resume "reboot") boots from the disk.
	if code := call(h.s.connect, `{"timeout":60,"memory":false}`); code != http.StatusCreated {
		t.Fatalf("connect without memory: %d", code)
	}
	if got := strings.Join(h.vms.calls, ","); got != "stop,start,suspend,wake,suspend,stop,start" {
		t.Fatalf("calls %s", got)
	}
}

// TestConnectOnlyExtends: a connect with a short timeout neither shortens
// a sandbox's end nor gives an end to one that has none.
func TestConnectOnlyExtends(t *testing.T) {
	h := newEnvdHarness(t)
	ctx := context.Background()
	a := h.key(t, "vm1", api.CreateTokenRequest{Allow: []string{api.PermExec}})
	connect := func(timeout string) {
		t.Helper()
		r := httptest.NewRequest("POST", "/sandboxes/sb1/connect", strings.NewReader(`{"timeout":`+timeout+`}`))
		r.SetPathValue("id", "sb1")
		w := httptest.NewRecorder()
		h.s.connect(w, r, a)
		if w.Code != http.StatusOK {
			t.Fatalf("connect: %d %s", w.Code, w.Body)
		}
	}
	end := func() time.Time {
		sb, err := h.s.cfg.Store.GetSandbox(ctx, "vm1")
		if err != nil {
			t.Fatal(err)
		}
		return sb.EndAt
	}
	if err := h.s.cfg.Store.PutSandbox(ctx, &store.Sandbox{VMID: "vm1", TemplateID: "base", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	connect("1")
	if e := end(); !e.IsZero() {
		t.Fatalf("a sandbox without an end got one: %v", e)
	}
	later := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	h.s.cfg.Store.SetSandboxEnd(ctx, "vm1", later)
	connect("1")
	if e := end(); !e.Equal(later) {
		t.Fatalf("connect moved the end from %v to %v", later, e)
	}
	connect("7200")
	if e := end(); !e.After(later) {
		t.Fatalf("a longer connect did not extend: %v", e)
	}
}

// The traffic token opens a sandbox's loopback through its preview host,
// not envd; the envd token opens both; neither opens another sandbox.
func TestTrafficTokenIsNotEnvd(t *testing.T) {
	h := newEnvdHarness(t)
	if err := h.s.cfg.Store.PutSandbox(context.Background(), &store.Sandbox{VMID: "vm1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	a := h.key(t, "vm1", api.CreateTokenRequest{Allow: []string{api.PermExec}})
	traffic, envd := h.s.trafficToken("vm1", a), h.s.envdToken("vm1", a)
	if traffic == envd {
		t.Fatal("the traffic token is the envd token")
	}
	if code := h.health(t, traffic); code != http.StatusUnauthorized {
		t.Fatalf("the traffic token on envd: %d", code)
	}
	for _, c := range []struct {
		hdr, tok string
		ok       bool
	}{
		{"E2B-Traffic-Access-Token", traffic, true},
		{"X-Access-Token", envd, true},
		{"E2B-Traffic-Access-Token", envd, false},
		{"X-Access-Token", traffic, false},
		{"E2B-Traffic-Access-Token", h.s.trafficToken("vm2", a), false},
	} {
		p, code := h.principal(c.hdr, c.tok)
		if c.ok && (p == nil || p.TokenID != a.TokenID) {
			t.Errorf("%s %.12s: refused (%d)", c.hdr, c.tok, code)
		}
		if !c.ok && code != http.StatusUnauthorized {
			t.Errorf("%s %.12s: %v %d, want 401", c.hdr, c.tok, p, code)
		}
	}
}

func (f *envdVMs) Delete(ctx context.Context, ref string) error {
	_, err := f.set("delete", "")
	return err
}

// A process stream whose sandbox went away under it ends with a TCP
// reset, which clients read as a connection error (E2B's Python SDK then
// probes the sandbox and says it was killed), not a malformed body.
func TestStreamOfAGoneSandboxIsReset(t *testing.T) {
	h := newEnvdHarness(t)
	agent := http.NewServeMux()
	agent.HandleFunc("POST "+guest.PathProcs, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte(`{"type":"start","pid":7}` + "\n")) // then the agent goes away
	})
	h.vms.g = guesttest.Agent(t, agent)
	h.vms.state = store.StateSuspended // paused under the stream
	a := h.key(t, "vm1", api.CreateTokenRequest{Allow: []string{api.PermExec}})
	req, _ := http.NewRequest("POST", h.url+"/process.Process/Start", strings.NewReader(string(envelope(0, `{"process":{"cmd":"/bin/sleep","args":["1000"]}}`))))
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("X-Access-Token", h.s.envdToken("vm1", a))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the stream ended with %v, want a connection reset", err)
	}
}

// A sandbox created with network.allowPublicTraffic: false answers a port
// request without a token with 403, and one with its traffic token as
// before; a public sandbox's ports need no token.
func TestPrivateTrafficNeedsTheTrafficToken(t *testing.T) {
	h := newEnvdHarness(t)
	ctx := context.Background()
	a := h.key(t, "vm1", api.CreateTokenRequest{Allow: []string{api.PermExec}})
	for _, private := range []bool{false, true} {
		if err := h.s.cfg.Store.PutSandbox(ctx, &store.Sandbox{VMID: "vm1", PrivateTraffic: private, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		p, code := h.principal("", "")
		if private && code != http.StatusForbidden {
			t.Errorf("private: no token: %v %d, want 403", p, code)
		}
		if !private && (code != 0 || p != nil) {
			t.Errorf("public: no token: %v %d, want the public port", p, code)
		}
		if p, code := h.principal("E2B-Traffic-Access-Token", h.s.trafficToken("vm1", a)); p == nil || p.TokenID != a.TokenID {
			t.Errorf("private=%v: the traffic token: refused (%d)", private, code)
		}
		// a wrong token: refused, with E2B's 403 for a secured sandbox
		want := http.StatusUnauthorized
		if private {
			want = http.StatusForbidden
		}
		if _, code := h.principal("E2B-Traffic-Access-Token", h.s.trafficToken("vm2", a)); code != want {
			t.Errorf("private=%v: another sandbox's traffic token: %d, want %d", private, code, want)
		}
	}
	// a sandbox killed meanwhile is not found, not public
	if err := h.s.cfg.Store.DeleteSandbox(ctx, "vm1"); err != nil {
		t.Fatal(err)
	}
	if p, code := h.principal("", ""); code != http.StatusBadGateway {
		t.Errorf("a sandbox whose record is gone: %v %d, want 502", p, code)
	}
}

func TestNetworkRulesOfACreate(t *testing.T) {
	for _, c := range []struct {
		body    string
		private bool
		err     string
	}{
		{``, false, ""},
		{`{}`, false, ""},
		{`{"allowPublicTraffic":true}`, false, ""},
		{`{"allowPublicTraffic":false}`, true, ""},
		{`{"allowPublicTraffic":false,"allowOut":[],"denyOut":null,"maskRequestHost":""}`, true, ""},
		{`{"allowOut":["1.1.1.1"]}`, false, "allowOut and network.denyOut are not supported"},
		{`{"denyOut":["0.0.0.0/0"]}`, false, "not supported"},
		{`{"maskRequestHost":"x.example"}`, false, "maskRequestHost is not supported"},
		{`{"rules":{"api.example":[{"transform":{}}]}}`, false, "network.rules"},
		{`{"allowPublicTrafic":false}`, false, "unknown field"},
		{`{"allowPublicTraffic":"no"}`, false, "network:"},
	} {
		private, err := networkOf(json.RawMessage(c.body))
		if c.err == "" && (err != nil || private != c.private) {
			t.Errorf("%s: %v %v, want %v", c.body, private, err, c.private)
		}
		if c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s: %v, want an error with %q", c.body, err, c.err)
		}
	}
}
