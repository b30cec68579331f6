package network

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/miekg/dns"
)

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// setup builds a Network and a fake QEMU (with a gVisor guest behind it) and
// attaches them. Cleanup closes the Network first, then the fake QEMU.
func setup(t *testing.T, p Policy) (*Network, *fakeQEMU) {
	t.Helper()
	return setupConfig(t, Config{Subnet: SubnetForIndex(7), Policy: p})
}

// setupConfig is setup with a whole Config.
func setupConfig(t *testing.T, cfg Config) (*Network, *fakeQEMU) {
	t.Helper()
	n, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	q := newFakeQEMU(t, n.Config(), filepath.Join(t.TempDir(), "net.sock"))
	t.Cleanup(func() { _ = n.Close() })
	q.listen()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- n.Attach(ctx, q.path) }()
	q.accept(time.Minute)
	if err := <-errc; err != nil {
		t.Fatalf("Attach: %v", err)
	}
	return n, q
}

func hostPort(t *testing.T, a net.Addr) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// udpEcho runs a UDP echo server on addr until the test ends; every datagram
// received is also reported on got.
func udpEcho(t *testing.T, addr string) (netip.AddrPort, <-chan struct{}) {
	t.Helper()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan struct{}, 16)
	done := make(chan struct{})
	t.Cleanup(func() { _ = pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			select {
			case got <- struct{}{}:
			default:
			}
			_, _ = pc.WriteTo(buf[:k], from)
		}
	}()
	return hostPort(t, pc.LocalAddr()), got
}

func tcpEcho(t *testing.T, addr string) (netip.AddrPort, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 16)
	t.Cleanup(func() { _ = ln.Close() })
	go echo(ln, accepted)
	return hostPort(t, ln.Addr()), accepted
}

func expectRefused(t *testing.T, q *fakeQEMU, dst netip.AddrPort) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := q.dialTCP(ctx, dst)
	if err == nil {
		c.Close()
		t.Fatalf("guest dial %s succeeded, want refused", dst)
	}
	if !strings.Contains(err.Error(), "refused") {
		t.Fatalf("guest dial %s: %v, want connection refused (RST)", dst, err)
	}
}

// hostIPv4 returns a non-loopback IPv4 address of this host: a wildcard
// listener answers there, and it is the realistic way for a guest to reach
// host services (it may be public: 192.0.2.x here).
func hostIPv4(t *testing.T) netip.Addr {
	t.Helper()
	own, ok := hostAddrs()
	if !ok {
		t.Fatal("cannot list host addresses")
	}
	var best netip.Addr
	for a := range own {
		if a.Is4() && !a.IsLoopback() && (!best.IsValid() || a.Less(best)) {
			best = a
		}
	}
	if !best.IsValid() {
		t.Skip("host has no non-loopback IPv4 address")
	}
	return best
}

func expectNone(t *testing.T, what string, chs ...<-chan struct{}) {
	t.Helper()
	deadline := time.After(500 * time.Millisecond)
	for {
		for _, ch := range chs {
			select {
			case <-ch:
				t.Fatalf("%s: a host server was reached", what)
			default:
			}
		}
		select {
		case <-deadline:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestEgressDeniedByDefault(t *testing.T) {
	n, q := setup(t, Policy{})
	hostIP := hostIPv4(t)
	all, accepted := tcpEcho(t, "0.0.0.0:0") // also answers on 127.0.0.1
	// The host's own address (not private here: only the host-own check
	// stops it), private, link-local, CGNAT and the gateway itself.
	for _, a := range []netip.Addr{hostIP, netip.MustParseAddr("10.1.2.3"),
		netip.MustParseAddr("172.16.0.1"), netip.MustParseAddr("192.168.0.1"),
		netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("100.64.0.1"), n.Gateway()} {
		expectRefused(t, q, netip.AddrPortFrom(a, all.Port()))
	}
	// Loopback: a real guest cannot even address the host's loopback;
	// hand-made frames are dropped (martian) before reaching the forwarder.
	q.injectSYN(netip.AddrPortFrom(n.GuestIP(), 40000), netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), all.Port()))
	// UDP to the host's address is dropped.
	udpAddr, udpGot := udpEcho(t, "0.0.0.0:0")
	uc, err := q.dialUDP(netip.AddrPortFrom(hostIP, udpAddr.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	if _, err := uc.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	expectNone(t, "default policy", accepted, udpGot)
}

func TestEgressAllowedPrivate(t *testing.T) {
	n, q := setup(t, Policy{AllowPrivate: true})
	hostIP := hostIPv4(t)
	all, accepted := tcpEcho(t, "0.0.0.0:0")
	dst := netip.AddrPortFrom(hostIP, all.Port())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := q.dialTCP(ctx, dst)
	if err != nil {
		t.Fatalf("guest dial %s: %v", dst, err)
	}
	roundTrip(t, c, "hello through the NAT")
	roundTrip(t, c, strings.Repeat("x", 300000)) // several windows' worth
	c.Close()
	<-accepted

	udpAddr, _ := udpEcho(t, "0.0.0.0:0")
	uc, err := q.dialUDP(netip.AddrPortFrom(hostIP, udpAddr.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	roundTrip(t, uc, "udp ping")
	roundTrip(t, uc, "udp ping 2")

	// A hand-made SYN reaches the forwarder, which dials out...
	q.injectSYN(netip.AddrPortFrom(n.GuestIP(), 40001), dst)
	select {
	case <-accepted:
	case <-time.After(time.Minute):
		t.Fatal("injected SYN was not forwarded")
	}
	// ... but never towards loopback, nor into the virtual subnet.
	q.injectSYN(netip.AddrPortFrom(n.GuestIP(), 40002), netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), all.Port()))
	expectRefused(t, q, netip.AddrPortFrom(n.Gateway(), all.Port()))
	expectNone(t, "loopback/subnet with AllowPrivate", accepted)
}

func TestEgressExtraDenied(t *testing.T) {
	hostIP := hostIPv4(t)
	_, q := setup(t, Policy{AllowPrivate: true, ExtraDenied: []netip.Prefix{netip.PrefixFrom(hostIP, 32)}})
	all, accepted := tcpEcho(t, "0.0.0.0:0")
	expectRefused(t, q, netip.AddrPortFrom(hostIP, all.Port()))
	expectNone(t, "ExtraDenied", accepted)
}

func TestDialGuest(t *testing.T) {
	n, q := setup(t, Policy{})
	ln, err := q.listenTCP(netip.AddrPortFrom(n.GuestIP(), 8080))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echo(ln, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := n.DialGuest(ctx, 8080)
	if err != nil {
		t.Fatalf("DialGuest: %v", err)
	}
	roundTrip(t, c, "hello guest")
	c.Close()
	if _, err := n.DialGuest(ctx, 8081); !errors.Is(err, ErrRefused) {
		t.Fatalf("DialGuest to a closed port: %v, want ErrRefused", err)
	}
	if _, err := n.DialGuest(ctx, 0); err == nil {
		t.Fatal("DialGuest(0) succeeded")
	}
}

func dnsQuery(t *testing.T, c net.Conn, name string) *dns.Msg {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	dc := &dns.Conn{Conn: c}
	if err := dc.WriteMsg(m); err != nil {
		t.Fatalf("dns write: %v", err)
	}
	r, err := dc.ReadMsg()
	if err != nil {
		t.Fatalf("dns read: %v", err)
	}
	return r
}

func TestDNS(t *testing.T) {
	n, q := setup(t, Policy{})
	uc, err := q.dialUDP(netip.AddrPortFrom(n.Gateway(), 53))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	// The answer depends on the host's resolver ("localhost." is not looked
	// up in /etc/hosts by Go); what matters is that the gateway answers.
	if r := dnsQuery(t, uc, "localhost"); !r.Response {
		t.Fatalf("not a DNS response: %v", r)
	}
	// A real name: if the host can resolve it, so must the guest.
	hctx, hcancel := context.WithTimeout(context.Background(), time.Minute)
	defer hcancel()
	if ips, err := net.DefaultResolver.LookupIPAddr(hctx, "deb.debian.org."); err == nil && len(ips) > 0 {
		r := dnsQuery(t, uc, "deb.debian.org")
		var got []string
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				got = append(got, a.A.String())
			}
		}
		if len(got) == 0 {
			t.Fatalf("host resolves deb.debian.org to %v, gateway answered %v", ips, r)
		}
		t.Logf("deb.debian.org -> %v", got)
	} else {
		t.Logf("host cannot resolve deb.debian.org (%v); real-name check skipped", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tc, err := q.dialTCP(ctx, netip.AddrPortFrom(n.Gateway(), 53))
	if err != nil {
		t.Fatalf("DNS over TCP: %v", err)
	}
	defer tc.Close()
	if r := dnsQuery(t, tc, "localhost"); !r.Response {
		t.Fatalf("not a DNS response over TCP: %v", r)
	}
}

func TestDHCPStaticLease(t *testing.T) {
	n, q := setup(t, Policy{})
	bc, err := q.broadcastUDP(68)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	mac, _ := net.ParseMAC(DefaultGuestMAC)
	disc, err := dhcpv4.NewDiscovery(mac)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bc.WriteTo(disc.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: 67}); err != nil {
		t.Fatal(err)
	}
	_ = bc.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 1500)
	k, _, err := bc.ReadFrom(buf)
	if err != nil {
		t.Fatalf("no DHCP offer: %v", err)
	}
	offer, err := dhcpv4.FromBytes(buf[:k])
	if err != nil {
		t.Fatal(err)
	}
	gw := net.IP(n.Gateway().AsSlice())
	if offer.MessageType() != dhcpv4.MessageTypeOffer ||
		!offer.YourIPAddr.Equal(net.IP(n.GuestIP().AsSlice())) ||
		len(offer.Router()) != 1 || !offer.Router()[0].Equal(gw) ||
		len(offer.DNS()) != 1 || !offer.DNS()[0].Equal(gw) {
		t.Fatalf("unexpected offer:\n%s", offer.Summary())
	}
}

func TestReattach(t *testing.T) {
	n, q := setup(t, Policy{AllowPrivate: true})
	ln, err := q.listenTCP(netip.AddrPortFrom(n.GuestIP(), 2222))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go echo(ln, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := n.DialGuest(ctx, 2222)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	roundTrip(t, c, "before")
	all, _ := tcpEcho(t, "0.0.0.0:0")
	gc, err := q.dialTCP(ctx, netip.AddrPortFrom(hostIPv4(t), all.Port()))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	roundTrip(t, gc, "egress before")

	// QEMU's side drops the stream; the Network re-dials on its own.
	q.disconnect()
	q.accept(time.Minute)
	if !n.Connected() {
		time.Sleep(100 * time.Millisecond)
	}
	// Existing connections survive (TCP retransmits across the gap)...
	roundTrip(t, c, "after")
	roundTrip(t, gc, "egress after")
	// ... and new ones work.
	c2, err := n.DialGuest(ctx, 2222)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	roundTrip(t, c2, "new after")
}

func TestAttachLifecycle(t *testing.T) {
	n, err := New(Config{Subnet: SubnetForIndex(3)}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	q := newFakeQEMU(t, n.Config(), filepath.Join(t.TempDir(), "late.sock"))

	// Nothing listens: Attach gives up with the context.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err = n.Attach(ctx, q.path)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Attach without socket: %v, want deadline exceeded", err)
	}

	// The socket appears later: Attach waits for it.
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- n.Attach(ctx, q.path) }()
	time.Sleep(300 * time.Millisecond)
	q.listen()
	q.accept(time.Minute)
	if err := <-errc; err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if err := n.Attach(ctx, q.path); !errors.Is(err, ErrAttached) {
		t.Fatalf("second Attach: %v, want ErrAttached", err)
	}
	n.Detach()
	q.disconnect()
	errc2 := make(chan error, 1)
	go func() { errc2 <- n.Attach(ctx, q.path) }()
	q.accept(time.Minute)
	if err := <-errc2; err != nil {
		t.Fatalf("Attach after Detach: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{},
		{Subnet: netip.MustParsePrefix("fd00::/64")},
		{Subnet: netip.MustParsePrefix("10.0.0.0/30")},
		{Subnet: SubnetForIndex(1), MAC: "nope"},
		{Subnet: SubnetForIndex(1), MAC: GatewayMAC},
		{Subnet: SubnetForIndex(1), MTU: 100},
		{Subnet: SubnetForIndex(MaxSubnetIndex + 1)},
	} {
		if n, err := New(c, nil); err == nil {
			n.Close()
			t.Errorf("New(%+v) succeeded", c)
		}
	}
}

// TestCloseNoLeak runs traffic of every kind, then checks that Close is
// idempotent, makes the API fail cleanly and leaves no goroutine behind.
func TestCloseNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		n, err := New(Config{Subnet: SubnetForIndex(9), Policy: Policy{AllowPrivate: true}}, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		q := newFakeQEMU(t, n.Config(), filepath.Join(t.TempDir(), "leak.sock"))
		q.listen()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- n.Attach(ctx, q.path) }()
		q.accept(time.Minute)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}

		ln, err := q.listenTCP(netip.AddrPortFrom(n.GuestIP(), 80))
		if err != nil {
			t.Fatal(err)
		}
		go echo(ln, nil)
		c, err := n.DialGuest(ctx, 80)
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, c, "in")

		hostIP := hostIPv4(t)
		tl, err := net.Listen("tcp", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		go echo(tl, nil)
		gc, err := q.dialTCP(ctx, netip.AddrPortFrom(hostIP, hostPort(t, tl.Addr()).Port()))
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, gc, "out") // left open: Close must tear it down
		pc, err := net.ListenPacket("udp", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		uc, err := q.dialUDP(netip.AddrPortFrom(hostIP, hostPort(t, pc.LocalAddr()).Port()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := uc.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, _, err := pc.ReadFrom(make([]byte, 16)); err != nil {
			t.Fatalf("udp not forwarded: %v", err)
		}
		dc, _ := q.dialUDP(netip.AddrPortFrom(n.Gateway(), 53))
		dnsQuery(t, dc, "localhost")

		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := n.DialGuest(ctx, 80); !errors.Is(err, ErrClosed) {
			t.Fatalf("DialGuest after Close: %v", err)
		}
		if err := n.Attach(ctx, q.path); !errors.Is(err, ErrClosed) {
			t.Fatalf("Attach after Close: %v", err)
		}
		c.Close()
		gc.Close()
		uc.Close()
		dc.Close()
		ln.Close()
		tl.Close()
		pc.Close()
		q.close()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines: %d before, %d after Close:\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

// TestMalformedFramesFromGuest: a guest can queue frames of any length on
// its NIC. Runts must be dropped without breaking the network: traffic
// still flows afterwards and Close (VM delete, daemon shutdown) returns.
func TestMalformedFramesFromGuest(t *testing.T) {
	// Not setup: its cleanup would Close the Network, and a wedged switch
	// would then hang the test binary instead of failing this test.
	n, err := New(Config{Subnet: SubnetForIndex(7)}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	q := newFakeQEMU(t, n.Config(), filepath.Join(t.TempDir(), "net.sock"))
	q.listen()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- n.Attach(ctx, q.path) }()
	q.accept(time.Minute)
	if err := <-errc; err != nil {
		t.Fatalf("Attach: %v", err)
	}
	q.mu.Lock()
	c := q.conn
	q.mu.Unlock()
	for _, size := range []int{0, 1, 6, 13} {
		if err := q.writeFrame(c, make([]byte, size)); err != nil {
			t.Fatalf("write %d-byte frame: %v", size, err)
		}
	}
	uc, err := q.dialUDP(netip.AddrPortFrom(n.Gateway(), 53))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	if r := dnsQuery(t, uc, "localhost"); !r.Response {
		t.Fatalf("not a DNS response after runt frames: %v", r)
	}
	closed := make(chan struct{})
	go func() { _ = n.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close hung after runt frames")
	}
}
