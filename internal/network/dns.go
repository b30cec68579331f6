package network

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// dnsServer is the network's DNS server on the gateway. It answers the
// network's own names (host.agentvm.internal, and the VMs of the same
// private network by name), applies the egress policy to other names
// (deny: refused; allow: only allow-listed names, whose addresses then
// become reachable if they pass the public-mode checks, see decide) and
// forwards the rest to the host's resolvers.
type dnsServer struct {
	n *Network

	once    sync.Once
	servers []string
}

func newDNSServer(n *Network) *dnsServer { return &dnsServer{n: n} }

func (d *dnsServer) upstreams() []string {
	d.once.Do(func() {
		if cfg, err := dns.ClientConfigFromFile("/etc/resolv.conf"); err == nil {
			for _, s := range cfg.Servers {
				d.servers = append(d.servers, net.JoinHostPort(s, cfg.Port))
			}
		}
	})
	return d.servers
}

func (d *dnsServer) serveUDP(pc net.PacketConn) error {
	buf := make([]byte, 65535)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		req := new(dns.Msg)
		if err := req.Unpack(buf[:n]); err != nil {
			continue
		}
		// Each query waits up to 5 s on the upstream resolvers in its own
		// goroutine; at the cap the datagram is dropped and the guest's
		// resolver retries it after its timeout.
		if !d.n.acquire(d.n.lim.dns) {
			continue
		}
		if !d.n.begin() {
			d.n.lim.dns.release()
			continue // closing: the next read fails
		}
		go func() {
			defer d.n.wg.Done()
			defer d.n.lim.dns.release()
			resp := d.answer(req)
			resp.Truncate(udpSize(req))
			if b, err := resp.Pack(); err == nil {
				pc.WriteTo(b, addr)
			}
		}()
	}
}

func udpSize(req *dns.Msg) int {
	if o := req.IsEdns0(); o != nil && o.UDPSize() > dns.MinMsgSize {
		return int(o.UDPSize())
	}
	return dns.MinMsgSize
}

func (d *dnsServer) serveTCP(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		// A DNS connection is a guest TCP connection like any other: it
		// counts against the TCP cap for as long as it stays open.
		if !d.n.acquire(d.n.lim.tcp) {
			c.Close()
			continue
		}
		if !d.n.begin() {
			d.n.lim.tcp.release()
			c.Close()
			continue // closing: the next accept fails
		}
		go func() {
			defer d.n.wg.Done()
			defer d.n.lim.tcp.release()
			defer c.Close()
			// Close must not wait out an idle guest connection's deadline.
			if !d.n.track(c) {
				return
			}
			defer d.n.untrack(c)
			d.serveTCPConn(c)
		}()
	}
}

// serveTCPConn answers the queries of one connection in turn until the
// guest closes it, idles 30 s, or a query finds the DNS cap full (the
// connection is then closed, which a resolver takes as "retry").
func (d *dnsServer) serveTCPConn(c net.Conn) {
	dc := &dns.Conn{Conn: c}
	for {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		req, err := dc.ReadMsg()
		if err != nil {
			return
		}
		if !d.n.acquire(d.n.lim.dns) {
			return
		}
		resp := d.answer(req)
		d.n.lim.dns.release()
		if err := dc.WriteMsg(resp); err != nil {
			return
		}
	}
}

func (d *dnsServer) local(name string) (netip.Addr, bool) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == HostName {
		return d.n.cfg.HostAddr(), true
	}
	if name == GitName && d.n.cfg.Serve != nil {
		return d.n.cfg.ServiceAddr(), true
	}
	// VM names are single DNS labels: other names (the usual internet
	// lookups) skip the peer list, a database read.
	if short, _ := strings.CutSuffix(name, ".agentvm.internal"); d.n.cfg.Names != nil && !strings.Contains(short, ".") {
		if a, ok := d.n.cfg.Names()[short]; ok {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (d *dnsServer) answer(req *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	if len(req.Question) != 1 {
		resp.Rcode = dns.RcodeFormatError
		return resp
	}
	q := req.Question[0]
	if a, ok := d.local(q.Name); ok {
		resp.Authoritative = true
		if q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY {
			resp.Answer = append(resp.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: a.AsSlice()})
		}
		return resp
	}
	e := d.n.EgressPolicy()
	switch {
	case e.Mode == EgressDeny:
		resp.Rcode = dns.RcodeRefused
		return resp
	case e.Mode == EgressAllow && !e.allowsDomain(q.Name):
		resp.Rcode = dns.RcodeNameError
		return resp
	}
	up := d.forward(req)
	if up == nil {
		resp.Rcode = dns.RcodeServerFailure
		return resp
	}
	up.Id = req.Id
	if e.Mode == EgressAllow {
		for _, rr := range up.Answer {
			switch v := rr.(type) {
			case *dns.A:
				if a, ok := netip.AddrFromSlice(v.A); ok {
					d.n.resolved.add(a, time.Duration(v.Hdr.Ttl)*time.Second)
				}
			case *dns.AAAA:
				if a, ok := netip.AddrFromSlice(v.AAAA); ok {
					d.n.resolved.add(a, time.Duration(v.Hdr.Ttl)*time.Second)
				}
			}
		}
	}
	return up
}

// forward asks the host's resolvers (UDP, then TCP when truncated).
func (d *dnsServer) forward(req *dns.Msg) *dns.Msg {
	ctx, cancel := context.WithTimeout(d.n.ctx, 5*time.Second)
	defer cancel()
	for _, s := range d.upstreams() {
		c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
		r, _, err := c.ExchangeContext(ctx, req, s)
		if err == nil && r.Truncated {
			c.Net = "tcp"
			r, _, err = c.ExchangeContext(ctx, req, s)
		}
		if err == nil {
			return r
		}
	}
	return nil
}
