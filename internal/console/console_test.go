package console

import (
	"context"
	"crypto/tls"
	"encoding/json"
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

// fakeAuth knows an admin token and one scoped token; revoke drops one.
type fakeAuth struct{ valid map[string]*auth.Principal }

func (f *fakeAuth) Authenticate(_ context.Context, secret string) (*auth.Principal, error) {
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
		{"form post (a cross-site form)", "token=" + adminTok, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
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
				t.Fatalf("session %+v: want the CSRF token of the cookie's token", s)
			}
			if strings.Contains(w.Body.String(), ck.Value) {
				t.Fatalf("the answer repeats the token: %s", w.Body)
			}
		})
	}
}

func TestSecureCookieOverTLS(t *testing.T) {
	_, _, h := newTest(t, nil)
	r := req("POST", "/console/session", `{"token":"`+adminTok+`"}`, map[string]string{"Content-Type": "application/json"}, "")
	r.TLS = &tlsState
	w := do(h, r)
	if ck := w.Result().Cookies(); w.Code != 200 || len(ck) != 1 || !ck[0].Secure {
		t.Fatalf("over TLS: %d %v", w.Code, ck)
	}
}

func TestCredentialChecksOriginAndCSRF(t *testing.T) {
	c, _, _ := newTest(t, nil)
	good := c.csrfToken(adminTok)
	for _, tc := range []struct {
		name   string
		method string
		hdr    map[string]string
		cookie string
		want   string // token, "" for none
		err    error
	}{
		{"no cookie", "POST", nil, "", "", nil},
		{"GET needs no CSRF token", "GET", nil, adminTok, adminTok, nil},
		{"same-origin GET", "GET", map[string]string{"Sec-Fetch-Site": "same-origin"}, adminTok, adminTok, nil},
		{"typed URL", "GET", map[string]string{"Sec-Fetch-Site": "none"}, adminTok, adminTok, nil},
		{"same-site GET (a preview host)", "GET", map[string]string{"Sec-Fetch-Site": "same-site"}, adminTok, "", ErrCrossSite},
		{"cross-site GET", "GET", map[string]string{"Sec-Fetch-Site": "cross-site"}, adminTok, "", ErrCrossSite},
		{"POST without CSRF", "POST", map[string]string{"Origin": origin}, adminTok, "", ErrCSRF},
		{"POST with a wrong CSRF", "POST", map[string]string{CSRFHeader: c.csrfToken("avt_other")}, adminTok, "", ErrCSRF},
		{"POST with CSRF", "POST", map[string]string{CSRFHeader: good, "Origin": origin}, adminTok, adminTok, nil},
		{"DELETE with CSRF", "DELETE", map[string]string{CSRFHeader: good}, adminTok, adminTok, nil},
		{"PUT without CSRF", "PUT", nil, adminTok, "", ErrCSRF},
		{"POST with CSRF from another origin", "POST", map[string]string{CSRFHeader: good, "Origin": "http://evil.example"}, adminTok, "", ErrCrossSite},
		{"WebSocket from the console", "GET", map[string]string{"Upgrade": "websocket", "Origin": origin}, adminTok, adminTok, nil},
		{"WebSocket from a preview host", "GET", map[string]string{"Upgrade": "websocket", "Origin": "http://8000-vm.localhost:7070"}, adminTok, "", ErrCrossSite},
		{"WebSocket without Origin", "GET", map[string]string{"Upgrade": "websocket"}, adminTok, "", ErrCrossSite},
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
	w := do(h, req("GET", "/console/session", "", nil, ""))
	if w.Code != 401 {
		t.Fatalf("no cookie: %d", w.Code)
	}
	w = do(h, req("GET", "/console/session", "", nil, scopedTok))
	var s Session
	if err := json.NewDecoder(w.Body).Decode(&s); w.Code != 200 || err != nil {
		t.Fatalf("scoped session: %d %v", w.Code, err)
	}
	if s.Admin || s.VMID != "vm1" || s.CSRFToken != c.csrfToken(scopedTok) || s.ExpiresAt == nil {
		t.Fatalf("scoped session: %+v", s)
	}
	// A revoked token's session ends: 401 and the cookie is removed.
	delete(fa.valid, scopedTok)
	w = do(h, req("GET", "/console/session", "", nil, scopedTok))
	if w.Code != 401 {
		t.Fatalf("revoked: %d", w.Code)
	}
	if ck := w.Result().Cookies(); len(ck) != 1 || ck[0].MaxAge >= 0 {
		t.Fatalf("revoked: want the cookie deleted, got %v", ck)
	}
	// Sign-out needs the CSRF token.
	if w = do(h, req("DELETE", "/console/session", "", nil, adminTok)); w.Code != 403 {
		t.Fatalf("sign-out without CSRF: %d", w.Code)
	}
	w = do(h, req("DELETE", "/console/session", "", map[string]string{CSRFHeader: c.csrfToken(adminTok)}, adminTok))
	if ck := w.Result().Cookies(); w.Code != 204 || len(ck) != 1 || ck[0].MaxAge >= 0 {
		t.Fatalf("sign-out: %d %v", w.Code, ck)
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
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self' ws://" + host, "frame-ancestors 'none'", "base-uri 'none'", "object-src 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
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
