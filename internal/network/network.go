// Package network provides per-VM virtual networks: a userspace gateway
// (gVisor netstack) with DHCP, DNS, egress for TCP and UDP, and an egress
// policy.
//
// Each VM gets its own Network with its own subnet. QEMU is started with
//
//	-netdev stream,id=n0,server=on,addr.type=unix,addr.path=<sock>
//
// i.e. QEMU listens and this package dials (Attach), so that a restarted
// daemon can re-dial a still-running QEMU and get the network back.
//
// The gateway's NIC is a point-to-point link to QEMU's socket (link.go);
// the stack's TCP and UDP forwarders enforce Policy before dialing. There
// is no NAT table (no virtual IP mapped to the host's loopback) and there
// are no port forwards.
package network

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

const nicID tcpip.NICID = 1

// ErrClosed is returned by operations on a closed Network.
var ErrClosed = errors.New("network: closed")

// ErrRefused is returned by DialGuest when the guest refuses the
// connection (nothing listens on the port).
var ErrRefused = errors.New("connection refused")

// Network is one VM's virtual network.
type Network struct {
	cfg   Config
	log   *slog.Logger
	stack *stack.Stack
	link  *link

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	wg      sync.WaitGroup         // every goroutine this Network starts
	tracked map[io.Closer]struct{} // live proxied connections, closed by Close
	attach  *attachment            // current Attach, nil if none

	connected atomic.Bool

	egress   atomic.Pointer[Egress]
	resolved resolvedSet
	lim      limiters

	closers   []io.Closer // service sockets (DNS, DHCP)
	closeOnce sync.Once
}

// New builds the virtual network (gateway, DHCP with a static lease for the
// guest MAC, DNS on the gateway, policy-checked TCP/UDP egress). Nothing is
// connected until Attach. log may be nil (slog.Default()).
func New(cfg Config, log *slog.Logger) (*Network, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Subnet = cfg.Subnet.Masked()
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "network", "subnet", cfg.Subnet.String())

	n := &Network{
		cfg:     cfg,
		log:     log,
		tracked: make(map[io.Closer]struct{}),
		lim:     newLimiters(cfg.Limits),
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	eg := cfg.Egress
	if err := eg.Validate(); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	n.egress.Store(&eg)

	gwMAC, err := net.ParseMAC(GatewayMAC)
	if err != nil {
		return nil, fmt.Errorf("network: gateway MAC: %w", err)
	}
	n.link = newLink(gwMAC, cfg.mtu(), tcpipAddr(cfg.Gateway()), tcpipAddr(cfg.HostAddr()), tcpipAddr(cfg.ServiceAddr()))

	if err := n.createStack(n.link); err != nil {
		_ = n.Close()
		return nil, err
	}
	if err := n.startServices(); err != nil {
		_ = n.Close()
		return nil, err
	}
	log.Info("virtual network created", "gateway", cfg.Gateway().String(),
		"guest_ip", cfg.GuestIP().String(), "guest_mac", cfg.guestMAC(),
		"allow_private", cfg.Policy.AllowPrivate)
	return n, nil
}

// Config returns the (normalized) configuration.
func (n *Network) Config() Config { return n.cfg }

// Gateway returns the gateway (and DNS server) address.
func (n *Network) Gateway() netip.Addr { return n.cfg.Gateway() }

// GuestIP returns the guest's address.
func (n *Network) GuestIP() netip.Addr { return n.cfg.GuestIP() }

// BytesSent returns the number of bytes sent to the guest.
func (n *Network) BytesSent() uint64 { return n.link.sent.Load() }

// BytesReceived returns the number of bytes received from the guest.
func (n *Network) BytesReceived() uint64 { return n.link.received.Load() }

// FramesDropped returns the number of frames from the guest refused as
// malformed or forged, and of ARP replies the gateway did not send.
func (n *Network) FramesDropped() uint64 { return n.link.dropped.Load() }

func tcpipAddr(a netip.Addr) tcpip.Address {
	if a.Is4() {
		b := a.As4()
		return tcpip.AddrFrom4(b)
	}
	b := a.As16()
	return tcpip.AddrFrom16(b)
}

func netipAddr(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip.Unmap()
}

func (n *Network) createStack(ep stack.LinkEndpoint) error {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	n.stack = s
	sack := tcpip.TCPSACKEnabled(true)
	_ = s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)

	if err := s.CreateNIC(nicID, ep); err != nil {
		return fmt.Errorf("network: create NIC: %s", err)
	}
	if err := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpipAddr(n.cfg.Gateway()).WithPrefix(),
	}, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("network: add gateway address: %s", err)
	}
	// The host gateway address (.254) answers ARP like the gateway; its
	// connections reach the forwarder, which admits only AllowHost ports.
	if err := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpipAddr(n.cfg.HostAddr()).WithPrefix(),
	}, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("network: add host gateway address: %s", err)
	}
	// The service address (.253) answers ARP too (Config.Serve).
	if err := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpipAddr(n.cfg.ServiceAddr()).WithPrefix(),
	}, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("network: add service address: %s", err)
	}
	// Spoofing + promiscuous: the gateway terminates connections to any
	// destination address; the forwarders then decide whether to dial out.
	if err := s.SetSpoofing(nicID, true); err != nil {
		return fmt.Errorf("network: spoofing: %s", err)
	}
	if err := s.SetPromiscuousMode(nicID, true); err != nil {
		return fmt.Errorf("network: promiscuous: %s", err)
	}
	sub, err := tcpip.NewSubnet(tcpipAddr(n.cfg.Subnet.Addr()),
		tcpip.MaskFromBytes(net.CIDRMask(n.cfg.Subnet.Bits(), 32)))
	if err != nil {
		return fmt.Errorf("network: subnet: %w", err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: sub, NIC: nicID}})

	s.SetTransportProtocolHandler(tcp.ProtocolNumber, tcp.NewForwarder(s, 0, tcpMaxInFlight, n.forwardTCP).HandlePacket)
	s.SetTransportProtocolHandler(udp.ProtocolNumber, udp.NewForwarder(s, n.forwardUDP).HandlePacket)
	return nil
}

// startServices starts DNS (UDP+TCP on gateway:53) and DHCP (port 67).
func (n *Network) startServices() error {
	gw := tcpip.FullAddress{NIC: nicID, Addr: tcpipAddr(n.cfg.Gateway()), Port: 53}
	dnsUDP, err := gonet.DialUDP(n.stack, &gw, nil, ipv4.ProtocolNumber)
	if err != nil {
		return fmt.Errorf("network: dns udp: %w", err)
	}
	n.closers = append(n.closers, dnsUDP)
	dnsTCP, err := gonet.ListenTCP(n.stack, gw, ipv4.ProtocolNumber)
	if err != nil {
		return fmt.Errorf("network: dns tcp: %w", err)
	}
	n.closers = append(n.closers, dnsTCP)
	dnsSrv := newDNSServer(n)
	dhcpSrv, err := n.newDHCPServer()
	if err != nil {
		return fmt.Errorf("network: dhcp: %w", err)
	}
	n.closers = append(n.closers, dhcpSrv)

	n.goService("dns-udp", func() error { return dnsSrv.serveUDP(dnsUDP) })
	n.goService("dns-tcp", func() error { return dnsSrv.serveTCP(dnsTCP) })
	n.goService("dhcp", dhcpSrv.Serve)
	return nil
}

func (n *Network) goService(name string, serve func() error) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		err := serve()
		if n.ctx.Err() == nil && err != nil {
			n.log.Error("service stopped", "service", name, "err", err)
		}
	}()
}

// begin registers a goroutine about to run on the Network's behalf; it
// returns false (and registers nothing) once Close has started.
func (n *Network) begin() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.wg.Add(1)
	return true
}

// track registers connections to be closed by Close; it returns false (and
// the caller must close them) once Close has started.
func (n *Network) track(cs ...io.Closer) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	for _, c := range cs {
		n.tracked[c] = struct{}{}
	}
	return true
}

func (n *Network) untrack(cs ...io.Closer) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range cs {
		delete(n.tracked, c)
	}
}

// DialGuest opens a TCP connection from the host side to GuestIP:port through
// the virtual network (the guest sees it coming from the gateway address).
func (n *Network) DialGuest(ctx context.Context, port int) (net.Conn, error) {
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("network: invalid port %d", port)
	}
	if n.ctx.Err() != nil {
		return nil, ErrClosed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(n.ctx, cancel)
	defer stop()
	c, err := gonet.DialContextTCP(ctx, n.stack, tcpip.FullAddress{
		NIC:  nicID,
		Addr: tcpipAddr(n.cfg.GuestIP()),
		Port: uint16(port),
	}, ipv4.ProtocolNumber)
	if err != nil {
		if n.ctx.Err() != nil {
			return nil, ErrClosed
		}
		// gVisor's adapter turns its typed errors into text: this is the
		// one place that reads it.
		if strings.HasSuffix(err.Error(), (&tcpip.ErrConnectionRefused{}).String()) {
			err = ErrRefused
		}
		return nil, fmt.Errorf("network: dial guest %s: %w",
			netip.AddrPortFrom(n.cfg.GuestIP(), uint16(port)), err)
	}
	return c, nil
}

// Close detaches from QEMU, stops all services and forwarders, closes every
// proxied connection and the netstack, and waits for all goroutines. It is
// idempotent and always returns nil.
func (n *Network) Close() error {
	n.closeOnce.Do(func() {
		n.mu.Lock()
		n.closed = true
		tracked := n.tracked
		n.tracked = map[io.Closer]struct{}{}
		n.mu.Unlock()

		n.cancel() // stops attach loops, in-flight dials, DialGuest
		for c := range tracked {
			_ = c.Close()
		}
		for _, c := range n.closers {
			_ = c.Close()
		}
		if n.stack != nil {
			n.stack.Close()
		}
		n.wg.Wait()
		if n.stack != nil {
			n.stack.Wait()
		}
		n.log.Info("virtual network closed")
	})
	return nil
}
