package proxy

import (
	"bufio"
	"context"
	"fmt"
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
	case <-time.After(10 * time.Second):
		t.Fatal("the preview stream outlived the revoked token")
	}
}
