package cluster

import (
	"context"
	"crypto/tls"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

func openStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Open(filepath.Join(t.TempDir(), "agentvm.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// handshake runs a TLS handshake between the two configurations and
// returns the node the server saw, or the first error.
func handshake(t *testing.T, server, client *tls.Config) (string, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		node string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		tc := tls.Server(c, server)
		if err := tc.Handshake(); err != nil {
			done <- result{err: err}
			return
		}
		cs := tc.ConnectionState()
		node, err := NodeOf(&cs)
		done <- result{node, err}
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), client)
	if err == nil {
		// TLS 1.3: the server checks the client's certificate after the
		// client's handshake returns; a read sees its verdict.
		c.Write([]byte("x"))
		c.Close()
	}
	r := <-done
	if err != nil {
		return "", err
	}
	return r.node, r.err
}

// Nodes of one store trust each other, each checking it reached the node
// it meant; a client without a certificate, or of another cluster, is
// refused.
func TestPeerTLS(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	a, err := NewPeerTLS(ctx, st, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewPeerTLS(ctx, st, "node-b")
	if err != nil {
		t.Fatal(err)
	}
	if node, err := handshake(t, b.Server(), a.Client("node-b")); err != nil || node != "node-a" {
		t.Fatalf("a to b: node %q, %v", node, err)
	}
	if _, err := handshake(t, b.Server(), a.Client("node-c")); err == nil {
		t.Fatal("a reached node b while it meant node c")
	}
	if _, err := handshake(t, b.Server(), &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}); err == nil {
		t.Fatal("a client without a certificate was admitted")
	}
	other, err := NewPeerTLS(ctx, openStore(t), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := handshake(t, b.Server(), other.Client("node-b")); err == nil {
		t.Fatal("a node of another cluster was admitted")
	}
	// The CA is made once: a third node of the first store still trusts a.
	c, err := NewPeerTLS(ctx, st, "node-c")
	if err != nil {
		t.Fatal(err)
	}
	if node, err := handshake(t, c.Server(), a.Client("node-c")); err != nil || node != "node-a" {
		t.Fatalf("a to c: node %q, %v", node, err)
	}
	// A certificate near its end is issued again before it is shown.
	cur, _ := a.current()
	oldDER := string(cur.Certificate[0])
	a.mu.Lock()
	a.expires = time.Now().Add(time.Hour)
	a.mu.Unlock()
	renewed, err := a.current()
	if err != nil || string(renewed.Certificate[0]) == oldDER {
		t.Fatalf("a certificate an hour from its end was not issued again: %v", err)
	}
	if node, err := handshake(t, b.Server(), a.Client("node-b")); err != nil || node != "node-a" {
		t.Fatalf("a to b with the new certificate: node %q, %v", node, err)
	}
}
