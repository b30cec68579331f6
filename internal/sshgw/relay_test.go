package sshgw

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/internal/auth"
	"golang.org/x/crypto/ssh"
)

// fakeOwner serves one SSH connection as another node's gateway would: a
// session's exec writes to stdout and stderr, sends its end of data and
// exits 3; a direct-tcpip channel is refused with a message.
func fakeOwner(t *testing.T, nc net.Conn, sawUser chan<- string) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	signer, _ := ssh.NewSignerFromKey(priv)
	cfg := &ssh.ServerConfig{NoClientAuth: true}
	cfg.AddHostKey(signer)
	sc, chans, reqs, err := ssh.NewServerConn(nc, cfg)
	if err != nil {
		t.Errorf("owner handshake: %v", err)
		return
	}
	defer sc.Close()
	sawUser <- sc.User()
	go ssh.DiscardRequests(reqs)
	for nch := range chans {
		if nch.ChannelType() != "session" {
			nch.Reject(ssh.Prohibited, "no forwards to "+string(nch.ExtraData()[4:13]))
			continue
		}
		ch, creqs, _ := nch.Accept()
		go func() {
			for r := range creqs {
				r.Reply(r.Type == "exec", nil)
				if r.Type != "exec" {
					continue
				}
				ch.Write([]byte("out:" + string(r.Payload[4:])))
				ch.Stderr().Write([]byte("err"))
				ch.CloseWrite()
				ch.SendRequest("exit-status", false, ssh.Marshal(struct{ C uint32 }{3}))
				ch.Close()
			}
		}()
	}
}

func TestRelayToOwner(t *testing.T) {
	g, _ := newTestGateway(t)
	sawUser := make(chan string, 1)
	var forwardedAs string
	g.cfg.Forward = func(_ context.Context, vmID, user string, p *auth.Principal, origin string) (net.Conn, error) {
		if vmID != "vm1" || !p.Admin || !strings.Contains(origin, "127.0.0.1:") || !strings.Contains(origin, "Go") {
			return nil, errors.New("unexpected forward")
		}
		forwardedAs = user
		front, back := tcpPair(t) // (net.Pipe does not buffer: both SSH ends write first)
		go fakeOwner(t, back, sawUser)
		return front, nil
	}
	serve(t, g)
	c, err := ssh.Dial("tcp", g.Addr(), &ssh.ClientConfig{User: "web+agent", Auth: []ssh.AuthMethod{ssh.Password("avm_admin")},
		HostKeyCallback: ssh.FixedHostKey(g.HostKey())})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if u := <-sawUser; u != "web+agent" || forwardedAs != "agent" {
		t.Fatalf("the owner saw user %q, forwarded as %q", u, forwardedAs)
	}
	for range 3 { // channels one after another on one relayed connection
		sess, err := c.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		sess.Stdout, sess.Stderr = &out, &errb
		err = sess.Run("hello")
		var ee *ssh.ExitError
		if !errors.As(err, &ee) || ee.ExitStatus() != 3 || out.String() != "out:hello" || errb.String() != "err" {
			t.Fatalf("relayed exec: %v %q %q", err, out.String(), errb.String())
		}
	}
	if _, err := c.Dial("tcp", "127.0.0.1:8000"); err == nil || !strings.Contains(err.Error(), "no forwards to 127.0.0.1") {
		t.Fatalf("a refused forward through the relay: %v", err)
	}
}

func TestRelayOwnerUnreachable(t *testing.T) {
	g, _ := newTestGateway(t)
	g.cfg.Forward = func(context.Context, string, string, *auth.Principal, string) (net.Conn, error) {
		return nil, errors.New("the VM runs on node b: it did not answer")
	}
	serve(t, g)
	c, err := ssh.Dial("tcp", g.Addr(), &ssh.ClientConfig{User: "web", Auth: []ssh.AuthMethod{ssh.Password("avm_admin")},
		HostKeyCallback: ssh.FixedHostKey(g.HostKey())})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.NewSession(); err == nil || !strings.Contains(err.Error(), "node b: it did not answer") {
		t.Fatalf("a session when the owner is unreachable: %v", err)
	}
}

// tcpPair is both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
