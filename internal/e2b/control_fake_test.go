package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/hypervisor/fakehv"
	"github.com/agentvm/agentvm/internal/proxy"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// fakeE2B is the E2B layer as the daemon wires it (server.go): the control
// plane on an API listener, envd behind the real preview proxy, over a VM
// service whose machines are fakes running the real guest agent
// (internal/hypervisor/fakehv). No QEMU, no daemon.
type fakeE2B struct {
	s   *Server
	svc *vm.Service
	hv  *fakehv.HV
	st  *store.Store
	api string // the control plane's base URL
	env string // the proxy's address, where envd answers
	key string // an E2B admin API key (e2b_...)
	ctx context.Context
}

func newFakeE2B(t *testing.T) *fakeE2B {
	t.Helper()
	return newFakeE2BOn(t, "")
}

// newFakeE2BOn is newFakeE2B on the store at dsn ("": a SQLite file of the
// test's); a PostgreSQL store listens to the other nodes, as a cluster
// node's does.
func newFakeE2BOn(t *testing.T, dsn string) *fakeE2B {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("the in-process guest agent runs commands as the VM's users: needs root")
	}
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("needs qemu-img for the disk overlays")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	dir := t.TempDir()
	run, err := os.MkdirTemp("", "avm-e2b-") // unix socket paths must stay short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	if dsn == "" {
		dsn = filepath.Join(dir, "db")
	}
	st, err := store.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if strings.HasPrefix(dsn, "postgres") {
		lctx, stop := context.WithCancel(context.Background())
		listening, ended := make(chan struct{}), make(chan error, 1)
		go func() { ended <- st.Listen(lctx, func() { close(listening) }, nil, func(string) {}) }()
		t.Cleanup(func() { stop(); <-ended })
		select {
		case <-listening:
		case err := <-ended:
			t.Fatalf("listen: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("not listening after a minute")
		}
	}
	img, err := fakehv.Image(filepath.Join(dir, "image"))
	if err != nil {
		t.Fatal(err)
	}
	hv := fakehv.New()
	log := slog.New(slog.DiscardHandler)
	svc, err := vm.New(vm.Config{DataDir: filepath.Join(dir, "data"), RunDir: run, CacheDir: filepath.Join(dir, "cache"),
		QEMUVersion: "10.0.2", Accel: "tcg", Hypervisor: vm.HypervisorOf(hv), EnsureImage: fakehv.EnsureImage(img),
		BootTimeout: time.Minute, Log: log}, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		svc.Close()
		for _, pid := range hv.PIDs() {
			hv.Kill(pid)
		}
	})
	tokens := auth.New(st, "avm_admin")
	s := New(Config{VMs: svc, Store: st, Tokens: tokens, Key: []byte("e2b-test-key"), Log: log})
	svc.OnDelete(s.Forget) // as server.go's forgetDeletedVM does
	px, err := proxy.New(proxy.Config{Listen: "127.0.0.1:0", Auth: tokens, Store: st, VMs: svc, Log: log,
		Compat: Proxy{Server: s}, CompatPort: EnvdPort})
	if err != nil {
		t.Fatal(err)
	}
	go px.Serve()
	t.Cleanup(func() { px.Close() })
	_, port, _ := strings.Cut(px.Addr(), ":")
	s.SetDomain(px.Domain() + ":" + port)
	mux := http.NewServeMux()
	s.Routes(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	key, err := tokens.Create(ctx, "", api.CreateTokenRequest{E2B: true})
	if err != nil {
		t.Fatal(err)
	}
	return &fakeE2B{s: s, svc: svc, hv: hv, st: st, api: hs.URL, env: px.Addr(), key: key.Secret, ctx: ctx}
}

// call sends a control-plane request with key as X-API-Key ("" sends none)
// and returns the status and body.
func (e *fakeE2B) call(t *testing.T, method, path, key, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(e.ctx, method, e.api+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// create makes a sandbox with the admin key and checks the answer.
func (e *fakeE2B) create(t *testing.T, body string) sandbox {
	t.Helper()
	code, b := e.call(t, "POST", "/sandboxes", e.key, body)
	if code != http.StatusCreated {
		t.Fatalf("create %s: %d %s", body, code, b)
	}
	var sb sandbox
	if err := json.Unmarshal(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sb
}

// info is GET /sandboxes/{id}.
func (e *fakeE2B) info(t *testing.T, id string) detail {
	t.Helper()
	code, b := e.call(t, "GET", "/sandboxes/"+id, e.key, "")
	if code != http.StatusOK {
		t.Fatalf("get %s: %d %s", id, code, b)
	}
	var d detail
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// list is GET /sandboxes?query: the listed sandboxes' ids.
func (e *fakeE2B) list(t *testing.T, query string) []string {
	t.Helper()
	code, b := e.call(t, "GET", "/sandboxes?"+query, e.key, "")
	if code != http.StatusOK {
		t.Fatalf("list ?%s: %d %s", query, code, b)
	}
	var ds []detail
	if err := json.Unmarshal(b, &ds); err != nil {
		t.Fatal(err)
	}
	ids := []string{}
	for _, d := range ds {
		ids = append(ids, d.SandboxID)
	}
	return ids
}

// vmState is the state the VM service records for sandbox id.
func (e *fakeE2B) vmState(t *testing.T, id string) store.State {
	t.Helper()
	v, err := e.svc.Get(e.ctx, id)
	if err != nil {
		t.Fatalf("vm of %s: %v", id, err)
	}
	return v.State
}

// wantAPIError checks an E2B error: the status, and a body
// {"code": status, "message": ...} whose message says want.
func wantAPIError(t *testing.T, what string, code int, b []byte, status int, want string) {
	t.Helper()
	var e apiErr
	if err := json.Unmarshal(b, &e); err != nil || code != status || e.Code != status || !strings.Contains(e.Message, want) {
		t.Errorf("%s: %d %s, want %d with %q", what, code, b, status, want)
	}
}

// The control plane over HTTP as E2B's SDKs drive it, on fake machines:
// create with metadata, list with filters, get, timeout, pause (a suspend),
// connect (a wake), kill, and E2B-style errors for what it refuses.
func TestControlPlaneOnFakeVMs(t *testing.T) {
	e := newFakeE2B(t)
	idRe := regexp.MustCompile(`^i[a-z0-9]{19}$`)

	code, b := e.call(t, "POST", "/sandboxes", "", `{"templateID":"base"}`)
	wantAPIError(t, "create without a key", code, b, http.StatusUnauthorized, "invalid API key")
	code, b = e.call(t, "GET", "/sandboxes", "e2b_0000000000000000000000000000000000000000", "")
	wantAPIError(t, "list with an unknown key", code, b, http.StatusUnauthorized, "invalid API key")

	a := e.create(t, `{"templateID":"base","timeout":600,"metadata":{"app":"a b","owner":"x"},"envVars":{"GREETING":"hi"}}`)
	if !idRe.MatchString(a.SandboxID) || a.TemplateID != "base" || a.EnvdVersion != EnvdVersion || a.ClientID != clientID ||
		a.EnvdAccessToken == "" || a.TrafficAccessToken == "" || a.EnvdAccessToken == a.TrafficAccessToken || !strings.HasPrefix(a.Domain, "localhost:") {
		t.Fatalf("create: %+v", a)
	}
	if st := e.vmState(t, a.SandboxID); st != store.StateRunning {
		t.Fatalf("the sandbox's VM is %s", st)
	}
	bb := e.create(t, `{"metadata":{"app":"b"}}`) // the default template, no timeout given
	if bb.TemplateID != "base" || bb.SandboxID == a.SandboxID {
		t.Fatalf("second create: %+v", bb)
	}

	d := e.info(t, a.SandboxID)
	if d.SandboxID != a.SandboxID || d.State != "running" || d.Metadata["app"] != "a b" || d.Metadata["owner"] != "x" ||
		d.EnvdAccessToken != a.EnvdAccessToken || d.Lifecycle == nil || d.Lifecycle.OnTimeout != "kill" || d.CPUCount < 1 || d.MemoryMB < 1 {
		t.Fatalf("get: %+v", d)
	}
	if left := time.Until(d.EndAt); left < 9*time.Minute || left > 10*time.Minute {
		t.Fatalf("end in %v, want about 600 s", left)
	}
	code, b = e.call(t, "GET", "/sandboxes/inosuchsandbox000000", e.key, "")
	wantAPIError(t, "get of a missing sandbox", code, b, http.StatusNotFound, "not found")

	// Filters: metadata as the SDKs encode it (each pair escaped, the whole
	// escaped once more by the query string), state, order and paging.
	md := url.QueryEscape("app=" + url.QueryEscape("a b"))
	if got := e.list(t, "metadata="+md); len(got) != 1 || got[0] != a.SandboxID {
		t.Fatalf("list by metadata app=a b: %v", got)
	}
	if got := e.list(t, "metadata="+url.QueryEscape("app=c")); len(got) != 0 {
		t.Fatalf("list by metadata app=c: %v", got)
	}
	if got := e.list(t, ""); len(got) != 2 || got[0] != bb.SandboxID || got[1] != a.SandboxID {
		t.Fatalf("list, newest first: %v", got)
	}
	if got := e.list(t, "order=asc&limit=1"); len(got) != 1 || got[0] != a.SandboxID {
		t.Fatalf("list asc, limit 1: %v", got)
	}
	if got := e.list(t, "state=paused"); len(got) != 0 {
		t.Fatalf("paused sandboxes before a pause: %v", got)
	}
	for q, want := range map[string]string{
		"state=sleeping": "unknown state", "limit=0": "limit must be", "order=up": "order must be",
		"nextToken=%21": "bad nextToken", "startedAfter=yesterday": "RFC 3339",
	} {
		code, b := e.call(t, "GET", "/sandboxes?"+q, e.key, "")
		wantAPIError(t, "list ?"+q, code, b, http.StatusBadRequest, want)
	}
	// v2's list pages with X-Next-Token.
	req, _ := http.NewRequestWithContext(e.ctx, "GET", e.api+"/v2/sandboxes?limit=1", nil)
	req.Header.Set("X-API-Key", e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	next := resp.Header.Get("X-Next-Token")
	if resp.StatusCode != 200 || next == "" {
		t.Fatalf("v2 list, limit 1: %d, next token %q", resp.StatusCode, next)
	}
	if got := e.list(t, "limit=1&nextToken="+next); len(got) != 1 || got[0] != a.SandboxID {
		t.Fatalf("the second page: %v", got)
	}

	// Bad creates are refused before any VM is made.
	vms, _ := e.svc.List(e.ctx)
	for body, c := range map[string]struct {
		status int
		want   string
	}{
		`{`:                               {400, "invalid JSON"},
		`{"templateID":"nosuchtemplate"}`: {404, "template \"nosuchtemplate\" not found"},
		`{"timeout":-1}`:                  {400, "timeout must be between"},
		`{"mcp":{"server":{}}}`:           {400, "mcp gateways are not supported"},
		`{"volumeMounts":[{"name":"v"}]}`: {400, "volumes are not supported"},
		`{"metadata":{"k":"` + strings.Repeat("v", 1025) + `"}}`: {400, "metadata keys are"},
	} {
		code, b := e.call(t, "POST", "/sandboxes", e.key, body)
		wantAPIError(t, "create "+body[:min(len(body), 40)], code, b, c.status, c.want)
	}
	code, b = e.call(t, "POST", "/templates", e.key, `{}`)
	wantAPIError(t, "template build", code, b, http.StatusBadRequest, "template builds are off on this server")
	if after, _ := e.svc.List(e.ctx); len(after) != len(vms) {
		t.Fatalf("refused creates made VMs: %d, then %d", len(vms), len(after))
	}

	// Timeout: the admin sets a new end.
	if code, b := e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/timeout", e.key, `{"timeout":3600}`); code != http.StatusNoContent {
		t.Fatalf("timeout: %d %s", code, b)
	}
	if left := time.Until(e.info(t, a.SandboxID).EndAt); left < 59*time.Minute || left > time.Hour {
		t.Fatalf("end in %v after a 3600 s timeout", left)
	}
	code, b = e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/timeout", e.key, `{}`)
	wantAPIError(t, "timeout without one", code, b, http.StatusBadRequest, "timeout (seconds) is required")

	// Pause is a suspend; a paused sandbox is listed so, and paused again
	// is a conflict.
	if code, b := e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/pause", e.key, ""); code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", code, b)
	}
	if st := e.vmState(t, a.SandboxID); st != store.StateSuspended {
		t.Fatalf("paused sandbox's VM is %s, want suspended", st)
	}
	if d := e.info(t, a.SandboxID); d.State != "paused" {
		t.Fatalf("paused sandbox reads %s", d.State)
	}
	if got := e.list(t, "state=paused"); len(got) != 1 || got[0] != a.SandboxID {
		t.Fatalf("paused sandboxes: %v", got)
	}
	if got := e.list(t, "state=running"); len(got) != 1 || got[0] != bb.SandboxID {
		t.Fatalf("running sandboxes: %v", got)
	}
	code, b = e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/pause", e.key, "")
	wantAPIError(t, "a second pause", code, b, http.StatusConflict, "already paused")

	// Connect wakes it (201: it was paused) and answers with the same
	// envd token; connect on a running sandbox is a 200.
	code, b = e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/connect", e.key, `{"timeout":60}`)
	var c sandbox
	if err := json.Unmarshal(b, &c); err != nil || code != http.StatusCreated || c.SandboxID != a.SandboxID || c.EnvdAccessToken != a.EnvdAccessToken {
		t.Fatalf("connect to a paused sandbox: %d %s", code, b)
	}
	if st := e.vmState(t, a.SandboxID); st != store.StateRunning {
		t.Fatalf("connected sandbox's VM is %s", st)
	}
	if code, b := e.call(t, "POST", "/v2/sandboxes/"+a.SandboxID+"/connect", e.key, `{"timeout":60}`); code != http.StatusOK {
		t.Fatalf("connect to a running sandbox: %d %s", code, b)
	}
	if left := time.Until(e.info(t, a.SandboxID).EndAt); left < 59*time.Minute {
		t.Fatalf("a shorter connect timeout moved the end to %v from now", left)
	}
	code, b = e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/connect", e.key, `{"timeout":-5}`)
	wantAPIError(t, "connect with a negative timeout", code, b, http.StatusBadRequest, "timeout must be between")

	// A key scoped to sandbox b sees b and nothing else, and may not kill.
	vb, err := e.svc.Get(e.ctx, bb.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	scoped, err := e.s.cfg.Tokens.Create(e.ctx, vb.ID, api.CreateTokenRequest{E2B: true})
	if err != nil {
		t.Fatal(err)
	}
	if code, b := e.call(t, "GET", "/sandboxes/"+bb.SandboxID, scoped.Secret, ""); code != http.StatusOK {
		t.Fatalf("scoped key, its own sandbox: %d %s", code, b)
	}
	code, b = e.call(t, "GET", "/sandboxes/"+a.SandboxID, scoped.Secret, "")
	wantAPIError(t, "scoped key, another sandbox", code, b, http.StatusNotFound, "scoped to another sandbox")
	code, b = e.call(t, "DELETE", "/sandboxes/"+bb.SandboxID, scoped.Secret, "")
	wantAPIError(t, "scoped key, kill", code, b, http.StatusForbidden, "needs the admin key")

	// Kill deletes the VM and the sandbox's record with it.
	if code, b := e.call(t, "DELETE", "/sandboxes/"+a.SandboxID, e.key, ""); code != http.StatusNoContent {
		t.Fatalf("kill: %d %s", code, b)
	}
	if _, err := e.svc.Get(e.ctx, a.SandboxID); err == nil {
		t.Fatal("the killed sandbox's VM is still there")
	}
	code, b = e.call(t, "GET", "/sandboxes/"+a.SandboxID, e.key, "")
	wantAPIError(t, "get of a killed sandbox", code, b, http.StatusNotFound, "not found")
	code, b = e.call(t, "DELETE", "/sandboxes/"+a.SandboxID, e.key, "")
	wantAPIError(t, "a second kill", code, b, http.StatusNotFound, "not found")
	if got := e.list(t, ""); len(got) != 1 || got[0] != bb.SandboxID {
		t.Fatalf("list after the kill: %v", got)
	}
}

// Snapshots are templates: a sandbox's snapshot is listed, makes new
// sandboxes with the parent's memory, and is deleted as a template; a fork
// makes running sandboxes that keep the parent's metadata.
func TestSnapshotsAndForksOnFakeVMs(t *testing.T) {
	e := newFakeE2B(t)
	a := e.create(t, `{"metadata":{"team":"red"}}`)
	va, err := e.svc.Get(e.ctx, a.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	e.hv.MachineOf(va.ID).SetMemory("parent's memory")

	code, b := e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", e.key, `{"name":"tmpl1"}`)
	var sn snapshotInfo
	if err := json.Unmarshal(b, &sn); err != nil || code != http.StatusCreated || sn.SnapshotID != "tmpl1" || len(sn.Names) != 1 {
		t.Fatalf("snapshot: %d %s", code, b)
	}
	code, b = e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/snapshots", e.key, `{"memory":false}`)
	wantAPIError(t, "a filesystem-only snapshot", code, b, http.StatusBadRequest, "filesystem-only snapshots are not supported")
	code, b = e.call(t, "GET", "/snapshots?sandboxID="+a.SandboxID, e.key, "")
	if code != http.StatusOK || !bytes.Contains(b, []byte(`"snapshotID":"tmpl1"`)) {
		t.Fatalf("list snapshots: %d %s", code, b)
	}
	if code, b := e.call(t, "GET", "/templates/aliases/tmpl1", e.key, ""); code != http.StatusOK {
		t.Fatalf("alias of a snapshot: %d %s", code, b)
	}
	code, b = e.call(t, "GET", "/templates/aliases/nosuch", e.key, "")
	wantAPIError(t, "alias of nothing", code, b, http.StatusNotFound, "not found")

	from := e.create(t, `{"templateID":"tmpl1"}`)
	vf, err := e.svc.Get(e.ctx, from.SandboxID)
	if err != nil || from.TemplateID != "tmpl1" || vf.State != store.StateRunning {
		t.Fatalf("create from a snapshot: %+v %v %v", from, vf, err)
	}
	if got := e.hv.MachineOf(vf.ID).Memory(); got != "parent's memory" {
		t.Fatalf("the sandbox made from a snapshot has memory %q: not a restore", got)
	}

	code, b = e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/fork", e.key, `{"count":2,"timeout":120}`)
	var forks []forkResult
	if err := json.Unmarshal(b, &forks); err != nil || code != http.StatusCreated || len(forks) != 2 {
		t.Fatalf("fork: %d %s", code, b)
	}
	for _, f := range forks {
		if f.Error != nil || f.Sandbox == nil {
			t.Fatalf("fork child: %+v", f)
		}
		if d := e.info(t, f.Sandbox.SandboxID); d.State != "running" || d.Metadata["team"] != "red" {
			t.Fatalf("fork child: %+v", d)
		}
	}
	code, b = e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/fork", e.key, `{"count":21}`)
	wantAPIError(t, "fork of 21", code, b, http.StatusBadRequest, "count must be between 1 and 20")

	code, b = e.call(t, "DELETE", "/templates/base", e.key, "")
	wantAPIError(t, "delete of the base image", code, b, http.StatusBadRequest, "built-in image")
	if code, b := e.call(t, "DELETE", "/templates/tmpl1", e.key, ""); code != http.StatusNoContent {
		t.Fatalf("delete template: %d %s", code, b)
	}
	code, b = e.call(t, "POST", "/sandboxes", e.key, `{"templateID":"tmpl1"}`)
	wantAPIError(t, "create from a deleted template", code, b, http.StatusNotFound, "not found")
}

// A connect to a sandbox whose filesystem-only auto-pause was announced
// (past its end, answered paused) but not yet done by the timeout loop
// does that pause first: the resume boots the VM from its disk, as
// E2B's test_auto_pause_filesystem_only_reboots expects (under load the
// loop came late, and the connect found the old machine running on).
func TestConnectDoesAnAnnouncedFilesystemOnlyPause(t *testing.T) {
	e := newFakeE2B(t)
	a := e.create(t, `{"templateID":"base","autoPause":true,"autoPauseMemory":false,"timeout":1}`)
	deadline := time.Now().Add(time.Minute)
	for e.info(t, a.SandboxID).State != "paused" {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox is not answered paused a minute past its end")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := e.vmState(t, a.SandboxID); st != store.StateRunning {
		t.Fatalf("the VM is %s before the connect (no timeout loop runs here)", st)
	}
	v, err := e.svc.Get(e.ctx, a.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	boots := func() int {
		n := 0
		for _, c := range e.hv.Starts() {
			if c.ID == v.ID && c.Incoming == "" {
				n++
			}
		}
		return n
	}
	before := boots()
	code, b := e.call(t, "POST", "/sandboxes/"+a.SandboxID+"/connect", e.key, `{"timeout":60}`)
	if code != http.StatusCreated {
		t.Fatalf("connect: %d %s, want 201 (resumed)", code, b)
	}
	if boots() != before+1 {
		t.Fatalf("the connect booted the VM %d times, want once", boots()-before)
	}
	if st := e.vmState(t, a.SandboxID); st != store.StateRunning {
		t.Fatalf("after the connect the VM is %s", st)
	}

	// Not when its end has not come, nor for a pause that keeps memory:
	// the connect finds it running and leaves it so (200, no boot).
	for _, body := range []string{
		`{"templateID":"base","autoPause":true,"autoPauseMemory":false,"timeout":3600}`,
		`{"templateID":"base","autoPause":true,"timeout":1}`,
	} {
		b := e.create(t, body)
		time.Sleep(1500 * time.Millisecond) // a 1 s timeout has passed (no loop pauses it here)
		bv, err := e.svc.Get(e.ctx, b.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		starts := len(e.hv.Starts())
		code, out := e.call(t, "POST", "/sandboxes/"+b.SandboxID+"/connect", e.key, `{"timeout":60}`)
		if code != http.StatusOK || len(e.hv.Starts()) != starts || e.vmState(t, b.SandboxID) != store.StateRunning {
			t.Errorf("connect to %s (%s): %d %s after %d starts, VM %s", body, bv.ID, code, out, len(e.hv.Starts())-starts, e.vmState(t, b.SandboxID))
		}
	}
}

// network.allowPublicTraffic: false is recorded on the sandbox and kept by
// its forks; a create without it, or with true, is public; an egress rule
// is refused and makes nothing.
func TestPrivateTrafficIsRecordedAndForked(t *testing.T) {
	e := newFakeE2B(t)
	priv := e.create(t, `{"network":{"allowPublicTraffic":false}}`)
	pub := e.create(t, `{"network":{"allowPublicTraffic":true}}`)
	private := func(name string) bool {
		t.Helper()
		v, err := e.svc.Get(e.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := e.st.GetSandboxFresh(e.ctx, v.ID)
		if err != nil {
			t.Fatal(err)
		}
		return sb.PrivateTraffic
	}
	if !private(priv.SandboxID) || private(pub.SandboxID) {
		t.Fatalf("recorded: private %v, public %v", private(priv.SandboxID), private(pub.SandboxID))
	}
	code, b := e.call(t, "POST", "/sandboxes/"+priv.SandboxID+"/fork", e.key, `{"count":1}`)
	var forks []forkResult
	if err := json.Unmarshal(b, &forks); err != nil || code != http.StatusCreated || len(forks) != 1 || forks[0].Sandbox == nil {
		t.Fatalf("fork: %d %s", code, b)
	}
	if !private(forks[0].Sandbox.SandboxID) {
		t.Fatal("the fork of a private sandbox is public")
	}
	vms, _ := e.svc.List(e.ctx)
	code, b = e.call(t, "POST", "/sandboxes", e.key, `{"network":{"denyOut":["0.0.0.0/0"]}}`)
	wantAPIError(t, "an egress rule", code, b, http.StatusBadRequest, "network.allowOut and network.denyOut are not supported")
	if after, _ := e.svc.List(e.ctx); len(after) != len(vms) {
		t.Fatalf("a refused create made a VM: %d -> %d", len(vms), len(after))
	}
}
