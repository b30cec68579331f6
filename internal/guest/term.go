package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/hashicorp/yamux"
)

func termPath(name string) string { return PathTerms + "/" + url.PathEscape(name) }

// CreateTerm starts a terminal (POST /v1/terms).
func (c *Client) CreateTerm(ctx context.Context, req TermCreate) (*TermInfo, error) {
	var info TermInfo
	if err := c.do(ctx, http.MethodPost, PathTerms, req, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// ListTerms returns the terminals, sorted by name.
func (c *Client) ListTerms(ctx context.Context) ([]TermInfo, error) {
	var list TermList
	if err := c.do(ctx, http.MethodGet, PathTerms, nil, &list); err != nil {
		return nil, err
	}
	return list.Terminals, nil
}

// GetTerm describes one terminal; an unknown name gives an *APIError with
// Status 404 and Code "not_found".
func (c *Client) GetTerm(ctx context.Context, name string) (*TermInfo, error) {
	var info TermInfo
	if err := c.do(ctx, http.MethodGet, termPath(name), nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// DeleteTerm hangs up the terminal's processes (SIGHUP, SIGKILL after about
// 2 s) and removes it. It returns once the process is gone.
func (c *Client) DeleteTerm(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, termPath(name), nil, nil)
}

// ResizeTerm sets the terminal size.
func (c *Client) ResizeTerm(ctx context.Context, name string, size TermSize) error {
	return c.do(ctx, http.MethodPost, termPath(name)+"/resize", size, nil)
}

// SignalTerm sends a signal ("INT", "SIGTERM", "9", ...) to the terminal's
// foreground process group.
func (c *Client) SignalTerm(ctx context.Context, name, sig string) error {
	return c.do(ctx, http.MethodPost, termPath(name)+"/signal", TermSignal{Signal: sig}, nil)
}

// upgrade sends an HTTP upgrade request on a new stream and returns the
// stream and the reader holding any bytes that followed the 101 answer. ctx
// bounds only the request.
func (c *Client) upgrade(ctx context.Context, path, proto string, body any) (*yamux.Stream, *bufio.Reader, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return nil, nil, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+path, bytes.NewReader(b))
	if err != nil {
		return nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", proto)
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	st, err := c.gate.open()
	if err != nil {
		return nil, nil, fmt.Errorf("guest: %s: %w", path, err)
	}
	stop := context.AfterFunc(ctx, func() {
		st.Close()
		st.SetDeadline(time.Unix(1, 0))
	})
	fail := func(err error) (*yamux.Stream, *bufio.Reader, error) {
		stop()
		st.Close()
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		return nil, nil, err
	}
	if err := req.Write(st); err != nil {
		return fail(fmt.Errorf("guest: %s: %w", path, err))
	}
	// http.ReadResponse has no header limit of its own (textproto joins a
	// line of any length), so the guest's answer is read through a bound
	// that is lifted once the headers are in: what follows is the
	// flow-controlled stream.
	lim := newBoundedReader(st, MaxHeaderBytes)
	br := bufio.NewReaderSize(lim, maxLineBytes)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fail(fmt.Errorf("guest: %s: %w", path, err))
	}
	lim.unbound()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		err := decodeAPIError(resp)
		resp.Body.Close()
		return fail(err)
	}
	if !stop() {
		st.Close()
		return nil, nil, ctx.Err()
	}
	return st, br, nil
}

// TermStream is a client attached to a terminal. Frames from the guest are
// read with Next (one reader at a time): api.FrameStdout (the scrollback replay
// first, then live output) and, once the process has exited, api.FrameExit
// (JSON ExitStatus) as the last frame. Write, Resize and Signal may be
// called concurrently with Next. Closing the stream detaches; the terminal
// keeps running (unless it is ephemeral and this was its last client).
type TermStream struct {
	// Tap, when set, sees the input written, the output read and the
	// resizes (recordings). Set it before the first Write or Next.
	Tap       Tap
	st        *yamux.Stream
	br        *bufio.Reader
	wmu       sync.Mutex
	closeOnce sync.Once
	closed    atomic.Bool
	stopCtx   func() bool
}

// AttachTerm attaches to a terminal. Cancelling ctx closes the stream.
func (c *Client) AttachTerm(ctx context.Context, name string, a TermAttach) (*TermStream, error) {
	st, br, err := c.upgrade(ctx, termPath(name)+"/attach", TermUpgrade, a)
	if err != nil {
		return nil, err
	}
	s := &TermStream{st: st, br: br}
	s.stopCtx = context.AfterFunc(ctx, func() { s.Close() })
	return s, nil
}

func (s *TermStream) writeFrame(typ byte, p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return api.WriteFrame(s.st, typ, p)
}

// Write sends p as input (typed keys).
func (s *TermStream) Write(p []byte) (int, error) {
	const max = 256 << 10
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), max)]
		if err := s.writeFrame(api.FrameStdin, chunk); err != nil {
			return n, err
		}
		if s.Tap != nil {
			s.Tap.Input(chunk)
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// Resize sets the terminal size.
func (s *TermStream) Resize(cols, rows int) error {
	b, err := json.Marshal(TermSize{Cols: cols, Rows: rows})
	if err != nil {
		return err
	}
	if s.Tap != nil {
		s.Tap.Resize(cols, rows)
	}
	return s.writeFrame(FrameResize, b)
}

// Signal sends sig to the terminal's foreground process group.
func (s *TermStream) Signal(sig syscall.Signal) error {
	return s.writeFrame(api.FrameSignal, []byte(strconv.Itoa(int(sig))))
}

// Next returns the next frame. After api.FrameExit the guest ends the stream
// (io.EOF); it also ends it without api.FrameExit when the terminal is deleted
// while its process survives, or when this client fell too far behind (the
// client may reattach and gets the scrollback).
func (s *TermStream) Next() (api.Frame, error) {
	f, err := api.ReadFrame(s.br)
	if err != nil && s.closed.Load() {
		err = net.ErrClosed
	}
	if err == nil && s.Tap != nil && f.Type == api.FrameStdout {
		s.Tap.Output(f.Data, false)
	}
	return f, err
}

// Close detaches.
func (s *TermStream) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		if s.stopCtx != nil {
			s.stopCtx()
		}
		s.st.Close()
		s.st.SetReadDeadline(time.Unix(1, 0)) // end a pending Next
	})
	return nil
}

// DialTCP connects to host:port from inside the guest (host "" means
// 127.0.0.1). ctx bounds only the connection setup. A guest-side dial
// failure is an *APIError with Code "unreachable" (Status 502).
//
// The returned conn has CloseWrite (via interface{ CloseWrite() error }):
// it ends the data sent to the guest, which then half-closes its TCP
// connection; reading continues until the guest side ends. Close also only
// sends that end-of-data marker to the guest (yamux has no reset); the
// guest closes its connection once the TCP peer closes, and yamux resets
// the stream after its StreamCloseTimeout if the peer never does.
func (c *Client) DialTCP(ctx context.Context, host string, port int) (net.Conn, error) {
	q := url.Values{}
	if host != "" {
		q.Set("host", host)
	} else {
		host = "127.0.0.1"
	}
	q.Set("port", strconv.Itoa(port))
	st, br, err := c.upgrade(ctx, PathTCP+"?"+q.Encode(), TCPUpgrade, nil)
	if err != nil {
		return nil, err
	}
	return &tcpConn{st: st, br: br, raddr: guestAddr(net.JoinHostPort(host, strconv.Itoa(port)))}, nil
}

// SFTP opens an SFTP session in the guest running as user (see PathSFTP).
// Close ends it.
func (c *Client) SFTP(ctx context.Context, user string) (net.Conn, error) {
	q := url.Values{}
	if user != "" {
		q.Set("user", user)
	}
	st, br, err := c.upgrade(ctx, PathSFTP+"?"+q.Encode(), SFTPUpgrade, nil)
	if err != nil {
		return nil, err
	}
	return &tcpConn{st: st, br: br, raddr: guestAddr("sftp")}, nil
}

// guestAddr is the address a DialTCP connection reaches inside the guest.
type guestAddr string

func (a guestAddr) Network() string { return "tcp" }
func (a guestAddr) String() string  { return string(a) }

type tcpConn struct {
	st     *yamux.Stream
	br     *bufio.Reader
	raddr  net.Addr
	rmu    sync.Mutex
	closed atomic.Bool
}

// mapErr makes deadline errors match os.ErrDeadlineExceeded, as net.Conn
// implementations do.
func (c *tcpConn) mapErr(err error) error {
	if err == nil {
		return nil
	}
	if c.closed.Load() {
		return net.ErrClosed
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return os.ErrDeadlineExceeded
	}
	return err
}

func (c *tcpConn) Read(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	c.rmu.Lock()
	n, err := c.br.Read(p)
	c.rmu.Unlock()
	return n, c.mapErr(err)
}

func (c *tcpConn) Write(p []byte) (int, error) {
	if c.closed.Load() {
		return 0, net.ErrClosed
	}
	n, err := c.st.Write(p)
	return n, c.mapErr(err)
}

// CloseWrite signals the end of the data sent to the guest.
func (c *tcpConn) CloseWrite() error { return c.st.Close() }

func (c *tcpConn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	err := c.st.Close()
	c.st.SetReadDeadline(time.Unix(1, 0)) // end a pending Read
	return err
}

func (c *tcpConn) LocalAddr() net.Addr                { return c.st.LocalAddr() }
func (c *tcpConn) RemoteAddr() net.Addr               { return c.raddr }
func (c *tcpConn) SetDeadline(t time.Time) error      { return c.st.SetDeadline(t) }
func (c *tcpConn) SetReadDeadline(t time.Time) error  { return c.st.SetReadDeadline(t) }
func (c *tcpConn) SetWriteDeadline(t time.Time) error { return c.st.SetWriteDeadline(t) }
