package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
)

// ExecStream is a running command with full-duplex streaming: stdin in, stdout and
// stderr out as produced, separately.
type ExecStream struct {
	rwc  io.ReadWriteCloser
	wmu  sync.Mutex
	once sync.Once
	stop func() bool // unregisters the context watcher
}

// StartExec starts a command over the upgraded exec protocol.
func (c *Client) StartExec(ctx context.Context, id string, req api.ExecRequest) (*ExecStream, error) {
	hreq, err := c.newRequest(ctx, "POST", "/v1/vms/"+url.PathEscape(id)+"/exec", req)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Connection", "Upgrade")
	hreq.Header.Set("Upgrade", api.ExecUpgrade)
	resp, err := c.HTTP.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("cannot reach agentvm at %s (is `agentvm serve` running?): %w", c.BaseURL, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, errors.New("exec: server did not upgrade the connection")
	}
	s := &ExecStream{rwc: rwc}
	s.stop = context.AfterFunc(ctx, func() { s.Close() })
	return s, nil
}

func (s *ExecStream) frame(t byte, p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return api.WriteFrame(s.rwc, t, p)
}

// Write sends stdin.
func (s *ExecStream) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += 64 << 10 {
		end := min(off+64<<10, len(p))
		if err := s.frame(api.FrameStdin, p[off:end]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// CloseStdin signals end of input.
func (s *ExecStream) CloseStdin() error { return s.frame(api.FrameStdinEOF, nil) }

// Signal delivers a signal to the command's process group.
func (s *ExecStream) Signal(sig syscall.Signal) error {
	return s.frame(api.FrameSignal, []byte(strconv.Itoa(int(sig))))
}

// Close ends the stream; a still-running command is killed.
func (s *ExecStream) Close() error {
	var err error
	s.once.Do(func() {
		if s.stop != nil {
			s.stop()
		}
		err = s.rwc.Close()
	})
	return err
}

// Wait copies output to stdout and stderr until the command exits. Error frames
// (for example "command not found") are written to stderr.
func (s *ExecStream) Wait(stdout, stderr io.Writer) (*api.ExitStatus, error) {
	buf := make([]byte, 64<<10)
	for {
		f, err := api.ReadFrameReuse(s.rwc, &buf)
		if err != nil {
			return nil, fmt.Errorf("exec stream ended before the command exited: %w", err)
		}
		p := f.Data
		switch f.Type {
		case api.FrameStdout:
			if stdout != nil {
				stdout.Write(p)
			}
		case api.FrameStderr:
			if stderr != nil {
				stderr.Write(p)
			}
		case api.FrameError:
			var e struct{ Message string }
			json.Unmarshal(p, &e)
			if stderr != nil && e.Message != "" {
				fmt.Fprintln(stderr, e.Message)
			}
		case api.FrameExit:
			var es api.ExitStatus
			if err := json.Unmarshal(p, &es); err != nil {
				return nil, fmt.Errorf("exec: bad exit frame: %w", err)
			}
			return &es, nil
		}
	}
}

// Run executes a command streaming stdin (if non-nil) and output, and returns
// its exit status. A non-zero exit is not an error.
func (c *Client) Run(ctx context.Context, id string, req api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*api.ExitStatus, error) {
	s, err := c.StartExec(ctx, id, req)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if stdin != nil {
		go func() {
			if _, err := io.Copy(s, stdin); err == nil {
				s.CloseStdin()
			}
		}()
	} else {
		s.CloseStdin()
	}
	return s.Wait(stdout, stderr)
}

// DialTCP opens a raw TCP stream to port inside the VM, through the server. The
// returned connection supports CloseWrite (half-close) when the server is reached
// over plain TCP.
func (c *Client) DialTCP(ctx context.Context, id string, port int) (net.Conn, error) {
	u, err := url.Parse(c.BaseURL)
	if err != nil || u.Scheme != "http" {
		return nil, fmt.Errorf("DialTCP needs an http:// server URL, got %q", c.BaseURL)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, fmt.Errorf("cannot reach agentvm at %s: %w", c.BaseURL, err)
	}
	req, _ := c.newRequest(ctx, "GET", fmt.Sprintf("/v1/vms/%s/tcp/%d", url.PathEscape(id), port), nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.TCPUpgrade)
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		return nil, decodeError(resp)
	}
	conn.SetDeadline(time.Time{})
	return &upgradedConn{Conn: conn, r: br}, nil
}

// upgradedConn reads first what the response parser buffered.
type upgradedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *upgradedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection: the service in the VM sees EOF.
func (c *upgradedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
