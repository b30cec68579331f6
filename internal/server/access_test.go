package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/coder/websocket"
)

func TestHTTPServerTimeouts(t *testing.T) {
	srv := newHTTPServer(http.NotFoundHandler())
	if srv.IdleTimeout <= 0 || srv.ReadHeaderTimeout <= 0 {
		t.Fatalf("API server without timeouts: idle %v, read header %v", srv.IdleTimeout, srv.ReadHeaderTimeout)
	}
}

// Env values (secrets) and events (command lines) are for the admin and
// tokens that run programs in the VM, not for a preview or files token.
func TestVMSecretsNeedARunPermission(t *testing.T) {
	ts := newTestServer(t, nil)
	ts.svc.Event("vm1", "exec", "admin", "curl -H 'Authorization: Bearer s3cr3t' https://api")
	preview := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermPreview}}).Secret
	files := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermFiles}}).Secret
	exec := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermExec}}).Secret
	term := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermTerm, api.PermPreview}}).Secret
	for _, c := range []struct {
		name, secret string
		env          string
		events       int
	}{
		{"preview", preview, redactedValue, 403},
		{"files", files, "sk-secret", 200}, // files reads /etc/agentvm/env anyway
		{"exec", exec, "sk-secret", 200},
		{"term", term, "sk-secret", 200},
		{"admin", testAdmin, "sk-secret", 200},
	} {
		resp := ts.do(t, "GET", "/v1/vms/web", c.secret)
		var v api.VM
		json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if resp.StatusCode != 200 || v.ID != "vm1" {
			t.Fatalf("%s: GET vm: %d %+v", c.name, resp.StatusCode, v)
		}
		if got, ok := v.Env["OPENAI_API_KEY"]; !ok || got != c.env {
			t.Errorf("%s token: env value %q, want %q", c.name, got, c.env)
		}
		resp = ts.do(t, "GET", "/v1/vms/web/events", c.secret)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.events {
			t.Errorf("%s token: GET events = %d, want %d", c.name, resp.StatusCode, c.events)
		}
		if c.events != 200 && strings.Contains(string(body), "s3cr3t") {
			t.Errorf("%s token read the admin's command line", c.name)
		}
	}
}

// upgradeURL serves, behind the real auth middleware, an exec-like raw
// upgrade and a terminal-like WebSocket that stay open until the client
// leaves, as exec, tcp and terminal attachments do.
func (ts *testServer) upgradeURL(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /raw", func(w http.ResponseWriter, r *http.Request) {
		conn, br, ok := switchProtocols(w, api.ExecUpgrade)
		if !ok {
			return
		}
		defer conn.Close()
		io.Copy(io.Discard, br) // like exec: reads frames until the client goes
	})
	mux.HandleFunc("GET /ws", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(context.Background()) // as getOrAttachTerm: not the request's
		defer cancel()
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				return
			}
		}
	})
	hs := httptest.NewServer(ts.auth(mux))
	t.Cleanup(hs.Close)
	return hs.URL
}

// Revoking a token closes its upgraded connections (exec, terminals).
func TestRevokeClosesUpgradedConnections(t *testing.T) {
	ts := newTestServer(t, nil)
	base := ts.upgradeURL(t)
	ctx := context.Background()

	raw := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermExec}})
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /raw HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+raw.Secret+"\r\nConnection: Upgrade\r\nUpgrade: "+api.ExecUpgrade+"\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}

	term := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermTerm}})
	ws, _, err := websocket.Dial(ctx, strings.Replace(base, "http", "ws", 1)+"/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + term.Secret}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()

	for _, id := range []string{raw.ID, term.ID} {
		if err := ts.tokens.Revoke(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("data on a revoked exec connection")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the exec-like connection outlived its revoked token")
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, _, err := ws.Read(rctx); err == nil || rctx.Err() != nil {
		t.Fatalf("the terminal WebSocket outlived its revoked token: %v", err)
	}
}

// A followed event stream ends when its token is revoked or expires.
func TestFollowedEventsEndWithToken(t *testing.T) {
	ts := newTestServer(t, nil)
	follow := func(secret string) *bufio.Reader {
		t.Helper()
		resp := ts.do(t, "GET", "/v1/vms/web/events?follow=1", secret)
		if resp.StatusCode != 200 {
			t.Fatalf("follow: %d", resp.StatusCode)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return bufio.NewReader(resp.Body)
	}
	ended := func(br *bufio.Reader, what string) {
		t.Helper()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				if _, err := br.ReadString('\n'); err != nil {
					return
				}
			}
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the event stream is still open", what)
		}
	}
	revoked := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermExec}})
	br := follow(revoked.Secret)
	ts.svc.Event("vm1", "test", "admin", "one")
	if line, err := br.ReadString('\n'); err != nil || !strings.Contains(line, "one") {
		t.Fatalf("first event: %q %v", line, err)
	}
	if err := ts.tokens.Revoke(context.Background(), revoked.ID); err != nil {
		t.Fatal(err)
	}
	ended(br, "revoke")

	expiring := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermExec}, TTL: "10s"})
	ended(follow(expiring.Secret), "expiry")
}

// A token restricted to one guest user reads its own events and the
// daemon's, not the admin's or other tokens' command lines.
func TestUserTokenSeesOnlyItsOwnEvents(t *testing.T) {
	ts := newTestServer(t, nil)
	sandbox := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermExec}, User: "sandbox"})
	other := ts.token(t, api.CreateTokenRequest{Allow: []string{api.PermExec}})
	ts.svc.Event("vm1", "exec", "admin", "curl -H 'Authorization: Bearer s3cr3t' https://api")
	ts.svc.Event("vm1", "exec", "token:"+other.ID, "mysql -pth3irs")
	ts.svc.Event("vm1", "exec", "admin:tok_0123456789ab", "psql postgres://u:adm1nt0k@db") // a stored admin token
	ts.svc.Event("vm1", "exec", "token:"+sandbox.ID, "echo mine")
	ts.svc.Event("vm1", "lifecycle", "system", "woke from suspend")
	for _, secret := range []string{testAdmin, sandbox.Secret} {
		resp := ts.do(t, "GET", "/v1/vms/web/events", secret)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "echo mine") || !strings.Contains(string(body), "woke from suspend") {
			t.Fatalf("events: %d %s", resp.StatusCode, body)
		}
		leaked := strings.Contains(string(body), "s3cr3t") || strings.Contains(string(body), "th3irs") || strings.Contains(string(body), "adm1nt0k")
		if restricted := secret == sandbox.Secret; leaked == restricted {
			t.Errorf("restricted %v: others' command lines shown: %v\n%s", restricted, leaked, body)
		}
	}
}
