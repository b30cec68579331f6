package network

import (
	"net/netip"
	"slices"
	"testing"
)

func TestIsForbidden(t *testing.T) {
	own := func() (map[netip.Addr]struct{}, bool) {
		return map[netip.Addr]struct{}{
			netip.MustParseAddr("203.0.113.7"): {}, // a public address of the host
			netip.MustParseAddr("2001:db8::7"): {},
		}, true
	}
	extra := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("10.9.9.9/32")}
	tests := []struct {
		addr         string
		def, private bool // forbidden with the default policy / with AllowPrivate
	}{
		// public
		{"1.1.1.1", false, false},
		{"151.101.2.132", false, false},
		{"2606:4700:4700::1111", false, false},
		{"::ffff:8.8.8.8", false, false},
		{"64:ff9b::808:808", false, false}, // NAT64 of 8.8.8.8
		// loopback: always denied, the daemon and local-only services
		// listen there
		{"127.0.0.1", true, true},
		{"127.255.1.2", true, true},
		{"::1", true, true},
		{"::ffff:127.0.0.1", true, true},
		// link-local (cloud metadata)
		{"169.254.169.254", true, false},
		{"fe80::1", true, false},
		{"fe80::1%eth0", true, false},
		// RFC 1918
		{"10.0.0.1", true, false},
		{"10.200.7.1", true, false},
		{"172.16.0.1", true, false},
		{"172.31.255.255", true, false},
		{"172.32.0.1", false, false},
		{"192.168.1.1", true, false},
		{"::ffff:192.168.1.1", true, false},
		// ULA, site-local, CGNAT
		{"fd00::1", true, false},
		{"fc00::1", true, false},
		{"fec0::1", true, false},
		{"100.64.0.1", true, false},
		{"100.127.255.254", true, false},
		{"100.128.0.1", false, false},
		// embedded IPv4
		{"64:ff9b::7f00:1", true, true},        // NAT64 of 127.0.0.1
		{"64:ff9b::a00:1", true, false},        // NAT64 of 10.0.0.1
		{"2002:7f00:1::1", true, true},         // 6to4 of 127.0.0.1
		{"2002:808:808::1", false, false},      // 6to4 of 8.8.8.8
		{"64:ff9b:1:7f00:0:100::", true, true}, // local-use NAT64 of 127.0.0.1
		// always denied
		{"0.0.0.0", true, true},
		{"0.1.2.3", true, true},
		{"::", true, true},
		{"::7f00:1", true, true},
		{"224.0.0.251", true, true},
		{"239.255.255.250", true, true},
		{"ff02::1", true, true},
		{"255.255.255.255", true, true},
		{"240.0.0.1", true, true},
		// host's own addresses
		{"203.0.113.7", true, false},
		{"2001:db8::7", true, false},
		{"::ffff:203.0.113.7", true, false},
		{"203.0.113.8", false, false},
		// ExtraDenied applies regardless of AllowPrivate
		{"198.51.100.20", true, true},
		{"10.9.9.9", true, true},
		{"10.9.9.10", true, false},
	}
	for _, tt := range tests {
		a := netip.MustParseAddr(tt.addr)
		if got := isForbidden(a, Policy{ExtraDenied: extra}, own); got != tt.def {
			t.Errorf("default policy: isForbidden(%s) = %v, want %v", tt.addr, got, tt.def)
		}
		if got := isForbidden(a, Policy{AllowPrivate: true, ExtraDenied: extra}, own); got != tt.private {
			t.Errorf("AllowPrivate: isForbidden(%s) = %v, want %v", tt.addr, got, tt.private)
		}
	}
	if !IsForbidden(netip.Addr{}, Policy{AllowPrivate: true}) {
		t.Error("invalid address allowed")
	}
	// Host addresses unknown: fail closed (default policy).
	noOwn := func() (map[netip.Addr]struct{}, bool) { return nil, false }
	if !isForbidden(netip.MustParseAddr("1.1.1.1"), Policy{}, noOwn) {
		t.Error("unknown host addresses: want fail closed")
	}
	// IPv4-mapped ExtraDenied prefixes also cover plain IPv4.
	mapped := Policy{AllowPrivate: true, ExtraDenied: []netip.Prefix{netip.MustParsePrefix("::ffff:1.2.3.0/120")}}
	if !isForbidden(netip.MustParseAddr("1.2.3.4"), mapped, own) {
		t.Error("IPv4-mapped ExtraDenied prefix not applied")
	}
}

func TestIsForbiddenRealHostAddrs(t *testing.T) {
	own, ok := hostAddrs()
	if !ok {
		t.Fatal("cannot list host addresses")
	}
	for a := range own {
		if !IsForbidden(a, Policy{}) {
			t.Errorf("host address %s not forbidden", a)
		}
	}
	if IsForbidden(netip.MustParseAddr("1.1.1.1"), Policy{}) {
		t.Error("1.1.1.1 forbidden")
	}
}

func TestSubnetForIndex(t *testing.T) {
	tests := []struct {
		i    int
		want string
	}{
		{0, "10.200.0.0/24"},
		{1, "10.200.1.0/24"},
		{7, "10.200.7.0/24"},
		{255, "10.200.255.0/24"},
		{256, "10.201.0.0/24"},
		{1000, "10.203.232.0/24"},
		{MaxSubnetIndex, "10.223.255.0/24"},
	}
	for _, tt := range tests {
		if got := SubnetForIndex(tt.i); got.String() != tt.want {
			t.Errorf("SubnetForIndex(%d) = %v, want %s", tt.i, got, tt.want)
		}
	}
	for _, i := range []int{-1, MaxSubnetIndex + 1, 100000} {
		if got := SubnetForIndex(i); got.IsValid() {
			t.Errorf("SubnetForIndex(%d) = %v, want invalid", i, got)
		}
	}
	seen := map[netip.Prefix]bool{}
	for i := 0; i <= MaxSubnetIndex; i++ {
		p := SubnetForIndex(i)
		if seen[p] || !InVMRanges(p.Addr()) || !InVMRanges(p.Masked().Addr().Next().Next()) {
			t.Fatalf("SubnetForIndex(%d) = %v: duplicate or outside %v", i, p, vmRanges)
		}
		seen[p] = true
	}
	for a, want := range map[string]bool{"10.199.255.255": false, "10.200.0.2": true, "10.207.255.254": true,
		"10.208.0.1": true, "10.223.255.255": true, "10.224.0.0": false, "192.168.1.1": false} {
		if InVMRanges(netip.MustParseAddr(a)) != want {
			t.Errorf("InVMRanges(%s) = %v", a, !want)
		}
	}
	c := Config{Subnet: SubnetForIndex(7)}
	if c.Gateway().String() != "10.200.7.1" || c.GuestIP().String() != "10.200.7.2" {
		t.Errorf("gateway %v guest %v", c.Gateway(), c.GuestIP())
	}
}

func TestIsListener(t *testing.T) {
	own := func() (map[netip.Addr]struct{}, bool) {
		return map[netip.Addr]struct{}{
			netip.MustParseAddr("203.0.113.7"): {},
			netip.MustParseAddr("2001:db8::7"): {},
		}, true
	}
	noOwn := func() (map[netip.Addr]struct{}, bool) { return nil, false }
	p := Policy{Listeners: []netip.AddrPort{
		netip.MustParseAddrPort("198.51.100.5:7070"), // API on one routable address
		netip.MustParseAddrPort("0.0.0.0:2222"),      // SSH gateway on every address
		netip.MustParseAddrPort("[::]:8443"),         // preview proxy, dual stack
	}}
	tests := []struct {
		dst  string
		own  func() (map[netip.Addr]struct{}, bool)
		want bool
	}{
		{"198.51.100.5:7070", own, true},
		{"198.51.100.5:22", own, true}, // a listener's own address is out of bounds entirely
		{"[::ffff:198.51.100.5]:7070", own, true},
		{"[64:ff9b::c633:6405]:7070", own, true}, // NAT64 of 198.51.100.5
		{"198.51.100.6:7070", own, false},
		{"203.0.113.7:2222", own, true}, // wildcard: every host address
		{"[2001:db8::7]:2222", own, true},
		{"203.0.113.7:8443", own, true},
		{"127.0.0.1:2222", own, true},
		{"203.0.113.7:2223", own, false},
		{"203.0.113.8:2222", own, false},  // not the host
		{"203.0.113.8:2222", noOwn, true}, // host addresses unknown: fail closed
		{"1.1.1.1:443", own, false},
	}
	for _, tt := range tests {
		if got := p.isListener(netip.MustParseAddrPort(tt.dst), tt.own); got != tt.want {
			t.Errorf("isListener(%s) = %v, want %v", tt.dst, got, tt.want)
		}
	}
	for _, port := range []int{7070, 2222, 8443} {
		if !p.deniesHostPort(port) {
			t.Errorf("host port %d of a listener not denied through HostAddr", port)
		}
	}
	if p.deniesHostPort(5432) {
		t.Error("host port 5432 denied")
	}
}

func TestParseListeners(t *testing.T) {
	tests := []struct {
		in      []string
		want    []netip.AddrPort
		wantErr bool
	}{
		{in: []string{"127.0.0.1:7070", "", "[::]:2222"}, want: []netip.AddrPort{
			netip.MustParseAddrPort("127.0.0.1:7070"), netip.MustParseAddrPort("[::]:2222")}},
		{in: []string{"[::ffff:10.0.0.1]:80"}, want: []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:80")}},
		{in: nil, want: nil},
		{in: []string{"localhost:7070"}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseListeners(tt.in...)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseListeners(%q): err %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("ParseListeners(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
