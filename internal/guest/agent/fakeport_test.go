package agent

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakePort imitates a guest virtio-serial port backed by a QEMU
// server=on chardev socket: reads return EOF while no host is attached,
// writes made while detached are queued and delivered to the next host, and
// Restore swaps in a new host connection without the guest noticing (as a
// snapshot restore does).
// testDeliverDelay delays the delivery of queued bytes, as a loaded machine
// may; the ordering must hold anyway (a CI run once lost it).
var testDeliverDelay = 20 * time.Millisecond

type fakePort struct {
	wmu   sync.Mutex // orders queued bytes before new writes, as QEMU does
	mu    sync.Mutex
	cur   net.Conn // guest end of the current host connection
	queue []byte
}

func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// Attach connects a new host; stale (queued) guest bytes are delivered first.
func (f *fakePort) Attach(t *testing.T) net.Conn {
	host, g := socketPair(t)
	f.wmu.Lock()
	f.mu.Lock()
	if f.cur != nil {
		f.cur.Close()
	}
	q := f.queue
	f.queue = nil
	f.cur = g
	f.mu.Unlock()
	go f.deliver(g, q)
	return host
}

// Restore replaces the host connection while the guest is mid-session.
func (f *fakePort) Restore(t *testing.T, staleToHost []byte) net.Conn {
	host, g := socketPair(t)
	f.wmu.Lock()
	f.mu.Lock()
	old := f.cur
	f.cur = g
	f.mu.Unlock()
	if old != nil {
		old.Close()
	}
	go f.deliver(g, staleToHost)
	return host
}

// deliver writes bytes that must reach the host before anything the guest
// writes later (the caller holds wmu; the host may not be reading yet, so
// this runs in its own goroutine).
func (f *fakePort) deliver(g net.Conn, b []byte) {
	defer f.wmu.Unlock()
	if testDeliverDelay > 0 {
		time.Sleep(testDeliverDelay)
	}
	if len(b) > 0 {
		g.Write(b)
	}
}

func (f *fakePort) Read(b []byte) (int, error) {
	for {
		f.mu.Lock()
		c := f.cur
		f.mu.Unlock()
		if c == nil {
			return 0, io.EOF
		}
		n, err := c.Read(b)
		if n > 0 {
			return n, nil
		}
		if err == nil {
			continue
		}
		f.mu.Lock()
		if f.cur == c { // host went away
			f.cur = nil
			c.Close()
			f.mu.Unlock()
			return 0, io.EOF
		}
		f.mu.Unlock() // replaced by Restore: keep reading on the new one
	}
}

func (f *fakePort) Write(b []byte) (int, error) {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	f.mu.Lock()
	c := f.cur
	if c == nil {
		f.queue = append(f.queue, b...)
		f.mu.Unlock()
		return len(b), nil
	}
	f.mu.Unlock()
	if _, err := c.Write(b); err != nil {
		f.mu.Lock()
		f.queue = append(f.queue, b...)
		f.mu.Unlock()
	}
	return len(b), nil
}

func (f *fakePort) Close() error { return nil }
