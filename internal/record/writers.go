package record

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// cutMarker starts the marker a recording ends with when it reached the
// VM's bound.
const cutMarker = "recording cut"

// castHeader is an asciicast v2 header; user and actor are agentvm's own
// keys (players ignore keys they do not know).
type castHeader struct {
	Version   int               `json:"version"`
	Width     int               `json:"width"`
	Height    int               `json:"height"`
	Timestamp int64             `json:"timestamp"`
	Title     string            `json:"title,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	User      string            `json:"agentvm_user,omitempty"`
	Actor     string            `json:"agentvm_actor,omitempty"`
}

// Cast records one terminal session. Its methods may be called from the
// relay's two directions at once; after Close they do nothing. A nil Cast
// (recording off) does nothing either.
type Cast struct {
	s     *Store
	vmID  string
	id    string
	start time.Time

	mu      sync.Mutex
	f       *os.File
	w       *bufio.Writer
	cut     bool
	pending []byte // the end of a chunk cut in the middle of a UTF-8 character
}

// Terminal starts the recording of a session on terminal term; nil when the
// VM's recording is off or the file cannot be made (logged).
func (s *Store) Terminal(vmID, term, user, actor string, cols, rows int) *Cast {
	if !s.Enabled(vmID) {
		return nil
	}
	dir, err := s.vmDir(vmID)
	if err != nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		s.cfg.Log.Warn("recording", "vm", vmID, "err", err)
		return nil
	}
	now := time.Now()
	c := &Cast{s: s, vmID: vmID, id: newID("term", now), start: now}
	f, err := os.OpenFile(filepath.Join(dir, c.id+".cast"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		s.cfg.Log.Warn("recording", "vm", vmID, "err", err)
		return nil
	}
	if cols <= 0 || rows <= 0 {
		cols, rows = 80, 24
	}
	c.f, c.w = f, bufio.NewWriterSize(f, 64<<10)
	h, _ := json.Marshal(castHeader{Version: 2, Width: cols, Height: rows, Timestamp: now.Unix(),
		Title: fmt.Sprintf("terminal %s (user %s)", term, user), Env: map[string]string{"TERM": "xterm-256color", "SHELL": "/bin/bash"},
		User: user, Actor: actor})
	c.write(append(h, '\n'))
	return c
}

// ID is the recording's id.
func (c *Cast) ID() string {
	if c == nil {
		return ""
	}
	return c.id
}

// Output records what the terminal printed (a terminal has one stream).
func (c *Cast) Output(b []byte, _ bool) { c.event("o", b) }

// Input records what a client typed.
func (c *Cast) Input(b []byte) { c.event("i", b) }

// Resize records a new window size.
func (c *Cast) Resize(cols, rows int) { c.event("r", []byte(fmt.Sprintf("%dx%d", cols, rows))) }

func (c *Cast) event(typ string, b []byte) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil || c.cut {
		return
	}
	if typ == "o" {
		// Keep a character cut between two chunks whole.
		b = append(c.pending, b...)
		c.pending = nil
		if i := incompleteTail(b); i < len(b) {
			c.pending = append([]byte(nil), b[i:]...)
			b = b[:i]
		}
	}
	data, _ := json.Marshal(string(b)) // invalid UTF-8 becomes U+FFFD, as asciicast wants text
	line := fmt.Sprintf("[%.6f, %q, %s]\n", time.Since(c.start).Seconds(), typ, data)
	c.write([]byte(line))
	if typ == "i" {
		c.w.Flush() // keystrokes are few: a crash loses little of what was typed
	}
}

// write appends to the file within the VM's bound; past it the recording
// ends with a marker.
func (c *Cast) write(b []byte) {
	if !c.s.reserve(c.vmID, c.id, int64(len(b))) {
		c.cut = true
		m := fmt.Sprintf("[%.6f, \"m\", %q]\n", time.Since(c.start).Seconds(), cutMarker+": the VM's recordings reached their bound")
		c.w.WriteString(m) // a few bytes past the bound, so that a player says why it ends
		c.w.Flush()
		return
	}
	c.w.Write(b)
}

// incompleteTail is where an incomplete UTF-8 sequence at the end of b
// starts (len(b) if there is none).
func incompleteTail(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			return len(b)
		}
	}
	return len(b)
}

// Close ends the recording.
func (c *Cast) Close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil {
		return
	}
	if len(c.pending) > 0 && !c.cut {
		data, _ := json.Marshal(string(c.pending))
		c.write([]byte(fmt.Sprintf("[%.6f, \"o\", %s]\n", time.Since(c.start).Seconds(), data)))
	}
	c.w.Flush()
	c.f.Close()
	c.f = nil
}

// maxExecOutput bounds the output an exec's record keeps of each stream.
const maxExecOutput = 64 << 10

// Exec is the record of one exec.
type Exec struct {
	ID              string    `json:"id"`
	Command         string    `json:"command"` // as the events show it
	Argv            []string  `json:"argv,omitempty"`
	Shell           string    `json:"shell,omitempty"`
	User            string    `json:"user,omitempty"`
	Cwd             string    `json:"cwd,omitempty"`
	Actor           string    `json:"actor"`
	Via             string    `json:"via"` // api, ssh
	StdinBytes      int64     `json:"stdin_bytes"`
	Stdout          string    `json:"stdout"`
	Stderr          string    `json:"stderr"`
	StdoutBytes     int64     `json:"stdout_bytes"`
	StderrBytes     int64     `json:"stderr_bytes"`
	StdoutTruncated bool      `json:"stdout_truncated,omitempty"`
	StderrTruncated bool      `json:"stderr_truncated,omitempty"`
	ExitCode        int       `json:"exit_code"`
	Signal          string    `json:"signal,omitempty"`
	TimedOut        bool      `json:"timed_out,omitempty"`
	Start           time.Time `json:"start"`
	DurationMs      int64     `json:"duration_ms"`
}

// ExecTap collects one exec's record as its streams pass; Done writes it.
// A nil ExecTap (recording off) does nothing.
type ExecTap struct {
	s    *Store
	vmID string
	mu   sync.Mutex
	e    Exec
	done bool
}

// Exec starts the record of an exec; nil when the VM's recording is off.
func (s *Store) Exec(vmID string, e Exec) *ExecTap {
	if !s.Enabled(vmID) {
		return nil
	}
	e.Start = time.Now().UTC()
	e.ID = newID("exec", e.Start)
	return &ExecTap{s: s, vmID: vmID, e: e}
}

// Input counts stdin.
func (t *ExecTap) Input(b []byte) {
	if t == nil {
		return
	}
	t.mu.Lock()
	t.e.StdinBytes += int64(len(b))
	t.mu.Unlock()
}

// Resize does nothing: an exec has no window.
func (t *ExecTap) Resize(int, int) {}

// Output keeps output (stderr when errStream), up to maxExecOutput.
func (t *ExecTap) Output(b []byte, errStream bool) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out, n, cut := &t.e.Stdout, &t.e.StdoutBytes, &t.e.StdoutTruncated
	if errStream {
		out, n, cut = &t.e.Stderr, &t.e.StderrBytes, &t.e.StderrTruncated
	}
	*n += int64(len(b))
	if room := maxExecOutput - len(*out); room < len(b) {
		b, *cut = b[:max(room, 0)], true
	}
	*out += string(b)
}

// Done writes the record with the exit status.
func (t *ExecTap) Done(code int, signal string, timedOut bool) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return
	}
	t.done = true
	t.e.ExitCode, t.e.Signal, t.e.TimedOut = code, signal, timedOut
	t.e.DurationMs = time.Since(t.e.Start).Milliseconds()
	t.e.Stdout = strings.ToValidUTF8(t.e.Stdout, "\uFFFD")
	t.e.Stderr = strings.ToValidUTF8(t.e.Stderr, "\uFFFD")
	b, _ := json.Marshal(t.e)
	b = append(b, '\n')
	dir, err := t.s.vmDir(t.vmID)
	if err != nil || os.MkdirAll(dir, 0o700) != nil {
		return
	}
	if !t.s.reserve(t.vmID, t.e.ID, int64(len(b))) {
		t.s.cfg.Log.Info("exec not recorded: the VM's recordings reached their bound", "vm", t.vmID)
		return
	}
	if err := os.WriteFile(filepath.Join(dir, t.e.ID+".jsonl"), b, 0o600); err != nil {
		t.s.cfg.Log.Warn("recording", "vm", t.vmID, "err", err)
	}
}

// Export writes the VM's recordings as a gzipped tar: each terminal's
// cast under terminals/, every exec as one line of execs.jsonl (oldest
// first), index.json (List) and events.jsonl (events, given).
func (s *Store) Export(vmID string, w io.Writer, events []byte) error {
	list, err := s.List(vmID)
	if err != nil {
		return err
	}
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	now := time.Now()
	add := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: now, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	index, _ := json.MarshalIndent(list, "", "  ")
	if err := add("index.json", index); err != nil {
		return err
	}
	var execs []byte
	for _, in := range list {
		rc, _, err := s.Open(vmID, in.ID)
		if err != nil {
			continue // evicted since the list
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		if in.Kind == "exec" {
			execs = append(execs, b...)
			continue
		}
		if err := add("terminals/"+in.ID+".cast", b); err != nil {
			return err
		}
	}
	if err := add("execs.jsonl", execs); err != nil {
		return err
	}
	if err := add("events.jsonl", events); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}
