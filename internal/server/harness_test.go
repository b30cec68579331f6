package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/guest/guesttest"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

const testAdmin = "avm_admin"

// testServer is the API over a real store and VM service holding one VM
// record ("web", id vm1) and no QEMU: what the store answers works, guest
// relays reach a fake agent when agent is set.
type testServer struct {
	*Server
	url string
	dir string // the data dir
}

func newTestServer(t *testing.T, agent http.Handler) *testServer {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	svc, err := vm.New(vm.Config{DataDir: dir, RunDir: filepath.Join(dir, "run"), CacheDir: filepath.Join(dir, "cache")}, st)
	if err != nil {
		t.Fatal(err)
	}
	v := &store.VM{ID: "vm1", Name: "web", State: "running", CPUs: 1, MemoryMiB: 512, NetIndex: 1,
		Env: map[string]string{"OPENAI_API_KEY": "sk-secret"}, CreatedAt: time.Now().UTC()}
	if err := st.CreateVM(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	s := &Server{svc: svc, store: st, token: testAdmin, tokens: auth.New(st, testAdmin), log: slog.New(slog.DiscardHandler)}
	if agent != nil {
		gc := fakeAgent(t, agent)
		s.guestFn = func(ctx context.Context, ref string) (*store.VM, *guest.Client, error) {
			v, err := svc.Get(ctx, ref)
			return v, gc, err
		}
	}
	hs := httptest.NewServer(s.routes())
	t.Cleanup(hs.Close)
	return &testServer{Server: s, url: hs.URL, dir: dir}
}

// token issues a token for vm1.
func (ts *testServer) token(t *testing.T, req api.CreateTokenRequest) *api.Token {
	t.Helper()
	tok, err := ts.tokens.Create(context.Background(), "vm1", req)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// do sends a request with secret as the bearer token.
func (ts *testServer) do(t *testing.T, method, path, secret string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, ts.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// fakeAgent serves h as a guest agent would (guesttest.Agent).
func fakeAgent(t *testing.T, h http.Handler) *guest.Client { return guesttest.Agent(t, h) }
