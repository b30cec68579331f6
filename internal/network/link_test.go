package network

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// recorder is a stack.NetworkDispatcher that keeps what it is given.
type recorder struct {
	mu   sync.Mutex
	got  [][]byte
	seen chan struct{}
}

func (r *recorder) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	r.mu.Lock()
	r.got = append(r.got, pkt.ToView().AsSlice())
	r.mu.Unlock()
	r.seen <- struct{}{}
}

func (r *recorder) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

var (
	testGatewayMAC = net.HardwareAddr{0x5a, 0x94, 0xef, 0xe4, 0x0c, 0xdd}
	testGuestMAC   = net.HardwareAddr{0x5a, 0x94, 0xef, 0xe4, 0x0c, 0xee}
)

func ethFrame(src, dst net.HardwareAddr, payload string) []byte {
	f := make([]byte, header.EthernetMinimumSize+len(payload))
	header.Ethernet(f).Encode(&header.EthernetFields{SrcAddr: tcpip.LinkAddress(src), DstAddr: tcpip.LinkAddress(dst), Type: header.IPv4ProtocolNumber})
	copy(f[header.EthernetMinimumSize:], payload)
	return f
}

func writePrefixed(t *testing.T, c net.Conn, size uint32, body []byte) {
	t.Helper()
	var p [4]byte
	binary.BigEndian.PutUint32(p[:], size)
	if _, err := c.Write(append(p[:], body...)); err != nil {
		t.Fatal(err)
	}
}

// Frames a hostile guest can queue on its NIC are dropped without
// disturbing the link: the valid frame sent after them still arrives, alone.
func TestLinkDropsMalformedFrames(t *testing.T) {
	l := newLink(testGatewayMAC, 1500)
	r := &recorder{seen: make(chan struct{}, 16)}
	l.Attach(r)
	qemu, ours := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- l.serve(ours) }()
	defer qemu.Close()

	writePrefixed(t, qemu, 0, nil)                                       // empty
	writePrefixed(t, qemu, 6, make([]byte, 6))                           // runt
	writePrefixed(t, qemu, maxFrameSize+1, make([]byte, maxFrameSize+1)) // oversized: skipped in step
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	forged := ethFrame(bcast, testGatewayMAC, "forged") // group source
	writePrefixed(t, qemu, uint32(len(forged)), forged)
	other := ethFrame(testGuestMAC, net.HardwareAddr{2, 0, 0, 0, 0, 9}, "elsewhere") // to nobody here
	writePrefixed(t, qemu, uint32(len(other)), other)
	valid := ethFrame(testGuestMAC, testGatewayMAC, "valid")
	writePrefixed(t, qemu, uint32(len(valid)), valid)

	select {
	case <-r.seen:
	case <-time.After(30 * time.Second):
		t.Fatal("the valid frame never arrived")
	}
	r.mu.Lock()
	got := r.got
	r.mu.Unlock()
	if len(got) != 1 || string(got[0]) != "valid" {
		t.Fatalf("delivered %q, want only the valid frame's payload", got)
	}
	if d := l.dropped.Load(); d != 4 {
		t.Fatalf("dropped %d frames, want 4", d)
	}
	qemu.Close()
	if err := <-done; err == nil {
		t.Fatal("serve returned no error when QEMU's end closed")
	}
}

// With no QEMU attached a frame from the stack is dropped, not queued or
// blocked on.
func TestLinkWriteWithoutConnection(t *testing.T) {
	l := newLink(testGatewayMAC, 1500)
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{ReserveHeaderBytes: header.EthernetMinimumSize})
	pkt.NetworkProtocolNumber = header.IPv4ProtocolNumber
	pkt.EgressRoute.RemoteLinkAddress = tcpip.LinkAddress(testGuestMAC)
	var list stack.PacketBufferList
	list.PushBack(pkt)
	if n, err := l.WritePackets(list); n != 1 || err != nil {
		t.Fatalf("WritePackets: %d %v", n, err)
	}
	list.DecRef()
	if l.sent.Load() != 0 {
		t.Fatal("counted a frame sent with no connection")
	}
}

// arpReply is an ARP reply claiming ip, as the stack would send it.
func arpReply(ip tcpip.Address) *stack.PacketBuffer {
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{ReserveHeaderBytes: header.EthernetMinimumSize + header.ARPSize})
	h := header.ARP(pkt.NetworkHeader().Push(header.ARPSize))
	h.SetIPv4OverEthernet()
	h.SetOp(header.ARPReply)
	copy(h.HardwareAddressSender(), testGatewayMAC)
	copy(h.ProtocolAddressSender(), ip.AsSlice())
	pkt.NetworkProtocolNumber = header.ARPProtocolNumber
	pkt.EgressRoute.RemoteLinkAddress = tcpip.LinkAddress(testGuestMAC)
	return pkt
}

// The gateway answers ARP only for its own addresses: in spoofing mode the
// stack would otherwise claim every address the guest asks about.
func TestLinkSendsOnlyItsOwnARPReplies(t *testing.T) {
	gw := tcpip.AddrFrom4([4]byte{10, 200, 1, 1})
	l := newLink(testGatewayMAC, 1500, gw)
	l.Attach(&recorder{seen: make(chan struct{}, 1)})
	qemu, ours := net.Pipe()
	defer qemu.Close()
	go l.serve(ours)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		l.mu.Lock()
		up := l.conn != nil
		l.mu.Unlock()
		if up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the link never took the connection")
		}
	}
	got := make(chan []byte, 2)
	go func() {
		var p [4]byte
		for {
			if _, err := io.ReadFull(qemu, p[:]); err != nil {
				return
			}
			f := make([]byte, binary.BigEndian.Uint32(p[:]))
			if _, err := io.ReadFull(qemu, f); err != nil {
				return
			}
			got <- f
		}
	}()
	for _, ip := range []tcpip.Address{tcpip.AddrFrom4([4]byte{10, 200, 1, 9}), gw} {
		var list stack.PacketBufferList
		list.PushBack(arpReply(ip))
		l.WritePackets(list)
		list.DecRef()
	}
	select {
	case f := <-got:
		if sender := header.ARP(f[header.EthernetMinimumSize:]).ProtocolAddressSender(); tcpip.AddrFromSlice(sender) != gw {
			t.Fatalf("the first frame on the wire claims %v, want only the gateway's reply", tcpip.AddrFromSlice(sender))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway's own ARP reply never left")
	}
	if l.dropped.Load() != 1 {
		t.Fatalf("dropped %d ARP replies, want 1", l.dropped.Load())
	}
}
