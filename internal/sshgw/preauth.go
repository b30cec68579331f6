package sshgw

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// Limits on connections that have not finished authentication. Before login
// a connection costs the gateway a goroutine, a key exchange and token
// lookups, and anyone who can reach the port can open one; without a cap a
// single client could hold thousands open and starve real logins. A login
// that takes longer than authTimeout is closed.
const (
	maxUnauthenticated      = 64
	maxUnauthenticatedPerIP = 8
	authTimeout             = 30 * time.Second
)

// preauthLimiter counts connections still in their handshake, in total and
// per source address.
type preauthLimiter struct {
	max, maxPerIP int

	mu    sync.Mutex
	total int
	perIP map[string]int
}

func newPreauthLimiter(max, maxPerIP int) *preauthLimiter {
	return &preauthLimiter{max: max, maxPerIP: maxPerIP, perIP: map[string]int{}}
}

// acquire takes a slot for a connection from ip; false when a limit is hit.
func (l *preauthLimiter) acquire(ip string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= l.max || l.perIP[ip] >= l.maxPerIP {
		return false
	}
	l.total++
	l.perIP[ip]++
	return true
}

// release gives back a slot taken by acquire.
func (l *preauthLimiter) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.perIP[ip]--; l.perIP[ip] <= 0 {
		delete(l.perIP, ip)
	}
}

// sourceKey is where a connection comes from, for the per-source limit:
// its IPv4 address, or its IPv6 /64 (one host commonly holds a whole /64),
// never the port, so the limit is not dodged by opening connections from
// many ports or addresses of one network.
func sourceKey(c net.Conn) string {
	host := c.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}
