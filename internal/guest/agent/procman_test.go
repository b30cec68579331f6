package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
)

// collect reads a process stream to its end event (or EOF).
func collect(t *testing.T, s *guest.ProcStream) (pid int, out map[string]string, end *guest.ProcEvent) {
	t.Helper()
	out = map[string]string{}
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			return pid, out, nil
		}
		if err != nil {
			t.Fatalf("next: %v", err)
		}
		switch ev.Type {
		case guest.ProcEventStart:
			pid = ev.PID
		case guest.ProcEventEnd:
			return pid, out, &ev
		default:
			out[ev.Type] += string(ev.Data)
		}
	}
}

func TestManagedProcesses(t *testing.T) {
	e := startAgent(t)
	e.connect(e.port.Attach(t), "")
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()

	t.Run("run", func(t *testing.T) {
		s, err := e.c.StartProc(ctx, guest.ProcStart{Argv: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, Env: map[string]string{"X": "y"}})
		if err != nil {
			t.Fatal(err)
		}
		pid, out, end := collect(t, s)
		if pid <= 0 || out["stdout"] != "out\n" || out["stderr"] != "err\n" || end == nil || end.ExitCode != 3 || end.Status != "exit status 3" {
			t.Fatalf("pid %d out %q end %+v", pid, out, end)
		}
	})

	t.Run("reattach, stdin, list, signal", func(t *testing.T) {
		s, err := e.c.StartProc(ctx, guest.ProcStart{Argv: []string{"/bin/cat"}, Stdin: true, Tag: "cat1"})
		if err != nil {
			t.Fatal(err)
		}
		first, _ := s.Next()
		s.Close() // detach: the process keeps running
		pid := first.PID
		l, err := e.c.ListProcs(ctx)
		if err != nil || len(l.Processes) != 1 || l.Processes[0].PID != pid || l.Processes[0].Tag != "cat1" {
			t.Fatalf("list = %+v, %v", l, err)
		}
		c, err := e.c.ConnectProc(ctx, guest.ProcSelector{Tag: "cat1"})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.c.ProcInput(ctx, guest.ProcInput{ProcSelector: guest.ProcSelector{PID: pid}, Data: []byte("hello\n")}); err != nil {
			t.Fatal(err)
		}
		if err := e.c.ProcCloseStdin(ctx, guest.ProcSelector{PID: pid}); err != nil {
			t.Fatal(err)
		}
		_, out, end := collect(t, c)
		if out["stdout"] != "hello\n" || end == nil || end.ExitCode != 0 {
			t.Fatalf("out %q end %+v", out, end)
		}
		waitFor(t, "the ended process to leave the list", func() bool {
			l, err := e.c.ListProcs(ctx)
			return err == nil && len(l.Processes) == 0
		})
		if _, err := e.c.ConnectProc(ctx, guest.ProcSelector{PID: pid}); err == nil {
			t.Fatal("connect to an ended process succeeded")
		}

		s, err = e.c.StartProc(ctx, guest.ProcStart{Argv: []string{"sleep", "60"}})
		if err != nil {
			t.Fatal(err)
		}
		first, _ = s.Next()
		if err := e.c.ProcSignal(ctx, guest.ProcSignal{ProcSelector: guest.ProcSelector{PID: first.PID}, Signal: "SIGKILL"}); err != nil {
			t.Fatal(err)
		}
		_, _, end = collect(t, s)
		if end == nil || end.Status != "signal: killed" || end.ExitCode != -1 {
			t.Fatalf("end %+v", end)
		}
	})

	t.Run("pty", func(t *testing.T) {
		s, err := e.c.StartProc(ctx, guest.ProcStart{Argv: []string{"/bin/sh", "-c", "stty size; read x; stty size"}, PTY: &guest.PTYSize{Cols: 80, Rows: 24}})
		if err != nil {
			t.Fatal(err)
		}
		first, _ := s.Next()
		var got strings.Builder
		for !strings.Contains(got.String(), "24 80") {
			ev, err := s.Next()
			if err != nil {
				t.Fatalf("next: %v (so far %q)", err, got.String())
			}
			got.Write(ev.Data)
		}
		sel := guest.ProcSelector{PID: first.PID}
		if err := e.c.ProcResize(ctx, guest.ProcResize{ProcSelector: sel, PTYSize: guest.PTYSize{Cols: 100, Rows: 30}}); err != nil {
			t.Fatal(err)
		}
		if err := e.c.ProcInput(ctx, guest.ProcInput{ProcSelector: sel, Data: []byte("\n")}); err != nil {
			t.Fatal(err)
		}
		_, out, end := collect(t, s)
		if !strings.Contains(out["pty"], "30 100") || end == nil || end.ExitCode != 0 {
			t.Fatalf("out %q end %+v", out, end)
		}
	})

	t.Run("time limit", func(t *testing.T) {
		s, err := e.c.StartProc(ctx, guest.ProcStart{Argv: []string{"sleep", "60"}, TimeoutMS: 200})
		if err != nil {
			t.Fatal(err)
		}
		_, _, end := collect(t, s)
		if end == nil || !end.TimedOut {
			t.Fatalf("end %+v", end)
		}
	})

	t.Run("background child keeps the pipe", func(t *testing.T) {
		s, err := e.c.StartProc(ctx, guest.ProcStart{Argv: []string{"/bin/sh", "-c", "sleep 30 & echo done"}})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, out, end := collect(t, s)
		if out["stdout"] != "done\n" || end == nil || end.ExitCode != 0 || time.Since(start) > 20*time.Second {
			t.Fatalf("out %q end %+v after %v", out, end, time.Since(start))
		}
	})

	t.Run("everything written before the exit arrives, however slowly read", func(t *testing.T) {
		// 40 MiB, more than the pipe, the stream queue and the channel window
		// hold, read slowly: the program exits while much of it still waits,
		// and draining it takes longer than the drain window.
		s, err := e.c.StartProc(ctx, guest.ProcStart{Argv: []string{"/bin/sh", "-c", "head -c 41943040 /dev/zero | tr '\\0' x"}})
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for {
			ev, err := s.Next()
			if err != nil {
				t.Fatalf("after %d bytes: %v", got, err)
			}
			if ev.Type == guest.ProcEventEnd {
				if got != 40<<20 || ev.ExitCode != 0 {
					t.Fatalf("got %d bytes, end %+v", got, ev)
				}
				break
			}
			got += len(ev.Data)
			time.Sleep(3 * time.Millisecond)
		}
	})

	t.Run("unknown user", func(t *testing.T) {
		_, err := e.c.StartProc(ctx, guest.ProcStart{Argv: []string{"true"}, User: "no-such-user-xyz"})
		var ae *guest.APIError
		if !errors.As(err, &ae) || ae.Code != guest.CodeUnknownUser {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, req := range []guest.ProcStart{{}, {Argv: []string{"no-such-program-x"}}, {Argv: []string{"true"}, PTY: &guest.PTYSize{}}, {Argv: []string{"true"}, User: "nobody-here"}} {
			if s, err := e.c.StartProc(ctx, req); err == nil {
				s.Close()
				t.Errorf("start %+v succeeded", req)
			}
		}
		if err := e.c.ProcSignal(ctx, guest.ProcSignal{ProcSelector: guest.ProcSelector{PID: 999999}, Signal: "TERM"}); err == nil {
			t.Error("signal to an unknown pid succeeded")
		}
		if err := e.c.ProcInput(ctx, guest.ProcInput{}); err == nil {
			t.Error("input without a selector succeeded")
		}
	})
}

func TestWatchDir(t *testing.T) {
	e := startAgent(t)
	e.connect(e.port.Attach(t), "")
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "old"), 0o755)
	s, err := e.c.WatchDir(ctx, dir, "", true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	events := make(chan string, 100)
	go func() {
		defer close(events)
		for {
			ev, err := s.Next()
			if err != nil {
				return
			}
			events <- ev.Op + " " + ev.Name
		}
	}()
	seen := map[string]bool{}
	await := func(want string, poke func()) {
		t.Helper()
		poke()
		for !seen[want] {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("stream ended waiting for %q (seen %v)", want, seen)
				}
				seen[ev] = true
			case <-time.After(200 * time.Millisecond):
				poke() // e.g. the new directory's watch was not in place yet
			case <-ctx.Done():
				t.Fatalf("no %q (seen %v)", want, seen)
			}
		}
	}
	nop := func() {}
	await("create a.txt", func() { os.WriteFile(filepath.Join(dir, "a.txt"), []byte("x"), 0o644) })
	await("create new", func() { os.Mkdir(filepath.Join(dir, "new"), 0o755) })
	await("create old/b.txt", func() { os.WriteFile(filepath.Join(dir, "old", "b.txt"), []byte("x"), 0o644) })
	await("write new/c.txt", func() { os.WriteFile(filepath.Join(dir, "new", "c.txt"), []byte("x"), 0o644) })
	// the agent's own atomic writes show as the target written
	if _, err := e.c.WriteFile(ctx, "", filepath.Join(dir, "w.txt"), strings.NewReader("w"), 0, false); err != nil {
		t.Fatal(err)
	}
	await("write w.txt", nop)
	// in place, as envd writes: created, owner set, written
	fi, err := e.c.WriteFileInPlace(ctx, "", filepath.Join(dir, "ip.txt"), strings.NewReader("ip"), false, map[string]string{"owner": "me", "Kind": "a=b"})
	if err != nil {
		t.Fatal(err)
	}
	// metadata: kept as user.e2b.* attributes, keys lowercased
	if len(fi.Metadata) != 2 || fi.Metadata["owner"] != "me" || fi.Metadata["kind"] != "a=b" {
		t.Fatalf("metadata %v", fi.Metadata)
	}
	if st, err := e.c.Stat(ctx, "", filepath.Join(dir, "ip.txt")); err != nil || !reflect.DeepEqual(st.Metadata, fi.Metadata) {
		t.Fatalf("stat metadata %v %v, written %v", st, err, fi.Metadata)
	}
	// Overwriting replaces the metadata: keys it does not name are gone.
	fi, err = e.c.WriteFileInPlace(ctx, "", filepath.Join(dir, "ip.txt"), strings.NewReader("ip"), true, map[string]string{"kind": "new"})
	if err != nil || !reflect.DeepEqual(fi.Metadata, map[string]string{"kind": "new"}) {
		t.Fatalf("metadata after an overwrite: %v %v", fi, err)
	}
	if _, err := e.c.WriteFileInPlace(ctx, "", filepath.Join(dir, "bad.txt"), strings.NewReader(""), false, map[string]string{"bad key": "x"}); err == nil {
		t.Error("a bad metadata key was accepted")
	}
	await("create ip.txt", nop)
	await("chmod ip.txt", nop)
	await("write ip.txt", nop)
	if b, _ := os.ReadFile(filepath.Join(dir, "ip.txt")); string(b) != "ip" {
		t.Fatalf("in-place content %q", b)
	}
	for ev := range seen {
		if strings.Contains(ev, ".agentvm-") {
			t.Fatalf("the agent's temporary file shows: %v", seen)
		}
	}
	os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "d.txt"))
	await("rename a.txt", nop)
	await("create d.txt", nop)
	os.Chmod(filepath.Join(dir, "d.txt"), 0o600)
	await("chmod d.txt", nop)
	os.Remove(filepath.Join(dir, "d.txt"))
	await("remove d.txt", nop)
	if _, err := e.c.WatchDir(ctx, filepath.Join(dir, "old", "b.txt"), "", false); err == nil {
		t.Error("watching a file succeeded")
	}
	if _, err := e.c.WatchDir(ctx, filepath.Join(dir, "missing"), "", false); err == nil {
		t.Error("watching a missing directory succeeded")
	}
}

// watchTempDir starts an agent and watches a new temporary directory
// (not recursively) through it.
func watchTempDir(t *testing.T) (*env, context.Context, string, *guest.WatchStream) {
	t.Helper()
	e := startAgent(t)
	e.connect(e.port.Attach(t), "")
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	t.Cleanup(cancel)
	dir := t.TempDir()
	s, err := e.c.WatchDir(ctx, dir, "", false)
	if err != nil {
		t.Fatal(err)
	}
	return e, ctx, dir, s
}

// TestWatchInPlaceWriteEvents: a new file written in place, as envd writes
// one, shows exactly what envd's does: created, its owner set, written;
// E2B's SDK tests count them.
func TestWatchInPlaceWriteEvents(t *testing.T) {
	e, ctx, dir, s := watchTempDir(t)
	defer s.Close()
	if _, err := e.c.WriteFileInPlace(ctx, "", filepath.Join(dir, "new.txt"), strings.NewReader("abc"), false, nil); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(dir, "end"), 0o755) // a sentinel: every event before it has arrived
	var got []string
	for {
		ev, err := s.Next()
		if err != nil {
			t.Fatalf("watch: %v (got %v)", err, got)
		}
		if ev.Name == "end" {
			break
		}
		got = append(got, ev.Op+" "+ev.Name)
	}
	if want := []string{"create new.txt", "chmod new.txt", "write new.txt"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
}

// A sync returns only once the stream has returned every change made
// before it: a poll right after a write (E2B's GetWatcherEvents) finds
// the write's events. A sync of a watch that is not open is a 404.
func TestWatchSync(t *testing.T) {
	e, ctx, dir, s := watchTempDir(t)
	var mu sync.Mutex
	var got []string
	go func() {
		for {
			ev, err := s.Next()
			if err != nil {
				return
			}
			mu.Lock()
			got = append(got, ev.Op+" "+ev.Name)
			mu.Unlock()
		}
	}()
	for i := range 20 {
		name := fmt.Sprintf("f%d.txt", i)
		if _, err := e.c.WriteFileInPlace(ctx, "", filepath.Join(dir, name), strings.NewReader("abc"), false, nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(ctx); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
		mu.Lock()
		n := len(got)
		last := ""
		if n > 0 {
			last = got[n-1]
		}
		mu.Unlock()
		if n != 3*(i+1) || last != "write "+name {
			t.Fatalf("after write %d and a sync: %d events, the last %q (want %d, %q)", i, n, last, 3*(i+1), "write "+name)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 20 {
		t.Fatalf("the watched directory has %d entries: a sync's mark shows there", len(entries))
	}
	s.Close()
	// The agent ends the watch when it sees the stream closed.
	for {
		sctx, scancel := context.WithTimeout(ctx, time.Second)
		err := s.Sync(sctx)
		scancel()
		var ae *guest.APIError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("sync of a closed watch: %v, want a 404", err)
		}
	}
}
