package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/store"
)

// imageVMs has a browser VM "br" and a default-image VM "web", whose ports
// all reach backend.
type imageVMs struct{ backend string }

func (f imageVMs) Get(_ context.Context, ref string) (*store.VM, error) {
	switch ref {
	case "br", "vm-br":
		return &store.VM{ID: "vm-br", Name: "br", State: "running", Image: image.Browser}, nil
	case "web", "vm-web":
		return &store.VM{ID: "vm-web", Name: "web", State: "running"}, nil
	}
	return nil, fmt.Errorf("no VM %q", ref)
}

func (f imageVMs) DialPort(ctx context.Context, _ string, _ int) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", f.backend)
}

func (imageVMs) Hold(string) func() { return func() {} }

// fakeChromium answers like Chromium's DevTools HTTP handler: only to a
// Host that is an IP address or localhost, with URLs on that Host.
func fakeChromium() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.Host)
		if net.ParseIP(host) == nil && host != "localhost" {
			http.Error(w, "Host header is specified and is not an IP address or localhost.", 500)
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=UTF-8")
		switch r.URL.Path {
		case "/json/version":
			fmt.Fprintf(w, `{"Browser": "Chrome/1", "webSocketDebuggerUrl": "ws://%s/devtools/browser/b1"}`, r.Host)
		case "/json/list":
			fmt.Fprintf(w, `[{"id": "P1", "type": "page", "devtoolsFrontendUrl": "https://x/inspector.html?ws=%s/devtools/page/P1", "webSocketDebuggerUrl": "ws://%s/devtools/page/P1"}]`, r.Host, r.Host)
		default:
			fmt.Fprintf(w, `{"host": %q}`, r.Host)
		}
	}))
}

func TestCDPThroughPreview(t *testing.T) {
	backend := fakeChromium()
	defer backend.Close()
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := New(Config{Listen: "127.0.0.1:0", Domain: "localhost", Auth: auth.New(st, "avm_admin"), Store: st, VMs: imageVMs{backend.Listener.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	go p.Serve()
	get := func(host, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+p.Addr()+path, nil)
		req.Host = host
		req.Header.Set("Authorization", "Bearer avm_admin")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.ContentLength >= 0 && resp.ContentLength != int64(len(b)) {
			t.Fatalf("%s%s: Content-Length %d for %d bytes", host, path, resp.ContentLength, len(b))
		}
		return resp.StatusCode, string(b)
	}

	host := "9222-br.localhost:" + p.port
	code, body := get(host, "/json/version")
	var v map[string]string
	if code != 200 || json.Unmarshal([]byte(body), &v) != nil || v["webSocketDebuggerUrl"] != "ws://"+host+"/devtools/browser/b1" {
		t.Fatalf("/json/version: %d %s", code, body)
	}
	code, body = get(host, "/json/list")
	var l []map[string]string
	if code != 200 || json.Unmarshal([]byte(body), &l) != nil || len(l) != 1 ||
		l[0]["webSocketDebuggerUrl"] != "ws://"+host+"/devtools/page/P1" ||
		l[0]["devtoolsFrontendUrl"] != "https://x/inspector.html?ws="+host+"/devtools/page/P1" {
		t.Fatalf("/json/list: %d %s", code, body)
	}
	if code, body = get(host, "/other"); code != 200 || body != `{"host": "127.0.0.1:9222"}` {
		t.Fatalf("the browser is not sent the Host it accepts: %d %s", code, body)
	}
	// Another image's port 9222, and another port of the browser VM, are
	// ordinary previews: the Host is the preview host.
	if code, _ := get("9222-web.localhost:"+p.port, "/json/version"); code != 500 {
		t.Fatalf("a default VM's port 9222 was rewritten: %d", code)
	}
	if code, _ := get("8000-br.localhost:"+p.port, "/json/version"); code != 500 {
		t.Fatalf("port 8000 of a browser VM was rewritten: %d", code)
	}
}

func TestRewriteCDPJSON(t *testing.T) {
	in := `{"Browser":"Chrome/1","webSocketDebuggerUrl":"ws://127.0.0.1:9222/devtools/browser/x","n":12345678901234567890}`
	out, err := rewriteCDPJSON([]byte(in), "9222-b.example.com", true)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	if m["webSocketDebuggerUrl"] != "wss://9222-b.example.com/devtools/browser/x" || m["n"].(json.Number).String() != "12345678901234567890" {
		t.Fatalf("rewritten: %s", out)
	}
	if _, err := rewriteCDPJSON([]byte("not json"), "h", false); err == nil {
		t.Fatal("bad JSON accepted")
	}
}

// DialGuest: the VMs' ports listen on their address.
func (f imageVMs) DialGuest(ctx context.Context, id string, port int) (net.Conn, error) {
	return f.DialPort(ctx, id, port)
}
