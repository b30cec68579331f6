package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/vm"
)

// The code interpreter: VMs of the code-interpreter image run a server on
// port 49999 that speaks E2B's code-interpreter protocol (E2B's SDKs reach it
// through the preview proxy). These routes relay to it through the VM's
// network and turn its events into agentvm's (api.CodeEvent).

const (
	defaultCodeTimeout = 5 * time.Minute
	maxCodeTimeout     = 24 * time.Hour
	maxCodeBody        = 10 << 20 // code and env of one run (the guest's limit too)
	maxCodeLine        = 32 << 20 // one event from the guest (a large image)
	// codeGrace is how long past a run's timeout the relay waits for the
	// guest to report the interrupt before it gives up on the run.
	codeGrace = 2 * time.Minute
)

// codeUser is the guest user kernels run as unless a context asks for root.
const codeUser = "user"

var contextIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (s *Server) codeRoutes(mux patternMux) {
	x := func(h http.HandlerFunc) http.HandlerFunc { return s.scoped(api.PermExec, h) }
	mux.HandleFunc("POST /v1/vms/{id}/code", x(s.runCode))
	mux.HandleFunc("GET /v1/vms/{id}/code/contexts", x(s.listCodeContexts))
	mux.HandleFunc("POST /v1/vms/{id}/code/contexts", x(s.createCodeContext))
	mux.HandleFunc("DELETE /v1/vms/{id}/code/contexts/{ctx}", x(s.codeContextOp("DELETE", "")))
	mux.HandleFunc("POST /v1/vms/{id}/code/contexts/{ctx}/restart", x(s.codeContextOp("POST", "/restart")))
}

// codeGuest returns an HTTP client whose connections go to the VM's code
// interpreter, or writes why the VM has none.
func (s *Server) codeGuest(w http.ResponseWriter, r *http.Request) (*http.Client, bool) {
	// Kernels run as the image's user "user" (E2B's), who may sudo: a token
	// limited to another guest user cannot use them.
	if p := principal(r); p.User != "" && p.User != codeUser {
		writeError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf(
			"this token is limited to user %q; code runs as %q", p.User, codeUser))
		return nil, false
	}
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return nil, false
	}
	if v.Image != image.CodeInterpreter {
		writeError(w, http.StatusConflict, api.CodeConflict, fmt.Sprintf(
			"VM %s was made from the %s image: code runs in VMs made with --image %s", v.Name, imageName(v.Image), image.CodeInterpreter))
		return nil, false
	}
	id := v.ID
	return &http.Client{Transport: &http.Transport{
		// The server listens on the guest's loopback: the guest agent dials
		// it from inside (waking the VM first).
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			_, gc, err := s.svc.Guest(ctx, id)
			if err != nil {
				return nil, err
			}
			return gc.DialTCP(ctx, "127.0.0.1", image.CodeInterpreterPort)
		},
		DisableKeepAlives:  true,
		DisableCompression: true,
		// A context start under emulation is slow; the guest gives a
		// kernel 180 s to start.
		ResponseHeaderTimeout: 4 * time.Minute,
	}}, true
}

// codeCall sends one request to the VM's code interpreter; a non-2xx answer
// is written to w as an agentvm error and reported as nil.
func (s *Server) codeCall(w http.ResponseWriter, r *http.Request, hc *http.Client, method, path string, body any) *http.Response {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(r.Context(), method, "http://code-interpreter"+path, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		if errors.Is(err, vm.ErrNotFound) || errors.Is(err, vm.ErrConflict) || errors.Is(err, vm.ErrUnavailable) && !errors.Is(err, vm.ErrGuestDial) {
			writeErr(w, unwrapURL(err))
			return nil
		}
		writeError(w, http.StatusBadGateway, api.CodeUnavailable, "the VM's code interpreter does not answer: "+unwrapURL(err).Error())
		return nil
	}
	if resp.StatusCode/100 == 2 {
		return resp
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	msg := guestMessage(b)
	switch resp.StatusCode {
	case http.StatusNotFound:
		writeError(w, http.StatusNotFound, api.CodeNotFound, msg)
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
		writeError(w, http.StatusBadRequest, api.CodeInvalid, msg)
	case http.StatusTooManyRequests, http.StatusConflict:
		writeError(w, http.StatusConflict, api.CodeConflict, msg)
	default:
		writeError(w, http.StatusBadGateway, api.CodeUnavailable, fmt.Sprintf("code interpreter: HTTP %d: %s", resp.StatusCode, msg))
	}
	return nil
}

func unwrapURL(err error) error {
	var ue interface{ Unwrap() error }
	if errors.As(err, &ue) {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}

// guestMessage is the text of an error body from the guest (plain text or a
// JSON object with a message), cleaned for display.
func guestMessage(b []byte) string {
	var j struct {
		Message string `json:"message"`
		Error   string `json:"error"`
		Detail  string `json:"detail"`
	}
	if json.Unmarshal(b, &j) == nil {
		for _, m := range []string{j.Message, j.Error, j.Detail} {
			if m != "" {
				return m
			}
		}
	}
	m := strings.ToValidUTF8(strings.TrimSpace(string(b)), "?")
	if m == "" {
		m = "no details"
	}
	return m
}

// guestExecute is the code interpreter's /execute body.
type guestExecute struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
	TimeoutMS int64             `json:"timeout_ms"`
}

func (s *Server) runCode(w http.ResponseWriter, r *http.Request) {
	var req api.RunCodeRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCodeBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "invalid JSON body: "+err.Error())
		return
	}
	if req.Context != "" && req.Language != "" {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "context and language are exclusive: a context has its language")
		return
	}
	if req.Context != "" && !contextIDRe.MatchString(req.Context) {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("invalid context id %q", req.Context))
		return
	}
	for k, v := range req.Env {
		if !vm.ValidEnv(k, v) {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("invalid environment variable %q", k))
			return
		}
	}
	timeout := time.Duration(req.Timeout)
	switch {
	case timeout < 0 || timeout > maxCodeTimeout:
		writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("timeout must be between 0 and %s", maxCodeTimeout))
		return
	case timeout == 0:
		timeout = defaultCodeTimeout
	}
	hc, ok := s.codeGuest(w, r)
	if !ok || s.refuseRootContext(w, r, hc, req.Context) {
		return
	}
	// Bound the whole relay: a guest that stops answering cannot hold the
	// request past the run's timeout and a grace for its interrupt.
	ctx, cancel := context.WithTimeout(r.Context(), timeout+codeGrace)
	defer cancel()
	r = r.WithContext(ctx)
	resp := s.codeCall(w, r, hc, "POST", "/execute", guestExecute{Code: req.Code, ContextID: req.Context,
		Language: req.Language, EnvVars: req.Env, TimeoutMS: timeout.Milliseconds()})
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // results are HTML: keep them their size
	emit := func(e api.CodeEvent) {
		enc.Encode(e)
		if fl != nil {
			fl.Flush()
		}
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := readLine(br, maxCodeLine)
		if len(bytes.TrimSpace(line)) > 0 {
			e, ok := translateCodeEvent(line)
			if !ok {
				emit(api.CodeEvent{Type: api.CodeEnd, Error: "the code interpreter sent a line that is not an event"})
				return
			}
			if e.Type != "" {
				emit(e)
			}
			if e.Type == api.CodeEnd {
				return
			}
		}
		if err != nil {
			why := "the code interpreter ended the run without finishing it"
			if !errors.Is(err, io.EOF) {
				why = "the connection to the code interpreter failed: " + err.Error()
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				why = fmt.Sprintf("the code interpreter did not finish the run within its timeout (%s) and %s more", timeout, codeGrace)
			}
			if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
				emit(api.CodeEvent{Type: api.CodeEnd, Error: why})
			}
			return
		}
	}
}

var errLineTooLong = errors.New("event longer than the limit")

// readLine reads one '\n'-terminated line of at most max bytes.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var out []byte
	for {
		chunk, err := br.ReadSlice('\n')
		out = append(out, chunk...)
		if len(out) > max {
			return nil, errLineTooLong
		}
		if err != bufio.ErrBufferFull {
			return out, err
		}
	}
}

// dataFrameMIME carries a pandas DataFrame as {"column": [values]}.
const dataFrameMIME = "application/vnd.agentvm.dataframe+json"

// e2bResult are the code interpreter's result fields and their MIME types.
var e2bResult = map[string]string{
	"text": "text/plain", "html": "text/html", "markdown": "text/markdown", "svg": "image/svg+xml",
	"png": "image/png", "jpeg": "image/jpeg", "pdf": "application/pdf", "latex": "text/latex",
	"json": "application/json", "javascript": "application/javascript",
}

// translateCodeEvent turns one line of the E2B protocol into an agentvm
// event; an unknown type gives an empty event (skipped) and bad JSON false.
func translateCodeEvent(line []byte) (api.CodeEvent, bool) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return api.CodeEvent{}, false
	}
	str := func(k string) string {
		var s string
		json.Unmarshal(m[k], &s)
		return s
	}
	switch str("type") {
	case "stdout":
		return api.CodeEvent{Type: api.CodeStdout, Text: str("text")}, true
	case "stderr":
		return api.CodeEvent{Type: api.CodeStderr, Text: str("text")}, true
	case "error":
		tb := str("traceback")
		if tb == "" {
			var lines []string
			if json.Unmarshal(m["traceback"], &lines) == nil {
				tb = strings.Join(lines, "\n")
			}
		}
		return api.CodeEvent{Type: api.CodeError, Name: str("name"), Value: str("value"), Traceback: tb}, true
	case "number_of_executions":
		var n int
		json.Unmarshal(m["execution_count"], &n)
		return api.CodeEvent{Type: api.CodeCount, ExecutionCount: n}, true
	case "end_of_execution":
		return api.CodeEvent{Type: api.CodeEnd}, true
	case "unexpected_end_of_execution":
		return api.CodeEvent{Type: api.CodeEnd, Error: "the kernel ended the run unexpectedly"}, true
	case "result":
		e := api.CodeEvent{Type: api.CodeResult, Data: map[string]json.RawMessage{}}
		json.Unmarshal(m["is_main_result"], &e.Main)
		for k, v := range m {
			if mime, ok := e2bResult[k]; ok && !isNull(v) {
				e.Data[mime] = v
			}
		}
		if v := m["chart"]; !isNull(v) {
			e.Chart = v
		}
		if v := m["data"]; !isNull(v) {
			e.Data[dataFrameMIME] = v // a DataFrame's columns: {"col": [values]}
		}
		var extra map[string]json.RawMessage
		if json.Unmarshal(m["extra"], &extra) == nil {
			for k, v := range extra {
				if _, taken := e.Data[k]; !taken {
					e.Data[k] = v
				}
			}
		}
		return e, true
	}
	return api.CodeEvent{}, true
}

func isNull(v json.RawMessage) bool { return len(v) == 0 || string(v) == "null" }

func (s *Server) listCodeContexts(w http.ResponseWriter, r *http.Request) {
	hc, ok := s.codeGuest(w, r)
	if !ok {
		return
	}
	resp := s.codeCall(w, r, hc, "GET", "/contexts", nil)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	out := api.CodeContextList{Contexts: []api.CodeContext{}}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out.Contexts); err != nil {
		writeError(w, http.StatusBadGateway, api.CodeUnavailable, "code interpreter: bad context list: "+err.Error())
		return
	}
	if out.Contexts == nil {
		out.Contexts = []api.CodeContext{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) createCodeContext(w http.ResponseWriter, r *http.Request) {
	var req api.CreateCodeContextRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	if req.Cwd != "" && (!strings.HasPrefix(req.Cwd, "/") || strings.ContainsRune(req.Cwd, 0)) {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "cwd must be an absolute path")
		return
	}
	switch req.User {
	case "", codeUser:
	case "root":
		if p := principal(r); p.User != "" {
			writeError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf(
				"this token is limited to user %q; a context as root needs a token without a user limit", p.User))
			return
		}
	default:
		writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("user must be %q (the default) or \"root\"", codeUser))
		return
	}
	hc, ok := s.codeGuest(w, r)
	if !ok {
		return
	}
	resp := s.codeCall(w, r, hc, "POST", "/contexts", req)
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	var c api.CodeContext
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&c); err != nil || c.ID == "" {
		writeError(w, http.StatusBadGateway, api.CodeUnavailable, "code interpreter: bad context answer")
		return
	}
	if req.User == "root" && c.User != "root" {
		// A server from an image built before root contexts ignores the field.
		if del, err := http.NewRequestWithContext(r.Context(), "DELETE", "http://code-interpreter/contexts/"+c.ID, nil); err == nil {
			if resp, err := hc.Do(del); err == nil {
				resp.Body.Close()
			}
		}
		writeError(w, http.StatusConflict, api.CodeConflict,
			"this VM's code interpreter cannot run a context as root: its image predates them (make the VM anew)")
		return
	}
	writeJSON(w, http.StatusCreated, c)
}

// refuseRootContext answers 403, and says so, when a token limited to a
// guest user names a context that runs as root: the limit holds for the
// contexts it may not create.
func (s *Server) refuseRootContext(w http.ResponseWriter, r *http.Request, hc *http.Client, ctxID string) bool {
	p := principal(r)
	if p.User == "" || ctxID == "" {
		return false
	}
	resp := s.codeCall(w, r, hc, "GET", "/contexts", nil)
	if resp == nil {
		return true
	}
	defer resp.Body.Close()
	var cs []api.CodeContext
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&cs); err != nil {
		writeError(w, http.StatusBadGateway, api.CodeUnavailable, "code interpreter: bad context list: "+err.Error())
		return true
	}
	for _, c := range cs {
		if c.ID == ctxID && c.User == "root" {
			writeError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf(
				"this token is limited to user %q; context %s runs as root", p.User, ctxID))
			return true
		}
	}
	return false
}

func (s *Server) codeContextOp(method, suffix string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("ctx")
		if !contextIDRe.MatchString(id) {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("invalid context id %q", id))
			return
		}
		hc, ok := s.codeGuest(w, r)
		if !ok || s.refuseRootContext(w, r, hc, id) {
			return
		}
		resp := s.codeCall(w, r, hc, method, "/contexts/"+id+suffix, nil)
		if resp == nil {
			return
		}
		resp.Body.Close()
		if method == "DELETE" {
			writeJSON(w, http.StatusOK, map[string]string{"message": "context " + id + " removed"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"message": "context " + id + " restarted"})
	}
}
