package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

// stateOf reads a VM's state from the list (which, unlike GET of the VM,
// is not activity on it).
func stateOf(t *testing.T, s *testenv.Server, id string) api.State {
	t.Helper()
	vms, err := s.Client.ListVMs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vms {
		if v.ID == id {
			return v.State
		}
	}
	return "gone"
}

func waitListState(t *testing.T, s *testenv.Server, id string, want api.State, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		st := stateOf(t, s, id)
		if st == want {
			return
		}
		// States nothing leaves on its own end the wait at once.
		if (st == api.StateError || st == "gone") && st != want {
			t.Fatalf("%s is %s, waiting for %s", id, st, want)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("%s did not become %s within %s (state %s)", id, want, d, stateOf(t, s, id))
}

func eventLog(t *testing.T, s *testenv.Server, id string) string {
	t.Helper()
	es, err := s.Client.Events(context.Background(), id, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, e := range es {
		b.WriteString(e.Type + " | " + e.Actor + " | " + e.Message + "\n")
	}
	return b.String()
}

func TestIdleSuspendAndEvents(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, errOut, code := s.CLI("", "create", "--name", "idle1", "--memory", "512", "--idle-timeout", "8s", "--json")
	if code != 0 {
		t.Fatalf("create: %q", errOut)
	}
	_ = out
	v, err := s.Client.GetVM(ctx, "idle1")
	if err != nil || v.IdleTimeoutSec != 8 {
		t.Fatalf("idle policy not set: %v %+v", err, v)
	}
	if r := s.Exec(ctx, v.ID, "echo counting > /tmp/marker"); r.ExitCode != 0 {
		t.Fatal("exec failed")
	}
	// A terminal open counts as activity: nothing is suspended meanwhile.
	if _, err := s.Client.CreateTerminal(ctx, v.ID, api.TermCreate{Name: "busy"}); err != nil {
		t.Fatal(err)
	}
	tr := attach(t, s.Client, v.ID, "busy", clientAttachNoScrollback())
	time.Sleep(16 * time.Second)
	if st := stateOf(t, s, v.ID); st != "running" {
		t.Fatalf("suspended while a terminal was attached: %s", st)
	}
	tr.close()
	waitListState(t, s, v.ID, "suspended", 40*time.Second)
	// the next request wakes it transparently
	r := s.Exec(ctx, v.ID, "cat /tmp/marker")
	if r.Stdout != "counting\n" || stateOf(t, s, v.ID) != "running" {
		t.Fatalf("after idle suspend: %q %s", r.Stdout, stateOf(t, s, v.ID))
	}
	log := eventLog(t, s, v.ID)
	for _, want := range []string{"lifecycle | admin | create", "exec | admin | echo counting > /tmp/marker -> exit 0",
		"terminal | admin | opened terminal busy", "terminal | admin | attached to terminal busy", "detached from terminal busy",
		"lifecycle | idle-policy | suspended after", "exec | admin | cat /tmp/marker -> exit 0"} {
		if !strings.Contains(log, want) {
			t.Fatalf("event log lacks %q:\n%s", want, log)
		}
	}
	out, _, code = s.CLI("", "events", "idle1")
	if code != 0 || !strings.Contains(out, "idle-policy") {
		t.Fatalf("agentvm events: %d %q", code, out)
	}
	// follow: a new event arrives on the stream
	fctx, fcancel := context.WithTimeout(ctx, time.Minute)
	defer fcancel()
	got := make(chan api.Event, 16)
	seen, _ := s.Client.Events(ctx, v.ID, 0)
	var lastSeq int64
	if len(seen) > 0 {
		lastSeq = seen[len(seen)-1].Seq
	}
	go s.Client.FollowEvents(fctx, v.ID, lastSeq, func(e api.Event) error { got <- e; return nil })
	time.Sleep(500 * time.Millisecond)
	s.Exec(ctx, v.ID, "echo followed")
	select {
	case e := <-got:
		if e.Type != "exec" || !strings.Contains(e.Message, "echo followed") {
			t.Fatalf("followed event: %+v", e)
		}
	case <-fctx.Done():
		t.Fatal("no event on the follow stream")
	}

	// metrics
	req, _ := http.NewRequest("GET", s.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+s.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`agentvm_vms{state="running"} 1`, `agentvm_operation_duration_seconds_count{op="create"} 1`,
		`agentvm_operation_duration_seconds_count{op="exec"}`, "agentvm_host_memory_committed_bytes 536870912"} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("metrics lack %q:\n%s", want, body)
		}
	}
	resp, _ = http.Get(s.URL + "/metrics")
	if resp.StatusCode != 401 {
		t.Fatalf("metrics without a token: %d", resp.StatusCode)
	}

	// policies change on an existing VM
	if out, errOut, code := s.CLI("", "policy", "idle1", "--idle-timeout", "0", "--restart", "on-failure"); code != 0 {
		t.Fatalf("policy: %d %q %q", code, out, errOut)
	}
	if v, err := s.Client.GetVM(ctx, "idle1"); err != nil || v.IdleTimeoutSec != 0 || v.Restart != "on-failure" {
		t.Fatalf("policy not applied: %v %+v", err, v)
	}
	if _, errOut, code := s.CLI("", "policy", "idle1", "--idle-timeout", "soon"); code == 0 || !strings.Contains(errOut, "want a duration") {
		t.Fatalf("bad policy: %d %q", code, errOut)
	}

	// delete-after, set at create and on an existing VM
	short := s.CreateVM(ctx, api.CreateVMRequest{Name: "shortlived", DeleteAfter: api.Duration(3 * time.Second)})
	later := s.CreateVM(ctx, api.CreateVMRequest{Name: "later"})
	if _, errOut, code := s.CLI("", "policy", "later", "--delete-after", "2s"); code != 0 {
		t.Fatalf("policy --delete-after: %q", errOut)
	}
	waitListState(t, s, short.ID, "gone", time.Minute)
	waitListState(t, s, later.ID, "gone", time.Minute)
	if log := eventLog(t, s, short.ID); !strings.Contains(log, "delete-after 3s reached") {
		t.Fatalf("delete-after event missing:\n%s", log)
	}
}

func TestRestartPolicy(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "crashy", Restart: "always"})
	if r := s.Exec(ctx, v.ID, "echo durable > /root/keep && sync"); r.ExitCode != 0 {
		t.Fatal("write failed")
	}
	_, errOut, code := s.CLI("", "create", "--name", "bad", "--restart", "sometimes")
	if code == 0 || !strings.Contains(errOut, "never, on-failure or always") {
		t.Fatalf("bad restart policy: %d %q", code, errOut)
	}
	pids := testenv.QEMUProcesses(v.ID)
	if len(pids) != 1 {
		t.Fatalf("qemu pids of %s: %v", v.ID, pids)
	}
	syscall.Kill(pids[0], syscall.SIGKILL) // the QEMU process this test's server started
	waitListState(t, s, v.ID, "crashed", time.Minute)
	waitListState(t, s, v.ID, "running", 4*time.Minute)
	r := s.Exec(ctx, v.ID, "cat /root/keep")
	if r.Stdout != "durable\n" {
		t.Fatalf("after the restart: %q", r.Stdout)
	}
	log := eventLog(t, s, v.ID)
	for _, want := range []string{"lifecycle | system | QEMU exited: crashed", "restart-policy | restart policy always", "restart-policy | restarted from its disk"} {
		if !strings.Contains(log, want) {
			t.Fatalf("event log lacks %q:\n%s", want, log)
		}
	}
}
