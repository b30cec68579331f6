package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/store"
)

// get sends a preview request for host with the given headers.
func get(t *testing.T, p *Proxy, host string, hdr map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+p.Addr()+"/execute", nil)
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A server bound only to the guest's loopback (the code interpreter,
// DevTools) is served to the admin and to exec tokens without a user limit;
// a preview-only token, or exec limited to one user, gets the VM's address,
// where nothing listens, and an error that says why.
func TestLoopbackNeedsExec(t *testing.T) {
	lo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ran code") }))
	defer lo.Close()
	p, as := newProxyOn(t, fakeVMs{lo: lo.Listener.Addr().String()}, nil)
	go p.Serve()
	ctx := context.Background()
	secret := func(req api.CreateTokenRequest) string {
		tok, err := as.Create(ctx, "vm1", req)
		if err != nil {
			t.Fatal(err)
		}
		return tok.Secret
	}
	for _, c := range []struct {
		name, secret string
		ok           bool
	}{
		{"admin", "avm_admin", true},
		{"preview and exec", secret(api.CreateTokenRequest{Allow: []string{api.PermPreview, api.PermExec}}), true},
		{"preview only", secret(api.CreateTokenRequest{Allow: []string{api.PermPreview}}), false},
		{"preview, files and display", secret(api.CreateTokenRequest{Allow: []string{api.PermPreview, api.PermFiles, api.PermDisplay}}), false},
		{"exec limited to a user", secret(api.CreateTokenRequest{Allow: []string{api.PermPreview, api.PermExec}, User: "user"}), false},
	} {
		code, body := get(t, p, "49999-web.localhost", map[string]string{"Authorization": "Bearer " + c.secret})
		if c.ok && (code != 200 || body != "ran code") {
			t.Errorf("%s: %d %q, want the loopback server", c.name, code, body)
		}
		if !c.ok && (code != http.StatusBadGateway || strings.Contains(body, "ran code") || !strings.Contains(body, "exec permission")) {
			t.Errorf("%s: %d %q, want a 502 that names the exec permission", c.name, code, body)
		}
	}
	if code, _ := get(t, p, "49999-web.localhost", nil); code != http.StatusUnauthorized {
		t.Errorf("no token: %d", code)
	}
	// A port the admin made public is the admin's grant: it is served as to
	// the admin.
	if err := p.cfg.Store.PutPort(ctx, &store.Port{VMID: "vm1", Port: 8080, Kind: "http", Public: true, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, p, "8080-web.localhost", nil); code != 200 || body != "ran code" {
		t.Errorf("public port: %d %q", code, body)
	}
}

// fakeCompat owns every VM; its credential is the header X-Test-Key, "good"
// for the admin.
type fakeCompat struct{}

func (fakeCompat) Route(*http.Request) (string, int, bool) { return "", 0, false }
func (fakeCompat) Owns(context.Context, *store.VM) bool    { return true }
func (fakeCompat) Reach(_ context.Context, v *store.VM) (*store.VM, bool) {
	return v, v.State == store.StateRunning
}
func (fakeCompat) Serve(w http.ResponseWriter, _ *http.Request, _ *store.VM) {
	io.WriteString(w, "envd")
}
func (fakeCompat) NotFound(w http.ResponseWriter, _ string) { w.WriteHeader(http.StatusBadGateway) }
func (fakeCompat) PortClosed(w http.ResponseWriter, _ string, _ int) {
	w.WriteHeader(http.StatusBadGateway)
	io.WriteString(w, "port is not open")
}
func (fakeCompat) Allow(http.ResponseWriter, *http.Request, *store.VM, int, bool) bool { return true }
func (fakeCompat) Principal(w http.ResponseWriter, r *http.Request, _ *store.VM) (*auth.Principal, bool) {
	switch r.Header.Get("X-Test-Key") {
	case "":
		return nil, true
	case "good":
		return auth.Admin, true
	}
	w.WriteHeader(http.StatusUnauthorized)
	return nil, false
}

// A compatibility layer's VMs (E2B sandboxes) have public ports, on their
// address: their loopback needs the layer's credential or an agentvm
// token that may reach it.
func TestCompatLoopbackNeedsCredential(t *testing.T) {
	lo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "devtools") }))
	defer lo.Close()
	addr := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app") }))
	defer addr.Close()
	p, as := newProxyOn(t, fakeVMs{lo: lo.Listener.Addr().String()}, fakeCompat{})
	go p.Serve()
	preview, err := as.Create(context.Background(), "vm1", api.CreateTokenRequest{Allow: []string{api.PermPreview}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		hdr  map[string]string
		code int
		body string
	}{
		{"anonymous", nil, http.StatusBadGateway, "port is not open"},
		{"preview token", map[string]string{"Authorization": "Bearer " + preview.Secret}, http.StatusBadGateway, "port is not open"},
		{"a wrong credential", map[string]string{"X-Test-Key": "bad"}, http.StatusUnauthorized, ""},
		{"the layer's credential", map[string]string{"X-Test-Key": "good"}, 200, "devtools"},
		{"the admin token", map[string]string{"Authorization": "Bearer avm_admin"}, 200, "devtools"},
	} {
		if code, body := get(t, p, "9222-web.localhost", c.hdr); code != c.code || body != c.body {
			t.Errorf("%s: %d %q, want %d %q", c.name, code, body, c.code, c.body)
		}
	}
	// What listens on the address is public.
	p2, _ := newProxyOn(t, fakeVMs{backend: addr.Listener.Addr().String()}, fakeCompat{})
	go p2.Serve()
	if code, body := get(t, p2, "3000-web.localhost", nil); code != 200 || body != "app" {
		t.Errorf("public address port: %d %q", code, body)
	}
}

// A sandbox's own credentials, checked by the proxy, never reach its apps.
func TestCompatCredentialsStripped(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("X-Access-Token")+"|"+r.Header.Get("E2B-Traffic-Access-Token")+"|"+r.Header.Get("Authorization"))
	}))
	defer app.Close()
	p, _ := newProxyOn(t, fakeVMs{backend: app.Listener.Addr().String()}, fakeCompat{})
	go p.Serve()
	code, body := get(t, p, "3000-web.localhost", map[string]string{
		"X-Access-Token": "envd", "E2B-Traffic-Access-Token": "traffic", "Authorization": "Bearer e2b_" + strings.Repeat("0", 40)})
	if code != 200 || body != "||" {
		t.Fatalf("the app saw %d %q", code, body)
	}
}

// suspendedVMs is fakeVMs whose VM is suspended.
type suspendedVMs struct{ fakeVMs }

func (f suspendedVMs) Get(ctx context.Context, ref string) (*store.VM, error) {
	v, err := f.fakeVMs.Get(ctx, ref)
	if v != nil {
		v.State = store.StateSuspended
	}
	return v, err
}

// wakingCompat is fakeCompat whose Reach wakes the VM when wake is set.
type wakingCompat struct {
	fakeCompat
	wake  bool
	woken *int
}

func (c wakingCompat) Reach(_ context.Context, v *store.VM) (*store.VM, bool) {
	if !c.wake {
		return v, false
	}
	*c.woken++
	w := *v
	w.State = store.StateRunning
	return &w, true
}

// A request for a paused VM of the compatibility layer is served once the
// layer woke it (E2B's autoResume), and answered as a missing sandbox
// when the layer leaves it paused.
func TestCompatAutoResume(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app") }))
	defer app.Close()
	for _, wake := range []bool{false, true} {
		woken := 0
		p, _ := newProxyOn(t, suspendedVMs{fakeVMs{backend: app.Listener.Addr().String()}}, wakingCompat{wake: wake, woken: &woken})
		go p.Serve()
		code, body := get(t, p, "3000-web.localhost", nil)
		switch {
		case wake && (code != 200 || body != "app" || woken != 1):
			t.Errorf("autoResume: %d %q, woken %d times", code, body, woken)
		case !wake && (code != http.StatusBadGateway || woken != 0):
			t.Errorf("no autoResume: %d %q", code, body)
		}
	}
}

// A caller the layer refuses (a private sandbox without its token) does not
// wake the paused VM it asked for: the credential is checked first.
func TestCompatRefusalWakesNothing(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "app") }))
	defer app.Close()
	woken := 0
	p, _ := newProxyOn(t, suspendedVMs{fakeVMs{backend: app.Listener.Addr().String()}}, wakingCompat{wake: true, woken: &woken})
	go p.Serve()
	if code, _ := get(t, p, "3000-web.localhost", map[string]string{"X-Test-Key": "wrong"}); code != http.StatusUnauthorized || woken != 0 {
		t.Fatalf("a refused caller: %d, woken %d times", code, woken)
	}
	if code, body := get(t, p, "3000-web.localhost", map[string]string{"X-Test-Key": "good"}); code != 200 || body != "app" || woken != 1 {
		t.Fatalf("an allowed caller: %d %q, woken %d times", code, body, woken)
	}
}
