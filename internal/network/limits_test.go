package network

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// limitEvents records Config.OnLimit calls as "kind/limit".
type limitEvents chan string

func (e limitEvents) onLimit(kind string, limit int) { e <- fmt.Sprintf("%s/%d", kind, limit) }

// expect waits for exactly the events want (in any order), then checks
// that no further one follows.
func (e limitEvents) expect(t *testing.T, want ...string) {
	t.Helper()
	need := map[string]int{}
	for _, w := range want {
		need[w]++
	}
	for range want {
		select {
		case got := <-e:
			if need[got] == 0 {
				t.Fatalf("unexpected limit event %q (want %v)", got, want)
			}
			need[got]--
		case <-time.After(time.Minute):
			t.Fatalf("limit events: still waiting for %v", need)
		}
	}
	select {
	case got := <-e:
		t.Fatalf("extra limit event %q (want only %v)", got, want)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestLimitsDefaults(t *testing.T) {
	tests := []struct {
		in, want Limits
	}{
		{Limits{}, Limits{DefaultMaxTCPConns, DefaultMaxUDPFlows, DefaultMaxDNSInFlight}},
		{Limits{TCPConns: 5, UDPFlows: -1}, Limits{5, DefaultMaxUDPFlows, DefaultMaxDNSInFlight}},
		{Limits{1, 2, 3}, Limits{1, 2, 3}},
	}
	for _, tt := range tests {
		if got := tt.in.withDefaults(); got != tt.want {
			t.Errorf("%+v.withDefaults() = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

// TestLimitEventRateLimited: a guest stuck at a cap is refused over and
// over; each kind reports at most once per limitEventInterval, every
// refusal is counted.
func TestLimitEventRateLimited(t *testing.T) {
	ev := make(limitEvents, 100)
	n, err := New(Config{Subnet: SubnetForIndex(10), OnLimit: ev.onLimit,
		Limits: Limits{TCPConns: 3, UDPFlows: 2, DNSInFlight: 1}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	tests := []struct {
		l     *limiter
		event string
	}{
		{n.lim.tcp, "tcp/3"},
		{n.lim.udp, "udp/2"},
		{n.lim.dns, "dns/1"},
	}
	for _, tt := range tests {
		before := LimitRefusals(tt.l.kind)
		for i := 0; i < 5; i++ {
			n.refused(tt.l)
		}
		ev.expect(t, tt.event) // one per kind: kinds do not silence each other
		if got := LimitRefusals(tt.l.kind) - before; got != 5 {
			t.Errorf("%s: %d refusals counted, want 5", tt.l.kind, got)
		}
		// A minute later the next refusal reports again.
		tt.l.lastEvent.Add(-int64(limitEventInterval))
		n.refused(tt.l)
		ev.expect(t, tt.event)
	}
}

// TestTCPConnLimit: the guest's TCP connections beyond the cap get a RST,
// and a closed one frees its slot.
func TestTCPConnLimit(t *testing.T) {
	ev := make(limitEvents, 100)
	_, q := setupConfig(t, Config{Subnet: SubnetForIndex(7), Policy: Policy{AllowPrivate: true},
		Limits: Limits{TCPConns: 2}, OnLimit: ev.onLimit})
	echoAddr, _ := tcpEcho(t, "0.0.0.0:0")
	dst := netip.AddrPortFrom(hostIPv4(t), echoAddr.Port())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var open []net.Conn
	for i := 0; i < 2; i++ {
		c, err := q.dialTCP(ctx, dst)
		if err != nil {
			t.Fatalf("connection %d under the cap: %v", i, err)
		}
		defer c.Close()
		roundTrip(t, c, "under the cap")
		open = append(open, c)
	}
	before := LimitRefusals(LimitTCP)
	expectRefused(t, q, dst)
	expectRefused(t, q, dst)
	if got := LimitRefusals(LimitTCP) - before; got != 2 {
		t.Errorf("%d TCP refusals counted, want 2", got)
	}
	ev.expect(t, "tcp/2")

	open[0].Close()
	for {
		c, err := q.dialTCP(ctx, dst)
		if err == nil {
			roundTrip(t, c, "slot freed")
			c.Close()
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("no slot freed after closing a connection: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUDPFlowLimit: a new UDP flow beyond the cap is dropped while the
// existing ones keep working.
func TestUDPFlowLimit(t *testing.T) {
	ev := make(limitEvents, 100)
	_, q := setupConfig(t, Config{Subnet: SubnetForIndex(7), Policy: Policy{AllowPrivate: true},
		Limits: Limits{UDPFlows: 1}, OnLimit: ev.onLimit})
	echoAddr, got := udpEcho(t, "0.0.0.0:0")
	dst := netip.AddrPortFrom(hostIPv4(t), echoAddr.Port())
	u1, err := q.dialUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer u1.Close()
	roundTrip(t, u1, "first flow")
	<-got

	before := LimitRefusals(LimitUDP)
	u2, err := q.dialUDP(dst) // another source port: another flow
	if err != nil {
		t.Fatal(err)
	}
	defer u2.Close()
	if _, err := u2.Write([]byte("second flow")); err != nil {
		t.Fatal(err)
	}
	expectNone(t, "UDP flow beyond the cap", got)
	if n := LimitRefusals(LimitUDP) - before; n < 1 {
		t.Errorf("%d UDP refusals counted, want at least 1", n)
	}
	ev.expect(t, "udp/1")
	roundTrip(t, u1, "first flow still works")
}

// slowUpstream is a DNS resolver on the host's loopback that answers
// every query with 192.0.2.1, holding queries for "slow." until released.
func slowUpstream(t *testing.T) (addr string, queried <-chan string, release chan<- struct{}) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	q := make(chan string, 16)
	rel := make(chan struct{})
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			req := new(dns.Msg)
			if req.Unpack(buf[:k]) != nil || len(req.Question) != 1 {
				continue
			}
			name := req.Question[0].Name
			q <- name
			go func() {
				if name == "slow." {
					<-rel
				}
				resp := new(dns.Msg)
				resp.SetReply(req)
				resp.Answer = append(resp.Answer, &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
					A: net.IPv4(192, 0, 2, 1)})
				b, _ := resp.Pack()
				_, _ = pc.WriteTo(b, from)
			}()
		}
	}()
	return pc.LocalAddr().String(), q, rel
}

// dnsServerFor returns n's DNS server logic bound to upstream, to be served
// on host sockets (the guest path to it is covered by TestDNS).
func dnsServerFor(n *Network, upstream string) *dnsServer {
	d := newDNSServer(n)
	d.once.Do(func() {})
	d.servers = []string{upstream}
	return d
}

func sendQuery(t *testing.T, c net.Conn, name string, id uint16) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	m.Id = id
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

func readAnswer(t *testing.T, c net.Conn) *dns.Msg {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 65535)
	k, err := c.Read(buf)
	if err != nil {
		t.Fatalf("no DNS answer: %v", err)
	}
	m := new(dns.Msg)
	if err := m.Unpack(buf[:k]); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestDNSInFlightLimit: queries beyond the cap are dropped instead of each
// holding a goroutine and an upstream socket; a DNS connection beyond the
// TCP cap is closed.
func TestDNSInFlightLimit(t *testing.T) {
	ev := make(limitEvents, 100)
	n, err := New(Config{Subnet: SubnetForIndex(11), Limits: Limits{DNSInFlight: 1, TCPConns: 1}, OnLimit: ev.onLimit}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	upstream, queried, release := slowUpstream(t)
	d := dnsServerFor(n, upstream)

	t.Run("udp", func(t *testing.T) {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		go func() { _ = d.serveUDP(pc) }()
		c, err := net.Dial("udp", pc.LocalAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()

		sendQuery(t, c, "slow", 1)
		if got := <-queried; got != "slow." {
			t.Fatalf("upstream got %q", got)
		}
		before := LimitRefusals(LimitDNS)
		sendQuery(t, c, "over.the.cap", 2)
		select {
		case got := <-queried:
			t.Fatalf("query %q beyond the cap reached the upstream", got)
		case <-time.After(500 * time.Millisecond):
		}
		if got := LimitRefusals(LimitDNS) - before; got != 1 {
			t.Errorf("%d DNS refusals counted, want 1", got)
		}
		ev.expect(t, "dns/1")

		close(release)
		// Its answer, or SERVFAIL if the upstream timeout (2 s) struck
		// first on a loaded machine: either way the slot is free again.
		if r := readAnswer(t, c); r.Id != 1 {
			t.Fatalf("answer to the held query: %v", r)
		}
		// The slot is free again. UDP queries may be lost (a datagram
		// dropped at the cap, a late answer): ask again the way a
		// resolver does, until a generous deadline.
		answered := false
		for id, deadline := uint16(3), time.Now().Add(time.Minute); !answered && time.Now().Before(deadline); id++ {
			sendQuery(t, c, "after.release", id)
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 65535)
			for {
				k, err := c.Read(buf)
				if err != nil {
					break // timed out: ask again
				}
				r := new(dns.Msg)
				if r.Unpack(buf[:k]) == nil && r.Id == id && len(r.Answer) == 1 {
					answered = true
					break
				}
			}
		}
		if !answered {
			t.Fatal("no answer after the slot was released")
		}
	})

	t.Run("tcp connections", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() { _ = d.serveTCP(ln) }()
		c1, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c1.Close()
		dc1 := &dns.Conn{Conn: c1}
		m := new(dns.Msg)
		m.SetQuestion("first.", dns.TypeA)
		if err := dc1.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		_ = c1.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := dc1.ReadMsg(); err != nil {
			t.Fatalf("first connection: %v", err)
		}
		<-queried

		// c1 holds the only TCP slot: c2 is closed at once.
		c2, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c2.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("connection beyond the TCP cap: read %v, want EOF", err)
		}
		ev.expect(t, "tcp/1")
	})
}
