package console

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
)

// fakeAuth knows an admin token and one scoped token; revoke drops one;
// err fails every call (a database error).
type fakeAuth struct {
	valid map[string]*auth.Principal
	err   error
}

func (f *fakeAuth) Authenticate(_ context.Context, secret string) (*auth.Principal, error) {
	if f.err != nil {
		return nil, f.err
	}
	if p, ok := f.valid[secret]; ok {
		return p, nil
	}
	return nil, auth.ErrUnauthenticated
}

const (
	adminTok  = "avm_admin"
	scopedTok = "avt_scoped"
	host      = "console.test:7070"
	origin    = "http://console.test:7070"
)

func newTest(t *testing.T, assets fstest.MapFS) (*Console, *fakeAuth, http.Handler) {
	t.Helper()
	fa := &fakeAuth{valid: map[string]*auth.Principal{
		adminTok:  auth.Admin,
		scopedTok: {TokenID: "t1", VMID: "vm1", Allow: []string{"term", "files"}, ExpiresAt: time.Now().Add(time.Hour)},
	}}
	cfg := Config{Auth: fa, Key: []byte("test key"), Log: slog.New(slog.DiscardHandler)}
	if assets != nil {
		cfg.Assets = assets
	}
	c := New(cfg)
	if assets == nil {
		c.assets = nil // as a binary built without the console
	}
	mux := http.NewServeMux()
	c.Routes(mux)
	return c, fa, mux
}

func req(method, path, body string, hdr map[string]string, cookie string) *http.Request {
	r := httptest.NewRequest(method, "http://"+host+path, strings.NewReader(body))
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	if cookie != "" {
		r.AddCookie(&http.Cookie{Name: auth.SessionCookie, Value: cookie})
	}
	return r
}

func do(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestSignInSetsAStrictHttpOnlyCookie(t *testing.T) {
	c, _, h := newTest(t, nil)
	json1 := map[string]string{"Content-Type": "application/json", "Origin": origin}
	for _, tc := range []struct {
		name   string
		body   string
		hdr    map[string]string
		status int
	}{
		{"admin", `{"token":"` + adminTok + `"}`, json1, 200},
		{"scoped", `{"token":"` + scopedTok + `"}`, json1, 200},
		{"wrong token", `{"token":"avt_nope"}`, json1, 401},
		{"form post", "token=" + adminTok, map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": origin}, 415},
		{"no origin at all (an old browser's cross-site form)", "token=" + adminTok, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 403},
		{"other origin", `{"token":"` + adminTok + `"}`, map[string]string{"Content-Type": "application/json", "Origin": "http://8000-vm.localhost:7080"}, 403},
		{"cross-site fetch", `{"token":"` + adminTok + `"}`, map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := do(h, req("POST", "/console/session", tc.body, tc.hdr, ""))
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			cookies := w.Result().Cookies()
			if tc.status != 200 {
				if len(cookies) != 0 {
					t.Fatalf("a refused sign-in set a cookie: %v", cookies)
				}
				return
			}
			if len(cookies) != 1 {
				t.Fatalf("cookies: %v", cookies)
			}
			ck := cookies[0]
			if ck.Name != auth.SessionCookie || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.Secure {
				t.Fatalf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/, not Secure over plain HTTP", ck)
			}
			var s Session
			json.NewDecoder(w.Body).Decode(&s)
			if s.CSRFToken == "" || s.CSRFToken != c.csrfToken(ck.Value) {
				t.Fatalf("session %+v: want the CSRF token of the cookie's session id", s)
			}
			if strings.Contains(ck.Value, "avm_") || strings.Contains(ck.Value, "avt_") {
				t.Fatalf("the cookie holds the token: %q", ck.Value)
			}
			if b, err := base64.RawURLEncoding.DecodeString(ck.Value); err != nil || len(b) != 32 {
				t.Fatalf("the cookie must be 32 random bytes, base64url: %q", ck.Value)
			}
			if strings.Contains(w.Body.String(), ck.Value) || strings.Contains(w.Body.String(), `avt_scoped"`) {
				t.Fatalf("the answer repeats the session id or the token: %s", w.Body)
			}
		})
	}
}

func TestSecureCookieOverTLS(t *testing.T) {
	_, _, h := newTest(t, nil)
	r := req("POST", "/console/session", `{"token":"`+adminTok+`"}`, map[string]string{"Content-Type": "application/json", "Origin": "https://" + host}, "")
	r.TLS = &tlsState
	w := do(h, r)
	if ck := w.Result().Cookies(); w.Code != 200 || len(ck) != 1 || !ck[0].Secure {
		t.Fatalf("over TLS: %d %v", w.Code, ck)
	}
}

// startSession signs in with token and returns the session id.
func startSession(t *testing.T, c *Console, token string) string {
	t.Helper()
	p, err := c.auth.Authenticate(context.Background(), token)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := c.sessions.create(token, p.ExpiresAt)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestCredentialChecksOriginAndCSRF(t *testing.T) {
	c, _, _ := newTest(t, nil)
	id := startSession(t, c, adminTok)
	good := c.csrfToken(id)
	same := map[string]string{"Sec-Fetch-Site": "same-origin"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		method string
		hdr    map[string]string
		cookie string
		want   string // token, "" for none
		err    error
	}{
		{"no cookie", "POST", nil, "", "", nil},
		{"same-origin GET with CSRF", "GET", with("Sec-Fetch-Site", "same-origin", CSRFHeader, good), id, adminTok, nil},
		{"GET with CSRF and Origin", "GET", with("Origin", origin, CSRFHeader, good), id, adminTok, nil},
		{"same-origin fetch GET without CSRF", "GET", same, id, "", ErrCSRF},
		{"GET with a wrong CSRF", "GET", with("Sec-Fetch-Site", "same-origin", CSRFHeader, c.csrfToken("other")), id, "", ErrCSRF},
		{"neither Sec-Fetch-Site nor Origin (an old browser)", "GET", with(CSRFHeader, good), id, "", ErrCrossSite},
		{"old browser's cross-site navigation", "GET", nil, id, "", ErrCrossSite},
		{"typed URL", "GET", with("Sec-Fetch-Site", "none", "Sec-Fetch-Mode", "navigate"), id, "", ErrCrossSite},
		{"download link", "GET", with("Sec-Fetch-Site", "same-origin", "Sec-Fetch-Mode", "navigate"), id, adminTok, nil},
		{"cross-site navigation", "GET", with("Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate"), id, "", ErrCrossSite},
		{"EventSource", "GET", with("Sec-Fetch-Site", "same-origin", "Accept", "text/event-stream"), id, adminTok, nil},
		{"same-site GET (a preview host)", "GET", with("Sec-Fetch-Site", "same-site", CSRFHeader, good), id, "", ErrCrossSite},
		{"cross-site GET", "GET", with("Sec-Fetch-Site", "cross-site"), id, "", ErrCrossSite},
		{"POST without CSRF", "POST", with("Origin", origin), id, "", ErrCSRF},
		{"POST with a wrong CSRF", "POST", with("Origin", origin, CSRFHeader, c.csrfToken("other")), id, "", ErrCSRF},
		{"POST with CSRF", "POST", with(CSRFHeader, good, "Origin", origin), id, adminTok, nil},
		{"DELETE with CSRF", "DELETE", with(CSRFHeader, good, "Sec-Fetch-Site", "same-origin"), id, adminTok, nil},
		{"navigation POST without CSRF", "POST", with("Origin", origin, "Sec-Fetch-Mode", "navigate"), id, "", ErrCSRF},
		{"PUT without CSRF", "PUT", same, id, "", ErrCSRF},
		{"POST with CSRF from another origin", "POST", with(CSRFHeader, good, "Origin", "http://evil.example"), id, "", ErrCrossSite},
		{"WebSocket from the console", "GET", with("Upgrade", "websocket", "Origin", origin), id, adminTok, nil},
		{"WebSocket from a preview host", "GET", with("Upgrade", "websocket", "Origin", "http://8000-vm.localhost:7070"), id, "", ErrCrossSite},
		{"WebSocket without Origin", "GET", with("Upgrade", "websocket", "Sec-Fetch-Site", "same-origin"), id, "", ErrCrossSite},
		{"unknown session", "GET", with("Sec-Fetch-Site", "same-origin", CSRFHeader, c.csrfToken("nope")), "nope", "", ErrNoSession},
		{"the token itself as the cookie", "GET", with("Sec-Fetch-Site", "same-origin", CSRFHeader, c.csrfToken(adminTok)), adminTok, "", ErrNoSession},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.Credential(req(tc.method, "/v1/vms", "", tc.hdr, tc.cookie))
			if got != tc.want || err != tc.err {
				t.Fatalf("Credential = %q, %v; want %q, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestSessionAndRevocation(t *testing.T) {
	c, fa, h := newTest(t, nil)
	same := map[string]string{"Sec-Fetch-Site": "same-origin"}
	w := do(h, req("GET", "/console/session", "", same, ""))
	if w.Code != 401 {
		t.Fatalf("no cookie: %d", w.Code)
	}
	scoped := startSession(t, c, scopedTok)
	if w = do(h, req("GET", "/console/session", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, scoped)); w.Code != 403 {
		t.Fatalf("cross-site session read: %d", w.Code)
	}
	w = do(h, req("GET", "/console/session", "", same, scoped))
	var s Session
	if err := json.NewDecoder(w.Body).Decode(&s); w.Code != 200 || err != nil {
		t.Fatalf("scoped session: %d %v", w.Code, err)
	}
	if s.Admin || s.VMID != "vm1" || s.CSRFToken != c.csrfToken(scoped) || s.ExpiresAt == nil {
		t.Fatalf("scoped session: %+v", s)
	}
	// A database error is not a sign-out: 500, the cookie stays.
	fa.err = errors.New("database is locked")
	w = do(h, req("GET", "/console/session", "", same, scoped))
	if w.Code != 500 || len(w.Result().Cookies()) != 0 {
		t.Fatalf("store error: %d %v, want 500 and the cookie kept", w.Code, w.Result().Cookies())
	}
	fa.err = nil
	// A revoked token's session ends: 401, the cookie is removed, and so
	// is the session.
	delete(fa.valid, scopedTok)
	w = do(h, req("GET", "/console/session", "", same, scoped))
	if w.Code != 401 {
		t.Fatalf("revoked: %d", w.Code)
	}
	if ck := w.Result().Cookies(); len(ck) != 1 || ck[0].MaxAge >= 0 {
		t.Fatalf("revoked: want the cookie deleted, got %v", ck)
	}
	if _, ok := c.sessions.lookup(scoped); ok {
		t.Fatal("a revoked token's session is still kept")
	}
}

func TestSignOutEndsTheSession(t *testing.T) {
	c, _, h := newTest(t, nil)
	id := startSession(t, c, adminTok)
	same := map[string]string{"Sec-Fetch-Site": "same-origin"}
	// Sign-out needs the CSRF token.
	if w := do(h, req("DELETE", "/console/session", "", same, id)); w.Code != 403 {
		t.Fatalf("sign-out without CSRF: %d", w.Code)
	}
	w := do(h, req("DELETE", "/console/session", "", map[string]string{CSRFHeader: c.csrfToken(id), "Sec-Fetch-Site": "same-origin"}, id))
	if ck := w.Result().Cookies(); w.Code != 204 || len(ck) != 1 || ck[0].MaxAge >= 0 {
		t.Fatalf("sign-out: %d %v", w.Code, ck)
	}
	// The old cookie is worthless now, even replayed with its CSRF token.
	if _, err := c.Credential(req("GET", "/v1/vms", "", map[string]string{CSRFHeader: c.csrfToken(id), "Sec-Fetch-Site": "same-origin"}, id)); err != ErrNoSession {
		t.Fatalf("after sign-out: %v, want ErrNoSession", err)
	}
	if w := do(h, req("GET", "/console/session", "", same, id)); w.Code != 401 {
		t.Fatalf("session after sign-out: %d", w.Code)
	}
}

func TestSessionLifetimes(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	fa := &fakeAuth{valid: map[string]*auth.Principal{
		adminTok:  auth.Admin,
		scopedTok: {TokenID: "t1", VMID: "vm1", ExpiresAt: now.Add(2 * time.Hour)},
	}}
	c := New(Config{Auth: fa, Log: slog.New(slog.DiscardHandler), IdleLifetime: time.Hour, MaxLifetime: 3 * time.Hour, MaxSessions: 3, Now: clock})
	alive := func(id string) bool { _, ok := c.sessions.lookup(id); return ok }

	// Idle: used within the idle lifetime it lives on, past it it ends.
	a := startSession(t, c, adminTok)
	now = now.Add(50 * time.Minute)
	if !alive(a) {
		t.Fatal("a session used within its idle lifetime ended")
	}
	now = now.Add(61 * time.Minute)
	if alive(a) {
		t.Fatal("an idle session lived on")
	}
	// Absolute: used all along, it still ends.
	b := startSession(t, c, adminTok)
	for i := 0; i < 5; i++ {
		now = now.Add(35 * time.Minute)
		if !alive(b) {
			t.Fatalf("a used session ended after %d min", 35*(i+1))
		}
	}
	now = now.Add(10 * time.Minute) // 185 min
	if alive(b) {
		t.Fatal("a session outlived its absolute lifetime")
	}
	// A scoped token's session ends with the token.
	fa.valid[scopedTok].ExpiresAt = now.Add(30 * time.Minute)
	sc := startSession(t, c, scopedTok)
	now = now.Add(29 * time.Minute)
	if !alive(sc) {
		t.Fatal("the scoped session ended early")
	}
	now = now.Add(2 * time.Minute)
	if alive(sc) {
		t.Fatal("a scoped session outlived its token")
	}
	// Bounded: the oldest goes.
	var ids []string
	for i := 0; i < 5; i++ {
		now = now.Add(time.Second)
		ids = append(ids, startSession(t, c, adminTok))
	}
	if n := c.sessions.len(); n != 3 {
		t.Fatalf("%d sessions kept, want the cap of 3", n)
	}
	if alive(ids[0]) || alive(ids[1]) || !alive(ids[2]) || !alive(ids[4]) {
		t.Fatal("the cap must end the oldest sessions")
	}
	// Through the API: an ended session is a 401 with the cookie removed.
	mux := http.NewServeMux()
	c.Routes(mux)
	now = now.Add(2 * time.Hour)
	w := do(mux, req("GET", "/console/session", "", map[string]string{"Sec-Fetch-Site": "same-origin"}, ids[4]))
	if ck := w.Result().Cookies(); w.Code != 401 || len(ck) != 1 || ck[0].MaxAge >= 0 {
		t.Fatalf("idle session: %d %v, want 401 and the cookie removed", w.Code, ck)
	}
}

func TestCSRFTokenDependsOnKeyAndToken(t *testing.T) {
	a := New(Config{Key: []byte("k1")})
	b := New(Config{Key: []byte("k2")})
	if a.csrfToken(adminTok) == b.csrfToken(adminTok) || a.csrfToken(adminTok) == a.csrfToken(scopedTok) {
		t.Fatal("CSRF tokens must differ per key and per token")
	}
	if a.csrfToken(adminTok) != a.csrfToken(adminTok) {
		t.Fatal("CSRF token must be stable")
	}
}

func TestPageHeaders(t *testing.T) {
	_, _, h := newTest(t, fstest.MapFS{
		"index.html":  {Data: []byte("<!doctype html><title>x</title>")},
		"ui/app.js":   {Data: []byte("console.log(1)")},
		"ui/.secret":  {Data: []byte("no")},
		"ui/app.css":  {Data: []byte("body{}")},
		"notui.txt":   {Data: []byte("no")},
		"ui/sub/x.js": {Data: []byte("1")},
	})
	w := do(h, req("GET", "/", "", nil, ""))
	if w.Code != 200 || !strings.Contains(w.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("index: %d %s", w.Code, w.Header())
	}
	csp := w.Header().Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'; ", "frame-ancestors 'none'", "base-uri 'none'", "object-src 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, host) {
		t.Errorf("CSP echoes the Host header: %q", csp)
	}
	if strings.Contains(csp, "unsafe-eval") || strings.Contains(strings.Split(csp, "style-src")[0], "unsafe-inline") {
		t.Errorf("CSP allows inline or eval'd script: %q", csp)
	}
	for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"} {
		if w.Header().Get(k) != v {
			t.Errorf("%s = %q, want %q", k, w.Header().Get(k), v)
		}
	}
	w = do(h, req("GET", "/ui/app.js", "", nil, ""))
	if w.Code != 200 || !strings.Contains(w.Header().Get("Content-Type"), "javascript") || w.Header().Get("ETag") == "" {
		t.Fatalf("app.js: %d %v", w.Code, w.Header())
	}
	etag := w.Header().Get("ETag")
	if w = do(h, req("GET", "/ui/app.js", "", map[string]string{"If-None-Match": etag}, "")); w.Code != http.StatusNotModified {
		t.Fatalf("revalidation: %d", w.Code)
	}
	for _, p := range []string{"/ui/.secret", "/ui/missing.js", "/ui/../notui.txt"} {
		if w = do(h, req("GET", p, "", nil, "")); w.Code == 200 {
			t.Errorf("%s: served (%s)", p, w.Body)
		}
	}
}

func TestNotBuiltSaysHowToBuild(t *testing.T) {
	_, _, h := newTest(t, nil)
	w := do(h, req("GET", "/", "", nil, ""))
	b, _ := io.ReadAll(w.Body)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(string(b), "npm run build") || !strings.Contains(string(b), "scripts/setup.sh") {
		t.Fatalf("not built: %d %s", w.Code, b)
	}
	if w.Header().Get("Content-Security-Policy") == "" {
		t.Fatal("the not-built page needs the CSP too")
	}
}

func TestSandbox(t *testing.T) {
	w := httptest.NewRecorder()
	Sandbox(w)
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "sandbox") || !strings.Contains(csp, "default-src 'none'") {
		t.Fatalf("sandbox CSP: %q", csp)
	}
}

var tlsState = tls.ConnectionState{HandshakeComplete: true}
