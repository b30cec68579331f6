package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// A preview reaches a port on the VM's network address. Only a caller that
// may run code as any user there (auth.Principal.ReachesLoopback) also
// reaches a server bound to the guest's loopback alone, through the guest
// agent: those servers (Chromium's DevTools, the code interpreter, VNC)
// trust whoever reaches them. A preview-only token, a shared E2B preview
// URL and an unauthenticated caller get the VM's address only. The
// transport's pool keys connections by host, so the two kinds never share
// a kept-alive connection: "<id>.vm" dials the address, "<id>.lo" may fall
// back to the loopback.

const (
	hostAddress  = ".vm"
	hostLoopback = ".lo"
)

// errAddressOnly is a dial refused on the VM's address for a caller that
// may not reach its loopback.
var errAddressOnly = errors.New("nothing listens on the VM's network address")

type loopbackKey struct{}

// withLoopback records whether the caller of r may reach the VM's loopback.
func withLoopback(r *http.Request, ok bool) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), loopbackKey{}, ok))
}

// Loopback reports whether the proxy let the caller of r reach the VM's
// loopback: a cluster node that forwards the request (Config.Forward) tells
// the owner's proxy (ServeForwarded).
func Loopback(r *http.Request) bool {
	ok, _ := r.Context().Value(loopbackKey{}).(bool)
	return ok
}

// wakeGrace is how long the dial of a request that woke its VM waits for
// something to listen on the port: a server whose VM was paused or
// suspended in the middle of its start (an E2B sandbox whose timeout came
// a second after it ran `python3 -m http.server`) listens a moment after
// the wake, not at once.
const wakeGrace = 10 * time.Second

// dial connects to the port of the target addr names. After a wake it
// retries "nothing listens" for wakeGrace.
func (p *Proxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	t, _ := ctx.Value(ctxKey{}).(target)
	var deadline time.Time
	for {
		c, err := p.dialOnce(ctx, addr)
		if err == nil || !t.asleep || !errors.Is(err, vm.ErrNoListener) {
			return c, err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(wakeGrace)
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-t.gone: // the client went away
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *Proxy) dialOnce(ctx context.Context, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, _ := strconv.Atoi(portStr)
	if id, ok := strings.CutSuffix(host, hostLoopback); ok {
		return p.cfg.VMs.DialPort(ctx, id, port)
	}
	c, err := p.cfg.VMs.DialGuest(ctx, strings.TrimSuffix(host, hostAddress), port)
	if errors.Is(err, vm.ErrNoListener) {
		return nil, fmt.Errorf("%w: %w", errAddressOnly, err)
	}
	return c, err
}

// callerReachesLoopback authenticates the agentvm token a request carries,
// if any, and reports the caller when it may reach the VM's loopback.
func (p *Proxy) callerReachesLoopback(r *http.Request, v *store.VM) *auth.Principal {
	pr, err := p.caller(r)
	if err != nil || !pr.ReachesLoopback(v.ID) {
		return nil
	}
	return pr
}
