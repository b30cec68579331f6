package network

import (
	"net/netip"
	"testing"
	"time"
)

// A connection to another VM's address goes to that VM when it is a peer
// (a member of the same private network: Config.Peer says so), for VMs of
// every part of the address plan, and is refused otherwise.
func TestDecidePeers(t *testing.T) {
	peerSub := SubnetForIndex(300) // past the first 256: 10.201.44.0/24
	peer, err := New(Config{Subnet: peerSub}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	asked := 0
	n, err := New(Config{Subnet: SubnetForIndex(9), Peer: func(a netip.Addr) *Network {
		asked++
		if peerSub.Contains(a) {
			return peer
		}
		return nil
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ap := netip.MustParseAddrPort
	if r, ok := n.decide(ap("10.201.44.2:5432"), "tcp"); !ok || r.peer != peer {
		t.Fatalf("the peer's guest: allowed %v peer %v (%s)", ok, r.peer, r.why)
	}
	if r, ok := n.decide(ap("10.201.44.1:53"), "udp"); ok || r.peer != nil {
		t.Fatalf("the peer's gateway: allowed %v (%s)", ok, r.why)
	}
	if _, ok := n.decide(ap("10.222.1.2:80"), "tcp"); ok {
		t.Fatal("a VM that is no peer: allowed")
	}
	before := asked
	if _, ok := n.decide(ap("10.224.0.2:80"), "tcp"); ok || asked != before {
		t.Fatalf("an address outside the plan: allowed %v, peer lookup asked %d times", ok, asked-before)
	}
}

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

// TestDecideAllowModeResolved: in allow mode an allow-listed name admits
// the addresses its DNS returned only when they pass the checks of public
// mode; explicit CIDRs still open private ranges.
func TestDecideAllowModeResolved(t *testing.T) {
	hostIP := hostIPv4(t)
	tests := []struct {
		name     string
		policy   Policy
		dst      string
		resolved bool // returned by a DNS answer for example.com
		want     bool
	}{
		{"public address", Policy{}, "93.184.216.34:443", true, true},
		{"not resolved", Policy{}, "8.8.8.8:443", false, false},
		{"RFC 1918", Policy{}, "10.1.2.3:443", true, false},
		{"LAN", Policy{}, "192.168.1.10:80", true, false},
		{"cloud metadata", Policy{}, "169.254.169.254:80", true, false},
		{"CGNAT", Policy{}, "100.64.0.1:80", true, false},
		{"ULA", Policy{}, "[fd00::1]:80", true, false},
		{"loopback", Policy{}, "127.0.0.1:80", true, false},
		{"host address", Policy{}, netip.AddrPortFrom(hostIP, 80).String(), true, false},
		{"explicit CIDR opens private", Policy{}, "10.9.1.1:443", false, true},
		{"explicit CIDR, also resolved", Policy{}, "10.9.1.1:443", true, true},
		// --allow-private-egress: resolved addresses get what public mode
		// would give them, loopback still never.
		{"RFC 1918, allow-private", Policy{AllowPrivate: true}, "10.1.2.3:443", true, true},
		{"loopback, allow-private", Policy{AllowPrivate: true}, "127.0.0.1:80", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := New(Config{Subnet: netip.MustParsePrefix("10.200.9.0/24"), Policy: tt.policy}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			if err := n.SetEgress(Egress{Mode: EgressAllow, Domains: []string{"example.com"},
				Allow: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}); err != nil {
				t.Fatal(err)
			}
			dst := netip.MustParseAddrPort(tt.dst)
			if tt.resolved {
				n.resolved.add(dst.Addr(), time.Minute)
			}
			if r, got := n.decide(dst, "tcp"); got != tt.want {
				t.Fatalf("decide(%s) allowed %v (%s), want %v", dst, got, r.why, tt.want)
			}
		})
	}
}

// TestDecideDaemonListeners: loopback and the daemon's listeners are denied
// whatever the daemon's and the VM's policies say.
func TestDecideDaemonListeners(t *testing.T) {
	hostIP := hostIPv4(t)
	policy := Policy{AllowPrivate: true, Listeners: []netip.AddrPort{
		netip.MustParseAddrPort("198.51.100.10:7070"), // API on one address
		netip.MustParseAddrPort("0.0.0.0:2222"),       // SSH gateway on all
		netip.MustParseAddrPort("127.0.0.1:8080"),     // preview proxy on loopback
	}}
	everything := Egress{Mode: EgressAllow, Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}
	hostPort := func(p uint16) string { return netip.AddrPortFrom(hostIP, p).String() }
	tests := []struct {
		name   string
		egress Egress
		dst    string
		want   bool
	}{
		{"loopback", Egress{}, "127.0.0.1:80", false},
		{"loopback v6", Egress{}, "[::1]:80", false},
		{"API address, its port", Egress{}, "198.51.100.10:7070", false},
		{"API address, another port", Egress{}, "198.51.100.10:443", false},
		{"wildcard SSH port on a host address", Egress{}, hostPort(2222), false},
		{"other port on a host address", Egress{}, hostPort(2223), true},
		{"public address, SSH's port", Egress{}, "198.51.100.11:2222", true},
		{"allow 0.0.0.0/0: API", everything, "198.51.100.10:7070", false},
		{"allow 0.0.0.0/0: loopback", everything, "127.0.0.1:8080", false},
		{"host gateway: SSH port", Egress{AllowHost: []int{2222}}, "10.200.9.254:2222", false},
		{"host gateway: proxy port", Egress{AllowHost: []int{8080}}, "10.200.9.254:8080", false},
		{"host gateway: API port", Egress{AllowHost: []int{7070}}, "10.200.9.254:7070", false},
		{"host gateway: other port", Egress{AllowHost: []int{5432}}, "10.200.9.254:5432", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := New(Config{Subnet: netip.MustParsePrefix("10.200.9.0/24"), Policy: policy, Egress: tt.egress}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			dst := netip.MustParseAddrPort(tt.dst)
			if r, got := n.decide(dst, "tcp"); got != tt.want {
				t.Fatalf("decide(%s) allowed %v (%s), want %v", dst, got, r.why, tt.want)
			}
		})
	}
}
