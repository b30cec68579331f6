package network

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// fakeQEMU plays QEMU's part of "-netdev stream,server=on": it listens on a
// unix socket and exchanges Ethernet frames, each prefixed with a 4-byte
// big-endian length, with whoever connects (the Network). Behind it sits a
// gVisor netstack acting as the guest, statically configured with GuestIP.
type fakeQEMU struct {
	t    *testing.T
	path string
	ln   net.Listener

	stack *stack.Stack
	ep    *channel.Endpoint

	closeOnce sync.Once
	wmu       sync.Mutex // serializes frame writes to conn
	mu        sync.Mutex
	conn      net.Conn
	cancel    context.CancelFunc
	wg        sync.WaitGroup
}

const guestNIC tcpip.NICID = 1

func newFakeQEMU(t *testing.T, cfg Config, path string) *fakeQEMU {
	t.Helper()
	mac, err := net.ParseMAC(cfg.guestMAC())
	if err != nil {
		t.Fatal(err)
	}
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	ep := channel.New(256, uint32(cfg.mtu()), tcpip.LinkAddress(mac))
	if err := s.CreateNIC(guestNIC, ethernet.New(ep)); err != nil {
		t.Fatal(err)
	}
	if err := s.AddProtocolAddress(guestNIC, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpipAddr(cfg.GuestIP()), PrefixLen: cfg.Subnet.Bits()},
	}, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	sub, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{}), tcpip.MaskFromBytes(make([]byte, 4)))
	s.SetRouteTable([]tcpip.Route{{Destination: sub, Gateway: tcpipAddr(cfg.Gateway()), NIC: guestNIC}})
	q := &fakeQEMU{t: t, path: path, stack: s, ep: ep}
	t.Cleanup(q.close)
	return q
}

// listen creates the unix socket, like QEMU does at startup.
func (q *fakeQEMU) listen() {
	q.t.Helper()
	ln, err := net.Listen("unix", q.path)
	if err != nil {
		q.t.Fatal(err)
	}
	q.ln = ln
}

// accept waits for the Network to connect and starts exchanging frames.
func (q *fakeQEMU) accept(timeout time.Duration) {
	q.t.Helper()
	_ = q.ln.(*net.UnixListener).SetDeadline(time.Now().Add(timeout))
	c, err := q.ln.Accept()
	if err != nil {
		q.t.Fatalf("fake qemu: accept: %v", err)
	}
	q.serve(c)
}

// connect dials a "-netdev stream,server=on" socket of a real QEMU (retrying
// until it exists) and exchanges frames over it, so that the guest netstack
// sits behind that QEMU netdev instead of behind our own listener.
func (q *fakeQEMU) connect(path string, timeout time.Duration) {
	q.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			q.serve(c)
			return
		}
		if time.Now().After(deadline) {
			q.t.Fatalf("guest peer: dial %s: %v", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// serve exchanges frames between c and the guest netstack until disconnect.
func (q *fakeQEMU) serve(c net.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	q.mu.Lock()
	q.conn, q.cancel = c, cancel
	q.mu.Unlock()
	q.wg.Add(2)
	go func() { // guest -> network
		defer q.wg.Done()
		for {
			pkt := q.ep.ReadContext(ctx)
			if pkt == nil {
				return
			}
			frame := pkt.ToView().AsSlice()
			pkt.DecRef()
			if err := q.writeFrame(c, frame); err != nil {
				return
			}
		}
	}()
	go func() { // network -> guest
		defer q.wg.Done()
		var hdr [4]byte
		for {
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			frame := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(c, frame); err != nil {
				return
			}
			if len(frame) < header.EthernetMinimumSize {
				continue
			}
			pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame)})
			q.ep.InjectInbound(0, pkt) // the ethernet endpoint parses the header
			pkt.DecRef()
		}
	}()
}

func (q *fakeQEMU) writeFrame(c net.Conn, frame []byte) error {
	msg := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(frame)), uint32(len(frame)))
	q.wmu.Lock()
	defer q.wmu.Unlock()
	_, err := c.Write(append(msg, frame...))
	return err
}

// injectSYN sends a hand-made TCP SYN frame from the guest's MAC to the
// gateway, bypassing the guest netstack (which refuses to send to some
// destinations, e.g. loopback, as a real guest kernel would; a malicious
// guest can still craft such frames).
func (q *fakeQEMU) injectSYN(src, dst netip.AddrPort) {
	q.t.Helper()
	gwMAC, _ := net.ParseMAC(GatewayMAC)
	ipLen := header.IPv4MinimumSize + header.TCPMinimumSize
	frame := make([]byte, header.EthernetMinimumSize+ipLen)
	header.Ethernet(frame).Encode(&header.EthernetFields{
		SrcAddr: q.ep.LinkAddress(),
		DstAddr: tcpip.LinkAddress(gwMAC),
		Type:    header.IPv4ProtocolNumber,
	})
	ip := header.IPv4(frame[header.EthernetMinimumSize:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(ipLen),
		TTL:         64,
		Protocol:    uint8(header.TCPProtocolNumber),
		SrcAddr:     tcpipAddr(src.Addr()),
		DstAddr:     tcpipAddr(dst.Addr()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	th := header.TCP(ip[header.IPv4MinimumSize:])
	th.Encode(&header.TCPFields{
		SrcPort:    src.Port(),
		DstPort:    dst.Port(),
		SeqNum:     1000,
		DataOffset: header.TCPMinimumSize,
		Flags:      header.TCPFlagSyn,
		WindowSize: 65535,
	})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(header.TCPMinimumSize))
	th.SetChecksum(^th.CalculateChecksum(xsum))
	q.mu.Lock()
	c := q.conn
	q.mu.Unlock()
	if c == nil {
		q.t.Fatal("injectSYN: not connected")
	}
	if err := q.writeFrame(c, frame); err != nil {
		q.t.Fatalf("injectSYN: %v", err)
	}
}

// disconnect drops the current connection, as a dying peer would.
func (q *fakeQEMU) disconnect() {
	q.mu.Lock()
	c, cancel := q.conn, q.cancel
	q.conn, q.cancel = nil, nil
	q.mu.Unlock()
	if c != nil {
		cancel()
		_ = c.Close()
	}
	q.wg.Wait()
}

func (q *fakeQEMU) close() {
	q.closeOnce.Do(func() {
		q.disconnect()
		if q.ln != nil {
			_ = q.ln.Close()
		}
		q.stack.Close()
		q.ep.Close()
		q.stack.Wait()
	})
}

func fullAddr(ap netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: guestNIC, Addr: tcpipAddr(ap.Addr()), Port: ap.Port()}
}

// dialTCP connects from the guest.
func (q *fakeQEMU) dialTCP(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	return gonet.DialContextTCP(ctx, q.stack, fullAddr(dst), ipv4.ProtocolNumber)
}

// dialUDP opens a connected UDP socket in the guest.
func (q *fakeQEMU) dialUDP(dst netip.AddrPort) (*gonet.UDPConn, error) {
	ra := fullAddr(dst)
	return gonet.DialUDP(q.stack, nil, &ra, ipv4.ProtocolNumber)
}

// listenTCP listens in the guest on GuestIP:port.
func (q *fakeQEMU) listenTCP(addr netip.AddrPort) (net.Listener, error) {
	return gonet.ListenTCP(q.stack, fullAddr(addr), ipv4.ProtocolNumber)
}

// broadcastUDP opens a guest UDP socket bound to port that may broadcast.
func (q *fakeQEMU) broadcastUDP(port uint16) (*gonet.UDPConn, error) {
	var wq waiter.Queue
	ep, terr := q.stack.NewEndpoint(udp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if terr != nil {
		return nil, &net.OpError{Op: "socket", Err: errString(terr.String())}
	}
	ep.SocketOptions().SetBroadcast(true)
	if terr := ep.Bind(tcpip.FullAddress{NIC: guestNIC, Port: port}); terr != nil {
		ep.Close()
		return nil, &net.OpError{Op: "bind", Err: errString(terr.String())}
	}
	return gonet.NewUDPConn(&wq, ep), nil
}

type errString string

func (e errString) Error() string { return string(e) }

// echo serves an echo on every accepted connection until ln is closed.
func echo(ln net.Listener, accepted chan<- struct{}) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if accepted != nil {
			accepted <- struct{}{}
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// roundTrip writes msg to c and expects it back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(buf) != msg {
		t.Fatalf("got %q, want %q", buf, msg)
	}
}
