package network

import (
	"fmt"
	"net"
	"net/netip"
)

const (
	// DefaultGuestMAC is the guest MAC used when Config.MAC is empty.
	DefaultGuestMAC = "5a:94:ef:e4:0c:ee"
	// GatewayMAC is the MAC of the virtual gateway (DHCP/DNS server, router).
	GatewayMAC = "5a:94:ef:e4:0c:dd"
	// DefaultMTU is the MTU announced over DHCP and used by the gateway.
	DefaultMTU = 1500
)

// Config describes one VM's virtual network.
type Config struct {
	// Subnet is the VM's IPv4 network, e.g. 10.200.7.0/24 (see SubnetForIndex).
	// Gateway (router, DHCP and DNS server) = first host address (.1),
	// guest = second host address (.2).
	Subnet netip.Prefix
	// MAC is the guest's MAC; it gets a static DHCP lease for GuestIP.
	// Default DefaultGuestMAC.
	MAC string
	// MTU, default DefaultMTU.
	MTU int
	// SearchDomains are announced over DHCP (optional).
	SearchDomains []string
	// Policy is the host-protection policy (always applied).
	Policy Policy
	// Egress is the initial operator egress policy (see SetEgress).
	Egress Egress
	// Peer, when set, returns the network of another VM on the same
	// private network whose subnet holds addr (nil otherwise): the guest's
	// connections to that VM's address are routed to it.
	Peer func(addr netip.Addr) *Network
	// Names, when set, returns the extra names the network's DNS answers
	// (the VMs of the same private network).
	Names func() map[string]netip.Addr
	// Limits caps the connections, flows and DNS queries the guest can
	// have open at once (zero fields: the Default* constants).
	Limits Limits
	// Serve, when set, answers the guest's TCP connections to ServiceAddr
	// (the .253 of its subnet, named git.agentvm.internal): it returns the
	// port's handler, which owns the connection and is called on its own
	// goroutine, or nil to refuse it. Whatever the egress policy says:
	// these are the daemon's services for this VM, not the way out.
	Serve func(port uint16) func(net.Conn)
	// OnLimit, when set, is told that the guest hit a cap (kind is one of
	// LimitKinds) and was refused; at most once a minute per kind, from
	// its own goroutine.
	OnLimit func(kind string, limit int)
}

// Gateway returns the gateway address (.1 of Subnet).
func (c Config) Gateway() netip.Addr { return c.Subnet.Masked().Addr().Next() }

// GuestIP returns the guest address (.2 of Subnet).
func (c Config) GuestIP() netip.Addr { return c.Gateway().Next() }

func (c Config) guestMAC() string {
	if c.MAC == "" {
		return DefaultGuestMAC
	}
	return c.MAC
}

func (c Config) mtu() int {
	if c.MTU == 0 {
		return DefaultMTU
	}
	return c.MTU
}

func (c Config) validate() error {
	if !c.Subnet.IsValid() || !c.Subnet.Addr().Is4() {
		return fmt.Errorf("network: subnet %v must be a valid IPv4 prefix", c.Subnet)
	}
	if b := c.Subnet.Bits(); b < 8 || b > 29 {
		return fmt.Errorf("network: subnet %v: prefix length must be between /8 and /29", c.Subnet)
	}
	if _, err := net.ParseMAC(c.guestMAC()); err != nil {
		return fmt.Errorf("network: guest MAC: %w", err)
	}
	if c.guestMAC() == GatewayMAC {
		return fmt.Errorf("network: guest MAC %s is the gateway's", GatewayMAC)
	}
	if m := c.mtu(); m < 576 || m > 65535 {
		return fmt.Errorf("network: MTU %d out of range [576, 65535]", m)
	}
	return nil
}

// vmRanges are the ranges SubnetForIndex allocates from: 10.200.0.0 to
// 10.223.255.255, 6,144 /24 networks. The first 256 (10.200.0.0/16) are
// the whole of the plan before it grew, so VMs made then keep their
// addresses.
var vmRanges = []netip.Prefix{netip.MustParsePrefix("10.200.0.0/13"), netip.MustParsePrefix("10.208.0.0/12")}

// MaxSubnetIndex is the largest index SubnetForIndex accepts.
const MaxSubnetIndex = 24*256 - 1

// InVMRanges reports whether a is in a VM's subnet (of any VM).
func InVMRanges(a netip.Addr) bool {
	for _, r := range vmRanges {
		if r.Contains(a) {
			return true
		}
	}
	return false
}

// SubnetForIndex returns the i-th /24 of vmRanges:
// i=0 -> 10.200.0.0/24, i=1 -> 10.200.1.0/24, ..., i=255 -> 10.200.255.0/24,
// i=256 -> 10.201.0.0/24, ..., i=6143 -> 10.223.255.0/24.
// It returns the zero (invalid) Prefix when i is outside [0, MaxSubnetIndex];
// New rejects an invalid prefix.
//
// The networks are fully virtual (userspace), so they never conflict with
// host routes; they only need to differ from what a guest must reach (and
// RFC 1918 destinations are denied by default anyway).
func SubnetForIndex(i int) netip.Prefix {
	if i < 0 || i > MaxSubnetIndex {
		return netip.Prefix{}
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + i/256), byte(i % 256), 0}), 24)
}
