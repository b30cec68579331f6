package api

import "encoding/json"

// The code interpreter: VMs made from the code-interpreter image run code in
// live kernels ("contexts") that keep variables, imports and the working
// directory between calls.

// RunCodeRequest is the body of POST /v1/vms/{id}/code. Context and Language
// are exclusive; with neither, the code runs in the default Python context;
// with Language alone, in that language's default context.
type RunCodeRequest struct {
	Code     string            `json:"code"`
	Language string            `json:"language,omitempty"` // python (default), javascript, bash
	Context  string            `json:"context,omitempty"`  // a context id from /code/contexts
	Env      map[string]string `json:"env,omitempty"`      // for this run only
	// Timeout interrupts the run (the context and its variables survive);
	// default 5m, at most 24h.
	Timeout Duration `json:"timeout,omitempty"`
}

// Code event types, one JSON object per line of POST /v1/vms/{id}/code.
const (
	CodeStdout = "stdout" // Text
	CodeStderr = "stderr" // Text
	CodeResult = "result" // Data (MIME type -> value), Main, Chart
	CodeError  = "error"  // Name, Value, Traceback
	CodeCount  = "count"  // ExecutionCount
	CodeEnd    = "end"    // last line; Error set when the run ended abnormally
)

// CodeEvent is one line of a run's newline-delimited JSON stream.
type CodeEvent struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
	// Data maps MIME types (text/plain, text/html, text/markdown, image/png
	// and image/jpeg as base64, image/svg+xml, application/json, text/latex,
	// application/pdf as base64, application/javascript) to the result's
	// representations. Main marks the value of the code's last expression.
	Data  map[string]json.RawMessage `json:"data,omitempty"`
	Main  bool                       `json:"main,omitempty"`
	Chart json.RawMessage            `json:"chart,omitempty"`

	Name      string `json:"name,omitempty"`
	Value     string `json:"value,omitempty"`
	Traceback string `json:"traceback,omitempty"`

	ExecutionCount int `json:"execution_count,omitempty"`

	Error string `json:"error,omitempty"` // on end: why the run ended abnormally
}

// CodeContext is a live kernel in a code-interpreter VM.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
	User     string `json:"user,omitempty"` // the guest user its process runs as
}

// CreateCodeContextRequest is the body of POST /v1/vms/{id}/code/contexts.
type CreateCodeContextRequest struct {
	Language string `json:"language,omitempty"` // python (default), javascript, typescript, r, java, bash
	Cwd      string `json:"cwd,omitempty"`      // default /home/user
	// User is "user" (the default) or "root"; root needs a token without
	// a user limit.
	User string `json:"user,omitempty"`
}

// CodeContextList is returned by GET /v1/vms/{id}/code/contexts.
type CodeContextList struct {
	Contexts []CodeContext `json:"contexts"`
}
