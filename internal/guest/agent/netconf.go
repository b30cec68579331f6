package agent

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/vishvananda/netlink"
)

// primaryLink returns eth0, or else the first non-loopback device.
func primaryLink() (netlink.Link, error) {
	if l, err := netlink.LinkByName("eth0"); err == nil {
		return l, nil
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		attrs := l.Attrs()
		if attrs.Flags&net.FlagLoopback != 0 || l.Type() != "device" {
			continue
		}
		return l, nil
	}
	return nil, errors.New("no network interface")
}

// configureNetwork replaces the IPv4 addresses of the primary interface with
// n.Address and points the default route at n.Gateway, over netlink.
func configureNetwork(n *guest.Network) error {
	link, err := primaryLink()
	if err != nil {
		return err
	}
	addr, err := netlink.ParseAddr(n.Address)
	if err != nil {
		return fmt.Errorf("address %q: %w", n.Address, err)
	}
	var gw net.IP
	if n.Gateway != "" {
		if gw = net.ParseIP(n.Gateway); gw == nil {
			return fmt.Errorf("bad gateway %q", n.Gateway)
		}
	}
	existing, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	have := false
	for _, e := range existing {
		if e.IPNet.String() == addr.IPNet.String() {
			have = true
			continue
		}
		if err := netlink.AddrDel(link, &e); err != nil {
			return fmt.Errorf("delete %s: %w", e.IPNet, err)
		}
	}
	if !have {
		if err := netlink.AddrAdd(link, addr); err != nil && !strings.Contains(err.Error(), "exists") {
			return fmt.Errorf("add %s: %w", addr.IPNet, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("link up: %w", err)
		}
	}
	if gw != nil {
		_, def, _ := net.ParseCIDR("0.0.0.0/0")
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: def, Gw: gw}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("default route via %s: %w", gw, err)
		}
	}
	return nil
}

// bringUpLinks sets every non-loopback interface up at agent start, so that the
// template snapshot already has its NIC up and a restore only assigns an address.
func bringUpLinks() {
	links, err := netlink.LinkList()
	if err != nil {
		return
	}
	for _, l := range links {
		if l.Attrs().Flags&net.FlagLoopback == 0 && l.Attrs().Flags&net.FlagUp == 0 {
			netlink.LinkSetUp(l)
		}
	}
}
