package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
)

// termReader collects a terminal's output in the background.
type termReader struct {
	t    *testing.T
	tm   *client.Terminal
	mu   sync.Mutex
	buf  strings.Builder
	done chan struct{}
}

func attach(t *testing.T, c *client.Client, vm, name string, o client.AttachOptions) *termReader {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tm, err := c.AttachTerminal(ctx, vm, name, o)
	if err != nil {
		t.Fatalf("attach %s: %v", name, err)
	}
	r := &termReader{t: t, tm: tm, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		b := make([]byte, 32<<10)
		for {
			n, err := tm.Read(b)
			r.mu.Lock()
			r.buf.Write(b[:n])
			r.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return r
}

func (r *termReader) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

// waitFor waits until the output contains s.
func (r *termReader) waitFor(s string, d time.Duration) string {
	r.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if out := r.output(); strings.Contains(out, s) {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("terminal output never contained %q; got:\n%s", s, r.output())
	return ""
}

func (r *termReader) send(s string) {
	r.t.Helper()
	if _, err := r.tm.Write([]byte(s)); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

func (r *termReader) close() {
	r.tm.Close()
	<-r.done
}

func TestTerminals(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "term1"})
	c := s.Client

	if _, err := c.CreateTerminal(ctx, v.ID, api.TermCreate{Name: "work", Cols: 100, Rows: 30}); err != nil {
		t.Fatal(err)
	}
	a := attach(t, c, v.ID, "work", client.AttachOptions{})
	a.send("echo marker-$((6*7))\n")
	a.waitFor("marker-42", 30*time.Second)

	t.Run("output while detached is kept for the next client", func(t *testing.T) {
		a.t = t
		a.send("for i in 1 2 3 4 5; do echo tick-$i; sleep 0.5; done; echo loop-$((2*3))-done\n")
		a.close() // every client gone: the loop keeps running
		// (the guest drops the client once the close reaches it)
		waitUntil(t, "the detach to be seen", time.Minute, func() (bool, string) {
			ts, err := c.ListTerminals(ctx, v.ID)
			ok := err == nil && len(ts) == 1 && ts[0].Name == "work" && ts[0].Clients == 0 && !ts[0].Exited
			return ok, fmt.Sprintf("list: %v %+v", err, ts)
		})
		a = attach(t, c, v.ID, "work", client.AttachOptions{})
		out := a.waitFor("loop-6-done", time.Minute) // (not the echo of the typed line)
		if !strings.Contains(out, "marker-42") || !strings.Contains(out, "tick-5") {
			t.Fatalf("scrollback lost earlier output:\n%s", out)
		}
	})

	t.Run("two clients see the same output", func(t *testing.T) {
		a.t = t
		b := attach(t, c, v.ID, "work", client.AttachOptions{NoScrollback: true})
		defer b.close()
		time.Sleep(300 * time.Millisecond)
		a.send("echo shared-$((1+1))\n")
		a.waitFor("shared-2", 20*time.Second)
		b.waitFor("shared-2", 20*time.Second)
		b.send("echo from-b-$((2+2))\n")
		a.waitFor("from-b-4", 20*time.Second)
	})

	t.Run("resize and signals", func(t *testing.T) {
		a.t = t
		if err := a.tm.Resize(132, 43); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		a.send("stty size\n")
		a.waitFor("43 132", 20*time.Second)
		a.send("sleep 300\n")
		// signalled once it runs (before, the interrupt would reach the
		// idle shell and the sleep would start after it)
		waitUntil(t, "the sleep to start", time.Minute, func() (bool, string) {
			return strings.TrimSpace(s.Exec(ctx, v.ID, "pgrep -fx 'sleep 300' || true").Stdout) != "", "no sleep 300"
		})
		if err := c.SignalTerminal(ctx, v.ID, "work", "INT"); err != nil {
			t.Fatal(err)
		}
		// the sleep is gone: the shell runs the next line at once
		a.send("echo after-int-$((7*7))\n")
		a.waitFor("after-int-49", time.Minute)
	})

	t.Run("survives suspend and wake", func(t *testing.T) {
		a.t = t
		a.send("echo before-suspend; sleep 2 && echo woke-$((3*3)) &\n")
		a.waitFor("before-suspend", 20*time.Second)
		a.close()
		info1, _ := c.GetTerminal(ctx, v.ID, "work")
		if _, err := c.SuspendVM(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
		// Attaching wakes the VM; the shell, its job and the scrollback are there.
		a = attach(t, c, v.ID, "work", client.AttachOptions{})
		out := a.waitFor("woke-9", 60*time.Second)
		if !strings.Contains(out, "marker-42") {
			t.Fatalf("scrollback after wake:\n%s", out)
		}
		info2, err := c.GetTerminal(ctx, v.ID, "work")
		if err != nil || info2.PID != info1.PID {
			t.Fatalf("terminal after wake: %v %+v (before %+v)", err, info2, info1)
		}
	})

	t.Run("exit status and kill", func(t *testing.T) {
		a.t = t
		a.send("exit 3\n")
		<-a.done
		if ex := a.tm.Exit(); ex == nil || ex.ExitCode != 3 {
			t.Fatalf("exit: %+v", ex)
		}
		ti, err := c.GetTerminal(ctx, v.ID, "work")
		if err != nil || !ti.Exited || ti.ExitCode != 3 {
			t.Fatalf("exited terminal: %v %+v", err, ti)
		}
		if err := c.KillTerminal(ctx, v.ID, "work"); err != nil {
			t.Fatal(err)
		}
		_, err = c.GetTerminal(ctx, v.ID, "work")
		wantStatus(t, err, 404, "")
	})

	t.Run("bad input", func(t *testing.T) {
		_, err := c.CreateTerminal(ctx, v.ID, api.TermCreate{Name: "bad name/../x"})
		wantStatus(t, err, 400, api.CodeInvalid)
		_, err = c.CreateTerminal(ctx, v.ID, api.TermCreate{User: "nosuchuser"})
		wantStatus(t, err, 400, api.CodeInvalid)
		if _, err := c.CreateTerminal(ctx, v.ID, api.TermCreate{Name: "dup"}); err != nil {
			t.Fatal(err)
		}
		_, err = c.CreateTerminal(ctx, v.ID, api.TermCreate{Name: "dup"})
		wantStatus(t, err, 409, "")
		wantStatus(t, c.SignalTerminal(ctx, v.ID, "dup", "NOTASIGNAL"), 400, api.CodeInvalid)
		_, err = c.AttachTerminal(ctx, v.ID, "missing", client.AttachOptions{})
		wantStatus(t, err, 404, "")
	})

	t.Run("agentvm term CLI", func(t *testing.T) {
		out, errOut, code := s.CLI("echo cli-$((5*5)); whoami; exit 4\n", "term", "term1", "--session", "cli", "--user", "agent")
		if code != 4 || !strings.Contains(out, "cli-25") || !strings.Contains(out, "agent") {
			t.Fatalf("term: code %d out %q err %q", code, out, errOut)
		}
		out, _, code = s.CLI("", "term", "term1", "--ls")
		if code != 0 || !strings.Contains(out, "cli") || !strings.Contains(out, "exited 4") {
			t.Fatalf("term --ls: %d %q", code, out)
		}
	})
}

func clientAttachNoScrollback() client.AttachOptions { return client.AttachOptions{NoScrollback: true} }
