package e2b

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/record"
	"github.com/agentvm/agentvm/internal/store"
)

// envd, served by the daemon for each sandbox's port 49983 on top of the
// VM's guest agent: the preview proxy hands those requests here.

// envdCall is one envd request: the sandbox, the caller's user and the
// VM's agent.
type envdCall struct {
	s    *Server
	vm   *store.VM
	p    *auth.Principal // the key the envd token or signature is bound to
	user string
	g    *guest.Client
	ka   time.Duration // keepalive interval of streams
}

// route tells the preview proxy which sandbox and port a request names
// when its Host is not a preview host: E2B's SDKs send E2b-Sandbox-Id and
// E2b-Sandbox-Port with every envd request (and E2B_SANDBOX_URL points
// them at the proxy's address).
func route(r *http.Request) (ref string, port int, ok bool) {
	id := r.Header.Get("E2b-Sandbox-Id")
	if id == "" {
		return "", 0, false
	}
	port, err := strconv.Atoi(r.Header.Get("E2b-Sandbox-Port"))
	if err != nil || port < 1 || port > 65535 {
		port = EnvdPort
	}
	return id, port, true
}

// Owns reports whether v is an E2B sandbox: its ports are public, as E2B
// sandboxes' are, and its proxy errors are E2B's.
func (s *Server) Owns(ctx context.Context, v *store.VM) bool {
	_, err := s.cfg.Store.GetSandbox(ctx, v.ID)
	return err == nil
}

// notFound answers a request for a sandbox that does not exist or does not
// run, as E2B's proxy does (the SDKs read "was not found" as "not running").
func notFound(w http.ResponseWriter, id string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	json.NewEncoder(w).Encode(map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway})
}

// portClosed answers a request for a port nothing listens on.
func portClosed(w http.ResponseWriter, id string, port int) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	json.NewEncoder(w).Encode(map[string]any{"sandboxId": id, "message": "The sandbox is running but port is not open", "port": port, "code": http.StatusBadGateway})
}

// Envd serves one envd request for sandbox v. The proxy calls it (through
// Proxy.Serve) only for running VMs that Owns accepted, so the sandbox
// record is not looked up a second time on this hot path.
func (s *Server) Envd(w http.ResponseWriter, r *http.Request, v *store.VM) {
	signed := r.URL.Path == "/files" && r.URL.Query().Has("signature") && r.Header.Get("X-Access-Token") == ""
	var p *auth.Principal
	var err error
	if signed {
		p, err = s.signer(r, v.ID)
	} else {
		p, err = s.envdPrincipal(r.Context(), v.ID, r.Header.Get("X-Access-Token"))
	}
	if err != nil {
		envdAuthError(w, err)
		return
	}
	// Tracked under its key: a revoke or expiry ends the request, and any
	// stream it holds open, at once.
	w, r, done, err := s.cfg.Tokens.TrackHTTP(w, r, p)
	if err != nil {
		envdHTTPError(w, http.StatusTooManyRequests, err.Error())
		return
	}
	defer done()
	if r.URL.Path == "/health" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	user, err := basicUser(r)
	if err != nil {
		envdHTTPError(w, http.StatusUnauthorized, err.Error())
		return
	}
	_, g, err := s.cfg.VMs.Guest(r.Context(), v.ID)
	if err != nil {
		notFound(w, v.Name)
		return
	}
	c := &envdCall{s: s, vm: v, p: p, user: user, g: g, ka: keepalive(r)}
	switch r.URL.Path {
	case "/files":
		switch r.Method {
		case http.MethodGet:
			c.download(w, r, signed)
		case http.MethodPost:
			c.upload(w, r, signed)
		default:
			envdHTTPError(w, http.StatusMethodNotAllowed, "use GET or POST on /files")
		}
		return
	}
	if r.Method != http.MethodPost {
		envdHTTPError(w, http.StatusNotFound, "no such envd endpoint: "+r.Method+" "+r.URL.Path)
		return
	}
	switch r.URL.Path {
	case "/process.Process/Start":
		serverStream(w, r, c.start)
	case "/process.Process/Connect":
		serverStream(w, r, c.connect)
	case "/process.Process/List":
		unary(w, r, c.list)
	case "/process.Process/SendInput":
		unary(w, r, c.sendInput)
	case "/process.Process/SendSignal":
		unary(w, r, c.sendSignal)
	case "/process.Process/CloseStdin":
		unary(w, r, c.closeStdin)
	case "/process.Process/Update":
		unary(w, r, c.update)
	case "/process.Process/StreamInput":
		c.streamInput(w, r)
	case "/filesystem.Filesystem/Stat":
		unary(w, r, c.stat)
	case "/filesystem.Filesystem/ListDir":
		unary(w, r, c.listDir)
	case "/filesystem.Filesystem/MakeDir":
		unary(w, r, c.makeDir)
	case "/filesystem.Filesystem/Move":
		unary(w, r, c.move)
	case "/filesystem.Filesystem/Remove":
		unary(w, r, c.remove)
	case "/filesystem.Filesystem/WatchDir":
		serverStream(w, r, c.watchDir)
	case "/filesystem.Filesystem/CreateWatcher":
		unary(w, r, c.createWatcher)
	case "/filesystem.Filesystem/GetWatcherEvents":
		unary(w, r, c.getWatcherEvents)
	case "/filesystem.Filesystem/RemoveWatcher":
		unary(w, r, c.removeWatcher)
	default:
		writeUnaryError(w, rpcErr(codeUnimplemented, "%s is not implemented", r.URL.Path))
	}
}

// envdHTTPError is the error body of envd's plain HTTP endpoints.
func envdHTTPError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiErr{Code: status, Message: msg})
}

// basicUser reads the user of "Authorization: Basic base64(user:)".
func basicUser(r *http.Request) (string, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return DefaultUser, nil
	}
	enc, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return "", errors.New("Authorization must be Basic base64(<user>:)")
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", errors.New("Authorization: bad base64")
	}
	user, _, _ := strings.Cut(string(b), ":")
	if user == "" {
		return DefaultUser, nil
	}
	if !validUser(user) {
		return "", errors.New("invalid username")
	}
	return user, nil
}

// validUser: a plausible user name or uid, which never reads as an option.
func validUser(u string) bool {
	return u != "" && len(u) <= 64 && !strings.ContainsAny(u, "/:\x00\n\t ") && !strings.HasPrefix(u, "-")
}

// guestRPCError maps an agent error to a Connect error.
func guestRPCError(err error) error {
	var ae *guest.APIError
	if !errors.As(err, &ae) {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return err
		}
		return rpcErr(codeUnavailable, "the sandbox's agent: %v", err)
	}
	switch ae.Code {
	case guest.CodeUnknownUser:
		return rpcErr(codeUnauthenticated, "invalid username: %s", ae.Message)
	case guest.CodeNotFound:
		return rpcErr(codeNotFound, "%s", ae.Message)
	case guest.CodeInvalid, guest.CodeIsDirectory, guest.CodeNotDirectory, guest.CodeNotEmpty:
		return rpcErr(codeInvalidArgument, "%s", ae.Message)
	case guest.CodeExists:
		return rpcErr(codeAlreadyExists, "%s", ae.Message)
	case guest.CodePermission:
		return rpcErr(codePermissionDenied, "%s", ae.Message)
	case guest.CodeNoSpace, guest.CodeTooMany:
		return rpcErr(codeResourceExhausted, "%s", ae.Message)
	case guest.CodeConflict:
		return rpcErr(codeFailedPrecondition, "%s", ae.Message)
	}
	return rpcErr(codeInternal, "%s", ae.Message)
}

// keepalive is the interval of keepalive messages a stream asks for
// (Keepalive-Ping-Interval, seconds), bounded to 1 s - 5 min.
func keepalive(r *http.Request) time.Duration {
	sec, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval"))
	if err != nil || sec <= 0 {
		sec = 50
	}
	return time.Duration(min(max(sec, 1), 300)) * time.Second
}

// processStart is process.Process/Start.
func (c *envdCall) start(ctx context.Context, req *startRequest, st *stream) error {
	if req.Process == nil || req.Process.Cmd == "" {
		return rpcErr(codeInvalidArgument, "process.cmd is required")
	}
	ps := guest.ProcStart{Argv: append([]string{req.Process.Cmd}, req.Process.Args...), Env: req.Process.Envs, User: c.user,
		Stdin: req.Stdin == nil || *req.Stdin}
	if req.Process.Cwd != nil {
		ps.Cwd = *req.Process.Cwd
	}
	if req.Tag != nil {
		ps.Tag = *req.Tag
	}
	if req.PTY != nil {
		if req.PTY.Size == nil {
			return rpcErr(codeInvalidArgument, "pty.size is required")
		}
		ps.PTY = &guest.PTYSize{Cols: int(req.PTY.Size.Cols), Rows: int(req.PTY.Size.Rows)}
	}
	if dl, ok := ctx.Deadline(); ok {
		// The call's deadline is the process's own time limit.
		ps.TimeoutMS = max(time.Until(dl).Milliseconds(), 1)
	}
	// The process outlives this call: the agent stream is tied to the
	// client's connection only, not to the deadline (the agent enforces
	// that and reports it).
	ps2, err := c.g.StartProc(context.WithoutCancel(ctx), ps)
	if err != nil {
		return guestRPCError(err)
	}
	// Who ran what as whom, as the native exec records it.
	c.s.cfg.VMs.Event(c.vm.ID, "exec", c.p.Actor(), "envd: %s (user %s)", strings.Join(ps.Argv, " "), c.user)
	var rec *record.ExecTap
	if c.s.cfg.Record != nil {
		// What this call relays: input sent by later calls is not counted,
		// and a process the client left running ends the record with -1.
		rec = c.s.cfg.Record.Exec(c.vm.ID, record.Exec{Command: "envd: " + strings.Join(ps.Argv, " "), Argv: ps.Argv,
			User: c.user, Cwd: ps.Cwd, Actor: c.p.Actor(), Via: "e2b"})
		defer rec.Done(-1, "", false)
	}
	return c.relay(ctx, ps2, st, req.PTY != nil, rec)
}

// ptyReady bounds how long a terminal's start event waits for the first
// output of its program (see relay). E2B's SDKs always start an
// interactive login shell, which prints a prompt; on a machine this busy
// (E2B's pty test beside two busy cores and the race-enabled unit tests
// once saw no prompt within 3 s) that can take seconds; only a silent
// program waits all of it.
var ptyReady = 10 * time.Second

func (c *envdCall) connect(ctx context.Context, req *connectRequest, st *stream) error {
	sel, err := selector(req.Process)
	if err != nil {
		return err
	}
	ps, err := c.g.ConnectProc(context.WithoutCancel(ctx), sel)
	if err != nil {
		return guestRPCError(err)
	}
	return c.relay(ctx, ps, st, false, nil)
}

// relay forwards a managed process's events to the stream, with keepalives
// in between, until the end event, the client leaving or the deadline.
//
// With holdStart (a terminal's start), the start event waits for the
// program's first output, its end, or ptyReady: a shell's first output is
// its prompt, so input a client sends once pty.create returns reaches a
// shell that reads it. Sent at once, as envd does, input typed while a
// login shell still starts (a few hundred ms under emulation and load) is
// echoed by the terminal and answered only later, after a client that
// waited 300 ms for the answer has gone.
func (c *envdCall) relay(ctx context.Context, ps *guest.ProcStream, st *stream, holdStart bool, rec *record.ExecTap) error {
	defer ps.Close()
	stop := context.AfterFunc(ctx, func() { ps.Close() })
	defer stop()
	events, errc, stopPull := pull(ps.Next)
	defer stopPull()
	tick := time.NewTicker(c.ka)
	defer tick.Stop()
	started := false
	var held *processEvent // the terminal's start, not sent yet
	var ready <-chan time.Time
	flush := func() error {
		if held == nil {
			return nil
		}
		pe := *held
		held, ready = nil, nil
		return st.Send(processEventResponse{Event: pe})
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				flush() // a held start first: the client learns the pid of what may still run
				err := <-errc
				c.abortIfGone(st.w)
				if errors.Is(err, io.EOF) {
					return rpcErr(codeUnavailable, "the process stream ended without a result (the agent went away or the stream fell behind)")
				}
				return rpcErr(codeUnavailable, "the process stream: %v", err)
			}
			var pe processEvent
			if ev.Type != guest.ProcEventStart {
				if err := flush(); err != nil {
					return err
				}
			}
			switch ev.Type {
			case guest.ProcEventStart:
				if started {
					continue // one start per process; a hostile agent's repeats are dropped
				}
				started = true
				pe.Start = &startEvent{PID: uint32(ev.PID)}
				if holdStart {
					held = &pe
					timer := time.NewTimer(ptyReady) // once: only the first start gets here
					defer timer.Stop()
					ready = timer.C
					continue
				}
			case guest.ProcEventStdout:
				pe.Data = &dataEvent{Stdout: ev.Data}
				rec.Output(ev.Data, false)
			case guest.ProcEventStderr:
				pe.Data = &dataEvent{Stderr: ev.Data}
				rec.Output(ev.Data, true)
			case guest.ProcEventPTY:
				pe.Data = &dataEvent{PTY: ev.Data}
				rec.Output(ev.Data, false)
			case guest.ProcEventEnd:
				sig := ""
				if strings.HasPrefix(ev.Status, "signal: ") {
					sig = strings.TrimPrefix(ev.Status, "signal: ")
				}
				rec.Done(ev.ExitCode, sig, ev.TimedOut)
				if ev.TimedOut {
					return rpcErr(codeDeadlineExceeded, "the process was killed at its time limit (the call's timeout)")
				}
				end := &endEvent{ExitCode: int32(ev.ExitCode), Exited: !strings.HasPrefix(ev.Status, "signal"), Status: ev.Status}
				if ev.ExitCode != 0 {
					end.Error = ev.Status
				}
				if ev.Error != "" {
					end.Error = ev.Error
				}
				pe.End = end
			default:
				continue
			}
			if err := st.Send(processEventResponse{Event: pe}); err != nil {
				return err
			}
			if pe.End != nil {
				return nil
			}
		case <-ready:
			if err := flush(); err != nil {
				return err
			}
		case <-tick.C:
			if started && held == nil {
				if err := st.Send(processEventResponse{Event: processEvent{Keepalive: &empty{}}}); err != nil {
					return err
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// abortIfGone cuts the connection of a stream whose sandbox was killed or
// paused under it, as E2B does: the client sees the stream end at the TCP
// level (and its health probe then finds the sandbox gone). A kill ends
// QEMU before its record goes, so a sandbox still recorded as running
// whose agent does not answer a ping either (2 s; a guest that slow
// under TCG gets a reset too) is gone as well.
func (c *envdCall) abortIfGone(w http.ResponseWriter) {
	gone := false
	if v, err := c.s.cfg.VMs.Get(context.Background(), c.vm.ID); err != nil || v.State != store.StateRunning {
		gone = true
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		gone = c.g.Ping(ctx) != nil
		cancel()
	}
	if gone {
		resetConn(w)
		panic(http.ErrAbortHandler)
	}
}

// resetConn ends an HTTP/1.x response's connection with a TCP reset, so
// that the client reads a connection error, as from a host that died: a
// plain close in the middle of a chunked body reads to some clients
// (pyqwest, under E2B's Python SDK) as a malformed response, not as the
// sandbox going away. An HTTP/2 stream cannot be hijacked: the caller's
// panic resets the stream instead.
func resetConn(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	nc := conn
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	if tcp, ok := nc.(*net.TCPConn); ok {
		tcp.SetLinger(0)
	}
	conn.Close()
}

// pull reads a guest stream on a goroutine: its events, then (once the
// channel is closed) the error that ended it. stop releases the goroutine
// when the reader leaves first.
func pull[T any](next func() (T, error)) (<-chan T, <-chan error, func()) {
	events := make(chan T, 16)
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(events)
		for {
			ev, err := next()
			if err != nil {
				errc <- err
				return
			}
			select {
			case events <- ev:
			case <-done:
				return
			}
		}
	}()
	return events, errc, func() { close(done) }
}

func selector(sel *processSelector) (guest.ProcSelector, error) {
	switch {
	case sel == nil:
		return guest.ProcSelector{}, rpcErr(codeInvalidArgument, "process selector is required")
	case sel.PID != nil && *sel.PID > 0:
		return guest.ProcSelector{PID: int(*sel.PID)}, nil
	case sel.Tag != nil && *sel.Tag != "":
		return guest.ProcSelector{Tag: *sel.Tag}, nil
	}
	return guest.ProcSelector{}, rpcErr(codeInvalidArgument, "select the process by pid or tag")
}

func (c *envdCall) list(ctx context.Context, _ *empty) (*listResponse, error) {
	l, err := c.g.ListProcs(ctx)
	if err != nil {
		return nil, guestRPCError(err)
	}
	out := &listResponse{Processes: make([]processInfo, 0, len(l.Processes))}
	for _, p := range l.Processes {
		pi := processInfo{PID: uint32(p.PID), Config: processConfig{Envs: p.Env}}
		if len(p.Argv) > 0 {
			pi.Config.Cmd, pi.Config.Args = p.Argv[0], p.Argv[1:]
		}
		if pi.Config.Args == nil {
			pi.Config.Args = []string{}
		}
		if p.Cwd != "" {
			cwd := p.Cwd
			pi.Config.Cwd = &cwd
		}
		if p.Tag != "" {
			tag := p.Tag
			pi.Tag = &tag
		}
		out.Processes = append(out.Processes, pi)
	}
	return out, nil
}

func (c *envdCall) sendInput(ctx context.Context, req *sendInputRequest) (*empty, error) {
	sel, err := selector(req.Process)
	if err != nil {
		return nil, err
	}
	if req.Input == nil {
		return nil, rpcErr(codeInvalidArgument, "input is required")
	}
	data := req.Input.Stdin
	if req.Input.PTY != nil {
		data = req.Input.PTY
	}
	if len(data) > guest.MaxProcInput {
		return nil, rpcErr(codeResourceExhausted, "input larger than %d bytes: send it in parts", guest.MaxProcInput)
	}
	if err := c.g.ProcInput(ctx, guest.ProcInput{ProcSelector: sel, Data: data}); err != nil {
		return nil, guestRPCError(err)
	}
	return &empty{}, nil
}

// signalName reads process.Signal: its name or its number.
func signalName(v string) (string, error) {
	switch strings.Trim(v, `"`) {
	case "SIGNAL_SIGKILL", "9":
		return "SIGKILL", nil
	case "SIGNAL_SIGTERM", "15":
		return "SIGTERM", nil
	}
	return "", rpcErr(codeInvalidArgument, "unknown signal %s: use SIGNAL_SIGTERM or SIGNAL_SIGKILL", v)
}

func (c *envdCall) sendSignal(ctx context.Context, req *struct {
	Process *processSelector `json:"process"`
	Signal  json.RawMessage  `json:"signal"`
}) (*empty, error) {
	sel, err := selector(req.Process)
	if err != nil {
		return nil, err
	}
	sig, err := signalName(string(req.Signal))
	if err != nil {
		return nil, err
	}
	if err := c.g.ProcSignal(ctx, guest.ProcSignal{ProcSelector: sel, Signal: sig}); err != nil {
		return nil, guestRPCError(err)
	}
	return &empty{}, nil
}

func (c *envdCall) closeStdin(ctx context.Context, req *closeStdinRequest) (*empty, error) {
	sel, err := selector(req.Process)
	if err != nil {
		return nil, err
	}
	if err := c.g.ProcCloseStdin(ctx, sel); err != nil {
		return nil, guestRPCError(err)
	}
	return &empty{}, nil
}

func (c *envdCall) update(ctx context.Context, req *updateRequest) (*empty, error) {
	sel, err := selector(req.Process)
	if err != nil {
		return nil, err
	}
	if req.PTY == nil || req.PTY.Size == nil {
		return &empty{}, nil // nothing to change
	}
	if err := c.g.ProcResize(ctx, guest.ProcResize{ProcSelector: sel, PTYSize: guest.PTYSize{Cols: int(req.PTY.Size.Cols), Rows: int(req.PTY.Size.Rows)}}); err != nil {
		return nil, guestRPCError(err)
	}
	return &empty{}, nil
}

// streamInput is process.Process/StreamInput, a client stream: a start
// message naming the process, then input messages, until the body ends.
func (c *envdCall) streamInput(w http.ResponseWriter, r *http.Request) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/connect+json") {
		unsupportedType(w, ct, "application/connect+json")
		return
	}
	br, err := newEnvelopeReader(r)
	var sel guest.ProcSelector
	if err == nil {
		for err == nil {
			var msg []byte
			if msg, err = br.next(); err != nil || msg == nil {
				break
			}
			var m struct {
				Start *struct {
					Process *processSelector `json:"process"`
				} `json:"start"`
				Data *struct {
					Input *processInput `json:"input"`
				} `json:"data"`
			}
			if err = decodeMessage(msg, &m); err != nil {
				break
			}
			switch {
			case m.Start != nil:
				sel, err = selector(m.Start.Process)
			case m.Data != nil && m.Data.Input != nil:
				if sel == (guest.ProcSelector{}) {
					err = rpcErr(codeInvalidArgument, "the first message must be start")
					break
				}
				data := m.Data.Input.Stdin
				if m.Data.Input.PTY != nil {
					data = m.Data.Input.PTY
				}
				if len(data) > guest.MaxProcInput {
					err = rpcErr(codeResourceExhausted, "input larger than %d bytes: send it in parts", guest.MaxProcInput)
					break
				}
				if e := c.g.ProcInput(r.Context(), guest.ProcInput{ProcSelector: sel, Data: data}); e != nil {
					err = guestRPCError(e)
				}
			}
		}
	}
	io.Copy(io.Discard, io.LimitReader(r.Body, maxRequestMessage)) // read to EOF before answering
	w.Header().Set("Content-Type", "application/connect+json")
	w.WriteHeader(http.StatusOK)
	st := &stream{w: w}
	if err == nil {
		st.Send(empty{})
	}
	st.end(err)
}

// Proxy adapts the Server to the preview proxy's Compat.
type Proxy struct{ *Server }

func (Proxy) Route(r *http.Request) (string, int, bool)                   { return route(r) }
func (p Proxy) Serve(w http.ResponseWriter, r *http.Request, v *store.VM) { p.Envd(w, r, v) }
func (Proxy) NotFound(w http.ResponseWriter, ref string)                  { notFound(w, ref) }
func (Proxy) PortClosed(w http.ResponseWriter, ref string, port int)      { portClosed(w, ref, port) }

// errPrivateTraffic answers a request without a token for a port of a
// sandbox created with network.allowPublicTraffic: false.
var errPrivateTraffic = errors.New("this sandbox's traffic is private (network.allowPublicTraffic: false): send its trafficAccessToken in the E2B-Traffic-Access-Token header")

// Principal is the key behind the envd or traffic access token a request
// for another port of sandbox v carries (X-Access-Token, or
// E2B-Traffic-Access-Token, which the code-interpreter SDKs send on every
// call): with one, the caller reaches the sandbox's loopback too (DevTools,
// the code interpreter, VNC), as with the envd token it can run anything
// anyway. Without one the port is public, as E2B's are, on the sandbox's
// address only, unless the sandbox's traffic is private (403). A token that
// does not hold is refused, not ignored.
func (p Proxy) Principal(w http.ResponseWriter, r *http.Request, v *store.VM) (*auth.Principal, bool) {
	sb, err := p.cfg.Store.GetSandbox(r.Context(), v.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		notFound(w, v.Name) // killed meanwhile
		return nil, false
	case err != nil:
		envdHTTPError(w, http.StatusServiceUnavailable, "read sandbox: "+err.Error())
		return nil, false
	}
	purpose, tok := purposeTraffic, r.Header.Get("E2B-Traffic-Access-Token")
	if tok == "" {
		purpose, tok = purposeEnvd, r.Header.Get("X-Access-Token")
	}
	if tok == "" {
		if sb.PrivateTraffic {
			envdHTTPError(w, http.StatusForbidden, errPrivateTraffic.Error())
			return nil, false
		}
		return nil, true
	}
	pr, err := p.tokenPrincipal(r.Context(), purpose, v.ID, tok)
	if err != nil {
		if sb.PrivateTraffic && errors.Is(err, errEnvdToken) {
			// E2B's answer to a secured sandbox's wrong token
			envdHTTPError(w, http.StatusForbidden, "Sandbox is secured with traffic access token. Provided token is invalid.")
			return nil, false
		}
		envdAuthError(w, err)
		return nil, false
	}
	return pr, true
}

// Allow guards the code interpreter: its /execute runs code, so it needs
// the sandbox's access token, which E2B's code-interpreter SDKs send on it.
// The interpreter listens on the guest's loopback, so every call of its
// needs one (Principal); /execute gets the clearer refusal.
func (p Proxy) Allow(w http.ResponseWriter, r *http.Request, v *store.VM, port int, loopback bool) bool {
	if loopback || port != image.CodeInterpreterPort || v.Image != image.CodeInterpreter || path.Clean("/"+r.URL.Path) != "/execute" {
		return true
	}
	envdAuthError(w, fmt.Errorf("%w: running code needs the sandbox's envdAccessToken or trafficAccessToken", errEnvdToken))
	return false
}
