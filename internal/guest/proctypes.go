package guest

// Managed processes: programs the agent runs on behalf of a caller that may
// come and go. Unlike an exec stream, a managed process outlives the request
// that started it; any later request can attach to its output, write its
// stdin, signal it or resize its pty, addressed by pid or by tag. They back
// the E2B-compatible process API.
//
//	POST /v1/procs               ProcStart -> NDJSON stream of ProcEvent (start first)
//	GET  /v1/procs               ProcList (running processes only)
//	POST /v1/procs/connect       ProcSelector -> NDJSON stream of ProcEvent from now on
//	POST /v1/procs/input         ProcInput
//	POST /v1/procs/close-stdin   ProcSelector
//	POST /v1/procs/signal        ProcSignal
//	POST /v1/procs/resize        ProcResize
//
// A stream ends after the end event, or without one when the caller goes
// away (the process keeps running) or falls behind by more than
// ProcSubscriberLag (it may connect again).
const (
	PathProcs           = "/v1/procs"
	PathProcsConnect    = "/v1/procs/connect"
	PathProcsInput      = "/v1/procs/input"
	PathProcsCloseStdin = "/v1/procs/close-stdin"
	PathProcsSignal     = "/v1/procs/signal"
	PathProcsResize     = "/v1/procs/resize"
)

// Limits of managed processes.
const (
	MaxProcs          = 512     // running managed processes per VM
	MaxProcTag        = 256     // bytes
	MaxProcInput      = 8 << 20 // bytes per input request
	ProcSubscriberLag = 64      // events queued for one stream before it is dropped
)

// Event types of a managed process stream.
const (
	ProcEventStart  = "start"
	ProcEventStdout = "stdout"
	ProcEventStderr = "stderr"
	ProcEventPTY    = "pty"
	ProcEventEnd    = "end"
)

// PTYSize is a terminal size.
type PTYSize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// ProcStart starts a managed process.
type ProcStart struct {
	Argv      []string          `json:"argv"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	User      string            `json:"user,omitempty"` // default root
	Tag       string            `json:"tag,omitempty"`
	Stdin     bool              `json:"stdin,omitempty"` // false: /dev/null (ignored with a pty)
	PTY       *PTYSize          `json:"pty,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"` // killed (SIGKILL to its group) after this
}

// ProcSelector names a managed process: by pid, or by tag when pid is 0.
type ProcSelector struct {
	PID int    `json:"pid,omitempty"`
	Tag string `json:"tag,omitempty"`
}

// ProcInput writes to a process's stdin (or its pty).
type ProcInput struct {
	ProcSelector
	Data []byte `json:"data"`
}

// ProcSignal sends a signal to a process's group.
type ProcSignal struct {
	ProcSelector
	Signal string `json:"signal"` // e.g. SIGTERM, SIGKILL
}

// ProcResize resizes a process's pty.
type ProcResize struct {
	ProcSelector
	PTYSize
}

// ProcInfo describes a running managed process.
type ProcInfo struct {
	PID  int               `json:"pid"`
	Tag  string            `json:"tag,omitempty"`
	Argv []string          `json:"argv"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	PTY  bool              `json:"pty,omitempty"`
}

// ProcList is the body of GET /v1/procs.
type ProcList struct {
	Processes []ProcInfo `json:"processes"`
}

// ProcEvent is one line of a managed process stream.
type ProcEvent struct {
	Type string `json:"type"`
	PID  int    `json:"pid,omitempty"`  // start
	Data []byte `json:"data,omitempty"` // stdout, stderr, pty
	// end
	ExitCode int    `json:"exit_code,omitempty"`
	Status   string `json:"status,omitempty"` // "exit status 1", "signal: killed"
	TimedOut bool   `json:"timed_out,omitempty"`
	Error    string `json:"error,omitempty"`
}
