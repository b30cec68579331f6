package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/console"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vmstats"
)

// consoleServer is the test server with the console mounted; a second VM
// ("db", vm2) shows what a scoped token must not see.
func consoleServer(t *testing.T) (*testServer, string) {
	t.Helper()
	ts := newTestServer(t, nil)
	v2 := &store.VM{ID: "vm2", Name: "db", State: "suspended", CPUs: 1, MemoryMiB: 256, NetIndex: 2, CreatedAt: time.Now().UTC()}
	if err := ts.store.CreateVM(context.Background(), v2); err != nil {
		t.Fatal(err)
	}
	ts.console = newConsole(ts.Server)
	ts.usage = vmstats.New(10 * time.Second)
	hs := httptest.NewServer(ts.routes())
	t.Cleanup(hs.Close)
	ts.url = hs.URL
	return ts, hs.URL
}

// browser is a signed-in browser: its cookie and CSRF token.
type browser struct {
	t      *testing.T
	url    string
	cookie *http.Cookie
	csrf   string
}

func signIn(t *testing.T, url, token string) *browser {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/console/session", strings.NewReader(`{"token":"`+token+`"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", url)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s console.Session
	json.NewDecoder(resp.Body).Decode(&s)
	if resp.StatusCode != 200 || len(resp.Cookies()) != 1 || s.CSRFToken == "" {
		t.Fatalf("sign in: %d %v %+v", resp.StatusCode, resp.Cookies(), s)
	}
	return &browser{t: t, url: url, cookie: resp.Cookies()[0], csrf: s.CSRFToken}
}

func (b *browser) do(method, path string, withCSRF bool, hdr map[string]string) *http.Response {
	b.t.Helper()
	req, _ := http.NewRequest(method, b.url+path, strings.NewReader("{}"))
	req.AddCookie(b.cookie)
	if withCSRF {
		req.Header.Set(console.CSRFHeader, b.csrf)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	return resp
}

func status(resp *http.Response) int {
	resp.Body.Close()
	return resp.StatusCode
}

func TestConsoleCookieAuth(t *testing.T) {
	ts, url := consoleServer(t)
	admin := signIn(t, url, testAdmin)
	if got := status(admin.do("GET", "/v1/vms", false, nil)); got != 200 {
		t.Fatalf("GET /v1/vms with the admin's cookie: %d", got)
	}
	resp := admin.do("GET", "/v1/vms/web/logs", false, nil)
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "sandbox") {
		t.Errorf("an API answer to a browser session must be sandboxed, CSP %q", csp)
	}
	resp.Body.Close()
	// State-changing calls need the CSRF token, and come from this origin.
	if got := status(admin.do("POST", "/v1/vms/web/pause", false, nil)); got != 403 {
		t.Fatalf("POST without CSRF token: %d, want 403", got)
	}
	if got := status(admin.do("POST", "/v1/vms/web/pause", true, map[string]string{"Origin": "http://8000-web.localhost:7080"})); got != 403 {
		t.Fatalf("POST from a preview origin: %d, want 403", got)
	}
	if got := status(admin.do("POST", "/v1/vms/web/pause", true, nil)); got == 401 || got == 403 {
		t.Fatalf("POST with the CSRF token: %d, want it past auth", got)
	}
	if got := status(admin.do("GET", "/v1/vms", false, map[string]string{"Sec-Fetch-Site": "cross-site"})); got != 403 {
		t.Fatalf("cross-site GET with the cookie: %d, want 403", got)
	}
	// Bearer clients are unchanged, and unknown API paths stay JSON 404s.
	if got := status(ts.do(t, "GET", "/v1/vms", testAdmin)); got != 200 {
		t.Fatalf("bearer: %d", got)
	}
	resp = ts.do(t, "GET", "/v1/nope", testAdmin)
	if resp.StatusCode != 404 || !strings.Contains(resp.Header.Get("Content-Type"), "json") {
		t.Fatalf("unknown endpoint: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	resp.Body.Close()
	resp = ts.do(t, "GET", "/", "")
	if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "text/html") || resp.Header.Get("Content-Security-Policy") == "" {
		t.Fatalf("GET /: %d %s", resp.StatusCode, ct)
	}
	resp.Body.Close()
}

func TestConsoleScopedTokenSeesOnlyItsVM(t *testing.T) {
	ts, url := consoleServer(t)
	tok := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermTerm, api.PermFiles}})
	b := signIn(t, url, tok.Secret)
	for path, want := range map[string]int{
		"/v1/vms":          403,
		"/v1/vms/web":      200,
		"/v1/vms/db":       403,
		"/v1/vms/vm2":      403,
		"/v1/host":         403,
		"/v1/tokens":       403,
		"/v1/vms/web/logs": 403,
	} {
		if got := status(b.do("GET", path, false, nil)); got != want {
			t.Errorf("GET %s with a scoped session: %d, want %d", path, got, want)
		}
	}
	// Revoking the token ends the session at its next request.
	if err := ts.tokens.Revoke(context.Background(), tok.ID); err != nil {
		t.Fatal(err)
	}
	if got := status(b.do("GET", "/v1/vms/web", false, nil)); got != 401 {
		t.Fatalf("after revoke: %d, want 401", got)
	}
	if got := status(b.do("GET", "/console/session", false, nil)); got != 401 {
		t.Fatalf("session after revoke: %d, want 401", got)
	}
}

func TestAllEvents(t *testing.T) {
	ts, url := consoleServer(t)
	ts.svc.Event("vm1", "exec", "admin", "on web")
	ts.svc.Event("vm2", "lifecycle", "admin", "on db")
	term := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermTerm}}).Secret
	preview := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermPreview}}).Secret

	list := func(secret string) []api.Event {
		t.Helper()
		resp := ts.do(t, "GET", "/v1/events", secret)
		defer resp.Body.Close()
		var out api.ListEventsResponse
		if err := json.NewDecoder(resp.Body).Decode(&out); resp.StatusCode != 200 || err != nil {
			t.Fatalf("list events: %d %v", resp.StatusCode, err)
		}
		return out.Events
	}
	if es := list(testAdmin); len(es) != 2 || es[0].VM != "vm1" || es[1].VM != "vm2" {
		t.Fatalf("admin: %+v", es)
	}
	if es := list(term); len(es) != 1 || es[0].VM != "vm1" {
		t.Fatalf("scoped: %+v", es)
	}
	if got := status(ts.do(t, "GET", "/v1/events", preview)); got != 403 {
		t.Fatalf("preview token: %d, want 403", got)
	}

	// Follow as server-sent events: a scoped stream gets its VM's events only.
	follow := func(secret string) (*bufio.Reader, func()) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/v1/events?follow=1", nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("follow: %v %v", err, resp)
		}
		return bufio.NewReader(resp.Body), func() { cancel(); resp.Body.Close() }
	}
	next := func(br *bufio.Reader) api.Event {
		t.Helper()
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			if data, ok := strings.CutPrefix(line, "data: "); ok {
				var e api.Event
				if err := json.Unmarshal([]byte(data), &e); err != nil {
					t.Fatal(err)
				}
				return e
			}
		}
	}
	all, stopAll := follow(testAdmin)
	defer stopAll()
	mine, stopMine := follow(term)
	defer stopMine()
	time.Sleep(100 * time.Millisecond) // both subscribed
	ts.svc.Event("vm2", "lifecycle", "admin", "db paused")
	ts.svc.Event("vm1", "lifecycle", "admin", "web paused")
	if e := next(all); e.VM != "vm2" || e.Message != "db paused" {
		t.Fatalf("admin stream: first %+v", e)
	}
	if e := next(all); e.VM != "vm1" {
		t.Fatalf("admin stream: second %+v", e)
	}
	if e := next(mine); e.VM != "vm1" || e.Message != "web paused" {
		t.Fatalf("scoped stream: %+v (it must skip the other VM's events)", e)
	}
}

func TestVMMetricsAndHost(t *testing.T) {
	ts, _ := consoleServer(t)
	// Sample this test process as if it were vm1's QEMU.
	ts.usage.Sample([]vmstats.Proc{{VMID: "vm1", PID: os.Getpid()}})
	ts.usage.Sample([]vmstats.Proc{{VMID: "vm1", PID: os.Getpid()}})
	resp := ts.do(t, "GET", "/v1/vms/web/metrics", ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermPreview}}).Secret)
	var m api.VMMetrics
	if err := json.NewDecoder(resp.Body).Decode(&m); resp.StatusCode != 200 || err != nil {
		t.Fatalf("metrics: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if m.VM != "vm1" || m.IntervalSec != 10 || len(m.Samples) != 1 || m.Samples[0].RSSBytes <= 0 {
		t.Fatalf("metrics: %+v", m)
	}
	resp = ts.do(t, "GET", "/v1/host", testAdmin)
	var h api.HostInfo
	if err := json.NewDecoder(resp.Body).Decode(&h); resp.StatusCode != 200 || err != nil {
		t.Fatalf("host: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	if h.Running != 1 || h.Suspended != 1 || h.MemoryCommittedBytes != 512<<20 || h.MemoryTotalBytes <= 0 || h.Templates == nil {
		t.Fatalf("host: %+v", h)
	}
}
