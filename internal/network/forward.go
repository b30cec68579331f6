package network

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

const (
	tcpMaxInFlight = 64 // concurrent pending outbound TCP handshakes
	tcpDialTimeout = 30 * time.Second
	udpDialTimeout = 10 * time.Second
	udpIdleTimeout = 60 * time.Second
	udpBufSize     = 65535
)

// errForbidden is returned by the egress dialer for a forbidden destination.
var errForbidden = errors.New("network: destination forbidden by egress policy")

// denied reports whether the host must not dial dst for the guest. The
// virtual subnet itself (gateway, guest, broadcast) is never dialed on the
// host, whatever the policy: only the in-process services answer there.
func (n *Network) denied(dst netip.Addr) bool {
	dst = dst.Unmap()
	if n.cfg.Subnet.Contains(dst) {
		return true
	}
	return IsForbidden(dst, n.cfg.Policy)
}

// dialerTo returns a dialer that connects only to want: its Control hook
// re-checks the address the socket actually connects to, so nothing but
// the destination the policy admitted can be reached.
func (n *Network) dialerTo(want netip.Addr, timeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout: timeout,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			if ap.Addr().Unmap() != want.Unmap() {
				return errForbidden
			}
			return nil
		},
	}
}

// forwardTCP handles a guest SYN to a non-local destination: it dials the
// destination from the host (if the policy allows it), or the peer VM on a
// private network, and only then completes the guest's handshake;
// otherwise the guest gets a RST.
func (n *Network) forwardTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	dst := netip.AddrPortFrom(netipAddr(id.LocalAddress), id.LocalPort)
	src := netip.AddrPortFrom(netipAddr(id.RemoteAddress), id.RemotePort)
	if !n.begin() {
		r.Complete(true)
		return
	}
	defer n.wg.Done()

	rt, ok := n.decide(dst, "tcp")
	if !ok {
		n.log.Info("egress denied", "proto", "tcp", "dst", dst.String(), "src", src.String(), "why", rt.why)
		r.Complete(true)
		return
	}
	// The slot is held for the connection's life: this handler returns
	// only when the proxied connection ends.
	if !n.acquire(n.lim.tcp) {
		n.log.Debug("egress refused: tcp connection limit", "dst", dst.String(), "src", src.String())
		r.Complete(true)
		return
	}
	defer n.lim.tcp.release()
	// The other end: a dial, or none for a daemon service for this VM
	// (Config.Serve), which takes the guest's connection itself.
	var out net.Conn
	if rt.serve == nil {
		ctx, cancel := context.WithTimeout(n.ctx, tcpDialTimeout)
		var err error
		if rt.peer != nil {
			out, err = rt.peer.DialGuest(ctx, int(dst.Port()))
		} else {
			out, err = n.dialerTo(rt.dial.Addr(), tcpDialTimeout).DialContext(ctx, "tcp", rt.dial.String())
		}
		cancel()
		if err != nil {
			if errors.Is(err, errForbidden) {
				n.log.Info("egress denied", "proto", "tcp", "dst", dst.String(), "src", src.String())
			} else {
				n.log.Debug("egress dial failed", "proto", "tcp", "dst", dst.String(), "err", err)
			}
			r.Complete(true)
			return
		}
	}

	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	r.Complete(false)
	if terr != nil {
		if out != nil {
			_ = out.Close()
		}
		n.log.Debug("guest handshake failed", "proto", "tcp", "dst", dst.String(), "err", terr.String())
		return
	}
	in := gonet.NewTCPConn(&wq, ep)
	conns := []io.Closer{in}
	if out != nil {
		conns = append(conns, out)
	}
	if !n.track(conns...) {
		for _, c := range conns {
			_ = c.Close()
		}
		return
	}
	defer n.untrack(conns...)
	if rt.serve != nil {
		defer in.Close()
		rt.serve(in)
		return
	}
	n.log.Debug("egress", "proto", "tcp", "dst", dst.String(), "src", src.String())
	n.proxyTCP(in, out)
}

// proxyTCP copies both ways, propagating half-closes; an error in either
// direction tears down both connections.
func (n *Network) proxyTCP(in *gonet.TCPConn, out net.Conn) {
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			_ = in.Close()
			_ = out.Close()
		})
	}
	done := make(chan struct{})
	n.wg.Add(1) // the caller holds a wg reference, so Add is safe here
	go func() {
		defer n.wg.Done()
		defer close(done)
		if _, err := io.Copy(out, in); err != nil {
			closeBoth()
			return
		}
		if cw, ok := out.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}()
	if _, err := io.Copy(in, out); err != nil {
		closeBoth()
	} else {
		_ = in.CloseWrite()
	}
	<-done
	closeBoth()
}

// forwardUDP handles the first datagram of a new guest UDP flow (4-tuple).
// It runs inline in the packet path, so it must not block.
func (n *Network) forwardUDP(r *udp.ForwarderRequest) {
	id := r.ID()
	dst := netip.AddrPortFrom(netipAddr(id.LocalAddress), id.LocalPort)
	src := netip.AddrPortFrom(netipAddr(id.RemoteAddress), id.RemotePort)
	rt, ok := n.decide(dst, "udp")
	if ok && rt.peer != nil {
		ok, rt.why = false, "UDP between VMs of a private network is not routed"
	}
	if !ok {
		// Multicast/broadcast chatter (mDNS, SSDP...) and datagrams to the
		// virtual subnet itself are routine: keep them out of the info log.
		if a := dst.Addr(); a.IsMulticast() || reservedPrefix.Contains(a) || n.cfg.Subnet.Contains(a) {
			n.log.Debug("egress denied", "proto", "udp", "dst", dst.String(), "src", src.String())
		} else {
			n.log.Info("egress denied", "proto", "udp", "dst", dst.String(), "src", src.String())
		}
		return // dropped
	}
	// Without an endpoint the netstack asks again on the flow's next
	// datagram, so a refused flow costs nothing until a slot frees up.
	if !n.acquire(n.lim.udp) {
		n.log.Debug("egress refused: udp flow limit", "dst", dst.String(), "src", src.String())
		return
	}
	if !n.begin() {
		n.lim.udp.release()
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		n.wg.Done()
		n.lim.udp.release()
		n.log.Debug("udp endpoint failed", "dst", dst.String(), "err", terr.String())
		return
	}
	go n.udpFlow(gonet.NewUDPConn(&wq, ep), rt.dial, src)
}

// udpFlow relays one UDP flow until it has been idle for udpIdleTimeout.
// The caller has registered it with n.wg and taken its n.lim.udp slot.
func (n *Network) udpFlow(in *gonet.UDPConn, dst, src netip.AddrPort) {
	defer n.wg.Done()
	defer n.lim.udp.release()
	ctx, cancel := context.WithTimeout(n.ctx, udpDialTimeout)
	out, err := n.dialerTo(dst.Addr(), udpDialTimeout).DialContext(ctx, "udp", dst.String())
	cancel()
	if err != nil {
		_ = in.Close()
		if errors.Is(err, errForbidden) {
			n.log.Info("egress denied", "proto", "udp", "dst", dst.String(), "src", src.String())
		} else {
			n.log.Debug("egress dial failed", "proto", "udp", "dst", dst.String(), "err", err)
		}
		return
	}
	if !n.track(in, out) {
		_ = in.Close()
		_ = out.Close()
		return
	}
	defer n.untrack(in, out)
	n.log.Debug("egress", "proto", "udp", "dst", dst.String(), "src", src.String())

	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			_ = in.Close()
			_ = out.Close()
		})
	}
	done := make(chan struct{})
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer close(done)
		relayUDP(out, in, &last)
		closeBoth()
	}()
	relayUDP(in, out, &last)
	closeBoth()
	<-done
}

// relayUDP copies datagrams from src to dst until an error or until the flow
// (both directions, tracked in last) has been idle for udpIdleTimeout.
func relayUDP(dst, src net.Conn, last *atomic.Int64) {
	buf := make([]byte, udpBufSize)
	for {
		idleFor := time.Since(time.Unix(0, last.Load()))
		if idleFor >= udpIdleTimeout {
			return
		}
		_ = src.SetReadDeadline(time.Now().Add(udpIdleTimeout - idleFor))
		k, err := src.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue // re-check the shared idle clock
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				continue // ICMP port unreachable for an earlier datagram
			}
			return
		}
		last.Store(time.Now().UnixNano())
		if _, err := dst.Write(buf[:k]); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			return
		}
	}
}
