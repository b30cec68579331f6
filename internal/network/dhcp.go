package network

import (
	"errors"
	"net"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/insomniacslk/dhcp/rfc1035label"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// The guest agent configures eth0 itself from the identity the host sends;
// the DHCP server is for images without the agent's network setup. A
// Network has one guest, so the server has one static lease: the guest's
// MAC gets the guest's address, and any other MAC gets no answer.

// newDHCPServer serves DHCP on the gateway's port 67.
func (n *Network) newDHCPServer() (*server4.Server, error) {
	var wq waiter.Queue
	ep, terr := n.stack.NewEndpoint(udp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if terr != nil {
		return nil, errors.New(terr.String())
	}
	ep.SocketOptions().SetBroadcast(true)
	if terr := ep.Bind(tcpip.FullAddress{NIC: nicID, Port: 67}); terr != nil {
		ep.Close()
		return nil, errors.New(terr.String())
	}
	return server4.NewServer("", nil, n.answerDHCP, server4.WithConn(gonet.NewUDPConn(&wq, ep)))
}

// dhcpLease is how long the lease lasts; the address never changes.
const dhcpLease = time.Hour

func (n *Network) answerDHCP(conn net.PacketConn, peer net.Addr, m *dhcpv4.DHCPv4) {
	guestMAC, _ := net.ParseMAC(n.cfg.guestMAC())
	if m.OpCode != dhcpv4.OpcodeBootRequest || m.ClientHWAddr.String() != guestMAC.String() {
		return
	}
	var answer dhcpv4.MessageType
	switch m.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		answer = dhcpv4.MessageTypeOffer
	case dhcpv4.MessageTypeRequest:
		answer = dhcpv4.MessageTypeAck
	default:
		return // release, decline, inform: nothing to do for a static lease
	}
	gw := net.IP(n.cfg.Gateway().AsSlice())
	reply, err := dhcpv4.NewReplyFromRequest(m,
		dhcpv4.WithMessageType(answer),
		dhcpv4.WithYourIP(net.IP(n.cfg.GuestIP().AsSlice())),
		dhcpv4.WithServerIP(gw),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(gw)),
		dhcpv4.WithOption(dhcpv4.OptIPAddressLeaseTime(dhcpLease)),
		dhcpv4.WithOption(dhcpv4.OptSubnetMask(net.CIDRMask(n.cfg.Subnet.Bits(), 32))),
		dhcpv4.WithOption(dhcpv4.OptRouter(gw)),
		dhcpv4.WithOption(dhcpv4.OptDNS(gw)),
		dhcpv4.WithOption(dhcpv4.Option{Code: dhcpv4.OptionInterfaceMTU, Value: dhcpv4.Uint16(uint16(n.cfg.mtu()))}),
	)
	if err != nil {
		n.log.Debug("dhcp: cannot build a reply", "err", err)
		return
	}
	if len(n.cfg.SearchDomains) > 0 {
		reply.UpdateOption(dhcpv4.OptDomainSearch(&rfc1035label.Labels{Labels: n.cfg.SearchDomains}))
	}
	if _, err := conn.WriteTo(reply.ToBytes(), peer); err != nil {
		n.log.Debug("dhcp: cannot answer", "err", err)
	}
}
