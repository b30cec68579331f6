package e2b

import (
	"bufio"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/guest/guesttest"
)

// A terminal's start event waits for its program's first output (a
// shell's prompt), so input sent once pty.create returns reaches a shell
// that reads it; a plain process's start is sent at once; a terminal
// whose program stays silent starts after ptyReady.
func TestTerminalStartWaitsForItsProgram(t *testing.T) {
	h := newEnvdHarness(t)
	var prompted atomic.Bool
	release := make(chan struct{})
	agent := http.NewServeMux()
	agent.HandleFunc("POST "+guest.PathProcs, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte(`{"type":"start","pid":7}` + "\n"))
		w.(http.Flusher).Flush()
		select { // the shell starts
		case <-release:
		case <-r.Context().Done():
			return
		}
		prompted.Store(true)
		w.Write([]byte(`{"type":"pty","data":"dXNlckB2bTp+JCA="}` + "\n")) // "user@vm:~$ "
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	h.vms.g = guesttest.Agent(t, agent)
	tok := h.s.envdToken("vm1", h.key(t, "vm1", api.CreateTokenRequest{Allow: []string{api.PermExec}}))
	open := func(body string) *bufio.Reader {
		t.Helper()
		req, _ := http.NewRequest("POST", h.url+"/process.Process/Start", strings.NewReader(string(envelope(0, body))))
		req.Header.Set("Content-Type", "application/connect+json")
		req.Header.Set("X-Access-Token", tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return bufio.NewReader(resp.Body)
	}
	next := func(br *bufio.Reader) string {
		t.Helper()
		done := make(chan struct{})
		defer close(done)
		go func() { // a stream that never sends fails the test instead of hanging it
			select {
			case <-done:
			case <-time.After(time.Minute):
				panic("no message on the stream within a minute")
			}
		}()
		var hdr [5]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			t.Fatalf("stream: %v", err)
		}
		b := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(br, b); err != nil {
			t.Fatalf("stream: %v", err)
		}
		return string(b)
	}

	// The shell prints its prompt only when released: a second after the
	// stream opened, or as soon as the start event arrived (which then
	// came before the prompt, and the test fails).
	br := open(`{"process":{"cmd":"/bin/bash","args":["-i","-l"]},"pty":{"size":{"cols":80,"rows":24}}}`)
	first := make(chan string, 1)
	go func() { first <- next(br) }()
	var msg string
	select {
	case msg = <-first:
		close(release)
		t.Fatalf("the terminal's first event %s came before its shell's first output", msg)
	case <-time.After(time.Second):
		close(release)
		msg = <-first
	}
	if !strings.Contains(msg, `"start"`) || !prompted.Load() {
		t.Fatalf("the terminal's first event: %s (prompted: %v)", msg, prompted.Load())
	}
	if msg = next(br); !strings.Contains(msg, `"pty"`) {
		t.Fatalf("after the start: %s", msg)
	}

	// A process without a terminal starts at once (the agent here never
	// writes a byte after its start).
	h.vms.g = guesttest.Agent(t, silentAgent())
	if msg := next(open(`{"process":{"cmd":"/bin/sleep","args":["1000"]}}`)); !strings.Contains(msg, `"start"`) {
		t.Fatalf("a plain process's first event: %s", msg)
	}
	// An agent that repeats the start (root in the guest can replace the
	// agent) gets one start through; the held start is not queued again.
	repeat := http.NewServeMux()
	repeat.HandleFunc("POST "+guest.PathProcs, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for range 1000 {
			w.Write([]byte(`{"type":"start","pid":9}` + "\n"))
		}
		w.Write([]byte(`{"type":"pty","data":"JCA="}` + "\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	h.vms.g = guesttest.Agent(t, repeat)
	rb := open(`{"process":{"cmd":"/bin/bash"},"pty":{"size":{"cols":80,"rows":24}}}`)
	if a, b := next(rb), next(rb); !strings.Contains(a, `"start"`) || !strings.Contains(b, `"pty"`) {
		t.Fatalf("repeated starts: %s then %s", a, b)
	}

	// A silent terminal program starts after ptyReady.
	h.vms.g = guesttest.Agent(t, silentAgent())
	defer func(d time.Duration) { ptyReady = d }(ptyReady)
	ptyReady = 300 * time.Millisecond
	start := time.Now()
	if msg := next(open(`{"process":{"cmd":"/bin/cat"},"pty":{"size":{"cols":80,"rows":24}}}`)); !strings.Contains(msg, `"start"`) {
		t.Fatalf("a silent terminal's first event: %s", msg)
	}
	if d := time.Since(start); d < ptyReady {
		t.Fatalf("a silent terminal's start came after %v, before ptyReady (%v): it was not held", d, ptyReady)
	}
}

func silentAgent() *http.ServeMux {
	agent := http.NewServeMux()
	agent.HandleFunc("POST "+guest.PathProcs, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte(`{"type":"start","pid":8}` + "\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	return agent
}
