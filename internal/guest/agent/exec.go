package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

const (
	rootPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	userPath = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
	// After the process exits its pipes are drained until they have been
	// seen empty for drainWindow (background children may keep them open),
	// and everything the process wrote before it exited is always forwarded;
	// beyond that, background output is forwarded for at most drainMax.
	drainWindow = 30 * time.Millisecond
	drainMax    = 2 * time.Second
	pipeChunk   = 256 << 10
	pipeSize    = 1 << 20 // F_SETPIPE_SZ: fewer wake-ups between the program and the agent
)

// execSpec is a validated exec request.
type execSpec struct {
	argv    []string
	path    string // resolved executable, "" when lookup failed
	lookErr error
	dir     string
	env     []string
	cred    *syscall.Credential
	timeout time.Duration
	stdin   bool
}

func (a *Agent) prepareExec(req *guest.ExecRequest) (*execSpec, error) {
	sp := &execSpec{stdin: req.Stdin, timeout: time.Duration(req.TimeoutMS) * time.Millisecond}
	switch {
	case len(req.Argv) > 0 && req.Shell != "":
		return nil, errors.New("give either argv or shell, not both")
	case req.Shell != "":
		sp.argv = []string{"/bin/sh", "-c", req.Shell}
	case len(req.Argv) > 0 && req.Argv[0] != "":
		sp.argv = req.Argv
	default:
		return nil, errors.New("argv or shell is required")
	}
	if req.TimeoutMS < 0 {
		return nil, errors.New("timeout_ms must be >= 0")
	}
	u, err := a.users.lookup(req.User)
	if err != nil {
		return nil, err
	}
	if uint32(os.Getuid()) != u.UID || uint32(os.Getgid()) != u.GID {
		sp.cred = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}

	env := make(map[string]string, 16)
	if u.UID == 0 {
		env["PATH"] = rootPath
	} else {
		env["PATH"] = userPath
	}
	for k, v := range *a.env.Load() {
		env[k] = v
	}
	env["HOME"], env["USER"], env["LOGNAME"], env["SHELL"] = u.Home, u.Name, u.Name, u.Shell
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, errors.New("invalid env name " + strconv.Quote(k))
		}
		env[k] = v
	}
	sp.env = make([]string, 0, len(env))
	for k, v := range env {
		sp.env = append(sp.env, k+"="+v)
	}

	if req.Cwd != "" {
		dir := req.Cwd
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(u.Home, dir)
		}
		fi, err := os.Stat(dir)
		if err != nil {
			return nil, errors.New("cwd: " + err.Error())
		}
		if !fi.IsDir() {
			return nil, errors.New("cwd " + strconv.Quote(dir) + " is not a directory")
		}
		sp.dir = dir
	} else if fi, err := os.Stat(u.Home); err == nil && fi.IsDir() {
		sp.dir = u.Home
	} else {
		sp.dir = "/"
	}
	sp.path, sp.lookErr = lookPath(sp.argv[0], env["PATH"], sp.dir)
	return sp, nil
}

// lookPath resolves file like a shell would. Paths with a slash are not
// checked here: execve reports their errors.
func lookPath(file, pathEnv, dir string) (string, error) {
	if strings.Contains(file, "/") {
		if !filepath.IsAbs(file) {
			file = filepath.Join(dir, file)
		}
		return file, nil
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := d + "/" + file
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New(file + ": command not found")
}

func (a *Agent) handleExec(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), guest.ExecUpgrade) {
		writeError(w, http.StatusBadRequest, "invalid", "exec needs Upgrade: "+guest.ExecUpgrade)
		return
	}
	var req guest.ExecRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad exec JSON: "+err.Error())
		return
	}
	sp, err := a.prepareExec(&req)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	conn, br, ok := switchProtocols(w, guest.ExecUpgrade)
	if !ok {
		return
	}
	defer conn.Close()
	run := &execRun{conn: conn}
	run.run(a, sp, br)
}

// execRun is one running exec stream.
type execRun struct {
	conn net.Conn
	wmu  sync.Mutex

	exitedAt atomic.Int64 // unix nanos when the process exited
	out, err outPipe

	mu       sync.Mutex
	pid      int
	exited   bool
	timedOut bool

	stdinW    *os.File
	stdinOnce sync.Once
}

func (e *execRun) write(b []byte) error {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	_, err := e.conn.Write(b)
	return err
}

func (e *execRun) sendJSON(typ byte, v any) {
	b, _ := json.Marshal(v)
	e.write(api.AppendFrame(make([]byte, 0, api.FrameHeaderLen+len(b)), typ, b))
}

// killGroup signals the process group unless the main process has exited
// (after that, its group belongs to background children that must live).
func (e *execRun) killGroup(sig syscall.Signal) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.exited {
		syscall.Kill(-e.pid, sig)
	}
}

func (e *execRun) closeStdin() {
	e.stdinOnce.Do(func() {
		if e.stdinW != nil {
			e.stdinW.Close()
		}
	})
}

func (e *execRun) fail(code int, msg string) {
	e.sendJSON(api.FrameError, guest.ErrorBody{Message: msg})
	e.sendJSON(api.FrameExit, guest.ExitStatus{ExitCode: code})
}

func (e *execRun) run(a *Agent, sp *execSpec, br *bufio.Reader) {
	if sp.lookErr != nil {
		e.fail(127, sp.lookErr.Error())
		return
	}
	stdinR := a.devnull
	if sp.stdin {
		r, w, err := bigPipe()
		if err != nil {
			e.fail(126, "pipe: "+err.Error())
			return
		}
		stdinR, e.stdinW = r, w
	}
	outR, outW, err := bigPipe()
	if err != nil {
		e.closeStdin()
		e.fail(126, "pipe: "+err.Error())
		return
	}
	errR, errW, err := bigPipe()
	if err != nil {
		e.closeStdin()
		outR.Close()
		outW.Close()
		e.fail(126, "pipe: "+err.Error())
		return
	}
	start := time.Now()
	proc, err := os.StartProcess(sp.path, sp.argv, &os.ProcAttr{
		Dir:   sp.dir,
		Env:   sp.env,
		Files: []*os.File{stdinR, outW, errW},
		Sys:   &syscall.SysProcAttr{Setsid: true, Credential: sp.cred},
	})
	outW.Close()
	errW.Close()
	if sp.stdin {
		stdinR.Close()
	}
	if err != nil {
		outR.Close()
		errR.Close()
		e.closeStdin()
		code := 126
		if errors.Is(err, syscall.ENOENT) {
			code = 127
		}
		e.fail(code, "exec "+sp.argv[0]+": "+unwrapExecErr(err))
		return
	}
	e.pid = proc.Pid

	var drained sync.WaitGroup
	drained.Add(2)
	e.out.f, e.err.f = outR, errR
	go e.pump(&e.out, api.FrameStdout, &drained)
	go e.pump(&e.err, api.FrameStderr, &drained)
	go e.readHost(br)

	var timer *time.Timer
	if sp.timeout > 0 {
		timer = time.AfterFunc(sp.timeout, func() {
			e.mu.Lock()
			if !e.exited {
				e.timedOut = true
				syscall.Kill(-e.pid, syscall.SIGKILL)
			}
			e.mu.Unlock()
		})
	}
	state, werr := proc.Wait()
	e.mu.Lock()
	e.exited = true
	timedOut := e.timedOut
	e.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	st := guest.ExitStatus{TimedOut: timedOut, DurationMS: time.Since(start).Milliseconds()}
	if werr != nil {
		st.ExitCode = 255
		e.sendJSON(api.FrameError, guest.ErrorBody{Message: "wait: " + werr.Error()})
	} else if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		st.ExitCode = 128 + int(ws.Signal())
		st.Signal = unix.SignalName(ws.Signal())
	} else {
		st.ExitCode = state.ExitCode()
	}
	// Forward what is already buffered, but do not wait for background
	// children that keep the pipes open.
	now := time.Now()
	e.exitedAt.Store(now.UnixNano())
	dl := now.Add(drainWindow)
	outR.SetReadDeadline(dl)
	errR.SetReadDeadline(dl)
	drained.Wait()
	e.sendJSON(api.FrameExit, st)
	e.closeStdin()
}

// bigPipe is os.Pipe with a 1 MiB buffer where the kernel allows it.
func bigPipe() (*os.File, *os.File, error) {
	r, w, err := os.Pipe()
	if err == nil {
		if rc, err := w.SyscallConn(); err == nil { // not Fd(): that makes the fd blocking
			rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeSize) })
		}
	}
	return r, w, err
}

func unwrapExecErr(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// outPipe is the read end of the process's stdout or stderr, with what the
// pump has read from it.
type outPipe struct {
	f    *os.File
	read atomic.Int64 // bytes read so far
	// owed bounds what was written before the process exited: set by the pump
	// (the only reader) at its first deadline after the exit, as what it read
	// plus what the pipe holds then. 0 until then.
	owed int64
}

// pending is how many bytes the pipe holds now.
func (p *outPipe) pending() int { return pendingBytes(p.f) }

// pendingBytes is how many bytes a pipe or pty master holds now (TIOCINQ,
// alias FIONREAD).
func pendingBytes(f *os.File) int {
	n := 0
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			if v, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ); err == nil {
				n = v
			}
		})
	}
	return n
}

// pump forwards a pipe chunk by chunk until EOF or, once the process has
// exited, until drainMore says to stop; after that it keeps reading and
// discarding until EOF so that background writers do not get SIGPIPE.
func (e *execRun) pump(p *outPipe, typ byte, drained *sync.WaitGroup) {
	f := p.f
	defer f.Close()
	buf := make([]byte, api.FrameHeaderLen+pipeChunk)
	forwarding := true
	var dl time.Time // the read deadline the pump set itself, if any
	for {
		readStart := time.Now()
		n, err := readMore(f, buf[api.FrameHeaderLen:])
		if n > 0 {
			p.read.Add(int64(n))
			if forwarding {
				api.PutFrameHeader(buf, typ, n)
				e.write(buf[:api.FrameHeaderLen+n])
			}
		}
		if err == nil {
			continue
		}
		if forwarding && errors.Is(err, os.ErrDeadlineExceeded) && e.drainMore(p, n, readStart, &dl) {
			continue
		}
		if forwarding {
			forwarding = false
			drained.Done()
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			f.SetReadDeadline(time.Time{})
			continue
		}
		return
	}
}

// drainMore decides, after the process exited and a read of p hit its
// deadline, whether to keep forwarding (and sets a new deadline if so).
//
// Forwarding stops when the pipe is empty and stayed so for most of a
// window (a read that started well before the deadline got nothing):
// everything written before the exit is out, and nothing more came. A read
// that started at or after the deadline never looked (the pump was blocked
// writing to a slow host): look again. Background writers that keep the
// pipe busy are cut off drainMax after the exit, but only once everything
// written before the exit is out.
func (e *execRun) drainMore(p *outPipe, n int, readStart time.Time, dl *time.Time) bool {
	exited := time.Unix(0, e.exitedAt.Load())
	pending := p.pending()
	if p.owed == 0 {
		// No read is in flight (this is the only reader): exact, and at
		// least what was written before the exit.
		p.owed = p.read.Load() + int64(pending)
	}
	deadline := *dl
	if deadline.IsZero() {
		deadline = exited.Add(drainWindow)
	}
	// The pipe must really be empty: a read can also fail at a deadline
	// that passed while its goroutine was descheduled, without looking.
	if n == 0 && pending == 0 && deadline.Sub(readStart) >= drainWindow/3 {
		return false
	}
	if time.Since(exited) >= drainMax && p.read.Load() >= p.owed {
		return false
	}
	*dl = time.Now().Add(drainWindow)
	p.f.SetReadDeadline(*dl)
	return true
}

// readHost applies frames from the host; when the stream ends before the
// process exits (client went away) the process group is killed.
func (e *execRun) readHost(br *bufio.Reader) {
	defer e.closeStdin()
	var buf []byte
	for {
		f, err := api.ReadFrameReuse(br, &buf)
		if err != nil {
			e.killGroup(syscall.SIGKILL)
			return
		}
		switch f.Type {
		case api.FrameStdin:
			if e.stdinW != nil {
				e.stdinW.Write(f.Data)
			}
		case api.FrameStdinEOF:
			e.closeStdin()
		case api.FrameSignal:
			if n, err := strconv.Atoi(strings.TrimSpace(string(f.Data))); err == nil && n > 0 && n < 65 {
				e.killGroup(syscall.Signal(n))
			}
		}
	}
}
