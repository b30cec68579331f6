package network

import (
	"sync/atomic"
	"time"
)

// Everything a guest opens through its network costs the host: a forwarded
// TCP connection holds a host socket and two goroutines, a UDP flow a host
// socket, two goroutines and two 64 KiB buffers for up to udpIdleTimeout, a
// DNS query a goroutine and an upstream socket. Code in a VM is untrusted,
// so each of these is capped per VM; beyond the cap the guest is refused
// (TCP: RST, UDP and DNS: the datagram is dropped) as an overloaded router
// would, which well-behaved clients retry.
const (
	// DefaultMaxTCPConns caps concurrent forwarded TCP connections (to the
	// internet, the host gateway, peer VMs and the DNS server over TCP).
	DefaultMaxTCPConns = 1024
	// DefaultMaxUDPFlows caps concurrent UDP flows (one per 4-tuple).
	DefaultMaxUDPFlows = 512
	// DefaultMaxDNSInFlight caps DNS queries being answered at once.
	DefaultMaxDNSInFlight = 64
)

// Kinds of per-VM limits, as reported to Config.OnLimit and by LimitRefusals.
const (
	LimitTCP = "tcp"
	LimitUDP = "udp"
	LimitDNS = "dns"
)

// LimitKinds lists the limit kinds in a stable order (for metrics).
var LimitKinds = []string{LimitTCP, LimitUDP, LimitDNS}

// limitEventInterval is the least time between two OnLimit calls for one
// kind on one network: a guest stuck at a cap refuses thousands of packets
// a second, and each call records an event.
const limitEventInterval = time.Minute

// Limits caps what one VM's guest can hold open on the host; zero fields
// take the defaults.
type Limits struct {
	TCPConns    int
	UDPFlows    int
	DNSInFlight int
}

func (l Limits) withDefaults() Limits {
	if l.TCPConns <= 0 {
		l.TCPConns = DefaultMaxTCPConns
	}
	if l.UDPFlows <= 0 {
		l.UDPFlows = DefaultMaxUDPFlows
	}
	if l.DNSInFlight <= 0 {
		l.DNSInFlight = DefaultMaxDNSInFlight
	}
	return l
}

// refusals counts refusals by kind for the whole process rather than per
// Network, so the metric stays monotonic when VMs come and go.
var refusals = map[string]*atomic.Uint64{
	LimitTCP: new(atomic.Uint64),
	LimitUDP: new(atomic.Uint64),
	LimitDNS: new(atomic.Uint64),
}

// LimitRefusals returns how many connections, flows or queries of kind (one
// of LimitKinds) all networks of this process refused at their cap.
func LimitRefusals(kind string) uint64 {
	if c := refusals[kind]; c != nil {
		return c.Load()
	}
	return 0
}

// limiter is a non-blocking counting semaphore: the packet path must never
// wait for a slot.
type limiter struct {
	kind string
	max  int64
	cur  atomic.Int64
	// lastEvent is when OnLimit was last called (unix nanoseconds).
	lastEvent atomic.Int64
}

func newLimiter(kind string, max int) *limiter {
	return &limiter{kind: kind, max: int64(max)}
}

func (l *limiter) tryAcquire() bool {
	if l.cur.Add(1) > l.max {
		l.cur.Add(-1)
		return false
	}
	return true
}

func (l *limiter) release() { l.cur.Add(-1) }

// limiters holds a Network's caps.
type limiters struct {
	tcp, udp, dns *limiter
}

func newLimiters(l Limits) limiters {
	l = l.withDefaults()
	return limiters{
		tcp: newLimiter(LimitTCP, l.TCPConns),
		udp: newLimiter(LimitUDP, l.UDPFlows),
		dns: newLimiter(LimitDNS, l.DNSInFlight),
	}
}

// acquire takes a slot of l, or records a refusal and returns false.
func (n *Network) acquire(l *limiter) bool {
	if l.tryAcquire() {
		return true
	}
	n.refused(l)
	return false
}

// refused counts a refusal at l's cap and, at most once per
// limitEventInterval, logs it and tells Config.OnLimit.
func (n *Network) refused(l *limiter) {
	refusals[l.kind].Add(1)
	now := time.Now().UnixNano()
	last := l.lastEvent.Load()
	if last != 0 && now-last < int64(limitEventInterval) {
		return
	}
	if !l.lastEvent.CompareAndSwap(last, now) {
		return // another refusal won the race and reports this minute
	}
	n.log.Warn("guest hit a network limit; refusing beyond it", "kind", l.kind, "limit", l.max)
	if n.cfg.OnLimit == nil || !n.begin() {
		return
	}
	// The refusal happens on the packet path; recording the event (a
	// database write) must not stall the guest's network.
	go func() {
		defer n.wg.Done()
		n.cfg.OnLimit(l.kind, int(l.max))
	}()
}
