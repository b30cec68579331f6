package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// fakeVMs is one running VM ("web", id vm1) whose ports are all backend,
// on its address; or, when lo is set, on its loopback only.
type fakeVMs struct{ backend, lo string }

func (f fakeVMs) Get(_ context.Context, ref string) (*store.VM, error) {
	if ref != "web" && ref != "vm1" {
		return nil, fmt.Errorf("no VM %q", ref)
	}
	return &store.VM{ID: "vm1", Name: "web", State: "running"}, nil
}

func (f fakeVMs) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if f.lo != "" {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", f.lo)
	}
	return f.DialGuest(ctx, id, port)
}

func (f fakeVMs) DialGuest(ctx context.Context, _ string, port int) (net.Conn, error) {
	if f.backend == "" {
		return nil, fmt.Errorf("%w: port %d: connection refused", vm.ErrNoListener, port)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", f.backend)
}

func (fakeVMs) Hold(string) func() { return func() {} }

func newTestProxy(t *testing.T, backend string) (*Proxy, *auth.Service) {
	t.Helper()
	return newProxyOn(t, fakeVMs{backend: backend}, nil)
}

func newProxyOn(t *testing.T, vms VMs, c Compat) (*Proxy, *auth.Service) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	as := auth.New(st, "avm_admin")
	cfg := Config{Listen: "127.0.0.1:0", Domain: "localhost", Auth: as, Store: st, VMs: vms}
	if c != nil {
		cfg.Compat, cfg.CompatPort = c, 49983
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, as
}

func TestServerTimeouts(t *testing.T) {
	p, _ := newTestProxy(t, "127.0.0.1:1")
	if p.srv.IdleTimeout <= 0 || p.srv.ReadHeaderTimeout <= 0 {
		t.Fatalf("preview server without timeouts: idle %v, read header %v", p.srv.IdleTimeout, p.srv.ReadHeaderTimeout)
	}
}

func TestTokenRedirectStaysOnHost(t *testing.T) {
	p, as := newTestProxy(t, "127.0.0.1:1")
	tok, err := as.Create(context.Background(), "vm1", api.CreateTokenRequest{Allow: []string{api.PermPreview}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ target, want string }{
		{"//evil.example/x?" + TokenParam + "=" + tok.Secret, "/evil.example/x"},
		{"///evil.example/x?a=1&" + TokenParam + "=" + tok.Secret, "/evil.example/x?a=1"},
		{`/\evil.example/x?` + TokenParam + "=" + tok.Secret, "/%5Cevil.example/x"},
		{"/app/page?x=1&" + TokenParam + "=" + tok.Secret + "&y=2", "/app/page?x=1&y=2"},
		{"/?" + TokenParam + "=" + tok.Secret, "/"},
	} {
		r := httptest.NewRequest("GET", c.target, nil)
		r.Host = "3000-web.localhost"
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, r)
		loc := rec.Header().Get("Location")
		if rec.Code != http.StatusFound || loc != c.want {
			t.Errorf("%s: %d Location %q, want %q", c.target, rec.Code, loc, c.want)
		}
		// what a browser would make of it: the same host
		if u, err := url.Parse("http://3000-web.localhost" + loc); err != nil || u.Host != "3000-web.localhost" {
			t.Errorf("%s: Location %q leaves the preview host", c.target, loc)
		}
		if strings.Contains(loc, tok.Secret) {
			t.Errorf("%s: the token stays in the URL", c.target)
		}
	}
}

// A preview stream opened with a token ends when the token is revoked.
func TestRevokeEndsPreviewStream(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			if _, err := fmt.Fprint(w, "data: tick\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}))
	defer backend.Close()
	p, as := newTestProxy(t, backend.Listener.Addr().String())
	go p.Serve()
	tok, err := as.Create(context.Background(), "vm1", api.CreateTokenRequest{Allow: []string{api.PermPreview}})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "http://"+p.Addr()+"/events", nil)
	req.Host = "3000-web.localhost"
	req.Header.Set("Authorization", "Bearer "+tok.Secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := as.Revoke(context.Background(), tok.ID); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := br.ReadString('\n'); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case <-ended:
	case <-time.After(time.Minute):
		t.Fatal("the preview stream outlived the revoked token")
	}
}

// The cookie ?agentvm_token= leaves holds no token, works only on its host
// and only while its token lives.
func TestPreviewCookie(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "cookie=%q auth=%q query=%q", r.Header.Get("Cookie"), r.Header.Get("Authorization"), r.URL.RawQuery)
	}))
	defer backend.Close()
	p, as := newTestProxy(t, backend.Listener.Addr().String())
	tok, err := as.Create(context.Background(), "vm1", api.CreateTokenRequest{Allow: []string{api.PermPreview}})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/?"+TokenParam+"="+tok.Secret, nil)
	r.Host = "3000-web.localhost"
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, r)
	cs := rec.Result().Cookies()
	if rec.Code != http.StatusFound || len(cs) != 1 || strings.Contains(cs[0].Value, tok.Secret) || !cs[0].HttpOnly || cs[0].Secure {
		t.Fatalf("%d cookies %+v", rec.Code, cs)
	}
	ck := cs[0]
	do := func(host string) (int, string) {
		r := httptest.NewRequest("GET", "/x?y=1", nil)
		r.Host = host
		r.AddCookie(ck)
		r.AddCookie(&http.Cookie{Name: "app", Value: "1"})
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, r)
		return rec.Code, rec.Body.String()
	}
	if code, body := do("3000-web.localhost"); code != 200 || body != `cookie="app=1" auth="" query="y=1"` {
		t.Fatalf("with the cookie: %d %s", code, body)
	}
	if code, _ := do("3001-web.localhost"); code != http.StatusUnauthorized {
		t.Fatalf("the cookie on another host: %d", code)
	}
	if err := as.Revoke(context.Background(), tok.ID); err != nil {
		t.Fatal(err)
	}
	if code, _ := do("3000-web.localhost"); code != http.StatusUnauthorized {
		t.Fatalf("the cookie of a revoked token: %d", code)
	}
}

// A caller without a valid token cannot tell a private preview from one of
// a VM that does not exist, nor learn a VM's name from its id.
func TestPreviewHidesVMs(t *testing.T) {
	p, as := newTestProxy(t, "127.0.0.1:1")
	get := func(host, secret string) (int, string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = host
		if secret != "" {
			r.Header.Set("Authorization", "Bearer "+secret)
		}
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, r)
		return rec.Code, rec.Body.String()
	}
	c1, b1 := get("3000-vm1.localhost", "")
	c2, b2 := get("3000-nosuchvm.localhost", "")
	if c1 != http.StatusUnauthorized || c1 != c2 || b1 != b2 || strings.Contains(b1, "web") {
		t.Fatalf("existing %d %q, missing %d %q", c1, b1, c2, b2)
	}
	tok, err := as.Create(context.Background(), "vm1", api.CreateTokenRequest{Allow: []string{api.PermPreview}})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := get("3000-nosuchvm.localhost", tok.Secret); code != http.StatusNotFound {
		t.Fatalf("a missing VM with a valid token: %d", code)
	}
	// A wrong token in the URL: the same answer for a VM that exists and
	// one that does not.
	var bodies []string
	for _, host := range []string{"3000-vm1.localhost", "3000-nosuchvm.localhost"} {
		r := httptest.NewRequest("GET", "/?"+TokenParam+"=avt_wrong", nil)
		r.Host = host
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, r)
		if rec.Code != http.StatusUnauthorized || strings.Contains(rec.Body.String(), "web") {
			t.Fatalf("a wrong token in the URL of %s: %d %s", host, rec.Code, rec.Body)
		}
		bodies = append(bodies, rec.Body.String())
	}
	if bodies[0] != bodies[1] {
		t.Fatalf("a wrong token in the URL tells a VM that exists from one that does not:\n%s\n%s", bodies[0], bodies[1])
	}
}

// The admin token's preview cookie ends when the admin token is replaced
// (a restart with a new admin.token), though the cookie key stays.
func TestAdminCookieEndsWithTheAdminToken(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app") }))
	defer backend.Close()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	proxyWith := func(admin string) *Proxy {
		p, err := New(Config{Listen: "127.0.0.1:0", Domain: "localhost", Auth: auth.New(st, admin), Store: st,
			VMs: fakeVMs{backend: backend.Listener.Addr().String()}, Key: []byte("cluster-wide key")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	old := proxyWith("avm_old_admin")
	r := httptest.NewRequest("GET", "/?"+TokenParam+"=avm_old_admin", nil)
	r.Host = "3000-web.localhost"
	rec := httptest.NewRecorder()
	old.ServeHTTP(rec, r)
	cs := rec.Result().Cookies()
	if rec.Code != http.StatusFound || len(cs) != 1 {
		t.Fatalf("%d %+v", rec.Code, cs)
	}
	get := func(p *Proxy) int {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = "3000-web.localhost"
		r.AddCookie(cs[0])
		rec := httptest.NewRecorder()
		p.ServeHTTP(rec, r)
		return rec.Code
	}
	if code := get(proxyWith("avm_old_admin")); code != http.StatusOK {
		t.Fatalf("the admin cookie under the same admin token: %d", code)
	}
	if code := get(proxyWith("avm_new_admin")); code != http.StatusUnauthorized {
		t.Fatalf("the admin cookie after the admin token was replaced: %d", code)
	}
}
