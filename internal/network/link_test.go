package network

import (
	"encoding/binary"
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
