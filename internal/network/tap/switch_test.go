package tap

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containers/gvisor-tap-vsock/pkg/types"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

var (
	gatewayMAC = tcpip.LinkAddress("\x5a\x94\xef\xe4\x0c\xdd")
	guestMAC   = tcpip.LinkAddress("\x5a\x94\xef\xe4\x0c\xee")
)

// fakeGateway records the payloads (Ethernet header stripped) the switch
// hands to the gateway's netstack.
type fakeGateway struct {
	mu   sync.Mutex
	got  [][]byte
	seen chan struct{}
}

func (g *fakeGateway) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	b := bytes.Clone(pkt.ToView().AsSlice())
	g.mu.Lock()
	g.got = append(g.got, b)
	g.mu.Unlock()
	g.seen <- struct{}{}
}
func (g *fakeGateway) LinkAddress() tcpip.LinkAddress { return gatewayMAC }
func (g *fakeGateway) IP() string                     { return "10.200.7.1" }

// startSwitch serves one QEMU-protocol connection on a switch; the returned
// conn is QEMU's end. Whatever the switch sends to it is discarded.
func startSwitch(t *testing.T) (*Switch, *fakeGateway, net.Conn) {
	t.Helper()
	sw := NewSwitch(false)
	gw := &fakeGateway{seen: make(chan struct{}, 4096)}
	sw.Connect(gw)
	qemu, ours := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sw.Accept(ctx, ours, types.QemuProtocol) }()
	drained := make(chan struct{})
	go func() { defer close(drained); _, _ = io.Copy(io.Discard, qemu) }()
	t.Cleanup(func() {
		cancel()
		_ = qemu.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("switch did not stop: a lock is probably held")
		}
		<-drained
	})
	return sw, gw, qemu
}

func writeFrame(t *testing.T, c net.Conn, frame []byte) {
	t.Helper()
	msg := binary.BigEndian.AppendUint32(nil, uint32(len(frame)))
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(append(msg, frame...)); err != nil {
		t.Fatalf("write frame: %v", err)
	}
}

func frame(src, dst tcpip.LinkAddress, payload []byte) []byte {
	f := make([]byte, header.EthernetMinimumSize+len(payload))
	header.Ethernet(f).Encode(&header.EthernetFields{SrcAddr: src, DstAddr: dst, Type: header.IPv4ProtocolNumber})
	copy(f[header.EthernetMinimumSize:], payload)
	return f
}

func waitDelivered(t *testing.T, gw *fakeGateway, n int) [][]byte {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-gw.seen:
		case <-time.After(10 * time.Second):
			t.Fatalf("gateway got %d frames, want %d", i, n)
		}
	}
	gw.mu.Lock()
	defer gw.mu.Unlock()
	return gw.got
}

// TestSwitchDropsMalformedFrames feeds the switch frames a hostile guest can
// queue on its NIC. Each must be dropped without disturbing the switch: the
// valid frame sent after it still reaches the gateway, alone.
func TestSwitchDropsMalformedFrames(t *testing.T) {
	tests := []struct {
		name  string
		frame []byte
	}{
		{"empty", nil},
		{"one byte", []byte{0xff}},
		{"13 bytes", bytes.Repeat([]byte{0xff}, header.EthernetMinimumSize-1)},
		{"multicast source", frame(tcpip.LinkAddress("\x01\x00\x5e\x00\x00\x01"), gatewayMAC, []byte("bad"))},
		{"broadcast source", frame(header.EthernetBroadcastAddress, gatewayMAC, []byte("bad"))},
		{"oversized", frame(guestMAC, gatewayMAC, make([]byte, MaxFrameSize))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sw, gw, qemu := startSwitch(t)
			writeFrame(t, qemu, tt.frame)
			writeFrame(t, qemu, frame(guestMAC, gatewayMAC, []byte("good")))
			got := waitDelivered(t, gw, 1)
			if len(got) != 1 || string(got[0]) != "good" {
				t.Fatalf("gateway got %d frames (first %d bytes), want only the valid one", len(got), len(got[0]))
			}
			if d := atomic.LoadUint64(&sw.Dropped); d != 1 {
				t.Errorf("Dropped = %d, want 1", d)
			}
		})
	}
}

// TestSwitchTxShortPacket checks that a packet too short for an Ethernet
// header handed to the switch for sending is dropped, and that the switch
// still sends afterwards (no lock left held).
func TestSwitchTxShortPacket(t *testing.T) {
	sw, gw, qemu := startSwitch(t)
	writeFrame(t, qemu, frame(guestMAC, gatewayMAC, []byte("learn")))
	waitDelivered(t, gw, 1)
	for _, size := range []int{0, 1, header.EthernetMinimumSize - 1} {
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(make([]byte, size))})
		sw.DeliverNetworkPacket(header.IPv4ProtocolNumber, pkt)
		pkt.DecRef()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(frame(gatewayMAC, guestMAC, []byte("reply")))})
		sw.DeliverNetworkPacket(header.IPv4ProtocolNumber, pkt)
		pkt.DecRef()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("send after a short packet hung")
	}
	if d := atomic.LoadUint64(&sw.Dropped); d != 3 {
		t.Errorf("Dropped = %d, want 3", d)
	}
}

// TestSwitchCAMBounded sprays source MACs, as a guest can: the switch must
// not learn more than MaxCAMEntries of them, yet keep forwarding.
func TestSwitchCAMBounded(t *testing.T) {
	sw, gw, qemu := startSwitch(t)
	const frames = MaxCAMEntries + 100
	for i := 0; i < frames; i++ {
		src := []byte{0x02, 0, 0, 0, byte(i >> 8), byte(i)}
		writeFrame(t, qemu, frame(tcpip.LinkAddress(src), gatewayMAC, []byte("x")))
	}
	waitDelivered(t, gw, frames)
	if n := len(sw.CAM()); n != MaxCAMEntries {
		t.Fatalf("CAM holds %d entries, want %d", n, MaxCAMEntries)
	}
}
