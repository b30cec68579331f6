package network

import (
	"net/netip"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	n, err := New(Config{Subnet: netip.MustParsePrefix("10.200.9.0/24"), Policy: Policy{DeniedPorts: []int{7070}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ap := netip.MustParseAddrPort
	ok := func(dst string, proto string, want bool) {
		t.Helper()
		r, got := n.decide(ap(dst), proto)
		if got != want {
			t.Fatalf("%s %s: allowed %v (%s), want %v", proto, dst, got, r.why, want)
		}
	}
	// public: the internet yes; private, loopback, metadata, own subnet no
	ok("93.184.216.34:443", "tcp", true)
	ok("10.0.0.1:80", "tcp", false)
	ok("127.0.0.1:80", "tcp", false)
	ok("169.254.169.254:80", "tcp", false)
	ok("10.200.9.1:80", "tcp", false)
	// the host gateway: only allow-listed TCP ports, never the daemon's
	ok("10.200.9.254:5432", "tcp", false)
	if err := n.SetEgress(Egress{AllowHost: []int{5432, 7070}}); err != nil {
		t.Fatal(err)
	}
	r, _ := n.decide(ap("10.200.9.254:5432"), "tcp")
	if r.dial != ap("127.0.0.1:5432") {
		t.Fatalf("host gateway dials %v", r.dial)
	}
	ok("10.200.9.254:7070", "tcp", false)
	ok("10.200.9.254:5432", "udp", false)
	// deny
	n.SetEgress(Egress{Mode: EgressDeny})
	ok("93.184.216.34:443", "tcp", false)
	// allow: CIDRs and names the DNS resolved
	n.SetEgress(Egress{Mode: EgressAllow, Allow: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}, Domains: []string{"example.com"}})
	ok("203.0.113.9:443", "tcp", true)
	ok("93.184.216.34:443", "tcp", false)
	n.resolved.add(netip.MustParseAddr("93.184.216.34"), time.Minute)
	ok("93.184.216.34:443", "tcp", true)
	ok("127.0.0.1:443", "tcp", false)
	e := n.EgressPolicy()
	if !e.allowsDomain("www.Example.com.") || e.allowsDomain("example.com.evil.test") {
		t.Fatal("allowsDomain")
	}
	if err := n.SetEgress(Egress{Mode: "sometimes"}); err == nil {
		t.Fatal("bad mode accepted")
	}
}
