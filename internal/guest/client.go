package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/agentvm/agentvm/api"
	"github.com/hashicorp/yamux"
)

// Client is the host side of the agent channel: one yamux session over the
// VM's virtio-serial socket, with net/http on top.
type Client struct {
	conn    net.Conn
	sess    *yamux.Session
	tr      *http.Transport
	hc      *http.Client
	hs      HandshakeResult
	gate    *streamGate
	closeMu sync.Once
}

// Connect dials the unix socket, performs the handshake (bounded by ctx) and
// starts a yamux client session.
func Connect(ctx context.Context, sockPath string, o HandshakeOptions) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sockPath)
	if err != nil {
		return nil, fmt.Errorf("guest: dial %s: %w", sockPath, err)
	}
	c, err := NewClient(ctx, conn, o)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// NewClient performs the handshake on an established connection (for tests
// and other transports) and starts the yamux client session. The client owns
// conn afterwards.
func NewClient(ctx context.Context, conn net.Conn, o HandshakeOptions) (*Client, error) {
	hc, res, err := HostHandshake(ctx, conn, o)
	if err != nil {
		return nil, err
	}
	cfg := YamuxConfig(true)
	// What yamux says of a session it ends (a keepalive the guest did not
	// answer in time, a bad frame) is the one trace of why every stream of
	// the VM's agent broke at once.
	cfg.LogOutput = sessionLog{}
	sess, err := yamux.Client(hc, cfg)
	if err != nil {
		return nil, fmt.Errorf("guest: yamux: %w", err)
	}
	// The host never accepts streams; an unaccepted one the guest opens
	// would sit in the accept backlog (256 of them, each with a 256 KiB
	// window) until the session ends. After GoAway the session answers
	// every SYN from the guest with RST at once; streams the host opens
	// are not affected.
	if err := sess.GoAway(); err != nil {
		sess.Close()
		return nil, fmt.Errorf("guest: yamux: %w", err)
	}
	c := &Client{conn: conn, sess: sess, hs: *res, gate: &streamGate{sess: sess, max: MaxStreams}}
	c.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return c.gate.open()
		},
		DisableCompression: true,
		// Large request bodies (file uploads) leave in big yamux frames:
		// every frame costs the guest's emulated CPU a parse and a wake-up.
		WriteBufferSize:     256 << 10,
		ReadBufferSize:      256 << 10,
		MaxIdleConns:        32,
		MaxIdleConnsPerHost: 32,
		ForceAttemptHTTP2:   false,
		// The guest is untrusted: the default allows 10 MiB of headers
		// per response.
		MaxResponseHeaderBytes: MaxHeaderBytes,
	}
	c.hc = &http.Client{Transport: c.tr}
	return c, nil
}

// AgentVersion is the version string the guest reported in the handshake.
func (c *Client) AgentVersion() string { return c.hs.AgentVersion }

// ClockSent says whether the handshake gave the agent the host's clock to
// set (HandshakeOptions.SetClock, to an agent that sets it).
func (c *Client) ClockSent() bool { return c.hs.ClockSent }

// Ping makes a round trip through the session (a yamux ping, no stream):
// once it returns, the agent serves the session, having set the clock the
// handshake gave it.
func (c *Client) Ping(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { // yamux's ping ends with the session, or after twice ConnectionWriteTimeout
		_, err := c.sess.Ping()
		errc <- err
	}()
	select {
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("guest: ping: %w", err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close ends the session and the connection.
func (c *Client) Close() error {
	c.closeMu.Do(func() {
		c.tr.CloseIdleConnections()
		c.sess.Close()
		c.conn.Close()
	})
	return nil
}

// Done is closed when the session dies (the host should then reconnect).
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// HTTPClient returns an http.Client whose requests travel over the agent
// session (URL host is ignored), for endpoints without a typed method.
func (c *Client) HTTPClient() *http.Client { return c.hc }

const baseURL = "http://agentvm"

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, baseURL+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("guest: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return decodeAPIError(resp)
	}
	if out == nil {
		if err := drainBounded(resp.Body, MaxReplyBytes); err != nil {
			return fmt.Errorf("guest: %s %s: %w", method, path, err)
		}
		return nil
	}
	return decodeReply(resp.Body, method+" "+path, out)
}

// decodeReply decodes one JSON reply of at most MaxReplyBytes.
func decodeReply(body io.Reader, what string, out any) error {
	if err := json.NewDecoder(newBoundedReader(body, MaxReplyBytes)).Decode(out); err != nil {
		return fmt.Errorf("guest: %s: decode: %w", what, err)
	}
	return nil
}

// decodeAPIError reads a non-2xx answer; its body is cut at
// MaxErrorBodyBytes (an error message needs no more).
func decodeAPIError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBodyBytes))
	var env ErrorEnvelope
	if json.Unmarshal(b, &env) == nil && env.Error != nil {
		env.Error.Status = resp.StatusCode
		return env.Error
	}
	return &APIError{Status: resp.StatusCode, Code: "http_" + strconv.Itoa(resp.StatusCode), Message: string(bytes.TrimSpace(b))}
}

// Info returns GET /v1/info.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	var info Info
	if err := c.do(ctx, http.MethodGet, PathInfo, nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// Healthz checks GET /v1/healthz.
func (c *Client) Healthz(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, PathHealthz, nil, nil)
}

// SetIdentity pushes a new identity (POST /v1/identity).
func (c *Client) SetIdentity(ctx context.Context, id Identity) error {
	_, err := c.ApplyIdentity(ctx, id)
	return err
}

// ApplyIdentity is SetIdentity returning the guest-side result (duration).
func (c *Client) ApplyIdentity(ctx context.Context, id Identity) (*IdentityResult, error) {
	var res IdentityResult
	if err := c.do(ctx, http.MethodPost, PathIdentity, id, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecStream is a running command on the guest. Frames from the guest are
// read with Next (one reader at a time); Write, CloseStdin and Signal may be
// called concurrently with Next.
type ExecStream struct {
	// OnExit, when set, is called with the exit status as it arrives.
	OnExit func(ExitStatus)
	// Tap, when set, sees the stdin written and the output read
	// (recordings). Set it before the first Write or Next.
	Tap Tap

	rwc       io.ReadWriteCloser
	wmu       sync.Mutex
	closeOnce sync.Once
	stopCtx   func() bool
}

// Exec starts a command. ctx covers the whole exec: cancelling it closes the
// stream, which makes the guest kill the process group. Errors detected
// before the start (bad user, cwd, request) are returned as *APIError.
func (c *Client) Exec(ctx context.Context, req ExecRequest) (*ExecStream, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+PathExec, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Connection", "Upgrade")
	hreq.Header.Set("Upgrade", ExecUpgrade)
	resp, err := c.hc.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("guest: exec: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return nil, decodeAPIError(resp)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, errors.New("guest: exec: upgraded body is not writable")
	}
	s := &ExecStream{rwc: rwc}
	s.stopCtx = context.AfterFunc(ctx, func() { s.Close() })
	return s, nil
}

func (s *ExecStream) writeFrame(typ byte, p []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return api.WriteFrame(s.rwc, typ, p)
}

// Write sends p as stdin (the request must have Stdin set).
func (s *ExecStream) Write(p []byte) (int, error) {
	const max = 256 << 10
	n := 0
	for len(p) > 0 {
		chunk := p
		if len(chunk) > max {
			chunk = chunk[:max]
		}
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

// A Tap sees what passes through a stream, as the recordings keep it.
// Its methods are called from the stream's reader and writers at once.
type Tap interface {
	Input(p []byte)               // stdin, typed keys
	Output(p []byte, stderr bool) // stdout or stderr
	Resize(cols, rows int)        // a terminal's new size
}

// CloseStdin sends stdin EOF.
func (s *ExecStream) CloseStdin() error { return s.writeFrame(api.FrameStdinEOF, nil) }

// Signal sends sig to the command's process group.
func (s *ExecStream) Signal(sig syscall.Signal) error {
	return s.writeFrame(api.FrameSignal, []byte(strconv.Itoa(int(sig))))
}

// Next returns the next frame from the guest (api.FrameStdout, api.FrameStderr,
// api.FrameError, api.FrameExit). api.FrameExit is the last frame.
func (s *ExecStream) Next() (api.Frame, error) {
	f, err := api.ReadFrame(s.rwc)
	if err == nil && s.Tap != nil && (f.Type == api.FrameStdout || f.Type == api.FrameStderr) {
		s.Tap.Output(f.Data, f.Type == api.FrameStderr)
	}
	if err == nil && f.Type == api.FrameExit && s.OnExit != nil {
		var st ExitStatus
		if json.Unmarshal(f.Data, &st) == nil {
			s.OnExit(st)
		}
	}
	return f, err
}

// Close closes the stream; if the command is still running the guest kills
// its process group.
func (s *ExecStream) Close() error {
	var err error
	s.closeOnce.Do(func() {
		if s.stopCtx != nil {
			s.stopCtx()
		}
		err = s.rwc.Close()
	})
	return err
}

// ExecError is returned by Run together with the exit status when the guest
// reported an error frame (e.g. command not found).
type ExecError struct{ Message string }

func (e *ExecError) Error() string { return "guest exec: " + e.Message }

// Wait relays frames to stdout/stderr (nil discards) until the exit frame
// and returns the exit status. Error frames are collected (up to
// maxExecErrorBytes: the guest could send them without end); if any
// arrived, Wait returns the status together with an *ExecError.
func (s *ExecStream) Wait(stdout, stderr io.Writer) (*ExitStatus, error) {
	var (
		msgs    []string
		msgLen  int
		dropped bool
	)
	for {
		f, err := s.Next()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("guest: exec stream ended before exit: %w", err)
		}
		switch f.Type {
		case api.FrameStdout:
			if stdout != nil {
				stdout.Write(f.Data)
			}
		case api.FrameStderr:
			if stderr != nil {
				stderr.Write(f.Data)
			}
		case api.FrameError:
			var e ErrorBody
			if json.Unmarshal(f.Data, &e) != nil {
				e.Message = string(f.Data)
			}
			if msgLen+len(e.Message) > maxExecErrorBytes {
				dropped = true
				continue
			}
			msgLen += len(e.Message)
			msgs = append(msgs, e.Message)
		case api.FrameExit:
			var st ExitStatus
			if err := json.Unmarshal(f.Data, &st); err != nil {
				return nil, fmt.Errorf("guest: bad exit frame: %w", err)
			}
			if dropped {
				msgs = append(msgs, fmt.Sprintf("(further guest errors dropped beyond %d bytes)", maxExecErrorBytes))
			}
			if len(msgs) > 0 {
				return &st, &ExecError{Message: joinMsgs(msgs)}
			}
			return &st, nil
		}
	}
}

func joinMsgs(m []string) string {
	var b bytes.Buffer
	for i, s := range m {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(s)
	}
	return b.String()
}

// Run executes req and waits for it. If stdin is non-nil it is streamed to
// the command (req.Stdin is set) and closed at its EOF. A non-zero exit code
// is not an error; check ExitStatus.
func (c *Client) Run(ctx context.Context, req ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*ExitStatus, error) {
	if stdin != nil {
		req.Stdin = true
	}
	s, err := c.Exec(ctx, req)
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
	}
	st, err := s.Wait(stdout, stderr)
	if err != nil && st == nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return st, err
}

// sessionLog passes yamux's log lines to the daemon's log, at warn level,
// but for a write to a QEMU that is gone (broken pipe, reset): its exit is
// logged where it is handled, and every delete would say it again here.
type sessionLog struct{}

func (sessionLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	if !strings.Contains(line, "broken pipe") && !strings.Contains(line, "connection reset") {
		slog.Warn("guest agent session", "yamux", line)
	}
	return len(p), nil
}
