package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

// Managed processes (guest/proctypes.go): programs that outlive the request
// that started them. Output goes to whoever is attached at the time it is
// produced; with nobody attached it is read and dropped, as a terminal
// without a viewer would.

const (
	procChunk = 32 << 10
	// procSendWait is how long output waits for a slow stream before that
	// stream is dropped (the program is held back meanwhile, as by a full
	// pipe).
	procSendWait = 30 * time.Second
)

type procManager struct {
	a        *Agent
	mu       sync.Mutex
	procs    map[int]*mproc
	starting atomic.Int64 // starts past the MaxProcs check, not yet in procs
}

func (m *procManager) count() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.procs))
}

// mproc is one managed process.
type mproc struct {
	m     *procManager
	info  guest.ProcInfo
	proc  *os.Process
	stdin *os.File // pipe to the program, or the pty master; nil when stdin is /dev/null
	ptmx  *os.File
	pubMu sync.Mutex // one event at a time, in order

	mu       sync.Mutex
	subs     map[*procSub]struct{}
	dead     bool // exited (maybe not yet reaped): no more signals
	timedOut bool
	ended    bool
}

// procSub is one attached stream.
type procSub struct {
	ch   chan guest.ProcEvent
	gone chan struct{} // closed when the stream is dropped or detaches
	once sync.Once
}

func (s *procSub) drop() { s.once.Do(func() { close(s.gone) }) }

func (a *Agent) registerProcs(mux *http.ServeMux) {
	m := &procManager{a: a, procs: map[int]*mproc{}}
	mux.HandleFunc("POST "+guest.PathProcs, m.handleStart)
	mux.HandleFunc("GET "+guest.PathProcs, m.handleList)
	mux.HandleFunc("POST "+guest.PathProcsConnect, m.handleConnect)
	mux.HandleFunc("POST "+guest.PathProcsInput, m.handleInput)
	mux.HandleFunc("POST "+guest.PathProcsCloseStdin, m.handleCloseStdin)
	mux.HandleFunc("POST "+guest.PathProcsSignal, m.handleSignal)
	mux.HandleFunc("POST "+guest.PathProcsResize, m.handleResize)
}

func (m *procManager) handleStart(w http.ResponseWriter, r *http.Request) {
	var req guest.ProcStart
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad process JSON: "+err.Error())
		return
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		writeError(w, http.StatusBadRequest, "invalid", "argv is required")
		return
	}
	if len(req.Tag) > guest.MaxProcTag {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("tag longer than %d bytes", guest.MaxProcTag))
		return
	}
	if req.PTY != nil {
		if err := checkSize(req.PTY.Cols, req.PTY.Rows); err != nil {
			writeError(w, http.StatusBadRequest, "invalid", "pty: "+err.Error())
			return
		}
	}
	if req.TimeoutMS < 0 {
		writeError(w, http.StatusBadRequest, "invalid", "timeout_ms must be >= 0")
		return
	}
	if _, err := m.a.users.lookup(req.User); err != nil {
		writeError(w, http.StatusBadRequest, userCode(err), err.Error())
		return
	}
	sp, err := m.a.prepareExec(&guest.ExecRequest{Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User})
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	if sp.lookErr != nil {
		writeError(w, http.StatusNotFound, "not_found", sp.lookErr.Error())
		return
	}
	if n := m.starting.Add(1) + m.count(); n > guest.MaxProcs {
		m.starting.Add(-1)
		writeError(w, http.StatusTooManyRequests, guest.CodeTooMany, fmt.Sprintf("%d managed processes are running; end some first", n-1))
		return
	}
	sub := newProcSub()
	p, err := m.start(&req, sp, sub)
	m.starting.Add(-1) // in the table now, or failed
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	p.stream(w, r, sub)
}

func newProcSub() *procSub {
	return &procSub{ch: make(chan guest.ProcEvent, guest.ProcSubscriberLag), gone: make(chan struct{})}
}

// start runs the program with sub attached from its first event on.
func (m *procManager) start(req *guest.ProcStart, sp *execSpec, sub *procSub) (*mproc, error) {
	p := &mproc{m: m, subs: map[*procSub]struct{}{sub: {}}}
	p.info = guest.ProcInfo{Tag: req.Tag, Argv: req.Argv, Env: req.Env, Cwd: sp.dir, PTY: req.PTY != nil}
	var files []*os.File
	var readers []*os.File
	var types []string
	var closeAfter []*os.File
	sys := &syscall.SysProcAttr{Setsid: true, Credential: sp.cred}
	if req.PTY != nil {
		uid := -1
		if sp.cred != nil {
			uid = int(sp.cred.Uid)
		}
		master, slave, err := openPTY(req.PTY.Cols, req.PTY.Rows, uid)
		if err != nil {
			return nil, err
		}
		sys.Setctty, sys.Ctty = true, 0
		files = []*os.File{slave, slave, slave}
		closeAfter = []*os.File{slave}
		p.ptmx, p.stdin = master, master
		readers, types = []*os.File{master}, []string{guest.ProcEventPTY}
	} else {
		stdinR := m.a.devnull
		if req.Stdin {
			r, w, err := bigPipe()
			if err != nil {
				return nil, err
			}
			stdinR, p.stdin = r, w
			closeAfter = append(closeAfter, r)
		}
		outR, outW, err := bigPipe()
		if err != nil {
			closeAll(closeAfter, p.stdin)
			return nil, err
		}
		errR, errW, err := bigPipe()
		if err != nil {
			closeAll(closeAfter, p.stdin, outR, outW)
			return nil, err
		}
		files = []*os.File{stdinR, outW, errW}
		closeAfter = append(closeAfter, outW, errW)
		readers, types = []*os.File{outR, errR}, []string{guest.ProcEventStdout, guest.ProcEventStderr}
	}
	proc, err := os.StartProcess(sp.path, sp.argv, &os.ProcAttr{Dir: sp.dir, Env: sp.env, Files: files, Sys: sys})
	closeAll(closeAfter)
	if err != nil {
		closeAll(readers, p.stdin)
		return nil, errors.New("exec " + sp.argv[0] + ": " + unwrapExecErr(err))
	}
	p.proc, p.info.PID = proc, proc.Pid
	sub.ch <- guest.ProcEvent{Type: guest.ProcEventStart, PID: proc.Pid}
	m.mu.Lock()
	m.procs[proc.Pid] = p
	m.mu.Unlock()

	var pumps sync.WaitGroup
	stop := make(chan struct{}) // closed when output stops being forwarded
	outs := make([]*procOut, len(readers))
	for i, f := range readers {
		outs[i] = &procOut{f: f, typ: types[i]}
		pumps.Add(1)
		go p.pump(outs[i], &pumps, stop)
	}
	var timer *time.Timer
	if req.TimeoutMS > 0 {
		timer = time.AfterFunc(time.Duration(req.TimeoutMS)*time.Millisecond, func() {
			p.mu.Lock()
			if !p.dead {
				p.timedOut = true
				syscall.Kill(-p.info.PID, syscall.SIGKILL)
			}
			p.mu.Unlock()
		})
	}
	go p.wait(timer, outs, &pumps, stop)
	return p, nil
}

func closeAll(lists ...any) {
	for _, l := range lists {
		switch v := l.(type) {
		case []*os.File:
			for _, f := range v {
				f.Close()
			}
		case *os.File:
			if v != nil {
				v.Close()
			}
		}
	}
}

// procOut is one output of a managed process and what its pump has read.
type procOut struct {
	f    *os.File
	typ  string
	read atomic.Int64
}

// pump forwards one output until EOF, or until stop once the program has
// exited; after that it reads and drops what background children still
// write, so that they do not get EPIPE.
func (p *mproc) pump(o *procOut, pumps *sync.WaitGroup, stop chan struct{}) {
	forwarding := true
	done := func() {
		if forwarding {
			forwarding = false
			pumps.Done()
		}
	}
	defer func() {
		done()
		if p.ptmx != o.f { // the pty master is closed by wait
			o.f.Close()
		}
	}()
	for {
		buf := make([]byte, procChunk)
		n, err := o.f.Read(buf)
		// Counted before it is published: a chunk read before stop was
		// closed is published whatever stop says by then, and wait waits
		// for the pumps after closing stop.
		o.read.Add(int64(n))
		if n > 0 && forwarding {
			select {
			case <-stop:
				done()
			default:
				p.publish(guest.ProcEvent{Type: o.typ, Data: buf[:n]})
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				done()
				o.f.SetReadDeadline(time.Time{})
				continue
			}
			return
		}
	}
}

// wait reaps the program, lets its output drain and sends the end event.
func (p *mproc) wait(timer *time.Timer, outs []*procOut, pumps *sync.WaitGroup, stop chan struct{}) {
	for {
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_PID, p.info.PID, &info, unix.WEXITED|unix.WNOWAIT, nil); err != unix.EINTR {
			break
		}
	}
	p.mu.Lock()
	p.dead = true
	timedOut := p.timedOut
	p.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	state, werr := p.proc.Wait()
	end := guest.ProcEvent{Type: guest.ProcEventEnd, TimedOut: timedOut}
	switch {
	case werr != nil:
		end.ExitCode, end.Status, end.Error = 255, "wait failed", werr.Error()
	default:
		end.Status = state.String()
		if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			end.ExitCode = -1
		} else {
			end.ExitCode = state.ExitCode()
		}
	}
	if timedOut {
		end.Error = "the process was killed at its time limit"
	}
	// Everything the program wrote before it exited comes out before the
	// end event, however slow the streams are; what background children
	// keep writing holds it back for at most drainMax (termDrainWindow on
	// a pty) once that is out.
	owed := make([]int64, len(outs))
	for i, o := range outs {
		owed[i] = o.read.Load() + int64(pendingBytes(o.f))
	}
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	wait := drainMax
	if p.ptmx != nil {
		wait = termDrainWindow
	}
	cut := time.Now().Add(wait)
	tick := time.NewTicker(20 * time.Millisecond)
	for waiting := true; waiting; {
		select {
		case <-drained:
			waiting = false
		case now := <-tick.C:
			if now.Before(cut) {
				continue
			}
			caughtUp := true
			for i, o := range outs {
				caughtUp = caughtUp && o.read.Load() >= owed[i]
			}
			if caughtUp {
				close(stop)
				for _, o := range outs {
					o.f.SetReadDeadline(time.Now()) // a pump blocked in Read stops forwarding
				}
				<-drained
				waiting = false
			}
		}
	}
	tick.Stop()
	if p.ptmx != nil {
		p.ptmx.Close()
	} else if p.stdin != nil {
		p.stdin.Close()
	}
	p.m.mu.Lock()
	if p.m.procs[p.info.PID] == p {
		delete(p.m.procs, p.info.PID)
	}
	p.m.mu.Unlock()
	p.mu.Lock()
	p.ended = true
	p.mu.Unlock()
	p.publish(end)
	p.mu.Lock()
	for s := range p.subs {
		s.drop()
	}
	p.subs = nil
	p.mu.Unlock()
}

// publish hands an event to every attached stream, waiting up to
// procSendWait for each; a stream that does not take it is dropped.
func (p *mproc) publish(ev guest.ProcEvent) {
	p.pubMu.Lock()
	defer p.pubMu.Unlock()
	p.mu.Lock()
	subs := make([]*procSub, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
			continue
		case <-s.gone:
			continue
		default:
		}
		t := time.NewTimer(procSendWait)
		select {
		case s.ch <- ev:
		case <-s.gone:
		case <-t.C:
			p.m.a.logf("process %d: stream too slow, dropped", p.info.PID)
			p.detach(s)
		}
		t.Stop()
	}
}

func (p *mproc) detach(s *procSub) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	s.drop()
}

// attach adds a stream, unless the program has already ended.
func (p *mproc) attach() *procSub {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil
	}
	s := newProcSub()
	s.ch <- guest.ProcEvent{Type: guest.ProcEventStart, PID: p.info.PID} // first, before any output
	p.subs[s] = struct{}{}
	return s
}

// stream writes sub's events as NDJSON until the end event, the caller
// leaves or the stream is dropped.
func (p *mproc) stream(w http.ResponseWriter, r *http.Request, sub *procSub) {
	defer p.detach(sub)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	for {
		select {
		case ev := <-sub.ch:
			if err := enc.Encode(ev); err != nil {
				return
			}
			// Flush only once the queue is empty: bulk output goes out in
			// larger writes.
			if len(sub.ch) == 0 && fl != nil {
				fl.Flush()
			}
			if ev.Type == guest.ProcEventEnd {
				return
			}
		case <-sub.gone:
			// Dropped or ended: deliver what was queued (the end event).
			for {
				select {
				case ev := <-sub.ch:
					if enc.Encode(ev) != nil {
						return
					}
				default:
					if fl != nil {
						fl.Flush()
					}
					return
				}
			}
		case <-r.Context().Done():
			return
		}
	}
}

func (m *procManager) handleList(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	list := guest.ProcList{Processes: make([]guest.ProcInfo, 0, len(m.procs))}
	for _, p := range m.procs {
		list.Processes = append(list.Processes, p.info)
	}
	m.mu.Unlock()
	sort.Slice(list.Processes, func(i, j int) bool { return list.Processes[i].PID < list.Processes[j].PID })
	writeJSON(w, list)
}

// find resolves a selector; it writes the error itself.
func (m *procManager) find(w http.ResponseWriter, sel guest.ProcSelector) *mproc {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sel.PID > 0 {
		if p := m.procs[sel.PID]; p != nil {
			return p
		}
		writeError(w, http.StatusNotFound, "not_found", "no running process with pid "+strconv.Itoa(sel.PID))
		return nil
	}
	if sel.Tag != "" {
		for _, p := range m.procs {
			if p.info.Tag == sel.Tag {
				return p
			}
		}
		writeError(w, http.StatusNotFound, "not_found", "no running process with tag "+strconv.Quote(sel.Tag))
		return nil
	}
	writeError(w, http.StatusBadRequest, "invalid", "select the process by pid or tag")
	return nil
}

func (m *procManager) handleConnect(w http.ResponseWriter, r *http.Request) {
	var sel guest.ProcSelector
	if err := decodeBody(w, r, &sel); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad selector JSON: "+err.Error())
		return
	}
	p := m.find(w, sel)
	if p == nil {
		return
	}
	sub := p.attach()
	if sub == nil {
		writeError(w, http.StatusNotFound, "not_found", "the process has ended")
		return
	}
	p.stream(w, r, sub)
}

func (m *procManager) handleInput(w http.ResponseWriter, r *http.Request) {
	var in guest.ProcInput
	body := http.MaxBytesReader(w, r.Body, guest.MaxProcInput*2)
	if err := json.NewDecoder(body).Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad input JSON: "+err.Error())
		return
	}
	p := m.find(w, in.ProcSelector)
	if p == nil {
		return
	}
	p.mu.Lock()
	f, ended := p.stdin, p.ended
	p.mu.Unlock()
	if f == nil || ended {
		writeError(w, http.StatusConflict, guest.CodeConflict, "the process has no open stdin (start it with stdin enabled)")
		return
	}
	// A program that does not read its input must not hold this request
	// (and a host stream) forever.
	f.SetWriteDeadline(time.Now().Add(procSendWait))
	_, err := f.Write(in.Data)
	f.SetWriteDeadline(time.Time{})
	if err != nil {
		writeError(w, http.StatusConflict, guest.CodeConflict, "write stdin: "+err.Error())
		return
	}
	writeJSON(w, struct{}{})
}

func (m *procManager) handleCloseStdin(w http.ResponseWriter, r *http.Request) {
	var sel guest.ProcSelector
	if err := decodeBody(w, r, &sel); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad selector JSON: "+err.Error())
		return
	}
	p := m.find(w, sel)
	if p == nil {
		return
	}
	if p.ptmx != nil {
		writeError(w, http.StatusConflict, guest.CodeConflict, "a pty has no stdin to close; send Ctrl-D (0x04) as input")
		return
	}
	p.mu.Lock()
	f := p.stdin
	p.mu.Unlock()
	if f != nil {
		f.Close()
	}
	writeJSON(w, struct{}{})
}

func (m *procManager) handleSignal(w http.ResponseWriter, r *http.Request) {
	var req guest.ProcSignal
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad signal JSON: "+err.Error())
		return
	}
	sig, err := guest.ParseSignal(req.Signal)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	p := m.find(w, req.ProcSelector)
	if p == nil {
		return
	}
	p.mu.Lock()
	dead := p.dead
	if !dead {
		syscall.Kill(-p.info.PID, sig)
	}
	p.mu.Unlock()
	if dead {
		writeError(w, http.StatusNotFound, "not_found", "the process has ended")
		return
	}
	writeJSON(w, struct{}{})
}

func (m *procManager) handleResize(w http.ResponseWriter, r *http.Request) {
	var req guest.ProcResize
	if err := decodeBody(w, r, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "bad resize JSON: "+err.Error())
		return
	}
	if err := checkSize(req.Cols, req.Rows); err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	p := m.find(w, req.ProcSelector)
	if p == nil {
		return
	}
	if p.ptmx == nil {
		writeError(w, http.StatusConflict, guest.CodeConflict, "the process has no pty")
		return
	}
	if err := setWinsize(p.ptmx, req.Cols, req.Rows); err != nil {
		writeError(w, http.StatusConflict, guest.CodeConflict, "resize: "+err.Error())
		return
	}
	writeJSON(w, struct{}{})
}
