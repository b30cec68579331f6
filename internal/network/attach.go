package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

const (
	dialBackoffMin = 50 * time.Millisecond
	dialBackoffMax = 2 * time.Second
)

// ErrAttached is returned by Attach when the Network is already attached.
var ErrAttached = errors.New("network: already attached")

type attachment struct {
	path   string
	cancel context.CancelFunc
	done   chan struct{}
}

// Attach dials QEMU's stream netdev unix socket (QEMU runs with
// server=on, so it listens on sockPath), retrying until ctx is done (QEMU may
// not have created the socket yet). Once connected it returns nil and serves
// the connection in the background; whenever the connection drops it keeps
// re-dialing sockPath with backoff (this covers a QEMU restarted on the same
// path) until Detach or Close. ctx only bounds the first connection.
func (n *Network) Attach(ctx context.Context, sockPath string) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return ErrClosed
	}
	if n.attach != nil {
		n.mu.Unlock()
		return ErrAttached
	}
	actx, cancel := context.WithCancel(n.ctx)
	a := &attachment{path: sockPath, cancel: cancel, done: make(chan struct{})}
	n.attach = a
	n.wg.Add(1)
	n.mu.Unlock()

	fail := func(err error) error {
		cancel()
		n.mu.Lock()
		if n.attach == a {
			n.attach = nil
		}
		n.mu.Unlock()
		close(a.done)
		n.wg.Done()
		return err
	}

	dctx, dcancel := context.WithCancel(actx)
	stop := context.AfterFunc(ctx, dcancel)
	conn, err := n.dialRetry(dctx, sockPath)
	stop()
	dcancel()
	if err != nil {
		switch {
		case n.ctx.Err() != nil:
			return fail(ErrClosed)
		case ctx.Err() != nil:
			return fail(fmt.Errorf("network: attach %s: %w", sockPath, ctx.Err()))
		default:
			return fail(errors.New("network: detached while attaching"))
		}
	}
	n.log.Info("attached to qemu netdev", "socket", sockPath)
	go n.serveLoop(actx, a, conn)
	return nil
}

// Detach stops serving and re-dialing the QEMU socket (the Network stays
// usable and can be attached again). It waits for the serving goroutine.
func (n *Network) Detach() {
	n.mu.Lock()
	a := n.attach
	n.attach = nil
	n.mu.Unlock()
	if a == nil {
		return
	}
	a.cancel()
	<-a.done
}

// Connected reports whether a QEMU connection is currently being served.
func (n *Network) Connected() bool { return n.connected.Load() }

func (n *Network) serveLoop(ctx context.Context, a *attachment, conn net.Conn) {
	defer n.wg.Done()
	defer close(a.done)
	defer a.cancel()
	for {
		n.serveConn(ctx, conn)
		if ctx.Err() != nil {
			return
		}
		n.log.Warn("qemu netdev connection lost; re-dialing", "socket", a.path)
		var err error
		conn, err = n.dialRetry(ctx, a.path)
		if err != nil {
			return // detached or closed
		}
		n.log.Info("re-attached to qemu netdev", "socket", a.path)
	}
}

// serveConn runs the link on conn until it fails or ctx is cancelled.
func (n *Network) serveConn(ctx context.Context, conn net.Conn) {
	n.connected.Store(true)
	defer n.connected.Store(false)
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	if err := n.link.serve(conn); err != nil && ctx.Err() == nil {
		n.log.Debug("qemu netdev stream ended", "err", err)
	}
}

// dialRetry dials the unix socket until it succeeds or ctx is done.
func (n *Network) dialRetry(ctx context.Context, path string) (net.Conn, error) {
	backoff := dialBackoffMin
	var d net.Dialer
	logged := false
	for {
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !logged {
			n.log.Debug("waiting for qemu netdev socket", "socket", path, "err", err)
			logged = true
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, dialBackoffMax)
	}
}
