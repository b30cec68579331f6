package sshgw

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/store"
	"golang.org/x/crypto/ssh"
)

// fakeVMs is one VM ("web", id vm1) without a guest agent: enough to log in
// and open channels.
type fakeVMs struct{}

func (fakeVMs) Get(_ context.Context, ref string) (*store.VM, error) {
	if ref != "web" && ref != "vm1" {
		return nil, fmt.Errorf("no VM %q", ref)
	}
	return &store.VM{ID: "vm1", Name: "web", State: "running"}, nil
}

func (fakeVMs) Guest(context.Context, string) (*store.VM, *guest.Client, error) {
	return nil, nil, errors.New("no guest agent in this test")
}

func (fakeVMs) Hold(string) func()                           { return func() {} }
func (fakeVMs) Event(string, string, string, string, ...any) {}

func newTestGateway(t *testing.T) (*Gateway, *auth.Service) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	as := auth.New(st, "avm_admin")
	g, err := New(Config{Listen: "127.0.0.1:0", HostKeyPath: filepath.Join(dir, "host_key"), Auth: as, VMs: fakeVMs{}})
	if err != nil {
		t.Fatal(err)
	}
	return g, as
}

func serve(t *testing.T, g *Gateway) {
	t.Helper()
	go g.Serve()
	t.Cleanup(func() { g.Close() })
}

// dialBanner opens a TCP connection and reads the server's SSH version
// line; an error means the gateway closed it first.
func dialBanner(t *testing.T, addr string) (net.Conn, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return nil, err
	}
	if !strings.HasPrefix(line, "SSH-2.0-") {
		t.Fatalf("banner %q", line)
	}
	return c, nil
}

func TestPreauthLimiter(t *testing.T) {
	l := newPreauthLimiter(3, 2)
	if !l.acquire("a") || !l.acquire("a") {
		t.Fatal("under the limits")
	}
	if l.acquire("a") {
		t.Fatal("third from one source")
	}
	if !l.acquire("b") {
		t.Fatal("another source")
	}
	if l.acquire("c") {
		t.Fatal("over the total")
	}
	l.release("a")
	if !l.acquire("c") {
		t.Fatal("a released slot is not reusable")
	}
	for _, c := range []struct{ addr, want string }{
		{"192.0.2.1:2222", "192.0.2.1"},
		{"[2001:db8:1:2:3::4]:2222", "2001:db8:1:2::/64"},
		{"[::ffff:192.0.2.1]:1", "192.0.2.1"},
	} {
		a, _ := net.ResolveTCPAddr("tcp", c.addr)
		if got := sourceKey(fakeConn{a}); got != c.want {
			t.Errorf("sourceKey(%s) = %q, want %q", c.addr, got, c.want)
		}
	}
}

type fakeConn struct{ remote net.Addr }

func (c fakeConn) Read([]byte) (int, error)         { return 0, errors.New("fake") }
func (c fakeConn) Write([]byte) (int, error)        { return 0, errors.New("fake") }
func (c fakeConn) Close() error                     { return nil }
func (c fakeConn) LocalAddr() net.Addr              { return c.remote }
func (c fakeConn) RemoteAddr() net.Addr             { return c.remote }
func (c fakeConn) SetDeadline(time.Time) error      { return nil }
func (c fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c fakeConn) SetWriteDeadline(time.Time) error { return nil }

// One source cannot hold more than maxUnauthenticatedPerIP connections in
// their handshake; a slot comes back when one of them goes.
func TestUnauthenticatedPerSourceCap(t *testing.T) {
	g, _ := newTestGateway(t)
	serve(t, g)
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := 0; i < maxUnauthenticatedPerIP; i++ {
		c, err := dialBanner(t, g.Addr())
		if err != nil {
			t.Fatalf("connection %d refused: %v", i, err)
		}
		open = append(open, c)
	}
	if c, err := dialBanner(t, g.Addr()); err == nil {
		c.Close()
		t.Fatalf("connection %d accepted over the per-source cap", maxUnauthenticatedPerIP+1)
	}
	open[0].Close()
	open = open[1:]
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := dialBanner(t, g.Addr())
		if err == nil {
			open = append(open, c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slot of a closed connection never came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A connection that does not log in within the deadline is closed.
func TestAuthDeadline(t *testing.T) {
	g, _ := newTestGateway(t)
	g.authTimeout = 300 * time.Millisecond
	serve(t, g)
	c, err := dialBanner(t, g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the silent connection was still open after 10 s")
			}
			break
		}
	}
	if time.Since(start) > 8*time.Second {
		t.Fatalf("closed only after %s", time.Since(start))
	}
}

func login(t *testing.T, g *Gateway, secret string) *ssh.Client {
	t.Helper()
	c, err := ssh.Dial("tcp", g.Addr(), &ssh.ClientConfig{User: "web", Auth: []ssh.AuthMethod{ssh.Password(secret)},
		HostKeyCallback: ssh.FixedHostKey(g.HostKey()), Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitClosed(t *testing.T, c *ssh.Client, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		c.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the SSH connection is still open", what)
	}
}

// Revoking a token ends the SSH connections logged in with it, sessions
// included; expiry does the same.
func TestRevokeAndExpiryCloseSSH(t *testing.T) {
	g, as := newTestGateway(t)
	serve(t, g)
	ctx := context.Background()
	tok, err := as.Create(ctx, "vm1", api.CreateTokenRequest{Allow: []string{api.PermSSH}})
	if err != nil {
		t.Fatal(err)
	}
	c := login(t, g, tok.Secret)
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	// still open a moment later: nothing else closes it
	if _, _, err := c.SendRequest("keepalive@openssh.com", true, nil); err != nil {
		t.Fatal(err)
	}
	if err := as.Revoke(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, c, "revoke")

	short, err := as.Create(ctx, "vm1", api.CreateTokenRequest{Allow: []string{api.PermSSH}, TTL: "10s"})
	if err != nil {
		t.Fatal(err)
	}
	c2 := login(t, g, short.Secret)
	defer c2.Close()
	waitClosed(t, c2, "expiry")
}
