package e2e

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

func serviceLogs(t *testing.T, s *testenv.Server, vm, name string) string {
	t.Helper()
	rc, err := s.Client.ServiceLogs(context.Background(), vm, name, 1000, false)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	return string(b)
}

func waitService(t *testing.T, s *testenv.Server, vm, name, state string) *api.ServiceInfo {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		si, err := s.Client.GetService(context.Background(), vm, name)
		if err == nil && si.ActiveState+"/"+si.SubState == state {
			return si
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s never %s: %v %+v", name, state, err, si)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func TestServicesProcessesJobs(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "svc1"})

	out, errOut, code := s.CLI("", "service", "create", "svc1", "ticker", "--restart", "always", "--sh", "--",
		"while true; do echo tick-$(date +%s); sleep 1; done")
	if code != 0 {
		t.Fatalf("service create: %d %q %q", code, out, errOut)
	}
	waitService(t, s, v.ID, "ticker", "active/running")
	waitUntil(t, "two ticks in the journal", 2*time.Minute, func() (bool, string) {
		l := serviceLogs(t, s, v.ID, "ticker")
		return strings.Count(l, "tick-") >= 2, fmt.Sprintf("%q", l)
	})

	t.Run("crash restarts it", func(t *testing.T) {
		si, _ := s.Client.GetService(ctx, v.ID, "ticker")
		if err := s.Client.SignalProcess(ctx, v.ID, si.MainPID, "KILL"); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			now, err := s.Client.GetService(ctx, v.ID, "ticker")
			if err == nil && now.ActiveState == "active" && now.MainPID != si.MainPID && now.MainPID != 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("not restarted: %v %+v", err, now)
			}
			time.Sleep(300 * time.Millisecond)
		}
	})

	t.Run("logs follow", func(t *testing.T) {
		// New lines arrive on an open follow stream, and through the CLI.
		fctx, fcancel := context.WithTimeout(ctx, 60*time.Second)
		defer fcancel()
		rc, err := s.Client.ServiceLogs(fctx, v.ID, "ticker", 1, true)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		since := time.Now().Unix()
		buf := make([]byte, 4096)
		var got strings.Builder
		for {
			n, err := rc.Read(buf)
			got.Write(buf[:n])
			if fresh := ticksAfter(got.String(), since); fresh >= 2 {
				break
			}
			if err != nil {
				t.Fatalf("follow ended: %v after %q", err, got.String())
			}
		}
		cmd := s.CLICmd("", "service", "logs", "svc1", "ticker", "-f", "-n", "1")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }() // only the CLI this test started
		since = time.Now().Unix()
		got.Reset()
		for ticksAfter(got.String(), since) < 2 {
			n, err := stdout.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				t.Fatalf("agentvm service logs -f ended: %v after %q", err, got.String())
			}
		}
	})

	t.Run("processes", func(t *testing.T) {
		ps, err := s.Client.ListProcesses(ctx, v.ID)
		if err != nil {
			t.Fatal(err)
		}
		var sawInit, sawTicker bool
		for _, p := range ps {
			sawInit = sawInit || (p.PID == 1 && strings.Contains(p.Command, "systemd") || p.PID == 1 && strings.Contains(p.Command, "init"))
			sawTicker = sawTicker || strings.Contains(p.Command, "tick-")
		}
		if !sawInit || !sawTicker {
			t.Fatalf("ps: init %v ticker %v (%d processes)", sawInit, sawTicker, len(ps))
		}
		out, _, code := s.CLI("", "ps", "svc1")
		if code != 0 || !strings.Contains(out, "PID") {
			t.Fatalf("agentvm ps: %q", out)
		}
		wantStatus(t, s.Client.SignalProcess(ctx, v.ID, 1, "KILL"), 400, "")
		wantStatus(t, s.Client.SignalProcess(ctx, v.ID, 4000000, "TERM"), 404, "")
	})

	t.Run("detached jobs", func(t *testing.T) {
		out, errOut, code := s.CLI("", "exec", "svc1", "--detach", "--sh", "--", "for i in 1 2 3; do echo line-$i; sleep 1; done; echo err-out >&2; exit 7")
		id := strings.TrimSpace(out)
		if code != 0 || !strings.HasPrefix(id, "j") {
			t.Fatalf("exec --detach: %d %q %q", code, out, errOut)
		}
		// the client goes away; a new one follows the output to the end
		rc, err := s.Client.JobLogs(ctx, v.ID, id, "stdout", 0, true)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "line-1\nline-2\nline-3\n" {
			t.Fatalf("followed output: %q", b)
		}
		j, err := s.Client.WaitJob(ctx, v.ID, id, time.Minute)
		if err != nil || !j.Exited || j.ExitCode != 7 {
			t.Fatalf("wait: %v %+v", err, j)
		}
		_, _, code = s.CLI("", "job", "wait", "svc1", id)
		if code != 7 {
			t.Fatalf("job wait exit code %d", code)
		}
		rc, _ = s.Client.JobLogs(ctx, v.ID, id, "stderr", 0, false)
		b, _ = io.ReadAll(rc)
		rc.Close()
		if string(b) != "err-out\n" {
			t.Fatalf("stderr: %q", b)
		}
		long, err := s.Client.StartJob(ctx, v.ID, api.ExecRequest{Cmd: []string{"sleep", "600"}, User: "agent"})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Client.SignalJob(ctx, v.ID, long.ID, "KILL"); err != nil {
			t.Fatal(err)
		}
		j, err = s.Client.WaitJob(ctx, v.ID, long.ID, time.Minute)
		if err != nil || !j.Exited || j.Signal == "" || j.User != "agent" {
			t.Fatalf("killed job: %v %+v", err, j)
		}
		// a job outlives the daemon: kill -9 it, restart it, the job is still there
		later, err := s.Client.StartJob(ctx, v.ID, api.ExecRequest{Shell: "sleep 4; echo after-restart"})
		if err != nil {
			t.Fatal(err)
		}
		s.Kill9()
		s.Restart()
		j, err = s.Client.WaitJob(ctx, v.ID, later.ID, 2*time.Minute)
		if err != nil || !j.Exited || j.ExitCode != 0 {
			t.Fatalf("job across a daemon restart: %v %+v", err, j)
		}
		rc, _ = s.Client.JobLogs(ctx, v.ID, later.ID, "stdout", 0, false)
		b, _ = io.ReadAll(rc)
		rc.Close()
		if string(b) != "after-restart\n" {
			t.Fatalf("output across a daemon restart: %q", b)
		}
		if err := s.Client.DeleteJob(ctx, v.ID, id); err != nil {
			t.Fatal(err)
		}
		_, err = s.Client.GetJob(ctx, v.ID, id)
		wantStatus(t, err, 404, "")
	})

	t.Run("survives suspend/wake and stop/start", func(t *testing.T) {
		if _, err := s.Client.SuspendVM(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
		before := time.Now().Unix()
		waitService(t, s, v.ID, "ticker", "active/running") // the request wakes the VM
		// Some tick is stamped after the suspend: the service runs on. (Not
		// a given second: the guest's clock is set at the wake, which may
		// take seconds on a busy host, and it skips the seconds between.)
		waitUntil(t, fmt.Sprintf("a tick after the wake (from %d)", before), 2*time.Minute, func() (bool, string) {
			l := serviceLogs(t, s, v.ID, "ticker")
			return lastTick(l) > before, fmt.Sprintf("%q", testenv.Tail(l, 400))
		})
		if _, err := s.Client.StopVM(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Client.StartVM(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
		waitService(t, s, v.ID, "ticker", "active/running") // enabled: started at boot
	})

	t.Run("stop, remove, bad input", func(t *testing.T) {
		if _, _, code := s.CLI("", "service", "stop", "svc1", "ticker"); code != 0 {
			t.Fatal("stop failed")
		}
		waitService(t, s, v.ID, "ticker", "inactive/dead")
		out, _, _ := s.CLI("", "service", "ls", "svc1")
		if !strings.Contains(out, "ticker") || !strings.Contains(out, "inactive") {
			t.Fatalf("service ls: %q", out)
		}
		if _, _, code := s.CLI("", "service", "rm", "svc1", "ticker"); code != 0 {
			t.Fatal("rm failed")
		}
		_, err := s.Client.GetService(ctx, v.ID, "ticker")
		wantStatus(t, err, 404, "")
		_, err = s.Client.CreateService(ctx, v.ID, api.ServiceCreate{Name: "Bad Name", Argv: []string{"true"}})
		wantStatus(t, err, 400, "")
		_, err = s.Client.CreateService(ctx, v.ID, api.ServiceCreate{Name: "x", Argv: []string{"true"}, Restart: "sometimes"})
		wantStatus(t, err, 400, "")
	})

	log := eventLog(t, s, v.ID)
	for _, want := range []string{"service | admin | service ticker created", "job | admin | job ", "service | admin | service ticker: stop", "service | admin | service ticker removed"} {
		if !strings.Contains(log, want) {
			t.Fatalf("event log lacks %q:\n%s", want, log)
		}
	}
}

// ticksAfter counts "tick-UNIXTIME" lines in a log with a time after since.
func ticksAfter(log string, since int64) int {
	n := 0
	for _, f := range strings.Fields(log) {
		if i := strings.Index(f, "tick-"); i >= 0 {
			if ts, err := strconv.ParseInt(f[i+5:], 10, 64); err == nil && ts > since {
				n++
			}
		}
	}
	return n
}

// lastTick is the largest N of the "tick-N" lines in a service's log (0
// when there are none).
func lastTick(log string) int64 {
	var last int64
	for _, f := range strings.Fields(log) {
		i := strings.Index(f, "tick-")
		if i < 0 {
			continue
		}
		if n, err := strconv.ParseInt(f[i+len("tick-"):], 10, 64); err == nil && n > last {
			last = n
		}
	}
	return last
}
