package agent

import (
	"net"
	"os"
	"runtime"
	"testing"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// TestConfigureNetwork runs configureNetwork in a throwaway network
// namespace on a dummy eth0.
func TestConfigureNetwork(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Skip(err)
	}
	defer orig.Close()
	ns, err := netns.New() // switches this thread
	if err != nil {
		t.Skipf("cannot create netns: %v", err)
	}
	defer func() {
		netns.Set(orig)
		ns.Close()
	}()
	if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}}); err != nil {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer0"}
		if err2 := netlink.LinkAdd(veth); err2 != nil {
			t.Skipf("cannot create a test link: dummy: %v, veth: %v", err, err2)
		}
		peer, _ := netlink.LinkByName("peer0")
		netlink.LinkSetUp(peer)
	}
	link, _ := netlink.LinkByName("eth0")
	old, _ := netlink.ParseAddr("192.168.9.9/24")
	netlink.AddrAdd(link, old)

	for _, n := range []guest.Network{
		{Address: "10.200.3.2/24", Gateway: "10.200.3.1"},
		{Address: "10.200.4.7/24", Gateway: "10.200.4.1"}, // a second identity replaces the first
	} {
		if err := configureNetwork(&n); err != nil {
			t.Fatal(err)
		}
		addrs, _ := netlink.AddrList(link, netlink.FAMILY_V4)
		if len(addrs) != 1 || addrs[0].IPNet.String() != n.Address {
			t.Fatalf("addresses %v, want only %s", addrs, n.Address)
		}
		routes, _ := netlink.RouteList(link, netlink.FAMILY_V4)
		found := false
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.Equal(net.ParseIP(n.Gateway)) {
				found = true
			}
		}
		if !found {
			t.Fatalf("no default route via %s in %v", n.Gateway, routes)
		}
	}
}
