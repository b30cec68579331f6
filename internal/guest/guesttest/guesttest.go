// Package guesttest serves a fake guest agent for unit tests of the host's
// code: an http.Handler in place of the agent, reached over an in-process
// pipe through the real handshake and yamux session.
package guesttest

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/hashicorp/yamux"
)

// Agent serves h as a guest agent would and returns the host's client for
// it; both end with the test.
func Agent(t testing.TB, h http.Handler) *guest.Client {
	t.Helper()
	hostSide, guestSide := net.Pipe()
	go func() {
		br := bufio.NewReaderSize(guestSide, guest.MaxHandshakeLine)
		var hs guest.GuestHandshake
		if _, err := hs.Scan(br, guestSide); err != nil {
			return
		}
		sess, err := yamux.Server(bufferedConn{guestSide, br}, guest.YamuxConfig(false))
		if err != nil {
			return
		}
		http.Serve(sess, h)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gc, err := guest.NewClient(ctx, hostSide, guest.HandshakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gc.Close() })
	return gc
}

// bufferedConn reads through the reader that scanned the handshake, which
// may hold the session's first bytes.
type bufferedConn struct {
	net.Conn
	r io.Reader
}

func (c bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
