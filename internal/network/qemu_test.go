package network

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// TestQEMUStreamReconnect checks, against a real QEMU, that a
// "-netdev stream,server=on" socket accepts a new client after the previous
// one went away (what happens when the daemon restarts): a first Network
// attaches and is closed, a second one attaches to the same running QEMU and
// exchanges frames through it.
//
// No guest runs. QEMU joins the netdev the Network attaches to and a second
// stream netdev with a hub; behind the second one the test's own netstack
// plays the guest (static GuestIP, DefaultGuestMAC). Frames therefore cross
// QEMU's real stream backend both ways, with no firmware timing involved:
// an earlier version waited for the virtio-net option ROM (iPXE) to do DHCP,
// which a starved CI machine did not always get to within 90 s.
func TestQEMUStreamReconnect(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	dir := t.TempDir()
	sock, peerSock := filepath.Join(dir, "net.sock"), filepath.Join(dir, "peer.sock")
	var out lockedBuffer
	// Not -S: QEMU's net layer holds every frame while the VM is stopped.
	cmd := exec.Command(qemu, "-machine", "none", "-nodefaults", "-display", "none",
		"-netdev", "stream,id=n0,server=on,addr.type=unix,addr.path="+sock,
		"-netdev", "stream,id=n1,server=on,addr.type=unix,addr.path="+peerSock,
		"-netdev", "hubport,id=h0,hubid=0,netdev=n0",
		"-netdev", "hubport,id=h1,hubid=0,netdev=n1")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // only the QEMU this test started
		_ = cmd.Wait()
	})

	cfg := Config{Subnet: SubnetForIndex(42)}
	guest := newFakeQEMU(t, cfg, "")
	guest.connect(peerSock, 30*time.Second)

	for round := 1; round <= 3; round++ {
		n, err := New(cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := n.Attach(ctx, sock); err != nil {
			cancel()
			t.Fatalf("round %d: Attach: %v\n%s", round, err, out.String())
		}
		start := time.Now()
		answered := guestAnswersARP(ctx, n)
		cancel()
		if !answered {
			n.Close()
			t.Fatalf("round %d: no ARP answer through QEMU (received %d bytes, sent %d)\n%s",
				round, n.BytesReceived(), n.BytesSent(), out.String())
		}
		t.Logf("round %d: ARP answered through QEMU after %v; %d bytes in, %d out",
			round, time.Since(start).Round(time.Millisecond), n.BytesReceived(), n.BytesSent())
		n.Close() // the "daemon" goes away; QEMU keeps running
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("qemu is gone: %v\n%s", err, out.String())
	}
}

// guestAnswersARP resolves the guest IP through the gateway netstack until
// it succeeds (frames went both ways through QEMU) or ctx is done.
func guestAnswersARP(ctx context.Context, n *Network) bool {
	guest, gw := tcpipAddr(n.GuestIP()), tcpipAddr(n.Gateway())
	for ctx.Err() == nil {
		var ok atomic.Bool
		done := make(chan struct{})
		_ = n.stack.RemoveNeighbor(nicID, ipv4.ProtocolNumber, guest)
		err := n.stack.GetLinkAddress(nicID, guest, gw, ipv4.ProtocolNumber, func(r stack.LinkResolutionResult) {
			ok.Store(r.Err == nil)
			close(done)
		})
		if _, wouldBlock := err.(*tcpip.ErrWouldBlock); err != nil && !wouldBlock {
			return false
		}
		select {
		case <-done:
			if ok.Load() {
				return true
			}
		case <-ctx.Done():
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// lockedBuffer is a bytes.Buffer safe for QEMU's output copier and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
