package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
)

type env struct {
	t    *testing.T
	port *fakePort
	root string
	c    *guest.Client
}

func startAgent(t *testing.T) *env {
	t.Helper()
	return startAgentWith(t, Options{})
}

// startAgentWith starts an agent with opts (Open, Root, NoSystem and Logf are
// set here).
func startAgentWith(t *testing.T, opts Options) *env {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("exec tests need root")
	}
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	for _, f := range []string{"passwd", "group"} {
		b, err := os.ReadFile("/etc/" + f)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(root, "etc", f), b, 0o644)
	}
	os.WriteFile(filepath.Join(root, "etc/hosts"), []byte("127.0.0.1\tlocalhost\n127.0.1.1\told\n::1\tlocalhost\n"), 0o644)
	fp := &fakePort{}
	logf := func(f string, a ...any) {
		if testing.Verbose() {
			log.Printf("agent: "+f, a...)
		}
	}
	opts.Open = func() (io.ReadWriteCloser, error) { return fp, nil }
	opts.Root, opts.NoSystem, opts.Logf = root, true, logf
	a, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	e := &env{t: t, port: fp, root: root}
	t.Cleanup(func() {
		if e.c != nil {
			e.c.Close()
		}
		cancel()
		select {
		case <-done:
		case <-time.After(testWait):
			t.Error("agent did not stop")
		}
	})
	return e
}

// connect attaches a new host, sends garbage before the hello and connects.
func (e *env) connect(hostConn net.Conn, garbage string) *guest.Client {
	e.t.Helper()
	if garbage != "" {
		hostConn.Write([]byte(garbage))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := guest.NewClient(ctx, hostConn, guest.HandshakeOptions{})
	if err != nil {
		e.t.Fatalf("connect: %v", err)
	}
	if e.c != nil {
		e.c.Close()
	}
	e.c = c
	return c
}

type result struct {
	st             *guest.ExitStatus
	err            error
	stdout, stderr string
	elapsed        time.Duration
}

func (e *env) run(req guest.ExecRequest, stdin io.Reader) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	start := time.Now()
	st, err := e.c.Run(ctx, req, stdin, &out, &errb)
	return result{st, err, out.String(), errb.String(), time.Since(start)}
}

func (e *env) mustRun(req guest.ExecRequest, stdin io.Reader) result {
	e.t.Helper()
	r := e.run(req, stdin)
	if r.err != nil {
		e.t.Fatalf("run %+v: %v", req, r.err)
	}
	return r
}

var stale = "\x00\x01\x00\x00\x00\x00\x00\x01\x00\x00\x00\x10stale yamux frame\nAGENTVM-START 0000000000000000\n" + strings.Repeat("\xff", 5000)

func TestAgent(t *testing.T) {
	e := startAgent(t)
	// Stale bytes queued by the guest before any host connected, and
	// garbage from the host side before its hello.
	e.port.Write([]byte("queued-from-guest\x00\x00" + stale))
	e.connect(e.port.Attach(t), stale)

	ctx := context.Background()
	t.Run("info", func(t *testing.T) {
		info, err := e.c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Proto != guest.ProtoVersion || info.Version != guest.Version || info.Hostname == "" || info.UptimeMS <= 0 {
			t.Fatalf("info = %+v", info)
		}
		if err := e.c.Healthz(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("echo", func(t *testing.T) {
		r := e.mustRun(guest.ExecRequest{Argv: []string{"echo", "hello", "world"}}, nil)
		if r.stdout != "hello world\n" || r.stderr != "" || r.st.ExitCode != 0 {
			t.Fatalf("got %+v", r)
		}
	})
	t.Run("true-latency", func(t *testing.T) {
		var best time.Duration = time.Hour
		for i := 0; i < 20; i++ {
			r := e.mustRun(guest.ExecRequest{Argv: []string{"true"}}, nil)
			if r.elapsed < best {
				best = r.elapsed
			}
		}
		t.Logf("best true round trip: %v", best)
	})
	t.Run("stdout-stderr-order", func(t *testing.T) {
		s, err := e.c.Exec(ctx, guest.ExecRequest{Shell: "echo out1; sleep 0.05; echo err1 >&2; sleep 0.05; echo out2; sleep 0.05; echo err2 >&2"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var seq []string
		for {
			f, err := s.Next()
			if err != nil {
				t.Fatal(err)
			}
			if f.Type == api.FrameExit {
				break
			}
			seq = append(seq, strconv.Itoa(int(f.Type))+":"+string(f.Data))
		}
		want := []string{"3:out1\n", "4:err1\n", "3:out2\n", "4:err2\n"}
		if strings.Join(seq, "|") != strings.Join(want, "|") {
			t.Fatalf("frames %q, want %q", seq, want)
		}
	})
	t.Run("stdin-cat", func(t *testing.T) {
		data := make([]byte, 3<<20)
		rand.Read(data)
		r := e.mustRun(guest.ExecRequest{Argv: []string{"cat"}}, bytes.NewReader(data))
		if r.st.ExitCode != 0 || r.stdout != string(data) {
			t.Fatalf("cat: exit %d, %d bytes back of %d", r.st.ExitCode, len(r.stdout), len(data))
		}
	})
	t.Run("stdin-null", func(t *testing.T) {
		r := e.mustRun(guest.ExecRequest{Shell: "cat; echo done"}, nil)
		if r.stdout != "done\n" {
			t.Fatalf("got %+v", r)
		}
	})
	t.Run("exit-code", func(t *testing.T) {
		r := e.mustRun(guest.ExecRequest{Shell: "echo x; exit 3"}, nil)
		if r.st.ExitCode != 3 || r.st.Signal != "" || r.st.TimedOut {
			t.Fatalf("got %+v", r.st)
		}
	})
	t.Run("not-found", func(t *testing.T) {
		r := e.run(guest.ExecRequest{Argv: []string{"no-such-command-xyz"}}, nil)
		var ee *guest.ExecError
		if r.st == nil || r.st.ExitCode != 127 || !errors.As(r.err, &ee) {
			t.Fatalf("got %+v", r)
		}
		r = e.run(guest.ExecRequest{Argv: []string{"/no/such/path"}}, nil)
		if r.st == nil || r.st.ExitCode != 127 {
			t.Fatalf("abs path: got %+v", r)
		}
		r = e.run(guest.ExecRequest{Shell: "no-such-command-xyz"}, nil)
		if r.st == nil || r.st.ExitCode != 127 || r.err != nil {
			t.Fatalf("shell: got %+v", r)
		}
	})
	t.Run("bad-request", func(t *testing.T) {
		for _, req := range []guest.ExecRequest{
			{Argv: []string{"true"}, Cwd: "/no/such/dir"},
			{Argv: []string{"true"}, User: "no-such-user-xyz"},
			{},
		} {
			_, err := e.c.Exec(ctx, req)
			var ae *guest.APIError
			if !errors.As(err, &ae) || ae.Status != 400 || ae.Code != "invalid" {
				t.Fatalf("%+v: err = %v", req, err)
			}
		}
	})
	t.Run("timeout-kills-group", func(t *testing.T) {
		pidFile := filepath.Join(t.TempDir(), "pid")
		r := e.mustRun(guest.ExecRequest{Shell: "sleep 100 & echo $! > " + pidFile + "; wait", TimeoutMS: 300}, nil)
		if !r.st.TimedOut || r.st.Signal != "SIGKILL" || r.st.ExitCode != 137 || r.elapsed > testWait {
			t.Fatalf("got %+v after %v", r.st, r.elapsed)
		}
		waitDead(t, readPid(t, pidFile))
	})
	t.Run("background-returns", func(t *testing.T) {
		r := e.mustRun(guest.ExecRequest{Shell: "sleep 100 & echo $!; echo started"}, nil)
		// Waiting for the pipe to close would take the sleep's 100 s.
		if r.elapsed > testWait || r.st.ExitCode != 0 {
			t.Fatalf("took %v: %+v", r.elapsed, r.st)
		}
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if len(lines) != 2 || lines[1] != "started" {
			t.Fatalf("stdout %q", r.stdout)
		}
		pid, _ := strconv.Atoi(lines[0])
		time.Sleep(200 * time.Millisecond)
		if !alive(pid) {
			t.Fatalf("background process %d died", pid)
		}
		syscall.Kill(pid, syscall.SIGKILL)
		// nohup/setsid variants also survive.
		r = e.mustRun(guest.ExecRequest{Shell: "nohup sleep 100 >/dev/null 2>&1 & echo $!"}, nil)
		pid, _ = strconv.Atoi(strings.TrimSpace(r.stdout))
		time.Sleep(100 * time.Millisecond)
		if !alive(pid) {
			t.Fatalf("nohup process %d died", pid)
		}
		syscall.Kill(pid, syscall.SIGKILL)
		t.Logf("background exec took %v", r.elapsed)
	})
	t.Run("slow-reader-gets-everything", func(t *testing.T) {
		// The process writes 3 MiB and exits while a background child keeps
		// the pipe open (so no EOF marks the end) and the host does not read
		// for longer than drainMax: all 3 MiB must still arrive.
		pidFile := filepath.Join(t.TempDir(), "pid")
		s, err := e.c.Exec(ctx, guest.ExecRequest{Shell: "sleep 60 & echo $! > " + pidFile + "; head -c 3145728 /dev/zero"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		time.Sleep(drainMax + 500*time.Millisecond)
		got := 0
		for {
			f, err := s.Next()
			if err != nil {
				t.Fatal(err)
			}
			if f.Type == api.FrameStdout {
				got += len(f.Data)
			}
			if f.Type == api.FrameExit {
				break
			}
		}
		syscall.Kill(readPid(t, pidFile), syscall.SIGKILL)
		if got != 3<<20 {
			t.Fatalf("%d bytes of stdout, want %d", got, 3<<20)
		}
	})
	t.Run("background-writer-cut-off", func(t *testing.T) {
		// A background child that never stops writing to the pipe does not
		// keep the exec open: it ends drainMax after the exit.
		pidFile := filepath.Join(t.TempDir(), "pid")
		// (The shell may exit before yes writes anything: under load it did.
		// Its own line comes first either way.)
		r := e.mustRun(guest.ExecRequest{Shell: "echo start; yes & echo $! > " + pidFile}, nil)
		syscall.Kill(readPid(t, pidFile), syscall.SIGKILL)
		if r.st.ExitCode != 0 || !strings.HasPrefix(r.stdout, "start\n") {
			t.Fatalf("got %+v, %d bytes", r.st, len(r.stdout))
		}
		t.Logf("returned after %v with %d bytes of background output", r.elapsed, len(r.stdout))
		// A slow writer that never leaves the pipe quiet for a whole window
		// is cut off too (it once held the exit for minutes).
		r = e.mustRun(guest.ExecRequest{Shell: "(while :; do echo x; sleep 0.005; done) & echo $! > " + pidFile}, nil)
		syscall.Kill(readPid(t, pidFile), syscall.SIGKILL)
		if r.st.ExitCode != 0 || r.elapsed > testWait {
			t.Fatalf("slow background writer: %+v after %v", r.st, r.elapsed)
		}
		t.Logf("slow background writer: returned after %v", r.elapsed)
	})
	t.Run("signal", func(t *testing.T) {
		s, err := e.c.Exec(ctx, guest.ExecRequest{Shell: "echo ready; sleep 100"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if f, err := s.Next(); err != nil || string(f.Data) != "ready\n" {
			t.Fatalf("first frame %v %v", f, err)
		}
		s.Signal(syscall.SIGTERM)
		st, err := s.Wait(nil, nil)
		if err != nil || st.Signal != "SIGTERM" || st.ExitCode != 143 {
			t.Fatalf("got %+v %v", st, err)
		}
	})
	t.Run("client-gone-kills", func(t *testing.T) {
		s, err := e.c.Exec(ctx, guest.ExecRequest{Shell: "echo $$; sleep 100"})
		if err != nil {
			t.Fatal(err)
		}
		f, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(f.Data)))
		s.Close()
		waitDead(t, pid)
	})
	t.Run("cwd-env", func(t *testing.T) {
		if err := e.c.SetIdentity(ctx, guest.Identity{Env: map[string]string{"BASE": "b", "FOO": "base"}}); err != nil {
			t.Fatal(err)
		}
		r := e.mustRun(guest.ExecRequest{Shell: `pwd; echo "$FOO $BASE $HOME $USER $LOGNAME"`, Cwd: "/tmp", Env: map[string]string{"FOO": "bar"}}, nil)
		if r.stdout != "/tmp\nbar b /root root root\n" {
			t.Fatalf("stdout %q", r.stdout)
		}
		r = e.mustRun(guest.ExecRequest{Argv: []string{"pwd"}}, nil)
		if r.stdout != "/root\n" {
			t.Fatalf("default cwd %q", r.stdout)
		}
	})
	t.Run("user", func(t *testing.T) {
		r := e.mustRun(guest.ExecRequest{Shell: "id -u; id -g; echo $USER $HOME", User: "nobody"}, nil)
		if r.stdout != "65534\n65534\nnobody /nonexistent\n" {
			t.Fatalf("stdout %q stderr %q", r.stdout, r.stderr)
		}
	})
	t.Run("identity", func(t *testing.T) {
		mid := "0123456789abcdef0123456789abcdef"
		res, err := e.c.ApplyIdentity(ctx, guest.Identity{
			Hostname: "vm-abc", MachineID: mid, Seed: []byte("0123456789"), TimeUnixNano: time.Now().UnixNano(),
			Network: &guest.Network{Address: "10.200.3.2/24", Gateway: "10.200.3.1", DNS: []string{"10.200.3.1"}},
		})
		if err != nil || !res.OK {
			t.Fatalf("%+v %v", res, err)
		}
		check := func(p, want string) {
			b, _ := os.ReadFile(filepath.Join(e.root, p))
			if string(b) != want {
				t.Errorf("%s = %q, want %q", p, b, want)
			}
		}
		check("etc/hostname", "vm-abc\n")
		check("etc/machine-id", mid+"\n")
		check("etc/resolv.conf", "nameserver 10.200.3.1\n")
		check("etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\tvm-abc\n::1\tlocalhost\n")
		if err := e.c.SetIdentity(ctx, guest.Identity{MachineID: "xyz"}); err == nil {
			t.Error("bad machine id accepted")
		}
	})

	t.Run("reconnect-after-disconnect", func(t *testing.T) {
		old := e.c
		// Leave output queued by the guest while no host is attached.
		s, err := old.Exec(ctx, guest.ExecRequest{Shell: "sleep 0.2; head -c 100000 /dev/zero"})
		if err != nil {
			t.Fatal(err)
		}
		_ = s
		e.port.mu.Lock()
		e.port.cur.Close() // host disconnects: the guest reads EOF
		e.port.mu.Unlock()
		waitClosed(t, old.Done())
		time.Sleep(400 * time.Millisecond)
		e.connect(e.port.Attach(t), "junk\n")
		r := e.mustRun(guest.ExecRequest{Argv: []string{"echo", "again"}}, nil)
		if r.stdout != "again\n" {
			t.Fatalf("got %+v", r)
		}
	})
	t.Run("restore", func(t *testing.T) {
		for i := 0; i < 3; i++ {
			old := e.c
			// The guest is mid-session (a stream even open) when a new host
			// connection replaces the old one; the new host sends garbage.
			s, err := old.Exec(ctx, guest.ExecRequest{Shell: "sleep 100"})
			if err != nil {
				t.Fatal(err)
			}
			_ = s
			host := e.port.Restore(t, []byte(stale))
			waitClosed(t, old.Done())
			start := time.Now()
			e.connect(host, stale)
			r := e.mustRun(guest.ExecRequest{Shell: "echo restored $((1+" + strconv.Itoa(i) + "))"}, nil)
			if r.stdout != "restored "+strconv.Itoa(i+1)+"\n" {
				t.Fatalf("got %+v", r)
			}
			t.Logf("reconnect+exec after restore: %v", time.Since(start))
		}
	})
}

func readPid(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}

// testWait bounds every wait on a condition: generous, because these tests
// run beside other packages' -race builds on busy 2-core machines.
const testWait = time.Minute

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timeout waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitDead(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("process %d still alive", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitClosed(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(testWait):
		t.Fatal("old session did not end")
	}
}

// TestConnectUnixSocket goes through guest.Connect on a unix socket that
// stands in for QEMU's server=on chardev.
func TestConnectUnixSocket(t *testing.T) {
	e := startAgent(t)
	dir, err := os.MkdirTemp("/tmp", "agv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "ag.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h := e.port.Attach(t)
			go func() { io.Copy(h, c); h.Close() }()
			go func() { io.Copy(c, h); c.Close() }()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := guest.Connect(ctx, sock, guest.HandshakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	if c.AgentVersion() != guest.Version {
		t.Fatalf("agent version %q", c.AgentVersion())
	}
	r := e.mustRun(guest.ExecRequest{Argv: []string{"echo", "via", "socket"}}, nil)
	if r.stdout != "via socket\n" {
		t.Fatalf("got %+v", r)
	}
}

// The clock a handshake carries is set before the session serves anything:
// a ping through the session comes back only once it is.
func TestHandshakeClockBeforeSession(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	got := make(chan time.Time, 1)
	e := startAgentWith(t, Options{SetClock: func(c time.Time) { got <- c; <-release }})
	t.Cleanup(unblock) // runs before the agent's own cleanup waits for it
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	before := time.Now()
	c, err := guest.NewClient(ctx, e.port.Attach(t), guest.HandshakeOptions{SetClock: true})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	if !c.ClockSent() {
		t.Fatal("the agent was not sent the clock")
	}
	select {
	case clock := <-got:
		if clock.Before(before) || clock.After(time.Now()) {
			t.Fatalf("clock %v is not the host's at the handshake (%v)", clock, before)
		}
	case <-ctx.Done():
		t.Fatal("the agent did not set the clock")
	}
	// However long this waits, the ping cannot come back while the clock
	// is being set.
	pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = c.Ping(pctx)
	pcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping while the clock is being set: %v", err)
	}
	unblock()
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping once the clock is set: %v", err)
	}
}
