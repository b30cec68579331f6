// Package agent is the guest side of the agent channel: it owns the
// virtio-serial port, performs the handshake, runs a yamux server session
// and serves the agent's HTTP API on it, returning to scanning mode whenever
// a session ends (host gone, snapshot restored, garbage received).
package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"github.com/hashicorp/yamux"
)

// Options configures an Agent.
type Options struct {
	// DevicePath is the virtio-serial port (default guest.DevicePath).
	DevicePath string
	// Open overrides how the port is opened (tests).
	Open func() (io.ReadWriteCloser, error)
	// Root prefixes the /etc files the agent reads and writes, and the
	// /proc/sys/kernel files GET /v1/info reads (default "/").
	Root string
	// NoSystem skips changes to the running machine in SetIdentity
	// (hostname syscall, clock, network, journald, resize2fs) and the
	// clock a handshake's START line carries.
	NoSystem bool
	// SetClock, when set, is called instead of clock_settime with the
	// clock of a handshake's START line, NoSystem or not (tests).
	SetClock func(time.Time)
	// Logf logs (default log.Printf).
	Logf func(format string, args ...any)
	// TermKillGrace is the time a deleted terminal's processes get between
	// SIGHUP and SIGKILL (default DefaultTermKillGrace).
	TermKillGrace time.Duration
}

// Agent is the guest agent.
type Agent struct {
	opts    Options
	logf    func(string, ...any)
	srv     *http.Server
	hs      guest.GuestHandshake
	users   *userDB
	env     atomic.Pointer[map[string]string]
	devnull *os.File
	start   time.Time
}

// New creates an agent; it loads the base environment file.
func New(opts Options) (*Agent, error) {
	if opts.DevicePath == "" {
		opts.DevicePath = guest.DevicePath
	}
	if opts.Root == "" {
		opts.Root = "/"
	}
	if opts.TermKillGrace <= 0 {
		opts.TermKillGrace = DefaultTermKillGrace
	}
	if opts.Open == nil {
		path := opts.DevicePath
		opts.Open = func() (io.ReadWriteCloser, error) {
			return os.OpenFile(path, os.O_RDWR, 0)
		}
	}
	uninheritIgnoredSignals()
	a := &Agent{opts: opts, logf: opts.Logf, start: time.Now()}
	if a.logf == nil {
		a.logf = log.Printf
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	a.devnull = devnull
	a.users = &userDB{root: opts.Root}
	a.loadEnv()

	mux := http.NewServeMux()
	mux.HandleFunc("GET "+guest.PathHealthz, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET "+guest.PathInfo, a.handleInfo)
	mux.HandleFunc("POST "+guest.PathIdentity, a.handleIdentity)
	mux.HandleFunc("POST "+guest.PathExec, a.handleExec)
	// Profiles of the agent itself (the host reaches them only through the
	// agent channel; the server exposes them to the admin token).
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	a.registerFiles(mux)
	a.registerTerms(mux)
	a.registerProcs(mux)
	a.registerServices(mux)
	a.srv = &http.Server{
		Handler:     mux,
		IdleTimeout: 10 * time.Minute,
		ErrorLog:    log.New(logWriter{a.logf}, "", 0),
	}
	return a, nil
}

type logWriter struct{ logf func(string, ...any) }

func (w logWriter) Write(p []byte) (int, error) { w.logf("http: %s", p); return len(p), nil }

func (a *Agent) path(p string) string { return filepath.Join(a.opts.Root, p) }

func (a *Agent) loadEnv() {
	m := map[string]string{}
	if b, err := os.ReadFile(a.path(envFile)); err == nil {
		if err := json.Unmarshal(b, &m); err != nil {
			a.logf("bad %s: %v", envFile, err)
			m = map[string]string{}
		}
	}
	a.env.Store(&m)
}

// Run serves until ctx is cancelled.
func (a *Agent) Run(ctx context.Context) error {
	if !a.opts.NoSystem {
		bringUpLinks()
	}
	p := newPort(a.opts.Open, a.logf)
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		p.readLoop(ctx.Done())
	}()
	defer func() { <-loopDone }()

	for ctx.Err() == nil {
		v := newView(p)
		v.ignoreEOF.Store(true)
		stop := context.AfterFunc(ctx, v.close)
		br := bufio.NewReaderSize(v, guest.MaxHandshakeLine)
		nonce, err := a.hs.Scan(br, p)
		if err != nil {
			stop()
			v.close()
			if ctx.Err() == nil {
				a.logf("handshake: %v", err)
				time.Sleep(50 * time.Millisecond)
			}
			continue
		}
		if !a.hs.Clock.IsZero() {
			a.setClock(a.hs.Clock)
		}
		v.ignoreEOF.Store(false)
		conn := &sessConn{r: br, v: v, p: p}
		sess, err := yamux.Server(conn, guest.YamuxConfig(false))
		if err != nil {
			stop()
			conn.Close()
			a.logf("yamux: %v", err)
			continue
		}
		a.logf("session %s started", nonce)
		err = a.srv.Serve(sess)
		sess.Close()
		stop()
		a.logf("session %s ended: %v", nonce, err)
	}
	return ctx.Err()
}

// writeError writes the API error envelope.
// switchProtocols takes over the request's connection and answers 101 with
// Upgrade: proto. When it cannot, it answers an error (or closes the
// connection) itself and returns ok false.
func switchProtocols(w http.ResponseWriter, proto string) (conn net.Conn, br *bufio.Reader, ok bool) {
	conn, br, ok = hijack(w)
	if ok && !sendSwitch(conn, proto) {
		return nil, nil, false
	}
	return conn, br, ok
}

// hijack takes the connection of an upgrade request; sendSwitch then
// answers 101. Between the two a handler can get ready for the stream
// (a terminal registers its client), so a caller that sees the 101 sees
// everything after it.
func hijack(w http.ResponseWriter) (net.Conn, *bufio.Reader, bool) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", "hijack: "+err.Error())
		return nil, nil, false
	}
	return conn, brw.Reader, true
}

func sendSwitch(conn net.Conn, proto string) bool {
	if _, err := io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: "+proto+"\r\nConnection: Upgrade\r\n\r\n"); err != nil {
		conn.Close()
		return false
	}
	return true
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(guest.ErrorEnvelope{Error: &guest.APIError{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
