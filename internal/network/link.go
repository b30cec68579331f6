package network

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// link is the gateway's end of the point-to-point Ethernet link to one VM:
// the gVisor NIC the gateway's netstack sends through, whose wire is QEMU's
// stream netdev (each frame preceded by its length, 4 bytes big-endian).
// There is one guest per Network, so there is no switch and no address
// learning: every frame from the stack goes to the connection of the moment
// (none while QEMU is not attached: dropped, as on a cable that is out).
//
// Frames from the guest are hostile: their lengths and addresses are
// checked before anything is allocated or delivered.
type link struct {
	mac tcpip.LinkAddress
	mtu uint32
	// answers are the addresses whose ARP replies may leave: the gateway's
	// own. The NIC is in spoofing mode, so without this check it would also
	// claim every address the guest asks about.
	answers map[tcpip.Address]bool

	dispatcher stack.NetworkDispatcher

	mu   sync.Mutex // guards conn; held while writing a frame to it
	conn net.Conn

	sent, received, dropped atomic.Uint64
}

// maxFrameSize is the largest frame accepted from QEMU: an Ethernet header
// with one VLAN tag and the largest MTU Config allows. The length prefix
// comes from the guest's side: without the bound one prefix could make the
// daemon allocate 4 GiB.
const maxFrameSize = header.EthernetMinimumSize + 4 + 65535

func newLink(mac net.HardwareAddr, mtu int, answers ...tcpip.Address) *link {
	l := &link{mac: tcpip.LinkAddress(mac), mtu: uint32(mtu), answers: map[tcpip.Address]bool{}}
	for _, a := range answers {
		l.answers[a] = true
	}
	return l
}

// serve reads frames from conn, QEMU's side of the link, and delivers them
// to the stack until conn fails; frames from the stack go to conn meanwhile.
func (l *link) serve(conn net.Conn) error {
	l.mu.Lock()
	l.conn = conn
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.conn == conn {
			l.conn = nil
		}
		l.mu.Unlock()
		conn.Close()
	}()
	r := bufio.NewReaderSize(conn, 64<<10)
	var prefix [4]byte
	for {
		if _, err := io.ReadFull(r, prefix[:]); err != nil {
			return err
		}
		size := binary.BigEndian.Uint32(prefix[:])
		if size > maxFrameSize {
			// Skipped rather than read: the stream stays in step.
			l.dropped.Add(1)
			if _, err := io.CopyN(io.Discard, r, int64(size)); err != nil {
				return fmt.Errorf("skip an oversized frame (%d bytes): %w", size, err)
			}
			continue
		}
		frame := make([]byte, size)
		if _, err := io.ReadFull(r, frame); err != nil {
			return err
		}
		l.receive(frame)
	}
}

// receive delivers one frame from the guest to the stack.
func (l *link) receive(frame []byte) {
	if len(frame) < header.EthernetMinimumSize {
		l.dropped.Add(1) // a runt: too short to have addresses
		return
	}
	eth := header.Ethernet(frame)
	// A group address is never a valid source (IEEE 802.3): the frame is forged.
	if header.IsMulticastEthernetAddress(eth.SourceAddress()) {
		l.dropped.Add(1)
		return
	}
	l.received.Add(uint64(len(frame)))
	if dst := eth.DestinationAddress(); dst != l.mac && dst != header.EthernetBroadcastAddress {
		return // for nobody here: the guest is the only other station
	}
	d := l.dispatcher
	if d == nil {
		return
	}
	payload := buffer.MakeWithData(frame[header.EthernetMinimumSize:])
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: payload})
	d.DeliverNetworkPacket(eth.Type(), pkt)
	pkt.DecRef()
}

// WritePackets sends the stack's packets to the guest.
func (l *link) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		l.write(pkt)
		n++
	}
	return n, nil
}

func (l *link) write(pkt *stack.PacketBuffer) {
	src := l.mac
	if pkt.EgressRoute.LocalLinkAddress != "" {
		src = pkt.EgressRoute.LocalLinkAddress
	}
	header.Ethernet(pkt.LinkHeader().Push(header.EthernetMinimumSize)).Encode(&header.EthernetFields{
		Type: pkt.NetworkProtocolNumber, SrcAddr: src, DstAddr: pkt.EgressRoute.RemoteLinkAddress,
	})
	if arp := header.ARP(pkt.NetworkHeader().Slice()); pkt.NetworkProtocolNumber == header.ARPProtocolNumber &&
		arp.IsValid() && arp.Op() == header.ARPReply && !l.answers[tcpip.AddrFromSlice(arp.ProtocolAddressSender())] {
		l.dropped.Add(1)
		return
	}
	size := pkt.Size()
	frame := make([]byte, 4, 4+size)
	binary.BigEndian.PutUint32(frame, uint32(size))
	for _, s := range pkt.AsSlices() {
		frame = append(frame, s...)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return
	}
	if _, err := l.conn.Write(frame); err != nil {
		l.conn.Close() // serve sees it and returns; the attachment re-dials
		return
	}
	l.sent.Add(uint64(size))
}

// The rest is stack.LinkEndpoint.

func (l *link) Attach(d stack.NetworkDispatcher)        { l.dispatcher = d }
func (l *link) IsAttached() bool                        { return l.dispatcher != nil }
func (l *link) MTU() uint32                             { return l.mtu }
func (l *link) SetMTU(mtu uint32)                       { l.mtu = mtu }
func (l *link) MaxHeaderLength() uint16                 { return header.EthernetMinimumSize }
func (l *link) LinkAddress() tcpip.LinkAddress          { return l.mac }
func (l *link) SetLinkAddress(a tcpip.LinkAddress)      { l.mac = a }
func (l *link) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareEther }
func (l *link) AddHeader(*stack.PacketBuffer)           {}
func (l *link) ParseHeader(*stack.PacketBuffer) bool    { return true }
func (l *link) Wait()                                   {}
func (l *link) Close()                                  {}
func (l *link) SetOnCloseAction(func())                 {}

func (l *link) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityResolutionRequired | stack.CapabilityRXChecksumOffload
}
