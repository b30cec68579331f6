package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
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

// do sends a request as the console's page would (Sec-Fetch-Site:
// same-origin), with the CSRF token or not; hdr overrides headers (""
// removes one).
func (b *browser) do(method, path string, withCSRF bool, hdr map[string]string) *http.Response {
	b.t.Helper()
	req, _ := http.NewRequest(method, b.url+path, strings.NewReader("{}"))
	req.AddCookie(b.cookie)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	if withCSRF {
		req.Header.Set(console.CSRFHeader, b.csrf)
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
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
	if strings.Contains(admin.cookie.Value, testAdmin) {
		t.Fatalf("the cookie holds the token: %q", admin.cookie.Value)
	}
	if got := status(admin.do("GET", "/v1/vms", true, nil)); got != 200 {
		t.Fatalf("GET /v1/vms with the admin's cookie: %d", got)
	}
	// Even a GET needs the CSRF token (GET /v1/vms/{id}?wake=1 changes state),
	// unless it is a download, an event stream or a WebSocket.
	if got := status(admin.do("GET", "/v1/vms/web?wake=1", false, nil)); got != 403 {
		t.Fatalf("GET without CSRF token: %d, want 403", got)
	}
	if got := status(admin.do("GET", "/v1/vms/web?wake=1", true, map[string]string{"Sec-Fetch-Site": ""})); got != 403 {
		t.Fatalf("GET with neither Sec-Fetch-Site nor Origin: %d, want 403", got)
	}
	if got := status(admin.do("GET", "/v1/vms/web", false, map[string]string{"Sec-Fetch-Mode": "navigate"})); got != 200 {
		t.Fatalf("a download link: %d, want 200", got)
	}
	resp := admin.do("GET", "/v1/vms/web/logs", true, nil)
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "sandbox") {
		t.Errorf("an API answer to a browser session must be sandboxed, CSP %q", csp)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("an API answer to a browser session must not be cached, Cache-Control %q", cc)
	}
	resp.Body.Close()
	// The console's cookie is no credential on /mcp.
	resp = admin.do("POST", "/mcp", true, map[string]string{"Content-Type": "application/json"})
	if body, _ := io.ReadAll(resp.Body); resp.StatusCode != 401 || !strings.Contains(string(body), "Bearer") {
		t.Fatalf("/mcp with the cookie: %d %s, want 401 naming bearer tokens", resp.StatusCode, body)
	}
	resp.Body.Close()
	// A valid bearer token wins over a cookie that fails the origin check.
	req, _ := http.NewRequest("GET", url+"/v1/vms", nil)
	req.AddCookie(admin.cookie)
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.Header.Set("Origin", "http://evil.example")
	if resp, err := http.DefaultClient.Do(req); err != nil || status(resp) != 200 {
		t.Fatalf("bearer with a cross-site cookie: %v %v, want 200", err, resp)
	}
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
	if got := status(admin.do("GET", "/v1/vms", true, map[string]string{"Sec-Fetch-Site": "cross-site"})); got != 403 {
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
		if got := status(b.do("GET", path, true, nil)); got != want {
			t.Errorf("GET %s with a scoped session: %d, want %d", path, got, want)
		}
	}
	// Revoking the token ends the session at its next request.
	if err := ts.tokens.Revoke(context.Background(), tok.ID); err != nil {
		t.Fatal(err)
	}
	if got := status(b.do("GET", "/v1/vms/web", true, nil)); got != 401 {
		t.Fatalf("after revoke: %d, want 401", got)
	}
	if got := status(b.do("GET", "/console/session", false, nil)); got != 401 {
		t.Fatalf("session after revoke: %d, want 401", got)
	}
}

func TestConsoleSignOutEndsTheSession(t *testing.T) {
	_, url := consoleServer(t)
	b := signIn(t, url, testAdmin)
	if got := status(b.do("GET", "/v1/vms", true, nil)); got != 200 {
		t.Fatalf("signed in: %d", got)
	}
	if got := status(b.do("DELETE", "/console/session", true, nil)); got != 204 {
		t.Fatalf("sign out: %d", got)
	}
	// The old cookie (kept by an attacker, say) is worthless: the daemon
	// ended the session.
	if got := status(b.do("GET", "/v1/vms", true, nil)); got != 401 {
		t.Fatalf("the old cookie after sign-out: %d, want 401", got)
	}
	if got := status(b.do("GET", "/console/session", false, nil)); got != 401 {
		t.Fatalf("session after sign-out: %d, want 401", got)
	}
}

func TestConsoleExpiredSession(t *testing.T) {
	ts, url := consoleServer(t)
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	ts.console = console.New(console.Config{Auth: ts.tokens, Log: ts.log, IdleLifetime: time.Hour, MaxLifetime: 4 * time.Hour, Now: clock})
	hs := httptest.NewServer(ts.routes())
	t.Cleanup(hs.Close)
	url = hs.URL
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	idle, old := signIn(t, url, testAdmin), signIn(t, url, testAdmin)
	for i := 0; i < 3; i++ { // old stays in use, idle does not
		advance(50 * time.Minute)
		if got := status(old.do("GET", "/v1/vms", true, nil)); got != 200 {
			t.Fatalf("a session in use: %d", got)
		}
	}
	if got := status(idle.do("GET", "/v1/vms", true, nil)); got != 401 {
		t.Fatalf("an idle session: %d, want 401", got)
	}
	advance(50 * time.Minute) // 200 min
	if got := status(old.do("GET", "/v1/vms", true, nil)); got != 200 {
		t.Fatalf("a session in use: %d", got)
	}
	advance(50 * time.Minute) // 250 min, past the absolute lifetime
	if got := status(old.do("GET", "/v1/vms", true, nil)); got != 401 {
		t.Fatalf("a session past its lifetime: %d, want 401", got)
	}
}

// A revoked token's console session loses its open event stream at once.
func TestConsoleSSEClosesOnRevoke(t *testing.T) {
	ts, url := consoleServer(t)
	tok := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermTerm}})
	b := signIn(t, url, tok.Secret)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/v1/events?follow=1", nil)
	req.AddCookie(b.cookie)
	req.Header.Set("Sec-Fetch-Site", "same-origin") // an EventSource: no CSRF header
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("follow: %v %v", err, resp)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, ":") {
		t.Fatalf("stream start: %q %v", line, err)
	}
	if err := ts.tokens.Revoke(context.Background(), tok.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, br); ctx.Err() != nil {
		t.Fatalf("the stream stayed open after the revoke (%v)", err)
	}
}

func TestConsoleScopedMetricsOfAnotherVM(t *testing.T) {
	ts, url := consoleServer(t)
	tok := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermTerm}})
	b := signIn(t, url, tok.Secret)
	for _, path := range []string{"/v1/vms/db/metrics", "/v1/vms/vm2/metrics"} {
		if got := status(b.do("GET", path, true, nil)); got != 403 {
			t.Errorf("GET %s with a scoped session: %d, want 403", path, got)
		}
		if got := status(ts.do(t, "GET", path, tok.Secret)); got != 403 {
			t.Errorf("GET %s with a scoped bearer: %d, want 403", path, got)
		}
	}
	if got := status(b.do("GET", "/v1/vms/web/metrics", true, nil)); got != 200 {
		t.Errorf("its own VM's metrics: %d, want 200", got)
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
	// The streams start after the events so far: a stream replays what
	// was recorded after its start point, so no wait for the subscription.
	start, err := ts.store.LastEventSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	follow := func(secret string) (*bufio.Reader, func()) {
		// the deadline bounds every read (next)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/v1/events?follow=1&after=%d", url, start), nil)
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
				t.Fatalf("stream: %v (no event within the deadline?)", err)
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

// GET /v1/events without after lists the newest limit events (oldest
// first), for the admin and a VM's token alike; with after, the ones after.
func TestAllEventsListsTheNewest(t *testing.T) {
	ts, _ := consoleServer(t)
	for i := 0; i < 6; i++ {
		ts.svc.Event("vm1", "exec", "admin", "web %d", i)
		ts.svc.Event("vm2", "exec", "admin", "db %d", i)
	}
	term := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermTerm}}).Secret
	list := func(secret, query string) []string {
		t.Helper()
		resp := ts.do(t, "GET", "/v1/events"+query, secret)
		defer resp.Body.Close()
		var out api.ListEventsResponse
		if err := json.NewDecoder(resp.Body).Decode(&out); resp.StatusCode != 200 || err != nil {
			t.Fatalf("list events%s: %d %v", query, resp.StatusCode, err)
		}
		var msgs []string
		for _, e := range out.Events {
			msgs = append(msgs, e.Message)
		}
		return msgs
	}
	if got := strings.Join(list(testAdmin, "?limit=3"), ","); got != "db 4,web 5,db 5" {
		t.Fatalf("admin, newest 3: %s", got)
	}
	if got := strings.Join(list(term, "?limit=2"), ","); got != "web 4,web 5" {
		t.Fatalf("scoped, newest 2: %s (its VM's newest, not the oldest, nor another VM's)", got)
	}
	if got := list(term, ""); len(got) != 6 || got[0] != "web 0" {
		t.Fatalf("scoped, all: %v", got)
	}
	if got := strings.Join(list(term, "?after=0&limit=2"), ","); got != "web 0,web 1" {
		t.Fatalf("scoped, after 0: %s", got)
	}
	// A token bound to no VM never lists every VM's events.
	r := httptest.NewRequest("GET", "/v1/events", nil)
	r = r.WithContext(context.WithValue(r.Context(), principalKey{}, &auth.Principal{TokenID: "t", Allow: auth.RunPerms}))
	w := httptest.NewRecorder()
	ts.listAllEvents(w, r)
	if w.Code != 403 {
		t.Fatalf("a token without a VM: %d, want 403", w.Code)
	}
}
