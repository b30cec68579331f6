package e2e

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

// timedWriter records when each write arrived.
type timedWriter struct {
	mu     *sync.Mutex
	name   string
	events *[]string
	times  *[]time.Time
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range strings.Fields(string(p)) {
		*w.events = append(*w.events, w.name+":"+l)
		*w.times = append(*w.times, time.Now())
	}
	return len(p), nil
}

func TestCreateAndExec(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// Create through the CLI, as a user would.
	out, stderr, code := s.CLI("", "create", "--name", "box1", "--memory", "512M", "--label", "team=qa", "--env", "GREETING=hello", "--json")
	if code != 0 {
		t.Fatalf("create: %d %s", code, stderr)
	}
	if !strings.Contains(out, `"state": "running"`) || !strings.Contains(out, `"name": "box1"`) {
		t.Fatalf("create output: %s", out)
	}

	t.Run("uname", func(t *testing.T) {
		out, errOut, code := s.CLI("", "exec", "box1", "--", "uname", "-a")
		if code != 0 || !strings.HasPrefix(out, "Linux box1 ") || !strings.Contains(out, "x86_64") {
			t.Fatalf("uname: code %d out %q err %q", code, out, errOut)
		}
	})
	t.Run("systemd is pid 1 and identity is fresh", func(t *testing.T) {
		r := s.Exec(ctx, "box1", "cat /proc/1/comm; hostname; cat /etc/hostname; grep 127.0.1.1 /etc/hosts; cat /etc/machine-id; date +%Y")
		lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if len(lines) != 6 || lines[0] != "systemd" || lines[1] != "box1" || lines[2] != "box1" || !strings.Contains(lines[3], "box1") || len(lines[4]) != 32 {
			t.Fatalf("identity: %q", r.Stdout)
		}
		if lines[5] != time.Now().UTC().Format("2006") {
			t.Errorf("guest clock not set: year %s", lines[5])
		}
	})
	t.Run("exit code propagation", func(t *testing.T) {
		_, _, code := s.CLI("", "exec", "box1", "--", "sh", "-c", "exit 42")
		if code != 42 {
			t.Fatalf("exit code %d, want 42", code)
		}
		r := s.Exec(ctx, "box1", "exit 3")
		if r.ExitCode != 3 {
			t.Fatalf("API exit code %d", r.ExitCode)
		}
		_, errOut, code := s.CLI("", "exec", "box1", "--", "no-such-command")
		if code != 127 || !strings.Contains(errOut, "not found") {
			t.Fatalf("missing command: code %d stderr %q", code, errOut)
		}
		r = s.Exec(ctx, "box1", "kill -TERM $$")
		if r.Signal != "SIGTERM" {
			t.Fatalf("signal: %+v", r)
		}
	})
	t.Run("stdout and stderr stream separately as produced", func(t *testing.T) {
		var events []string
		var times []time.Time
		var mu sync.Mutex // one lock for both writers: they share the slices
		ow := &timedWriter{mu: &mu, name: "out", events: &events, times: &times}
		ew := &timedWriter{mu: &mu, name: "err", events: &events, times: &times}
		st, err := s.Client.Run(ctx, "box1", api.ExecRequest{Shell: "echo one; sleep 1; echo two >&2; sleep 1; echo three"}, nil, ow, ew)
		if err != nil || st.ExitCode != 0 {
			t.Fatalf("run: %v %+v", err, st)
		}
		want := []string{"out:one", "err:two", "out:three"}
		if strings.Join(events, ",") != strings.Join(want, ",") {
			t.Fatalf("events %v, want %v", events, want)
		}
		// The guest sleeps 2 s between the first and the last output:
		// buffered output would arrive all at once.
		if d := times[2].Sub(times[0]); d < 1500*time.Millisecond {
			t.Errorf("outputs arrived %s apart: buffered, not streamed", d)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		out, _, code := s.CLI("line1\nline2\n", "exec", "box1", "--", "sh", "-c", "wc -l; cat /dev/stdin")
		if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "2") {
			t.Fatalf("stdin via CLI: %d %q", code, out)
		}
		big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
		var o bytes.Buffer
		st, err := s.Client.Run(ctx, "box1", api.ExecRequest{Cmd: []string{"sha256sum"}}, bytes.NewReader(big), &o, nil)
		if err != nil || st.ExitCode != 0 || !strings.HasPrefix(o.String(), "5c4ad") && len(o.String()) < 64 {
			t.Fatalf("1 MiB stdin: %v %+v %q", err, st, o.String())
		}
		r, err := s.Client.Exec(ctx, "box1", api.ExecRequest{Cmd: []string{"cat"}, Stdin: "via json"})
		if err != nil || r.Stdout != "via json" {
			t.Fatalf("json stdin: %v %+v", err, r)
		}
	})
	t.Run("user cwd env", func(t *testing.T) {
		r, err := s.Client.Exec(ctx, "box1", api.ExecRequest{Shell: `id -un; pwd; echo "$GREETING $EXTRA"; sudo -n id -un`, User: "agent", Cwd: "/tmp", Env: map[string]string{"EXTRA": "world"}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Stdout != "agent\n/tmp\nhello world\nroot\n" {
			t.Fatalf("got %q (stderr %q)", r.Stdout, r.Stderr)
		}
		out, _, _ := s.CLI("", "exec", "box1", "--user", "agent", "--", "pwd")
		if strings.TrimSpace(out) != "/home/agent" {
			t.Fatalf("default cwd %q", out)
		}
		out, _, _ = s.CLI("", "exec", "box1", "--cwd", "/etc", "--env", "A=1", "--", "sh", "-c", "pwd; echo $A")
		if out != "/etc\n1\n" {
			t.Fatalf("cli cwd/env %q", out)
		}
	})
	t.Run("timeout kills the process group", func(t *testing.T) {
		start := time.Now()
		r, err := s.Client.Exec(ctx, "box1", api.ExecRequest{Shell: "sleep 300 & sleep 301; echo never", Timeout: api.Duration(2 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		if !r.TimedOut || r.Signal != "SIGKILL" || strings.Contains(r.Stdout, "never") || time.Since(start) > 20*time.Second {
			t.Fatalf("timeout result %+v after %s", r, time.Since(start))
		}
		if left := s.Exec(ctx, "box1", "pgrep -x sleep || true").Stdout; left != "" {
			t.Fatalf("sleep processes survived the timeout: %q", left)
		}
		_, errOut, code := s.CLI("", "exec", "box1", "--timeout", "1s", "--", "sleep", "30")
		if code != 137 || !strings.Contains(errOut, "timed out") {
			t.Fatalf("cli timeout: code %d %q", code, errOut)
		}
	})
	t.Run("background processes outlive the exec", func(t *testing.T) {
		start := time.Now()
		r := s.Exec(ctx, "box1", "nohup sleep 1000 & echo started")
		if r.Stdout != "started\n" || time.Since(start) > 10*time.Second {
			t.Fatalf("background exec: %+v after %s", r, time.Since(start))
		}
		time.Sleep(time.Second)
		if r := s.Exec(ctx, "box1", "pgrep -f 'sleep 1000'"); r.ExitCode != 0 {
			t.Fatalf("background sleep died")
		}
	})
	t.Run("ndjson stream", func(t *testing.T) {
		var ev []api.ExecEvent
		err := s.Client.ExecEvents(ctx, "box1", api.ExecRequest{Shell: "echo a; echo b >&2; exit 5"}, func(e api.ExecEvent) { ev = append(ev, e) })
		// stdout and stderr are separate pipes: their order relative to
		// each other is not defined, each one's is.
		got := map[string]string{}
		for _, e := range ev {
			got[e.Type] += e.Data
		}
		if err != nil || got["stdout"] != "a\n" || got["stderr"] != "b\n" {
			t.Fatalf("events %v %+v", err, ev)
		}
		last := ev[len(ev)-1]
		if last.Type != "exit" || last.ExitCode == nil || *last.ExitCode != 5 {
			t.Fatalf("events %+v", ev)
		}
	})
	t.Run("list and inspect", func(t *testing.T) {
		vms, err := s.Client.ListVMs(ctx, "team=qa")
		if err != nil || len(vms) != 1 || vms[0].Name != "box1" || vms[0].IP == "" {
			t.Fatalf("ls by label: %v %+v", err, vms)
		}
		if vms, _ := s.Client.ListVMs(ctx, "team=dev"); len(vms) != 0 {
			t.Fatalf("label filter matched %d", len(vms))
		}
		out, _, code := s.CLI("", "inspect", "box1")
		if code != 0 || !strings.Contains(out, `"ip": "10.200.`) {
			t.Fatalf("inspect: %s", out)
		}
		if r := s.Exec(ctx, "box1", "ip -4 -o addr show eth0"); !strings.Contains(r.Stdout, vms[0].IP+"/24") {
			t.Fatalf("guest address %q, inspect says %s", r.Stdout, vms[0].IP)
		}
		out, _, code = s.CLI("", "logs", "box1")
		if code != 0 || len(out) == 0 {
			t.Fatalf("logs empty (code %d)", code)
		}
	})
}

func TestIdempotentCreateAndDisk(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	a := s.CreateVM(ctx, api.CreateVMRequest{IdempotencyKey: "req-1", Disk: 10 << 30})
	b := s.CreateVM(ctx, api.CreateVMRequest{IdempotencyKey: "req-1", Disk: 10 << 30})
	if a.ID != b.ID {
		t.Fatalf("idempotent create made two VMs: %s %s", a.ID, b.ID)
	}
	if vms, _ := s.Client.ListVMs(ctx); len(vms) != 1 {
		t.Fatalf("%d VMs after a retried create", len(vms))
	}
	// The disk grew from the 8 GiB image to 10 GiB during create.
	r := s.Exec(ctx, a.ID, "df -B1M --output=size / | tail -1")
	var mb int
	if _, err := fmtSscan(r.Stdout, &mb); err != nil || mb < 9500 {
		t.Fatalf("root filesystem is %q MiB, want ~10 GiB", r.Stdout)
	}
	// Two VMs get different identities and networks.
	c := s.CreateVM(ctx, api.CreateVMRequest{})
	ra := s.Exec(ctx, a.ID, "cat /etc/machine-id; hostname")
	rc := s.Exec(ctx, c.ID, "cat /etc/machine-id; hostname")
	if ra.Stdout == rc.Stdout || c.Subnet == a.Subnet {
		t.Fatalf("clones share identity: %q vs %q, subnets %s %s", ra.Stdout, rc.Stdout, a.Subnet, c.Subnet)
	}
}

func TestWarmPool(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "", "--warm-pool", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	a := s.CreateVM(ctx, api.CreateVMRequest{Name: "first"})
	// the create refills the pool of its shape in the background
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h, err := s.Client.Health(ctx)
		if err == nil && h.WarmPool["1x512"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool not refilled: %+v %v", h, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if vms, _ := s.Client.ListVMs(ctx); len(vms) != 1 {
		t.Fatalf("pool VMs are listed: %+v", vms)
	}
	// The OOM order (docs/operations.md): the pool's VM first, then users'
	// VMs, then the rest (the daemon keeps its own score).
	qemus := dataDirQEMUs(s.DataDir)
	var poolID string
	for id := range qemus {
		if id != a.ID {
			poolID = id
		}
	}
	if len(qemus) != 2 || testenv.OOMScore(qemuPID(qemus, a.ID)) != "500" || testenv.OOMScore(qemuPID(qemus, poolID)) != "1000" ||
		testenv.OOMScore(s.PID()) != testenv.OOMScore(os.Getpid()) {
		t.Fatalf("OOM scores: daemon %s, VM %s, pool VM %s (%v)", testenv.OOMScore(s.PID()),
			testenv.OOMScore(qemuPID(qemus, a.ID)), testenv.OOMScore(qemuPID(qemus, poolID)), qemus)
	}
	b, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "pooled", Memory: 512 << 20, Disk: 10 << 30,
		Env: map[string]string{"ROLE": "worker"}, Labels: map[string]string{"tier": "hot"}, IdempotencyKey: "pool-1"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.Source, "warm pool") || b.State != "running" || b.Labels["tier"] != "hot" {
		t.Fatalf("not served from the pool: %+v", b)
	}
	t.Logf("create from the warm pool: %d ms (restore path: %d ms)", b.CreateMs, a.CreateMs)
	if b.ID != poolID || testenv.OOMScore(qemuPID(qemus, b.ID)) != "500" {
		t.Fatalf("the claimed pool VM %s (pool VM was %s) keeps OOM score %s", b.ID, poolID, testenv.OOMScore(qemuPID(qemus, b.ID)))
	}
	r := s.Exec(ctx, "pooled", `hostname; grep -c pooled /etc/hosts; echo $ROLE; cat /etc/machine-id; df -B1M --output=size / | tail -1; ip -4 -o addr show eth0`)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 6 || lines[0] != "pooled" || lines[1] != "1" || lines[2] != "worker" || !strings.Contains(lines[5], b.IP+"/24") {
		t.Fatalf("pooled VM identity: %q", r.Stdout)
	}
	var mb int
	fmtSscan(lines[4], &mb)
	if mb < 9500 {
		t.Fatalf("disk not grown: %s MiB", lines[4])
	}
	if ra := s.Exec(ctx, "first", "cat /etc/machine-id"); strings.TrimSpace(ra.Stdout) == lines[3] {
		t.Fatal("pooled VM shares a machine-id")
	}
	again, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "pooled", Memory: 512 << 20, IdempotencyKey: "pool-1"})
	if err != nil || again.ID != b.ID {
		t.Fatalf("idempotent replay: %v %+v", err, again)
	}
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "pooled", Memory: 512 << 20}); !isStatus(err, 409) {
		t.Fatalf("duplicate name with a warm pool: %v", err)
	}
	// stopping the server removes the pool's VMs
	for _, id := range []string{a.ID, b.ID} {
		s.Client.DeleteVM(ctx, id)
	}
	s.Terminate()
	for _, p := range testenv.AllQEMUProcesses() {
		if strings.Contains(p, s.DataDir) {
			t.Fatalf("QEMU left after the server stopped: %s", p)
		}
	}
}
