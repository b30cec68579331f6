package proxy

import (
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

// anyVMs finds a VM for every non-empty reference and records the last one
// asked for.
type anyVMs struct{ refs *[]string }

func (v anyVMs) Get(_ context.Context, ref string) (*store.VM, error) {
	*v.refs = append(*v.refs, ref)
	if ref == "" {
		return nil, errors.New("empty VM reference")
	}
	return &store.VM{ID: "vm1", Name: ref, State: "running"}, nil
}

func (anyVMs) DialPort(context.Context, string, int) (net.Conn, error) {
	return nil, errors.New("no dialing in this test")
}

func (anyVMs) Hold(string) func() { return func() {} }

// FuzzPreviewHost routes arbitrary Host headers: a host is refused or names a
// VM (by a non-empty reference) and a port in 1..65535, either as
// <port>-<vm>.<domain> or through a mapped custom domain.
func FuzzPreviewHost(f *testing.F) {
	const domain = "preview.test"
	st, err := store.Open(filepath.Join(f.TempDir(), "db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	if err := st.PutDomain(context.Background(), &store.Domain{Domain: "app.example.com", VMID: "vm1", Port: 3000, CreatedAt: time.Now()}); err != nil {
		f.Fatal(err)
	}
	var refs []string
	p := &Proxy{cfg: Config{Domain: domain, Store: st, VMs: anyVMs{&refs}}}

	for _, h := range []string{
		"8080-web.preview.test", "8080-web.preview.test:7080", "8080-WEB.Preview.Test.", "1-vm-0123456789ab.preview.test",
		"65535-a.preview.test", "65536-a.preview.test", "0-a.preview.test", "-1-a.preview.test", "+80-a.preview.test",
		"0080-a.preview.test", "80-.preview.test", "80.preview.test", "-web.preview.test", "x.80-web.preview.test",
		"80-web.preview.test.evil.com", "preview.test", ".preview.test", "80-web.other.test", "app.example.com",
		"APP.example.com:443", "app.example.com.", "[::1]:80", "[80-web.preview.test]:1", "", ":", "80-web",
		"99999999999999999999-a.preview.test", "80-a\x00.preview.test", "80-a b.preview.test", "80-web..preview.test",
	} {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, host string) {
		refs = refs[:0]
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = host
		v, port, status, msg := p.route(r)
		for _, ref := range refs {
			if ref == "" {
				t.Fatalf("host %q: looked up an empty VM reference", host)
			}
		}
		if status != 0 {
			if v != nil || msg == "" {
				t.Fatalf("host %q: refused (%d) with vm %v, message %q", host, status, v, msg)
			}
			return
		}
		if v == nil || v.ID == "" || len(refs) == 0 {
			t.Fatalf("host %q: accepted without a VM (%v, lookups %q)", host, v, refs)
		}
		if port < 1 || port > 65535 {
			t.Fatalf("host %q: accepted with port %d", host, port)
		}
		name := strings.TrimSuffix(strings.ToLower(host), ".")
		if h, _, err := net.SplitHostPort(strings.ToLower(host)); err == nil {
			name = strings.TrimSuffix(h, ".")
		}
		if label, ok := strings.CutSuffix(name, "."+domain); ok {
			if strings.Contains(label, ".") || !strings.HasSuffix(label, "-"+refs[0]) {
				t.Fatalf("host %q: routed to VM %q port %d", host, refs[0], port)
			}
		} else if name != "app.example.com" || port != 3000 {
			t.Fatalf("host %q: routed as a custom domain to port %d", host, port)
		}
	})
}

func (v anyVMs) DialGuest(ctx context.Context, id string, port int) (net.Conn, error) {
	return v.DialPort(ctx, id, port)
}
