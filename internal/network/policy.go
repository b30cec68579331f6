package network

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Policy is the egress policy applied to every connection (TCP) or flow (UDP)
// that a guest opens towards an address outside its virtual subnet. The host
// side only ever dials on a VM's behalf after the destination passed
// IsForbidden, and the dialer re-checks the address it actually connects to.
type Policy struct {
	// AllowPrivate allows link-local, RFC 1918, ULA (fc00::/7), site-local
	// (fec0::/10), CGNAT (100.64.0.0/10) and the host's own interface
	// addresses. Default false: a VM can reach only the public internet.
	// Loopback and Listeners stay denied: they are the daemon's own
	// surface, which no VM needs and every VM could attack.
	AllowPrivate bool
	// ExtraDenied is always denied, even with AllowPrivate.
	ExtraDenied []netip.Prefix
	// Listeners are the daemon's own listen addresses (API, SSH gateway,
	// preview proxy): always denied, whatever AllowPrivate and the egress
	// policy say. A listener bound to one address denies that whole
	// address; a wildcard one (0.0.0.0, ::) denies its port on every
	// address of the host. Their ports are also refused through HostAddr.
	Listeners []netip.AddrPort
	// DeniedPorts are further host ports a guest never reaches through
	// HostAddr, whatever Egress.AllowHost says.
	DeniedPorts []int
}

// ParseListeners turns the daemon's bound listen addresses ("host:port", as
// net.Listener.Addr().String() prints them) into Policy.Listeners; empty
// strings (disabled listeners) are skipped.
func ParseListeners(addrs ...string) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	for _, s := range addrs {
		if s == "" {
			continue
		}
		ap, err := netip.ParseAddrPort(s)
		if err != nil {
			return nil, fmt.Errorf("daemon listener %q: %w", s, err)
		}
		out = append(out, netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port()))
	}
	return out, nil
}

// deniesHostPort reports whether a guest must not reach port on the host's
// loopback through HostAddr.
func (p Policy) deniesHostPort(port int) bool {
	if slices.Contains(p.DeniedPorts, port) {
		return true
	}
	for _, l := range p.Listeners {
		if int(l.Port()) == port {
			return true
		}
	}
	return false
}

// isListener reports whether dst reaches one of the daemon's listeners. own
// lists the host's addresses (ok false: unknown, so fail closed).
func (p Policy) isListener(dst netip.AddrPort, own func() (map[netip.Addr]struct{}, bool)) bool {
	a := dst.Addr().Unmap().WithZone("")
	if a.Is6() {
		// A NAT64 or 6to4 address is another way to name the IPv4 listener.
		if v4, ok := embeddedV4(a); ok && p.isListener(netip.AddrPortFrom(v4, dst.Port()), own) {
			return true
		}
	}
	for _, l := range p.Listeners {
		la := l.Addr().Unmap().WithZone("")
		if !la.IsUnspecified() {
			if la == a {
				return true
			}
			continue
		}
		if l.Port() != dst.Port() {
			continue
		}
		// A wildcard listener answers on loopback and on every address
		// of the host.
		if a.IsLoopback() || a.IsUnspecified() {
			return true
		}
		addrs, ok := own()
		if !ok {
			return true
		}
		if _, isOwn := addrs[a]; isOwn {
			return true
		}
	}
	return false
}

var (
	cgnatPrefix     = netip.MustParsePrefix("100.64.0.0/10")
	thisNetPrefix   = netip.MustParsePrefix("0.0.0.0/8")
	reservedPrefix  = netip.MustParsePrefix("240.0.0.0/4") // includes 255.255.255.255
	siteLocalPrefix = netip.MustParsePrefix("fec0::/10")
	ipv4CompatV6    = netip.MustParsePrefix("::/96") // includes :: and ::1
	nat64Prefix     = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local      = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFourPrefix = netip.MustParsePrefix("2002::/16")
)

// IsForbidden reports whether the host must refuse to dial addr on behalf of
// a guest under policy p.
//
// Always forbidden (whatever p.AllowPrivate says): invalid/unspecified
// addresses, loopback (127/8, ::1), 0.0.0.0/8, multicast, 240.0.0.0/4
// (reserved and the limited broadcast address), IPv4-compatible IPv6
// (::/96) and p.ExtraDenied. Loopback is where the daemon and the host's
// local-only services listen; Egress.AllowHost reaches chosen ports there
// through HostAddr without going through this check.
// Forbidden unless p.AllowPrivate: link-local
// (169.254/16, fe80::/10), RFC 1918, ULA fc00::/7, site-local fec0::/10, CGNAT
// 100.64/10, and every address assigned to one of the host's interfaces.
// IPv4-mapped IPv6 addresses are unmapped first, and IPv6 addresses that embed
// an IPv4 address through NAT64 (64:ff9b::/96, 64:ff9b:1::/48) or 6to4
// (2002::/16) are also checked through the embedded address.
func IsForbidden(addr netip.Addr, p Policy) bool {
	return isForbidden(addr, p, hostAddrs)
}

func isForbidden(addr netip.Addr, p Policy, own func() (map[netip.Addr]struct{}, bool)) bool {
	if !addr.IsValid() {
		return true
	}
	addr = addr.Unmap().WithZone("")
	for _, pfx := range p.ExtraDenied {
		if pfx.IsValid() && pfx.Contains(addr) {
			return true
		}
		// A prefix given in IPv4-mapped form still covers the IPv4 address.
		if pfx.IsValid() && pfx.Addr().Is4In6() && pfx.Bits() >= 96 {
			m := netip.PrefixFrom(pfx.Addr().Unmap(), pfx.Bits()-96)
			if m.Contains(addr) {
				return true
			}
		}
	}
	if addr.IsUnspecified() || addr.IsLoopback() || addr.IsMulticast() ||
		thisNetPrefix.Contains(addr) || reservedPrefix.Contains(addr) ||
		ipv4CompatV6.Contains(addr) {
		return true
	}
	if addr.Is6() {
		if v4, ok := embeddedV4(addr); ok && isForbidden(v4, p, own) {
			return true
		}
	}
	if p.AllowPrivate {
		return false
	}
	if addr.IsLinkLocalUnicast() || addr.IsPrivate() ||
		cgnatPrefix.Contains(addr) || siteLocalPrefix.Contains(addr) {
		return true
	}
	addrs, ok := own()
	if !ok {
		// Cannot tell which addresses are the host's own: fail closed.
		return true
	}
	_, isOwn := addrs[addr]
	return isOwn
}

// embeddedV4 extracts the IPv4 address carried by NAT64 and 6to4 addresses.
func embeddedV4(a netip.Addr) (netip.Addr, bool) {
	b := a.As16()
	switch {
	case nat64Prefix.Contains(a):
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	case nat64Local.Contains(a):
		// RFC 6052 layout for a /48 prefix: v4 bytes at 6,7,9,10 (byte 8 is u).
		return netip.AddrFrom4([4]byte{b[6], b[7], b[9], b[10]}), true
	case sixToFourPrefix.Contains(a):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return netip.Addr{}, false
}

// hostAddrCacheTTL bounds how stale the view of the host's own addresses can
// be (they change with DHCP renewals, VPNs, docker bridges...).
const hostAddrCacheTTL = 2 * time.Second

var hostAddrCache struct {
	mu      sync.Mutex
	fetched time.Time
	addrs   map[netip.Addr]struct{}
	ok      bool
}

// hostAddrs returns the set of addresses assigned to the host's interfaces.
// ok is false if they could not be listed.
func hostAddrs() (map[netip.Addr]struct{}, bool) {
	c := &hostAddrCache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ok && time.Since(c.fetched) < hostAddrCacheTTL {
		return c.addrs, true
	}
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		c.ok = false
		return nil, false
	}
	m := make(map[netip.Addr]struct{}, len(ifAddrs))
	for _, a := range ifAddrs {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if na, ok := netip.AddrFromSlice(ip); ok {
			m[na.Unmap()] = struct{}{}
		}
	}
	c.addrs, c.fetched, c.ok = m, time.Now(), true
	return m, true
}
