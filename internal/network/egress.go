package network

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// Egress modes.
const (
	EgressPublic = "public" // the public internet (default)
	EgressDeny   = "deny"   // nothing outside the VM's network
	EgressAllow  = "allow"  // only Allow CIDRs and Domains
)

// Egress is the operator's egress policy of a VM, changeable at run time.
// Whatever the mode, link-local, private ranges and the host's own
// addresses stay blocked unless an Allow CIDR names them explicitly or the
// daemon runs with Policy.AllowPrivate (the host itself: only AllowHost
// ports, at HostAddr); loopback and the daemon's listeners stay blocked
// always. An allow-listed domain admits the addresses its DNS answers
// return only when those pass the same checks as in public mode.
type Egress struct {
	Mode    string         `json:"mode,omitempty"`
	Allow   []netip.Prefix `json:"allow,omitempty"`   // allow mode: CIDRs
	Domains []string       `json:"domains,omitempty"` // allow mode: names and their subdomains
	// AllowHost lists host TCP ports the guest may reach on the host's
	// loopback through HostAddr (any mode). The daemon's own ports are
	// refused whatever this says (Policy.Listeners, Policy.DeniedPorts).
	AllowHost []int `json:"allow_host,omitempty"`
}

// Validate normalizes e and checks it.
func (e *Egress) Validate() error {
	switch e.Mode {
	case "":
		e.Mode = EgressPublic
	case EgressPublic, EgressDeny, EgressAllow:
	default:
		return fmt.Errorf("egress mode must be public, deny or allow, got %q", e.Mode)
	}
	if e.Mode != EgressAllow && (len(e.Allow) > 0 || len(e.Domains) > 0) {
		return fmt.Errorf("allow lists need egress mode allow (mode is %s)", e.Mode)
	}
	for i, p := range e.Allow {
		if !p.IsValid() {
			return fmt.Errorf("allow[%d] is not a CIDR", i)
		}
		e.Allow[i] = p.Masked()
	}
	for i, d := range e.Domains {
		d = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(d)), ".")
		d = strings.TrimPrefix(d, "*.")
		if d == "" || strings.ContainsAny(d, " /:@") || !strings.Contains(d, ".") && d != "localhost" {
			return fmt.Errorf("allow domain %q is not a domain name", e.Domains[i])
		}
		e.Domains[i] = d
	}
	for _, p := range e.AllowHost {
		if p < 1 || p > 65535 {
			return fmt.Errorf("allow-host port %d must be between 1 and 65535", p)
		}
	}
	return nil
}

// allowsDomain reports whether name (or a parent of it) is allow-listed.
func (e *Egress) allowsDomain(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	for _, d := range e.Domains {
		if name == d || strings.HasSuffix(name, "."+d) {
			return true
		}
	}
	return false
}

// HostAddr is the guest-visible address of the host (the .254 of the VM's
// subnet, also named host.agentvm.internal in the network's DNS): ports
// listed in Egress.AllowHost reach the host's loopback there.
func (c Config) HostAddr() netip.Addr {
	a := c.Subnet.Masked().Addr().As4()
	a[3] = 254
	return netip.AddrFrom4(a)
}

// HostName is the DNS name of HostAddr.
const HostName = "host.agentvm.internal"

// ServiceAddr is the guest-visible address of the daemon's services for
// this VM (the .253 of its subnet, see Config.Serve).
func (c Config) ServiceAddr() netip.Addr {
	a := c.Subnet.Masked().Addr().As4()
	a[3] = 253
	return netip.AddrFrom4(a)
}

// GitName is the DNS name of ServiceAddr: the VM's hosted git repository
// is http://git.agentvm.internal/NAME.git.
const GitName = "git.agentvm.internal"

// SetEgress replaces the egress policy; existing connections stay.
func (n *Network) SetEgress(e Egress) error {
	if err := e.Validate(); err != nil {
		return err
	}
	n.egress.Store(&e)
	n.resolved.reset()
	return nil
}

// EgressPolicy returns the current egress policy.
func (n *Network) EgressPolicy() Egress {
	if e := n.egress.Load(); e != nil {
		return *e
	}
	return Egress{Mode: EgressPublic}
}

// resolvedSet remembers the addresses the network's DNS returned for
// allow-listed names, so allow mode can admit connections to them.
type resolvedSet struct {
	mu sync.Mutex
	m  map[netip.Addr]time.Time
}

func (r *resolvedSet) add(a netip.Addr, ttl time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[netip.Addr]time.Time{}
	}
	exp := time.Now().Add(max(ttl, 10*time.Minute))
	if old, ok := r.m[a.Unmap()]; !ok || old.Before(exp) {
		r.m[a.Unmap()] = exp
	}
}

func (r *resolvedSet) has(a netip.Addr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	exp, ok := r.m[a.Unmap()]
	return ok && time.Now().Before(exp)
}

func (r *resolvedSet) reset() {
	r.mu.Lock()
	r.m = nil
	r.mu.Unlock()
}

// route is where a guest connection to dst goes.
type route struct {
	dial  netip.AddrPort // host-side address to dial
	peer  *Network       // or: the guest of a peer network (private networks)
	serve func(net.Conn) // or: a daemon service for this VM (Config.Serve)
	why   string         // when denied
}

// decide applies the policy to a guest connection towards dst (proto tcp
// or udp). ok false means refuse it.
func (n *Network) decide(dst netip.AddrPort, proto string) (route, bool) {
	a := dst.Addr().Unmap()
	e := n.EgressPolicy()
	if a == n.cfg.ServiceAddr() {
		if proto == "tcp" && n.cfg.Serve != nil {
			if h := n.cfg.Serve(dst.Port()); h != nil {
				return route{serve: h}, true
			}
		}
		return route{why: "no agentvm service on that port"}, false
	}
	if a == n.cfg.HostAddr() {
		p := int(dst.Port())
		if proto == "tcp" && slices.Contains(e.AllowHost, p) && !n.cfg.Policy.deniesHostPort(p) {
			return route{dial: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), dst.Port())}, true
		}
		return route{why: "host port not allowed (--allow-host)"}, false
	}
	if n.cfg.Policy.isListener(netip.AddrPortFrom(a, dst.Port()), hostAddrs) {
		return route{why: "agentvm's own listener"}, false
	}
	// Only VM subnets can hold a peer: the lookup (a database read) stays
	// off the path of ordinary internet connections.
	if n.cfg.Peer != nil && InVMRanges(a) {
		if peer := n.cfg.Peer(a); peer != nil {
			if a == peer.GuestIP() {
				return route{peer: peer}, true
			}
			return route{why: "peer network address"}, false
		}
	}
	if n.cfg.Subnet.Contains(a) {
		return route{why: "own virtual subnet"}, false
	}
	switch e.Mode {
	case EgressDeny:
		return route{why: "egress policy deny"}, false
	case EgressAllow:
		// Only the always-denied ranges here: an Allow CIDR may name a
		// private range on purpose.
		if IsForbidden(a, Policy{AllowPrivate: true, ExtraDenied: n.cfg.Policy.ExtraDenied}) {
			return route{why: "forbidden address"}, false
		}
		if isOwnHostAddr(a) {
			return route{why: "the host's own address"}, false
		}
		for _, p := range e.Allow {
			if p.Contains(a) {
				return route{dial: dst}, true
			}
		}
		if n.resolved.has(a) {
			// The policy named the domain, not its addresses: whoever
			// runs its DNS picks those, and may point it at 10.x, the
			// LAN or 169.254.169.254. They get the public-mode checks.
			if n.denied(a) {
				return route{why: "allow-listed name resolved to a forbidden address"}, false
			}
			return route{dial: dst}, true
		}
		return route{why: "not in the egress allow list"}, false
	}
	if n.denied(a) {
		return route{why: "forbidden address"}, false
	}
	return route{dial: dst}, true
}

func isOwnHostAddr(a netip.Addr) bool {
	addrs, ok := hostAddrs()
	if !ok {
		return true
	}
	_, own := addrs[a]
	return own
}
