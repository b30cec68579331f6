package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
)

func TestRing(t *testing.T) {
	var all []byte
	r := ring{size: 100}
	for i, n := range []int{10, 50, 39, 1, 1, 99, 100, 250, 3, 97, 0, 42} {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		for j := range p {
			p[j] += byte(j % 3)
		}
		all = append(all, p...)
		r.write(p)
		want := all[max(0, len(all)-100):]
		if got := r.bytes(); !bytes.Equal(got, want) {
			t.Fatalf("after %d writes: %q, want %q", i+1, got, want)
		}
		var frames []byte
		rd := bytes.NewReader(r.appendFrames(nil))
		for {
			f, err := api.ReadFrame(rd)
			if err != nil {
				break
			}
			frames = append(frames, f.Data...)
		}
		if !bytes.Equal(frames, want) {
			t.Fatalf("frames after %d writes: %q, want %q", i+1, frames, want)
		}
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{"INT": syscall.SIGINT, "SIGTERM": syscall.SIGTERM, "sigkill": syscall.SIGKILL, "9": syscall.SIGKILL, " hup ": syscall.SIGHUP, "64": 64} {
		if got, err := guest.ParseSignal(in); err != nil || got != want {
			t.Errorf("guest.ParseSignal(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "0", "65", "-1", "NOPE", "SIG"} {
		if _, err := guest.ParseSignal(in); err == nil {
			t.Errorf("guest.ParseSignal(%q) accepted", in)
		}
	}
}

// termOut collects the frames of an attached terminal stream.
type termOut struct {
	s      *guest.TermStream
	mu     sync.Mutex
	buf    bytes.Buffer
	exit   *guest.ExitStatus
	err    error // the stream's end (nil while it runs)
	done   chan struct{}
	notify chan struct{}
}

func attachTerm(t *testing.T, c *guest.Client, name string, a guest.TermAttach) *termOut {
	t.Helper()
	s, err := c.AttachTerm(context.Background(), name, a)
	if err != nil {
		t.Fatalf("attach %s: %v", name, err)
	}
	return readTerm(t, s)
}

func readTerm(t *testing.T, s *guest.TermStream) *termOut {
	o := &termOut{s: s, done: make(chan struct{}), notify: make(chan struct{}, 1)}
	go func() {
		defer close(o.done)
		for {
			f, err := s.Next()
			o.mu.Lock()
			if err != nil {
				o.err = err
				o.mu.Unlock()
				o.wake()
				return
			}
			switch f.Type {
			case api.FrameStdout:
				o.buf.Write(f.Data)
			case api.FrameExit:
				var st guest.ExitStatus
				if err := json.Unmarshal(f.Data, &st); err != nil {
					t.Errorf("bad exit frame %q", f.Data)
				}
				o.exit = &st
			default:
				t.Errorf("unexpected frame type %d", f.Type)
			}
			o.mu.Unlock()
			o.wake()
		}
	}()
	t.Cleanup(func() { s.Close(); <-o.done })
	return o
}

func (o *termOut) wake() {
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

func (o *termOut) output() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

func (o *termOut) write(t *testing.T, s string) {
	t.Helper()
	if _, err := o.s.Write([]byte(s)); err != nil {
		t.Fatalf("write %q: %v", s, err)
	}
}

// waitFor waits until the output contains sub.
func (o *termOut) waitFor(t *testing.T, sub string) {
	t.Helper()
	from, b := 0, []byte(sub)
	o.waitUntil(t, "output "+strconv.Quote(sub), func() bool {
		out := o.buf.Bytes()
		if bytes.Contains(out[from:], b) {
			return true
		}
		from = max(0, len(out)-len(b)+1)
		return false
	})
}

func (o *termOut) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// Generous: the flood subtest pushes 26 MiB through a pty, tr and the
	// stream under -race, and once needed more than 15 s with two busy
	// cores, the other packages' tests and a VM beside it.
	timer := time.NewTimer(2 * time.Minute)
	defer timer.Stop()
	for {
		o.mu.Lock()
		ok, ended := cond(), o.err != nil
		o.mu.Unlock()
		if ok {
			return
		}
		if ended {
			t.Fatalf("stream ended (%v) before %s; output:\n%q", o.err, what, o.output())
		}
		select {
		case <-o.notify:
		case <-timer.C:
			t.Fatalf("timeout waiting for %s; output:\n%q", what, o.output())
		}
	}
}

// waitEnd waits for the end of the stream and returns the exit status
// (nil if the stream ended without one).
func (o *termOut) waitEnd(t *testing.T) *guest.ExitStatus {
	t.Helper()
	select {
	case <-o.done:
	case <-time.After(testWait):
		t.Fatalf("stream did not end; output:\n%q", o.output())
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.exit
}

func startTermEnv(t *testing.T) *env {
	// Hangups must be enough in these tests however slow the machine, so
	// the SIGKILL escalation is far away (TestTermDeleteEscalates tests it).
	return startTermEnvWith(t, Options{TermKillGrace: time.Minute})
}

func startTermEnvWith(t *testing.T, opts Options) *env {
	e := startAgentWith(t, opts)
	e.connect(e.port.Attach(t), "")
	t.Cleanup(func() { deleteAllTerms(t, e) }) // runs before the agent stops
	return e
}

func deleteAllTerms(t *testing.T, e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ts, err := e.c.ListTerms(ctx)
	if err != nil {
		t.Errorf("list: %v", err)
		return
	}
	for _, ti := range ts {
		if err := e.c.DeleteTerm(ctx, ti.Name); err != nil && termAPIStatus(err) != 404 {
			t.Errorf("delete %s: %v", ti.Name, err)
		}
	}
}

func termAPIStatus(err error) int {
	var ae *guest.APIError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

func termWantErr(t *testing.T, err error, status int, code string) {
	t.Helper()
	var ae *guest.APIError
	if !errors.As(err, &ae) || ae.Status != status || ae.Code != code {
		t.Fatalf("err = %v, want %d %s", err, status, code)
	}
}

func createTerm(t *testing.T, c *guest.Client, req guest.TermCreate) *guest.TermInfo {
	t.Helper()
	ti, err := c.CreateTerm(context.Background(), req)
	if err != nil {
		t.Fatalf("create %+v: %v", req, err)
	}
	return ti
}

var termBashArgv = []string{"bash", "--norc", "--noprofile", "-i"}

// shell creates a bash terminal, attaches and waits for the prompt.
func termShell(t *testing.T, c *guest.Client, name string) (*guest.TermInfo, *termOut) {
	t.Helper()
	ti := createTerm(t, c, guest.TermCreate{Name: name, Argv: termBashArgv, Env: map[string]string{"PS1": "PROMPT$ "}})
	o := attachTerm(t, c, ti.Name, guest.TermAttach{})
	o.waitFor(t, "PROMPT$ ")
	return ti, o
}

func getTerm(t *testing.T, c *guest.Client, name string) *guest.TermInfo {
	t.Helper()
	ti, err := c.GetTerm(context.Background(), name)
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return ti
}

// waitTerm polls the terminal's info until cond holds.
func waitTerm(t *testing.T, c *guest.Client, name string, what string, cond func(*guest.TermInfo, error) bool) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for {
		ti, err := c.GetTerm(context.Background(), name)
		if cond(ti, err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("terminal %s: timeout waiting for %s (last %+v, %v)", name, what, ti, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// termProcsInSession lists the live processes named comm in session sid.
func termProcsInSession(sid int, comm string) []int {
	var pids []int
	for _, pid := range sessionPIDs(sid) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		if strings.TrimSpace(string(b)) == comm && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func termWaitProc(t *testing.T, sid int, comm string) int {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for {
		if p := termProcsInSession(sid, comm); len(p) > 0 {
			return p[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in session %d", comm, sid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkNoTermGoroutines fails if terminal or TCP goroutines are left.
func checkNoTermGoroutines(t *testing.T) {
	t.Helper()
	var stacks string
	for deadline := time.Now().Add(testWait); time.Now().Before(deadline); {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "agent.(*terminal)") && !strings.Contains(stacks, "agent.(*termClient)") && !strings.Contains(stacks, "agent.proxyTCP") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("terminal goroutines left:\n%s", stacks)
}

func TestTerm(t *testing.T) {
	e := startTermEnv(t)
	ctx := context.Background()

	t.Run("shell", func(t *testing.T) {
		ti, o := termShell(t, e.c, "sh1")
		if ti.Name != "sh1" || ti.PID <= 0 || ti.User != "root" || ti.Cols != 80 || ti.Rows != 24 || ti.Exited || ti.CreatedAt.IsZero() {
			t.Fatalf("info %+v", ti)
		}
		o.write(t, "echo hi-$((40+2)) $TERM\r")
		o.waitFor(t, "hi-42 xterm-256color")
		if ti := getTerm(t, e.c, "sh1"); ti.Clients != 1 {
			t.Fatalf("clients = %d", ti.Clients)
		}
	})

	t.Run("detach-scrollback", func(t *testing.T) {
		o := attachTerm(t, e.c, "sh1", guest.TermAttach{})
		o.waitFor(t, "hi-42")
		o.write(t, "sleep 0.3; echo detached-$((6*7))\r")
		o.waitFor(t, "sleep 0.3") // the echo of the input
		o.s.Close()
		o.waitEnd(t)
		waitTerm(t, e.c, "sh1", "no clients", func(ti *guest.TermInfo, err error) bool { return err == nil && ti.Clients == 0 })
		time.Sleep(600 * time.Millisecond)
		o = attachTerm(t, e.c, "sh1", guest.TermAttach{})
		o.waitFor(t, "detached-42")
		if !strings.Contains(o.output(), "hi-42") {
			t.Fatalf("replay lacks earlier output: %q", o.output())
		}
		o.s.Close()
		o.waitEnd(t)

		o = attachTerm(t, e.c, "sh1", guest.TermAttach{NoScrollback: true})
		o.write(t, "echo ns-$((1+1))\r")
		o.waitFor(t, "ns-2")
		if strings.Contains(o.output(), "hi-42") {
			t.Fatalf("NoScrollback replayed: %q", o.output())
		}
	})

	t.Run("two-clients", func(t *testing.T) {
		a := attachTerm(t, e.c, "sh1", guest.TermAttach{NoScrollback: true})
		b := attachTerm(t, e.c, "sh1", guest.TermAttach{NoScrollback: true})
		waitTerm(t, e.c, "sh1", "2 clients", func(ti *guest.TermInfo, err error) bool { return err == nil && ti.Clients >= 2 })
		b.write(t, "echo both-$((2*3))\r")
		a.waitFor(t, "both-6")
		b.waitFor(t, "both-6")
		a.write(t, "echo other-$((2*4))\r")
		a.waitFor(t, "other-8")
		b.waitFor(t, "other-8")
	})

	t.Run("attached-on-return", func(t *testing.T) {
		// An attach that has returned is registered: output from then on
		// reaches it, without a wait for the client count. (The 101 went
		// out before the registration once, and a client without
		// scrollback missed the next line under load; this checks the
		// count straight after each of many attaches.)
		termShell(t, e.c, "reg")
		for i := range 30 {
			s, err := e.c.AttachTerm(ctx, "reg", guest.TermAttach{NoScrollback: true})
			if err != nil {
				t.Fatal(err)
			}
			if ti := getTerm(t, e.c, "reg"); ti.Clients != 2 {
				t.Fatalf("attach %d returned before its client was registered: %d clients", i, ti.Clients)
			}
			s.Close()
			waitTerm(t, e.c, "reg", "the attach gone", func(ti *guest.TermInfo, err error) bool { return err == nil && ti.Clients == 1 })
		}
		e.c.DeleteTerm(ctx, "reg")
	})

	t.Run("resize", func(t *testing.T) {
		o := attachTerm(t, e.c, "sh1", guest.TermAttach{NoScrollback: true})
		if err := e.c.ResizeTerm(ctx, "sh1", guest.TermSize{Cols: 120, Rows: 40}); err != nil {
			t.Fatal(err)
		}
		o.write(t, "stty size\r")
		o.waitFor(t, "40 120")
		if err := o.s.Resize(132, 50); err != nil {
			t.Fatal(err)
		}
		waitTerm(t, e.c, "sh1", "resized", func(ti *guest.TermInfo, err error) bool { return err == nil && ti.Cols == 132 && ti.Rows == 50 })
		o.write(t, "stty size\r")
		o.waitFor(t, "50 132")
		// Attaching with a size resizes too.
		o2 := attachTerm(t, e.c, "sh1", guest.TermAttach{NoScrollback: true, Cols: 100, Rows: 30})
		o2.write(t, "stty size\r")
		o2.waitFor(t, "30 100")
		o.s.Resize(80, 24)
	})

	t.Run("signal", func(t *testing.T) {
		ti := getTerm(t, e.c, "sh1")
		o := attachTerm(t, e.c, "sh1", guest.TermAttach{NoScrollback: true})
		for i, via := range []string{"api", "frame"} {
			o.write(t, "sleep 100\r")
			pid := termWaitProc(t, ti.PID, "sleep")
			if via == "api" {
				if err := e.c.SignalTerm(ctx, "sh1", "INT"); err != nil {
					t.Fatal(err)
				}
			} else if err := o.s.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			waitDead(t, pid)
			o.write(t, fmt.Sprintf("echo rc=$?-%d\r", i))
			o.waitFor(t, fmt.Sprintf("rc=130-%d", i))
		}
		if getTerm(t, e.c, "sh1").Exited {
			t.Fatal("shell exited")
		}
	})

	t.Run("exit-code", func(t *testing.T) {
		_, o := termShell(t, e.c, "ex")
		o.write(t, "echo before-exit\r")
		o.waitFor(t, "before-exit\r\n")
		o.write(t, "exit 3\r")
		st := o.waitEnd(t)
		if st == nil || st.ExitCode != 3 || st.Signal != "" {
			t.Fatalf("exit %+v, err %v", st, o.err)
		}
		// The client count drops when the guest has closed the stream,
		// just after the exit frame went out.
		waitTerm(t, e.c, "ex", "no clients", func(ti *guest.TermInfo, err error) bool { return err == nil && ti.Clients == 0 })
		if ti := getTerm(t, e.c, "ex"); !ti.Exited || ti.ExitCode != 3 || ti.Clients != 0 {
			t.Fatalf("info %+v", ti)
		}
		// Attaching to an exited terminal replays and sends the exit.
		o = attachTerm(t, e.c, "ex", guest.TermAttach{})
		st = o.waitEnd(t)
		if st == nil || st.ExitCode != 3 || !strings.Contains(o.output(), "before-exit") {
			t.Fatalf("reattach: exit %+v, output %q", st, o.output())
		}
		// Input, resize and signals to an exited terminal are harmless.
		if err := e.c.SignalTerm(ctx, "ex", "TERM"); err != nil {
			t.Fatal(err)
		}
		if err := e.c.DeleteTerm(ctx, "ex"); err != nil {
			t.Fatal(err)
		}
		_, err := e.c.GetTerm(ctx, "ex")
		termWantErr(t, err, 404, "not_found")
	})

	t.Run("delete-kills", func(t *testing.T) {
		ti, o := termShell(t, e.c, "k")
		o.write(t, "sleep 100 &\r")
		o.write(t, "echo started-$((1+1))\r")
		o.waitFor(t, "started-2")
		bg := termWaitProc(t, ti.PID, "sleep")
		if err := e.c.DeleteTerm(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if alive(ti.PID) {
			t.Fatalf("shell %d alive after delete", ti.PID)
		}
		// bash exits on SIGHUP and hangs up its jobs (the SIGKILL is a
		// minute away).
		waitDead(t, bg)
		st := o.waitEnd(t)
		if st == nil || st.Signal != "SIGHUP" || st.ExitCode != 129 {
			t.Fatalf("exit %+v, err %v", st, o.err)
		}
		_, err := e.c.GetTerm(ctx, "k")
		termWantErr(t, err, 404, "not_found")
	})

	t.Run("ephemeral", func(t *testing.T) {
		flag := filepath.Join(t.TempDir(), "hup")
		ti := createTerm(t, e.c, guest.TermCreate{Ephemeral: true, Argv: []string{"sh", "-c", "trap 'echo hup > " + flag + "; exit 0' HUP; echo ready; while :; do sleep 0.05; done"}})
		if !ti.Ephemeral {
			t.Fatalf("info %+v", ti)
		}
		a := attachTerm(t, e.c, ti.Name, guest.TermAttach{})
		b := attachTerm(t, e.c, ti.Name, guest.TermAttach{})
		a.waitFor(t, "ready")
		b.waitFor(t, "ready")
		a.s.Close()
		a.waitEnd(t)
		// The terminal stays while b is attached (a 404 never satisfies this).
		waitTerm(t, e.c, ti.Name, "one client", func(ti *guest.TermInfo, err error) bool { return err == nil && ti.Clients == 1 })
		if ti := getTerm(t, e.c, ti.Name); ti.Exited {
			t.Fatalf("after first detach: %+v", ti)
		}
		b.s.Close()
		b.waitEnd(t)
		waitTerm(t, e.c, ti.Name, "removal", func(_ *guest.TermInfo, err error) bool { return termAPIStatus(err) == 404 })
		waitDead(t, ti.PID)
		if b, err := os.ReadFile(flag); err != nil || string(b) != "hup\n" {
			t.Fatalf("hup flag: %q %v", b, err)
		}

		// An ephemeral terminal that exits before anyone attached stays
		// until its output and status were fetched.
		ti = createTerm(t, e.c, guest.TermCreate{Ephemeral: true, Argv: []string{"sh", "-c", "echo bye-$((2+3)); exit 5"}})
		waitTerm(t, e.c, ti.Name, "exit", func(ti *guest.TermInfo, err error) bool { return err == nil && ti.Exited })
		o := attachTerm(t, e.c, ti.Name, guest.TermAttach{})
		if st := o.waitEnd(t); st == nil || st.ExitCode != 5 || !strings.Contains(o.output(), "bye-5") {
			t.Fatalf("exit %+v output %q", st, o.output())
		}
		waitTerm(t, e.c, ti.Name, "removal", func(_ *guest.TermInfo, err error) bool { return termAPIStatus(err) == 404 })
	})

	t.Run("user", func(t *testing.T) {
		f, err := os.OpenFile(filepath.Join(e.root, "etc/passwd"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("termtest:x:4242:4242:Term Test:/tmp:/bin/sh\n")
		f.Close()
		ti := createTerm(t, e.c, guest.TermCreate{User: "termtest"})
		if ti.User != "termtest" || len(ti.Argv) != 1 || ti.Argv[0] != "-sh" {
			t.Fatalf("info %+v", ti)
		}
		o := attachTerm(t, e.c, ti.Name, guest.TermAttach{})
		o.write(t, `echo "id=$(id -u):$(id -g) $HOME $USER $(stat -c %u $(tty)) $0"`+"\r")
		o.waitFor(t, "id=4242:4242 /tmp termtest 4242 -sh")

		// root's default shell is started as a login shell.
		ti = createTerm(t, e.c, guest.TermCreate{})
		if len(ti.Argv) != 1 || !strings.HasPrefix(ti.Argv[0], "-") || ti.User != "root" {
			t.Fatalf("info %+v", ti)
		}
		o = attachTerm(t, e.c, ti.Name, guest.TermAttach{})
		o.write(t, "echo \"login=$0 $(id -u) $PWD\"\r")
		o.waitFor(t, "login="+ti.Argv[0]+" 0 /root")
	})

	t.Run("scrollback-tail", func(t *testing.T) {
		const lines = 36000
		var want bytes.Buffer
		for i := 0; i < lines; i++ {
			fmt.Fprintf(&want, "%06d-abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz\r\n", i)
		}
		want.WriteString("end\r\n")
		if want.Len() <= guest.DefaultScrollback {
			t.Fatalf("test output too small: %d", want.Len())
		}
		ti := createTerm(t, e.c, guest.TermCreate{Name: "big", Argv: []string{"sh", "-c",
			`i=0; while [ $i -lt ` + strconv.Itoa(lines) + ` ]; do printf '%06d-abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz\n' $i; i=$((i+1)); done; echo end`}})
		// Attached while it runs: replay + live output is exactly the output.
		live := attachTerm(t, e.c, ti.Name, guest.TermAttach{})
		if st := live.waitEnd(t); st == nil || st.ExitCode != 0 {
			t.Fatalf("exit %+v err %v", st, live.err)
		}
		if got := live.output(); got != want.String() {
			t.Fatalf("live output: %d bytes, want %d (prefix ok %v)", len(got), want.Len(), strings.HasPrefix(want.String(), got))
		}
		o := attachTerm(t, e.c, ti.Name, guest.TermAttach{})
		o.waitEnd(t)
		got := o.output()
		tail := want.Bytes()[want.Len()-guest.DefaultScrollback:]
		if len(got) != guest.DefaultScrollback || got != string(tail) {
			t.Fatalf("scrollback: %d bytes, want the last %d", len(got), len(tail))
		}
		e.c.DeleteTerm(ctx, "big")
	})

	t.Run("slow-client-dropped", func(t *testing.T) {
		// Bursts of 512 KiB: the reading client keeps up, the other one
		// fills its stream window (16 MiB, yamux) and then its queue.
		const bursts = 52
		const total = bursts << 19
		ti := createTerm(t, e.c, guest.TermCreate{Name: "flood", Argv: []string{"sh", "-c",
			"read x; i=0; while [ $i -lt " + strconv.Itoa(bursts) + " ]; do head -c 524288 /dev/zero | tr '\\0' x; sleep 0.02; i=$((i+1)); done; echo; echo flood-$((3*3)); exec sleep 100"}})
		slow, err := e.c.AttachTerm(ctx, ti.Name, guest.TermAttach{}) // never read
		if err != nil {
			t.Fatal(err)
		}
		defer slow.Close()
		fast := attachTerm(t, e.c, ti.Name, guest.TermAttach{})
		fast.write(t, "go\r")
		fast.waitFor(t, "flood-9")
		if n := strings.Count(fast.output(), "x"); n != total {
			t.Fatalf("fast client got %d x, want %d", n, total)
		}
		waitTerm(t, e.c, ti.Name, "drop", func(ti *guest.TermInfo, err error) bool { return err == nil && ti.Clients == 1 })
		// The slow client's stream ends after what was already sent.
		n := 0
		for {
			f, err := slow.Next()
			if err != nil {
				break
			}
			n += len(f.Data)
		}
		if n >= total {
			t.Fatalf("slow client got %d bytes", n)
		}
		// It can reattach and gets the scrollback.
		o := attachTerm(t, e.c, ti.Name, guest.TermAttach{})
		o.waitFor(t, "flood-9")
		e.c.DeleteTerm(ctx, "flood")
	})

	t.Run("ctx-cancel-detaches", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		s, err := e.c.AttachTerm(cctx, "sh1", guest.TermAttach{NoScrollback: true})
		if err != nil {
			t.Fatal(err)
		}
		o := readTerm(t, s)
		cancel()
		if st := o.waitEnd(t); st != nil {
			t.Fatalf("exit %+v", st)
		}
		waitTerm(t, e.c, "sh1", "no clients", func(ti *guest.TermInfo, err error) bool { return err == nil && ti.Clients == 0 && !ti.Exited })
	})

	t.Run("names-list", func(t *testing.T) {
		a := createTerm(t, e.c, guest.TermCreate{Argv: []string{"sleep", "100"}})
		b := createTerm(t, e.c, guest.TermCreate{Argv: []string{"sleep", "100"}})
		if a.Name == b.Name || !validTermName(a.Name) || !validTermName(b.Name) {
			t.Fatalf("names %q %q", a.Name, b.Name)
		}
		createTerm(t, e.c, guest.TermCreate{Name: "A.b_c-9", Argv: []string{"sleep", "100"}})
		ts, err := e.c.ListTerms(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, ti := range ts {
			names = append(names, ti.Name)
		}
		if !sort.StringsAreSorted(names) || len(names) < 4 {
			t.Fatalf("names %q", names)
		}
		for _, n := range []string{a.Name, b.Name, "A.b_c-9", "sh1"} {
			if i := sort.SearchStrings(names, n); i == len(names) || names[i] != n {
				t.Fatalf("%s not listed in %q", n, names)
			}
		}
	})

	t.Run("bad-requests", func(t *testing.T) {
		for _, req := range []guest.TermCreate{
			{Name: "a/b"}, {Name: strings.Repeat("x", 65)}, {Name: ".."}, {Name: "sp ace"},
			{Cols: 1001}, {Rows: -1}, {User: "no-such-user-xyz"},
			{Argv: []string{"no-such-command-xyz"}}, {Argv: []string{"/no/such/path"}}, {Argv: []string{""}},
			{Cwd: "/no/such/dir"}, {Env: map[string]string{"A=B": "x"}},
		} {
			_, err := e.c.CreateTerm(ctx, req)
			termWantErr(t, err, 400, "invalid")
		}
		_, err := e.c.CreateTerm(ctx, guest.TermCreate{Name: "sh1"})
		termWantErr(t, err, 409, "exists")
		_, err = e.c.GetTerm(ctx, "nope")
		termWantErr(t, err, 404, "not_found")
		termWantErr(t, e.c.DeleteTerm(ctx, "nope"), 404, "not_found")
		termWantErr(t, e.c.ResizeTerm(ctx, "nope", guest.TermSize{Cols: 10, Rows: 10}), 404, "not_found")
		termWantErr(t, e.c.SignalTerm(ctx, "nope", "INT"), 404, "not_found")
		_, err = e.c.AttachTerm(ctx, "nope", guest.TermAttach{})
		termWantErr(t, err, 404, "not_found")
		_, err = e.c.AttachTerm(ctx, "sh1", guest.TermAttach{Cols: 5000, Rows: 10})
		termWantErr(t, err, 400, "invalid")
		for _, sig := range []string{"NOPE", "0", "99", ""} {
			termWantErr(t, e.c.SignalTerm(ctx, "sh1", sig), 400, "invalid")
		}
		for _, sz := range []guest.TermSize{{}, {Cols: 0, Rows: 10}, {Cols: 10, Rows: 1001}} {
			termWantErr(t, e.c.ResizeTerm(ctx, "sh1", sz), 400, "invalid")
		}
		// Attach without the upgrade header.
		resp, err := e.c.HTTPClient().Post("http://agentvm"+guest.PathTerms+"/sh1/attach", "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Fatalf("attach without upgrade: %d", resp.StatusCode)
		}
	})

	t.Run("echo-latency", func(t *testing.T) {
		createTerm(t, e.c, guest.TermCreate{Name: "cat", Argv: []string{"sh", "-c", "stty raw -echo; echo ready; exec cat"}})
		o := attachTerm(t, e.c, "cat", guest.TermAttach{})
		o.waitFor(t, "ready\n") // raw mode: no \r
		base := len(o.output())
		var ds []time.Duration
		for i := 0; i < 50; i++ {
			c := string(rune('a' + i%26))
			start := time.Now()
			o.write(t, c)
			n := base + i + 1
			o.waitUntil(t, "echo of "+c, func() bool { return o.buf.Len() >= n })
			ds = append(ds, time.Since(start))
		}
		if got := o.output()[base:]; got != strings.Repeat("abcdefghijklmnopqrstuvwxyz", 2)[:50] {
			t.Fatalf("echoed %q", got)
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("keystroke echo round trip: p50 %v, p90 %v, max %v", ds[25], ds[45], ds[49])
	})

	deleteAllTerms(t, e)
	if ts, err := e.c.ListTerms(ctx); err != nil || len(ts) != 0 {
		t.Fatalf("left: %+v %v", ts, err)
	}
	checkNoTermGoroutines(t)
}

// TestTermReconnect: a host that goes away (snapshot restore, host restart)
// only detaches the clients; the terminal keeps running.
func TestTermReconnect(t *testing.T) {
	e := startTermEnv(t)
	ctx := context.Background()
	ti, o := termShell(t, e.c, "keep")
	ep := createTerm(t, e.c, guest.TermCreate{Name: "keep2", Argv: termBashArgv})
	o2 := attachTerm(t, e.c, "keep2", guest.TermAttach{})
	o.write(t, "echo before-$((1+1))\r")
	o.waitFor(t, "before-2")
	for i := 0; i < 2; i++ {
		old := e.c
		host := e.port.Restore(t, []byte(stale))
		waitClosed(t, old.Done())
		o.waitEnd(t)
		if i == 0 {
			o2.waitEnd(t)
		}
		e.connect(host, stale)
		waitTerm(t, e.c, "keep", "clients detached", func(ti *guest.TermInfo, err error) bool { return err == nil && ti.Clients == 0 })
		if got := getTerm(t, e.c, "keep"); got.Exited || got.PID != ti.PID || !alive(ti.PID) {
			t.Fatalf("after restore: %+v", got)
		}
		o = attachTerm(t, e.c, "keep", guest.TermAttach{})
		o.waitFor(t, "before-2")
		o.write(t, fmt.Sprintf("echo after-$((2+%d))\r", i))
		o.waitFor(t, fmt.Sprintf("after-%d", 2+i))
	}
	if !alive(ep.PID) || getTerm(t, e.c, "keep2").Exited {
		t.Fatal("second terminal died")
	}
	deleteAllTerms(t, e)
	if ts, err := e.c.ListTerms(ctx); err != nil || len(ts) != 0 {
		t.Fatalf("left: %+v %v", ts, err)
	}
	checkNoTermGoroutines(t)
}

// TestTermDeleteEscalates deletes a terminal whose processes ignore SIGHUP:
// after the grace every process of the session gets SIGKILL, a background
// job in a group of its own included.
func TestTermDeleteEscalates(t *testing.T) {
	const grace = 300 * time.Millisecond
	e := startTermEnvWith(t, Options{TermKillGrace: grace})
	ctx := context.Background()
	ti := createTerm(t, e.c, guest.TermCreate{Name: "stubborn", Argv: []string{"sh", "-c", "set -m; trap '' HUP; sleep 101 & echo ready; sleep 100"}})
	o := attachTerm(t, e.c, "stubborn", guest.TermAttach{})
	o.waitFor(t, "ready")
	fg := termWaitProc(t, ti.PID, "sleep")
	var bg int
	waitFor(t, "the background sleep", func() bool {
		ps := termProcsInSession(ti.PID, "sleep")
		for _, p := range ps {
			if pgid, _ := syscall.Getpgid(p); pgid == p {
				bg = p
			}
		}
		return len(ps) == 2 && bg != 0
	})
	start := time.Now()
	if err := e.c.DeleteTerm(ctx, "stubborn"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < grace || alive(ti.PID) {
		t.Fatalf("delete took %v, alive %v", d, alive(ti.PID))
	}
	waitDead(t, fg)
	waitDead(t, bg)
	if st := o.waitEnd(t); st == nil || st.Signal != "SIGKILL" {
		t.Fatalf("exit %+v", st)
	}
}
