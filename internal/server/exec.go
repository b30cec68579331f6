package server

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/budget"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/record"
	"github.com/agentvm/agentvm/internal/vm"
)

var userRe = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

func validateExec(req *api.ExecRequest) (guest.ExecRequest, error) {
	var g guest.ExecRequest
	switch {
	case len(req.Cmd) > 0 && req.Shell != "":
		return g, errors.New("give either cmd (argv) or shell, not both")
	case len(req.Cmd) == 0 && req.Shell == "":
		return g, errors.New("missing command: give cmd (argv) or shell")
	case len(req.Cmd) > 0 && req.Cmd[0] == "":
		return g, errors.New("cmd[0] is empty")
	}
	if req.User != "" && !userRe.MatchString(req.User) {
		return g, fmt.Errorf("invalid user %q", req.User)
	}
	if req.Cwd != "" && (!path.IsAbs(req.Cwd) || strings.ContainsRune(req.Cwd, 0)) {
		return g, fmt.Errorf("cwd must be an absolute path, got %q", req.Cwd)
	}
	for k, v := range req.Env {
		if !vm.ValidEnv(k, v) {
			return g, fmt.Errorf("invalid environment variable %q", k)
		}
	}
	if req.Timeout < 0 {
		return g, errors.New("timeout must not be negative")
	}
	g = guest.ExecRequest{Argv: req.Cmd, Shell: req.Shell, Env: req.Env, Cwd: req.Cwd, User: req.User,
		TimeoutMS: time.Duration(req.Timeout).Milliseconds()}
	if req.Timeout > 0 && g.TimeoutMS == 0 {
		g.TimeoutMS = 1
	}
	return g, nil
}

// execVM runs a command. Three response shapes:
//   - Upgrade: agentvm-exec -> 101 and full-duplex frames (stdin streaming; the CLI uses this)
//   - Accept: application/x-ndjson or ?stream=1 -> one api.ExecEvent per line as produced
//   - otherwise -> one buffered api.ExecResult
func (s *Server) execVM(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	greq, err := validateExec(&req)
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	var ok bool
	if greq.User, ok = actAs(w, r, greq.User); !ok {
		return
	}
	upgrade := strings.EqualFold(r.Header.Get("Upgrade"), api.ExecUpgrade)
	streamed := strings.Contains(r.Header.Get("Accept"), "application/x-ndjson") || r.URL.Query().Get("stream") == "1" || r.URL.Query().Get("stream") == "true"
	greq.Stdin = upgrade || req.Stdin != ""
	if !upgrade && !streamed {
		// A buffered exec holds its output: refused before it runs when
		// the daemon's memory budget has no room left for it.
		rel, err := s.mem.Take(2*budgetChunk, "a buffered exec")
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error()+", or stream the output (Accept: application/x-ndjson)")
			return
		}
		// Held until the answer is written: the first chunk of its
		// output (execBuffered).
		defer rel()
	}
	vmRec, gc, err := s.svc.Guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background()) // the stream outlives r.Context() after a hijack
	defer cancel()
	stream, err := gc.Exec(ctx, greq)
	if err != nil {
		var ae *guest.APIError
		if errors.As(err, &ae) && ae.Status >= 400 && ae.Status < 500 {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, ae.Message)
			return
		}
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
		return
	}
	defer stream.Close()
	vmID, who, cmdline := vmRec.ID, actor(r), describeCmd(&req)
	start := time.Now()
	rec := s.rec.Exec(vmID, record.Exec{Command: cmdline, Argv: greq.Argv, Shell: greq.Shell, User: greq.User, Cwd: greq.Cwd, Actor: who, Via: "api"})
	if rec != nil {
		stream.Tap = rec
		defer rec.Done(-1, "", false) // a stream lost before its exit
	}
	stream.OnExit = func(st guest.ExitStatus) {
		rec.Done(st.ExitCode, st.Signal, st.TimedOut)
		data := map[string]string{"cmd": cmdline, "exit_code": strconv.Itoa(st.ExitCode), "ms": strconv.FormatInt(time.Since(start).Milliseconds(), 10)}
		if st.Signal != "" {
			data["signal"] = st.Signal
		}
		s.svc.EventData(vmID, "exec", who, data, "%s -> exit %d in %s", cmdline, st.ExitCode, time.Since(start).Round(time.Millisecond))
		s.metrics.observe("exec", time.Since(start))
	}
	switch {
	case upgrade:
		s.execUpgraded(w, stream)
	case streamed:
		go feedStdin(stream, req.Stdin)
		execNDJSON(w, r, stream)
	default:
		go feedStdin(stream, req.Stdin)
		execBuffered(w, r, stream, s.mem)
	}
}

func feedStdin(st *guest.ExecStream, stdin string) {
	if stdin != "" {
		io.WriteString(st, stdin)
		st.CloseStdin()
	}
}

func (s *Server) execUpgraded(w http.ResponseWriter, st *guest.ExecStream) {
	conn, br, ok := switchProtocols(w, api.ExecUpgrade)
	if !ok {
		return
	}
	defer conn.Close()
	// client -> guest: stdin, stdin EOF, signals
	go func() {
		for {
			f, err := api.ReadFrame(br)
			if err != nil {
				st.Close() // the client went away: the guest kills the process group
				return
			}
			switch f.Type {
			case api.FrameStdin:
				st.Write(f.Data)
			case api.FrameStdinEOF:
				st.CloseStdin()
			case api.FrameSignal:
				if n, err := strconv.Atoi(string(f.Data)); err == nil && n > 0 && n < 65 {
					st.Signal(syscall.Signal(n))
				}
			}
		}
	}()
	// guest -> client: output, errors, exit; frames are the same on both legs
	for {
		f, err := st.Next()
		if err != nil {
			msg, _ := json.Marshal(map[string]string{"message": "exec stream lost: " + err.Error()})
			api.WriteFrame(conn, api.FrameError, msg)
			return
		}
		if err := api.WriteFrame(conn, f.Type, f.Data); err != nil {
			return
		}
		if f.Type == api.FrameExit {
			return
		}
	}
}

func textOrBase64(b []byte) (string, bool) {
	if utf8.Valid(b) {
		return string(b), false
	}
	return base64.StdEncoding.EncodeToString(b), true
}

func execNDJSON(w http.ResponseWriter, r *http.Request, st *guest.ExecStream) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(200)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	go func() { <-r.Context().Done(); st.Close() }()
	for {
		f, err := st.Next()
		if err != nil {
			enc.Encode(api.ExecEvent{Type: "error", Message: "exec stream lost: " + err.Error()})
			return
		}
		ev := api.ExecEvent{}
		switch f.Type {
		case api.FrameStdout, api.FrameStderr:
			ev.Type = "stdout"
			if f.Type == api.FrameStderr {
				ev.Type = "stderr"
			}
			data, b64 := textOrBase64(f.Data)
			ev.Data = data
			if b64 {
				ev.Type += "_base64"
			}
		case api.FrameError:
			var e guest.ErrorBody
			json.Unmarshal(f.Data, &e)
			ev.Type, ev.Message = "error", e.Message
		case api.FrameExit:
			var es guest.ExitStatus
			json.Unmarshal(f.Data, &es)
			code := es.ExitCode
			ev = api.ExecEvent{Type: "exit", ExitCode: &code, Signal: es.Signal, TimedOut: es.TimedOut}
		default:
			continue
		}
		enc.Encode(ev)
		rc.Flush()
		if f.Type == api.FrameExit {
			return
		}
	}
}

// maxBufferedOutput caps each of stdout and stderr kept for a buffered exec
// response. Without it `{"cmd":["yes"],"timeout":"8s"}` grew the daemon's
// RSS by 557 MiB; the streaming modes have no cap because they hold nothing.
const maxBufferedOutput = 16 << 20

// cappedBuffer keeps the first max bytes written to it and discards the
// rest, still reporting every write as complete: the exec stream must be
// drained to the exit frame, or the guest's process would block on a full
// pipe instead of running to its end (or its timeout). What it keeps is
// taken from the daemon's memory budget a chunk at a time; when the budget
// is spent it keeps no more, and says so.
type cappedBuffer struct {
	b         strings.Builder
	max       int
	truncated bool
	by        string // why it truncated: "cap" or "memory_budget"
	mem       *budget.Memory
	held      int // bytes of the budget taken
	releases  []func()
}

// budgetChunk is how much of the budget a buffer takes at a time.
const budgetChunk = 1 << 20

func (c *cappedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := c.max - c.b.Len(); len(p) > room {
		c.truncated, c.by = true, "cap"
		p = p[:max(room, 0)]
	}
	for c.b.Len()+len(p) > c.held && c.by != "memory_budget" {
		// Twice what is kept: the buffer grows by doubling, so its
		// allocation can be up to twice its length.
		rel, err := c.mem.Take(2*budgetChunk, "a buffered exec's output")
		if err != nil {
			c.truncated, c.by = true, "memory_budget"
			break
		}
		c.releases = append(c.releases, rel)
		c.held += budgetChunk
	}
	if room := c.held - c.b.Len(); c.by == "memory_budget" && len(p) > room {
		p = p[:max(room, 0)]
	}
	c.b.Write(p)
	return n, nil
}

// release gives the buffer's share of the budget back.
func (c *cappedBuffer) release() {
	for _, rel := range c.releases {
		rel()
	}
	c.releases = nil
}

// execWaiter is the part of *guest.ExecStream a buffered exec uses.
type execWaiter interface {
	Wait(stdout, stderr io.Writer) (*guest.ExitStatus, error)
	Close() error
}

func execBuffered(w http.ResponseWriter, r *http.Request, st execWaiter, mem *budget.Memory) {
	go func() { <-r.Context().Done(); st.Close() }()
	out := &cappedBuffer{max: maxBufferedOutput, mem: mem}
	errb := &cappedBuffer{max: maxBufferedOutput, mem: mem}
	defer out.release()
	defer errb.release()
	es, err := st.Wait(out, errb)
	var ee *guest.ExecError
	if err != nil && !errors.As(err, &ee) {
		writeError(w, http.StatusBadGateway, api.CodeUnavailable, err.Error())
		return
	}
	if ee != nil {
		// Past the cap on purpose: the message (bounded by Wait) often
		// explains the failure, e.g. "command not found".
		errb.b.WriteString(ee.Message + "\n")
	}
	by := out.by
	if errb.by == "memory_budget" || by == "" {
		by = errb.by
	}
	writeExecResult(w, api.ExecResult{Stdout: out.b.String(), Stderr: errb.b.String(), ExitCode: es.ExitCode, Signal: es.Signal,
		TimedOut: es.TimedOut, DurationMs: es.DurationMS, StdoutTruncated: out.truncated, StderrTruncated: errb.truncated, TruncatedBy: by})
}

// writeExecResult answers res as JSON, escaping its output straight into
// the connection (writeJSONString) rather than into a copy in memory.
func writeExecResult(w http.ResponseWriter, res api.ExecResult) {
	stdout, stderr := res.Stdout, res.Stderr
	res.Stdout, res.Stderr = "", ""
	rest, err := json.Marshal(res)
	tail, ok := strings.CutPrefix(string(rest), `{"stdout":"","stderr":"",`)
	if err != nil || !ok {
		res.Stdout, res.Stderr = stdout, stderr
		writeJSON(w, http.StatusOK, res)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString(`{"stdout":`)
	writeJSONString(bw, stdout)
	bw.WriteString(`,"stderr":`)
	writeJSONString(bw, stderr)
	bw.WriteByte(',')
	bw.WriteString(tail)
	bw.WriteByte('\n')
	bw.Flush()
}

// describeCmd is the command of an exec request as one line (bounded).
func describeCmd(req *api.ExecRequest) string {
	c := req.Shell
	if c == "" {
		c = strings.Join(req.Cmd, " ")
	}
	if req.User != "" {
		c = "[" + req.User + "] " + c
	}
	if len(c) > 200 {
		c = c[:200] + "..."
	}
	return c
}
