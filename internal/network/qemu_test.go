package network

import (
	"bytes"
	"context"
	"net"
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
// exchanges frames with the guest. No OS is booted: the virtio-net option
// ROM (iPXE) does DHCP against our gateway and then answers ARP.
func TestQEMUStreamReconnect(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	dir := t.TempDir()
	sock, mon := filepath.Join(dir, "net.sock"), filepath.Join(dir, "mon.sock")
	var out lockedBuffer
	cmd := exec.Command(qemu, "-machine", "pc-q35-7.2,accel=tcg", "-nodefaults", "-display", "none",
		"-monitor", "unix:"+mon+",server=on,wait=off",
		"-netdev", "stream,id=n0,server=on,addr.type=unix,addr.path="+sock,
		"-device", "virtio-net-pci,netdev=n0,mac="+DefaultGuestMAC)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // only the QEMU this test started
		_ = cmd.Wait()
	})

	reset := func() {
		t.Helper()
		var c net.Conn
		var err error
		for i := 0; i < 100; i++ {
			if c, err = net.Dial("unix", mon); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("qemu monitor: %v\n%s", err, out.String())
		}
		defer c.Close()
		_, _ = c.Write([]byte("system_reset\n"))
		time.Sleep(200 * time.Millisecond)
	}

	cfg := Config{Subnet: SubnetForIndex(42)}
	for round := 1; round <= 3; round++ {
		n, err := New(cfg, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		// iPXE under TCG is slow to get to DHCP when the machine is busy
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		if err := n.Attach(ctx, sock); err != nil {
			cancel()
			t.Fatalf("round %d: Attach: %v\n%s", round, err, out.String())
		}
		reset() // restart the firmware so that iPXE does DHCP again
		start := time.Now()
		// On a starved machine the firmware can give up before it hears
		// from us: reset it again while nothing has come from the guest.
		stopResets := make(chan struct{})
		go func() {
			for {
				select {
				case <-stopResets:
					return
				case <-time.After(15 * time.Second):
					if n.BytesReceived() == 0 {
						if c, err := net.Dial("unix", mon); err == nil {
							_, _ = c.Write([]byte("system_reset\n"))
							time.Sleep(200 * time.Millisecond)
							c.Close()
						}
					}
				}
			}
		}()
		answered := guestAnswersARP(ctx, n)
		close(stopResets)
		if !answered {
			cancel()
			n.Close()
			t.Fatalf("round %d: no ARP answer from the guest (received %d bytes, sent %d)\n%s",
				round, n.BytesReceived(), n.BytesSent(), out.String())
		}
		t.Logf("round %d: guest (iPXE) answered ARP after %v; %d bytes in, %d out",
			round, time.Since(start).Round(time.Millisecond), n.BytesReceived(), n.BytesSent())
		cancel()
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
