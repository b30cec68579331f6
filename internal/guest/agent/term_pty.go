package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

const (
	termReadChunk = 32 << 10
	// termDrainWindow bounds the wait for the remaining output after the
	// process exited (background jobs may keep the pty open).
	termDrainWindow = 250 * time.Millisecond
	// DefaultTermKillGrace is the time between SIGHUP and SIGKILL when a
	// terminal is deleted.
	DefaultTermKillGrace = 2 * time.Second
	// termClientQueueMax bounds the output queued for one client (framed
	// bytes, the scrollback replay included); a client that falls further
	// behind is dropped and may reattach.
	termClientQueueMax = guest.DefaultScrollback + 4<<20
	// termFrameMax is the largest output frame sent to a client.
	termFrameMax = 256 << 10
	// termFinishTimeout bounds the delivery of the last output and the exit
	// frame to a client that does not read.
	termFinishTimeout = 30 * time.Second
)

// terminal is a process on a pty owned by the agent.
type terminal struct {
	m         *termManager
	name      string
	user      string
	argv      []string
	created   time.Time
	ephemeral bool
	pid       int
	proc      *os.Process
	ptmx      *os.File // master; non-blocking, in the runtime poller

	readDone chan struct{} // the reader saw EIO (or the master was closed)
	finished chan struct{} // the process was reaped and clients were told
	shutOnce sync.Once

	mu         sync.Mutex
	cols, rows int
	ring       ring
	clients    map[*termClient]struct{}
	hadClients bool
	dead       bool // the process exited (maybe not yet reaped): no more signals
	exited     bool // status is valid, exit frames were queued
	status     guest.ExitStatus
	closing    bool // removed from the manager
}

// openPTY opens a pty pair. The master is non-blocking so that Close
// interrupts a pending Read (creack/pty's helpers call (*os.File).Fd, which
// switches a file to blocking mode for good).
func openPTY(cols, rows int, uid int) (master, slave *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, os.NewSyscallError("open /dev/ptmx", err)
	}
	fail := func(what string, err error) (*os.File, *os.File, error) {
		unix.Close(fd)
		return nil, nil, os.NewSyscallError(what, err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		return fail("TIOCGPTN", err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return fail("TIOCSPTLCK", err)
	}
	if err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(rows), Col: uint16(cols)}); err != nil {
		return fail("TIOCSWINSZ", err)
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	sfd, err := unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("open "+name, err)
	}
	if tio, err := unix.IoctlGetTermios(sfd, unix.TCGETS); err == nil {
		tio.Iflag |= unix.IUTF8
		unix.IoctlSetTermios(sfd, unix.TCSETS, tio)
	}
	if uid >= 0 {
		// As sshd does: the user owns their tty (programs reopen it).
		unix.Fchown(sfd, uid, -1)
		unix.Fchmod(sfd, 0o620)
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), os.NewFile(uintptr(sfd), name), nil
}

func startTerminal(m *termManager, name, user string, sp *execSpec, cols, rows int, ephemeral bool) (*terminal, error) {
	uid := -1
	if sp.cred != nil {
		uid = int(sp.cred.Uid)
	}
	master, slave, err := openPTY(cols, rows, uid)
	if err != nil {
		return nil, err
	}
	proc, err := os.StartProcess(sp.path, sp.argv, &os.ProcAttr{
		Dir:   sp.dir,
		Env:   sp.env,
		Files: []*os.File{slave, slave, slave},
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: sp.cred},
	})
	slave.Close()
	if err != nil {
		master.Close()
		return nil, errors.New("exec " + sp.argv[0] + ": " + unwrapExecErr(err))
	}
	t := &terminal{
		m: m, name: name, user: user, argv: sp.argv, created: time.Now(), ephemeral: ephemeral,
		pid: proc.Pid, proc: proc, ptmx: master,
		readDone: make(chan struct{}), finished: make(chan struct{}),
		cols: cols, rows: rows, ring: ring{size: guest.DefaultScrollback},
		clients: map[*termClient]struct{}{},
	}
	go t.readLoop()
	go t.waitLoop()
	return t, nil
}

func (t *terminal) info() guest.TermInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	return guest.TermInfo{
		Name: t.name, PID: t.pid, User: t.user, Argv: t.argv,
		Cols: t.cols, Rows: t.rows, Clients: len(t.clients),
		CreatedAt: t.created, Ephemeral: t.ephemeral,
		Exited: t.exited, ExitCode: t.status.ExitCode, Signal: t.status.Signal,
	}
}

func (t *terminal) isClosing() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closing
}

// readLoop copies the master's output to the scrollback and the clients
// until EIO (no process has the pty open any more) or until the master is
// closed.
func (t *terminal) readLoop() {
	defer close(t.readDone)
	buf := make([]byte, termReadChunk)
	for {
		n, err := t.ptmx.Read(buf)
		if n > 0 {
			t.output(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

func (t *terminal) output(p []byte) {
	var dropped []*termClient
	t.mu.Lock()
	t.ring.write(p)
	if !t.exited {
		for c := range t.clients {
			if !c.enqueue(p) {
				delete(t.clients, c)
				dropped = append(dropped, c)
			}
		}
	}
	t.mu.Unlock()
	for _, c := range dropped {
		t.m.a.logf("terminal %s: client too slow, dropped", t.name)
		c.abort()
	}
	if len(dropped) > 0 {
		t.lastGone()
	}
}

// waitLoop reaps the process and tells the clients.
func (t *terminal) waitLoop() {
	// Wait without reaping first: signals to the process group are only sent
	// while !dead, and until the process is reaped its pid (the group id)
	// cannot be reused.
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, t.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	t.mu.Lock()
	t.dead = true
	t.mu.Unlock()
	state, werr := t.proc.Wait()
	st := guest.ExitStatus{DurationMS: time.Since(t.created).Milliseconds()}
	if werr != nil {
		st.ExitCode = 255
		t.m.a.logf("terminal %s: wait: %v", t.name, werr)
	} else if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		st.ExitCode = 128 + int(ws.Signal())
		st.Signal = unix.SignalName(ws.Signal())
	} else {
		st.ExitCode = state.ExitCode()
	}
	// Forward the remaining output first (EIO comes once every holder of
	// the pty is gone; background jobs may keep it open).
	timer := time.NewTimer(termDrainWindow)
	select {
	case <-t.readDone:
	case <-timer.C:
	}
	timer.Stop()
	b, _ := json.Marshal(st)
	frame := api.AppendFrame(nil, api.FrameExit, b)
	t.mu.Lock()
	t.exited = true
	t.status = st
	for c := range t.clients {
		c.finish(frame)
	}
	t.mu.Unlock()
	close(t.finished)
	t.lastGone()
}

// lastGone removes an ephemeral terminal whose last client is gone.
func (t *terminal) lastGone() {
	if !t.ephemeral {
		return
	}
	t.mu.Lock()
	gone := t.hadClients && len(t.clients) == 0 && !t.closing
	if gone {
		t.closing = true // refuse new clients from now on
	}
	t.mu.Unlock()
	if gone && t.m.remove(t) {
		go t.shutdown()
	}
}

// fgPgrp returns the foreground process group of the pty (0 if unknown).
func (t *terminal) fgPgrp() int {
	rc, err := t.ptmx.SyscallConn()
	if err != nil {
		return 0
	}
	pg := 0
	rc.Control(func(fd uintptr) {
		if n, err := unix.IoctlGetInt(int(fd), unix.TIOCGPGRP); err == nil {
			pg = n
		}
	})
	return pg
}

// signal sends sig to the foreground process group, or to the session
// leader's group when that fails.
func (t *terminal) signal(sig syscall.Signal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead {
		return
	}
	if pg := t.fgPgrp(); pg > 0 && syscall.Kill(-pg, sig) == nil {
		return
	}
	syscall.Kill(-t.pid, sig)
}

// hangup sends sig to the session leader's group and to the foreground group.
func (t *terminal) hangup(sig syscall.Signal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dead {
		return
	}
	fg := t.fgPgrp()
	syscall.Kill(-t.pid, sig)
	if fg > 0 && fg != t.pid {
		syscall.Kill(-fg, sig)
	}
	switch sig {
	case syscall.SIGHUP:
		syscall.Kill(-t.pid, syscall.SIGCONT)
		if fg > 0 && fg != t.pid {
			syscall.Kill(-fg, syscall.SIGCONT)
		}
	case syscall.SIGKILL:
		// A shell killed outright cannot forward the hangup to its
		// background jobs (each in its own group), so the escalation
		// reaches every process of the session. The leader is not reaped
		// yet (!t.dead), so its pid, the session id, is not reused.
		for _, pid := range sessionPIDs(t.pid) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// shutdown ends a terminal that was removed from the manager: SIGHUP, then
// SIGKILL after the kill grace; clients get the exit frame if the process
// exited in time, then the master is closed (which hangs up whatever still
// has the pty open).
func (t *terminal) shutdown() {
	t.shutOnce.Do(func() {
		t.mu.Lock()
		t.closing = true
		t.mu.Unlock()
		t.hangup(syscall.SIGHUP)
		grace := t.m.a.opts.TermKillGrace
		timer := time.NewTimer(grace)
		select {
		case <-t.finished:
		case <-timer.C:
			t.hangup(syscall.SIGKILL)
			timer.Reset(grace)
			select {
			case <-t.finished:
			case <-timer.C:
				t.m.a.logf("terminal %s: process %d did not exit after SIGKILL", t.name, t.pid)
			}
		}
		timer.Stop()
		t.mu.Lock()
		cs := make([]*termClient, 0, len(t.clients))
		for c := range t.clients {
			cs = append(cs, c)
		}
		t.mu.Unlock()
		for _, c := range cs {
			c.abortUnlessFinishing()
		}
		t.ptmx.Close()
	})
}

func (t *terminal) resize(cols, rows int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := setWinsize(t.ptmx, cols, rows); err != nil {
		return err
	}
	t.cols, t.rows = cols, rows
	return nil
}

// setWinsize sets a pty's size (TIOCSWINSZ on the master).
func setWinsize(ptmx *os.File, cols, rows int) error {
	rc, err := ptmx.SyscallConn()
	if err != nil {
		return err
	}
	ws := unix.Winsize{Row: uint16(rows), Col: uint16(cols)}
	var ierr error
	if err := rc.Control(func(fd uintptr) { ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &ws) }); err != nil {
		return err
	}
	return ierr
}

// serveClient runs one attached client on a hijacked stream until it
// detaches, is dropped, or the terminal ends. The client is registered
// before the 101 goes out: a caller whose attach has returned gets all
// the output from then on (a client without scrollback attached while
// another typed once missed the answer under load).
func (t *terminal) serveClient(conn net.Conn, br *bufio.Reader, att guest.TermAttach) {
	c := &termClient{conn: conn, wake: make(chan struct{}, 1), wdone: make(chan struct{})}
	t.mu.Lock()
	if t.closing {
		t.mu.Unlock()
		conn.Close()
		return
	}
	// Snapshot and registration under the same lock: the replay and the
	// live output neither overlap nor leave a gap.
	if !att.NoScrollback {
		c.q = t.ring.appendFrames(c.q)
	}
	t.clients[c] = struct{}{}
	t.hadClients = true
	if t.exited {
		b, _ := json.Marshal(t.status)
		c.exit = api.AppendFrame(nil, api.FrameExit, b)
		c.done = true
		conn.SetWriteDeadline(time.Now().Add(termFinishTimeout))
	}
	t.mu.Unlock()
	if !sendSwitch(conn, guest.TermUpgrade) {
		t.mu.Lock()
		delete(t.clients, c)
		t.mu.Unlock()
		return
	}
	go c.writeLoop()
	if att.Cols > 0 && att.Rows > 0 {
		t.resize(att.Cols, att.Rows)
	}
	t.readClient(br)
	c.abort()
	<-c.wdone
	t.mu.Lock()
	_, ok := t.clients[c]
	delete(t.clients, c)
	t.mu.Unlock()
	if ok {
		t.lastGone()
	}
}

// readClient applies the client's frames until its stream ends.
func (t *terminal) readClient(br *bufio.Reader) {
	for {
		f, err := api.ReadFrame(br)
		if err != nil {
			return
		}
		switch f.Type {
		case api.FrameStdin:
			if len(f.Data) > 0 {
				t.ptmx.Write(f.Data)
			}
		case guest.FrameResize:
			var sz guest.TermSize
			if json.Unmarshal(f.Data, &sz) == nil && checkSize(sz.Cols, sz.Rows) == nil {
				t.resize(sz.Cols, sz.Rows)
			}
		case api.FrameSignal:
			if n, err := strconv.Atoi(strings.TrimSpace(string(f.Data))); err == nil && n > 0 && n < 65 {
				t.signal(syscall.Signal(n))
			}
		}
	}
}

// termClient is one attached stream. Output is queued (as frames) by the
// terminal's reader and written by the client's own goroutine, so a slow
// client blocks nobody.
type termClient struct {
	conn      net.Conn
	wake      chan struct{}
	wdone     chan struct{}
	closeOnce sync.Once

	mu      sync.Mutex
	q       []byte // framed output not yet written
	spare   []byte
	exit    []byte // exit frame, sent once q is empty
	done    bool   // no more output is accepted (finishing or aborted)
	aborted bool
}

func (c *termClient) notify() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// enqueue queues output; it returns false when the client is too far behind.
func (c *termClient) enqueue(p []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return true
	}
	if len(c.q)+len(p)+api.FrameHeaderLen > termClientQueueMax {
		return false
	}
	c.q = appendOutputFrames(c.q, p)
	c.notify()
	return true
}

// finish queues the exit frame after the pending output.
func (c *termClient) finish(frame []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return
	}
	c.done = true
	c.exit = frame
	c.conn.SetWriteDeadline(time.Now().Add(termFinishTimeout))
	c.notify()
}

// abort closes the stream at once, dropping queued output.
func (c *termClient) abort() {
	c.mu.Lock()
	c.done, c.aborted = true, true
	c.q, c.spare, c.exit = nil, nil, nil
	c.mu.Unlock()
	c.closeConn()
	c.notify()
}

// abortUnlessFinishing aborts a client that is not delivering an exit frame.
func (c *termClient) abortUnlessFinishing() {
	c.mu.Lock()
	finishing := c.exit != nil
	c.mu.Unlock()
	if !finishing {
		c.abort()
	}
}

// closeConn closes the stream; a yamux Close only half-closes, so the read
// deadline is what ends the client's pending read.
func (c *termClient) closeConn() {
	c.closeOnce.Do(func() {
		c.conn.Close()
		c.conn.SetReadDeadline(time.Now())
	})
}

func (c *termClient) writeLoop() {
	defer close(c.wdone)
	for {
		c.mu.Lock()
		if c.aborted {
			c.mu.Unlock()
			return
		}
		b := c.q
		if len(b) == 0 {
			exit := c.exit
			c.mu.Unlock()
			if exit == nil {
				<-c.wake
				continue
			}
			c.conn.Write(exit)
			c.closeConn()
			return
		}
		c.q, c.spare = c.spare[:0], nil
		c.mu.Unlock()
		_, err := c.conn.Write(b)
		if err != nil {
			c.abort()
			return
		}
		if cap(b) <= 1<<20 {
			c.mu.Lock()
			if !c.aborted {
				c.spare = b[:0]
			}
			c.mu.Unlock()
		}
	}
}

// appendOutputFrames appends p to q as FrameStdout frames.
func appendOutputFrames(q, p []byte) []byte {
	for len(p) > 0 {
		n := min(len(p), termFrameMax)
		q = api.AppendFrame(q, api.FrameStdout, p[:n])
		p = p[n:]
	}
	return q
}

// ring keeps the last size bytes written to it.
type ring struct {
	size int
	buf  []byte // grows up to size, then wraps
	w    int    // once full: the next write position (the oldest byte)
}

func (r *ring) write(p []byte) {
	if len(p) >= r.size {
		p = p[len(p)-r.size:]
		r.buf = append(r.buf[:0], p...)
		r.w = 0
		return
	}
	if len(r.buf) < r.size {
		room := r.size - len(r.buf)
		if len(p) <= room {
			r.buf = append(r.buf, p...)
			return
		}
		r.buf = append(r.buf, p[:room]...)
		p = p[room:]
		r.w = 0
	}
	n := copy(r.buf[r.w:], p)
	if n < len(p) {
		r.w = copy(r.buf, p[n:])
	} else {
		r.w += n
		if r.w == r.size {
			r.w = 0
		}
	}
}

// appendFrames appends the kept bytes, oldest first, as output frames.
func (r *ring) appendFrames(q []byte) []byte {
	if len(r.buf) < r.size {
		return appendOutputFrames(q, r.buf)
	}
	q = appendOutputFrames(q, r.buf[r.w:])
	return appendOutputFrames(q, r.buf[:r.w])
}

// bytes returns a copy of the kept bytes, oldest first.
func (r *ring) bytes() []byte {
	if len(r.buf) < r.size {
		return append([]byte(nil), r.buf...)
	}
	out := make([]byte, 0, r.size)
	out = append(out, r.buf[r.w:]...)
	return append(out, r.buf[:r.w]...)
}
