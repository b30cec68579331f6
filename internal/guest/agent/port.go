package agent

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// port owns the virtio-serial device. A single goroutine reads it and hands
// chunks to whichever view (scanner or yamux session) is reading at the
// moment, so a dead session can be abandoned without interrupting a blocked
// device read. Reads returning EOF mean "no host connected": they are
// retried after a short sleep and reported once per run as an eof chunk,
// which ends a yamux session but is ignored while scanning.
type port struct {
	open func() (io.ReadWriteCloser, error)
	logf func(string, ...any)

	ch chan chunk

	mu  sync.Mutex // guards dev
	dev io.ReadWriteCloser

	wmu sync.Mutex // serialises writes to dev
}

type chunk struct {
	b   []byte
	eof bool
}

var errPortClosed = errors.New("agent: port closed")

func newPort(open func() (io.ReadWriteCloser, error), logf func(string, ...any)) *port {
	return &port{open: open, logf: logf, ch: make(chan chunk)}
}

func (p *port) device() io.ReadWriteCloser {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dev
}

// reopen (re)opens the device until it succeeds or done is closed.
func (p *port) reopen(done <-chan struct{}) bool {
	p.mu.Lock()
	if p.dev != nil {
		p.dev.Close()
		p.dev = nil
	}
	p.mu.Unlock()
	for attempt := 0; ; attempt++ {
		dev, err := p.open()
		if err == nil {
			p.mu.Lock()
			p.dev = dev
			p.mu.Unlock()
			return true
		}
		if attempt%50 == 0 {
			p.logf("open port: %v", err)
		}
		select {
		case <-done:
			return false
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readLoop runs until done is closed.
func (p *port) readLoop(done <-chan struct{}) {
	defer func() {
		p.mu.Lock()
		if p.dev != nil {
			p.dev.Close()
			p.dev = nil
		}
		p.mu.Unlock()
	}()
	if !p.reopen(done) {
		return
	}
	buf := make([]byte, readChunk)
	eofSent := false
	var eofSince time.Time // start of the current run of EOF reads
	send := func(c chunk) bool {
		select {
		case p.ch <- c:
			return true
		case <-done:
			return false
		}
	}
	for {
		n, err := readMore(p.device(), buf)
		if n > 0 {
			eofSent, eofSince = false, time.Time{}
			if !send(chunk{b: append([]byte(nil), buf[:n]...)}) {
				return
			}
			continue
		}
		select {
		case <-done:
			return
		default:
		}
		quiet := err == nil || err == io.EOF
		if quiet && eofSince.IsZero() {
			eofSince = time.Now()
		}
		// A host that is really gone stays gone: report EOF only once it
		// lasted eofDebounce (see there).
		if !eofSent && (!quiet || time.Since(eofSince) >= eofDebounce) {
			eofSent = true
			if !send(chunk{eof: true}) {
				return
			}
		}
		if quiet {
			time.Sleep(7 * time.Millisecond)
			continue
		}
		p.logf("read port: %v; reopening", err)
		time.Sleep(50 * time.Millisecond)
		if !p.reopen(done) {
			return
		}
	}
}

// eofDebounce is how long reads must keep finding no host before a session
// ends on it. After a restore the guest learns twice that the host's
// connection changed (QEMU's post-load "host closed", then "host open" when
// the daemon connects) from its control queue, which a busy guest's kworker
// may handle late: after the new host's data went through and a session
// started. Between the two, a read finds no data and no host and returns EOF;
// reported at once, it ended the fresh session under the host's first
// request (an identity push that failed with EOF). A host that really left is
// seen 250 ms later, and one that reconnected sooner has its first hello
// swallowed by the old session as a bad frame, which ends it just the same.
const eofDebounce = 250 * time.Millisecond

// readChunk bounds how much one chunk carries from the device to a view.
const readChunk = 256 << 10

// readMore reads at least one byte like Read, then keeps reading what is
// already available without blocking, up to len(buf). A virtio-serial port
// returns at most one 4 KiB buffer per read; handing each to the session as
// its own chunk made host-to-guest transfers cost a goroutine hand-off per
// 4 KiB, which under TCG capped uploads at ~15 MiB/s.
func readMore(dev io.Reader, buf []byte) (int, error) {
	sc, ok := dev.(syscall.Conn)
	if !ok {
		return dev.Read(buf)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return dev.Read(buf)
	}
	n := 0
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		if fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
			// blocking fd (no poller): a second read could wait for the host
			n, rerr = unix.Read(int(fd), buf)
			if n < 0 {
				n = 0
			}
			if n == 0 && rerr == nil {
				rerr = io.EOF
			}
			return true
		}
		for n < len(buf) {
			m, err := unix.Read(int(fd), buf[n:])
			if m > 0 {
				n += m
				continue
			}
			if err == unix.EINTR {
				continue
			}
			if err == unix.EAGAIN {
				return n > 0 // nothing yet: wait for the poller
			}
			if err != nil {
				rerr = err
			} else if n == 0 {
				rerr = io.EOF
			}
			return true
		}
		return true
	})
	if n > 0 {
		return n, nil
	}
	if rerr != nil {
		return 0, rerr
	}
	return 0, err
}

// Write writes to the device (serialised).
func (p *port) Write(b []byte) (int, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	dev := p.device()
	if dev == nil {
		return 0, errPortClosed
	}
	return dev.Write(b)
}

// view is one consumer of the port's chunks; closing it unblocks its reader
// and drops whatever it had buffered.
type view struct {
	p         *port
	pending   []byte
	ignoreEOF atomic.Bool
	done      chan struct{}
	once      sync.Once
}

func newView(p *port) *view { return &view{p: p, done: make(chan struct{})} }

func (v *view) Read(b []byte) (int, error) {
	for len(v.pending) == 0 {
		select {
		case <-v.done:
			return 0, net.ErrClosed
		default:
		}
		select {
		case c := <-v.p.ch:
			if c.eof {
				if v.ignoreEOF.Load() {
					continue
				}
				return 0, io.EOF
			}
			v.pending = c.b
		case <-v.done:
			return 0, net.ErrClosed
		}
	}
	n := copy(b, v.pending)
	v.pending = v.pending[n:]
	return n, nil
}

func (v *view) close() { v.once.Do(func() { close(v.done) }) }

// sessConn is the io.ReadWriteCloser given to yamux: reads come from the
// scanner's bufio.Reader (so bytes after START are kept), writes go to the
// port until the session is closed; Close never closes the device.
type sessConn struct {
	r      io.Reader
	v      *view
	p      *port
	mu     sync.Mutex
	closed bool
}

func (c *sessConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (c *sessConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return 0, net.ErrClosed
	}
	return c.p.Write(b)
}

func (c *sessConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.v.close()
	return nil
}
