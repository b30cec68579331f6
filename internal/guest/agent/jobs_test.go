package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
)

func TestJobStatus(t *testing.T) {
	meta := &jobMeta{JobInfo: api.JobInfo{ID: "j00000001", Argv: []string{"x"}, User: "root"}}
	for _, tc := range []struct {
		name   string
		p      map[string]string
		exited bool
		code   int
		sig    string
		pid    int
	}{
		{"running", map[string]string{"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "MainPID": "42", "ExecMainPID": "42", "ExecMainCode": "0"}, false, 0, "", 42},
		{"exited 0", map[string]string{"LoadState": "loaded", "ActiveState": "active", "SubState": "exited", "MainPID": "0", "ExecMainPID": "42", "ExecMainCode": "1", "ExecMainStatus": "0", "ExecMainExitTimestamp": "@1700000000"}, true, 0, "", 42},
		{"exited 3", map[string]string{"LoadState": "loaded", "ActiveState": "failed", "SubState": "failed", "ExecMainPID": "42", "ExecMainCode": "1", "ExecMainStatus": "3", "Result": "exit-code"}, true, 3, "", 42},
		{"killed", map[string]string{"LoadState": "loaded", "ActiveState": "failed", "ExecMainCode": "2", "ExecMainStatus": "9", "Result": "signal"}, true, 137, "SIGKILL", 0},
		{"dumped", map[string]string{"LoadState": "loaded", "ActiveState": "failed", "ExecMainCode": "3", "ExecMainStatus": "11", "Result": "core-dump"}, true, 139, "SIGSEGV", 0},
		{"never ran", map[string]string{"LoadState": "loaded", "ActiveState": "failed", "ExecMainCode": "0"}, true, -1, "", 0},
		{"unit gone", map[string]string{"LoadState": "not-found", "ActiveState": "inactive"}, true, -1, "", 0},
	} {
		ji := jobStatus(meta, tc.p)
		if ji.Exited != tc.exited || ji.ExitCode != tc.code || ji.Signal != tc.sig || ji.PID != tc.pid || ji.ID != meta.ID {
			t.Errorf("%s: %+v", tc.name, ji)
		}
		if ts := tc.p["ExecMainExitTimestamp"]; ts != "" && (ji.EndedAt == nil || !ji.EndedAt.Equal(time.Unix(1700000000, 0))) {
			t.Errorf("%s: ended at %v", tc.name, ji.EndedAt)
		}
	}
}

// sleeper starts a process standing for a job's main process.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

// finish ends a fake job: its process dies, then systemd notices.
func finish(t *testing.T, fake *fakeSystemd, cmd *exec.Cmd, id string, kv ...string) {
	t.Helper()
	cmd.Process.Kill()
	cmd.Wait()
	p := []string{"ActiveState", "active", "SubState", "exited", "MainPID", "0", "ExecMainPID", strconv.Itoa(cmd.Process.Pid),
		"ExecMainCode", "1", "ExecMainStatus", "0", "ExecMainExitTimestamp", "@1700000100"}
	fake.set(jobUnit(id), append(p, kv...)...)
}

func checkNoJobGoroutines(t *testing.T) {
	t.Helper()
	var stacks string
	for deadline := time.Now().Add(testWait); time.Now().Before(deadline); {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "agent.(*jobManager).followLog") && !strings.Contains(stacks, "agent.(*jobManager).handleWait") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("job goroutines left:\n%s", stacks)
}

func TestJobs(t *testing.T) {
	e, fake, home := startSvcAgent(t)
	ctx := context.Background()
	c := e.c
	jobsRoot := filepath.Join(e.root, "var/lib/agentvm/jobs")
	echo, err := lookPath("echo", userPath, home)
	if err != nil {
		t.Fatal(err)
	}
	startJob := func(t *testing.T, req guest.ExecRequest) (*api.JobInfo, *exec.Cmd) {
		t.Helper()
		proc := sleeper(t)
		fake.mu.Lock()
		fake.mainPID = proc.Process.Pid
		fake.mu.Unlock()
		ji, err := c.StartJob(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return ji, proc
	}

	var first *api.JobInfo
	var firstProc *exec.Cmd
	t.Run("start", func(t *testing.T) {
		before := time.Now()
		ji, proc := startJob(t, guest.ExecRequest{
			Argv: []string{"echo", "a b", "$HOME", "100%", "${X}", `q"\`}, User: testUser, Cwd: home, TimeoutMS: 1500,
			Env: map[string]string{"FOO": "bar baz", "ML": "l1\nl2"},
		})
		first, firstProc = ji, proc
		if !regexp.MustCompile(`^j[0-9a-f]{8}$`).MatchString(ji.ID) || ji.User != testUser || ji.PID != proc.Process.Pid || ji.Exited ||
			strings.Join(ji.Argv, "|") != `echo|a b|$HOME|100%|${X}|q"\` || ji.StartedAt.Before(before.Add(-time.Second)) || ji.EndedAt != nil {
			t.Fatalf("job = %+v", ji)
		}
		dir := filepath.Join(jobsRoot, ji.ID)
		fake.mu.Lock()
		var run []string
		for _, a := range fake.argvs {
			if a[0] == "systemd-run" {
				run = a
			}
		}
		fake.mu.Unlock()
		want := []string{"systemd-run",
			"--unit=agentvm-job-" + ji.ID, "--quiet", "--no-ask-password",
			"--property=RemainAfterExit=yes",
			"--property=StandardOutput=file:" + dir + "/stdout",
			"--property=StandardError=file:" + dir + "/stderr",
			"--property=RuntimeMaxSec=1500ms",
			"--uid=" + testUser, "--gid=4242", "--working-directory=" + home,
			"--setenv=FOO=bar baz", "--setenv=HOME=" + home, "--setenv=LOGNAME=" + testUser, "--setenv=ML=l1\nl2",
			"--setenv=PATH=" + userPath, "--setenv=SHELL=/bin/sh", "--setenv=USER=" + testUser,
			"--", echo, "a b", "$$HOME", "100%", "$${X}", `q"\`,
		}
		if strings.Join(run, "\x00") != strings.Join(want, "\x00") {
			t.Fatalf("systemd-run args:\n%q\nwant:\n%q", run, want)
		}
		wantCalls(t, fake, strings.Join(want, " "))
		var st syscall.Stat_t
		if err := syscall.Stat(dir, &st); err != nil || st.Uid != testUID || st.Gid != testUID {
			t.Fatalf("job dir: %+v, %v", st, err)
		}
		var meta jobMeta
		b, _ := os.ReadFile(filepath.Join(dir, "job.json"))
		if err := json.Unmarshal(b, &meta); err != nil || meta.ID != ji.ID || meta.User != testUser || len(meta.Argv) != 6 || meta.Final {
			t.Fatalf("job.json %s: %v", b, err)
		}
		checkSystemdRunParses(t, want[1:])
	})

	t.Run("no group", func(t *testing.T) {
		appendFile(t, filepath.Join(e.root, "etc/passwd"), "agvnogrp:x:4243:4999::"+home+":/bin/sh\n")
		ji, _ := startJob(t, guest.ExecRequest{Argv: []string{"true"}, User: "agvnogrp"})
		calls := strings.Join(fake.takeCalls(), "\n")
		if !strings.Contains(calls, " --uid=agvnogrp --working-directory=") || strings.Contains(calls, "--gid") {
			t.Fatalf("calls:\n%s", calls)
		}
		if err := c.DeleteJob(ctx, ji.ID); err != nil {
			t.Fatal(err)
		}
		fake.takeCalls()
	})

	t.Run("exit", func(t *testing.T) {
		ji, err := c.GetJob(ctx, first.ID)
		if err != nil || ji.Exited || ji.PID != firstProc.Process.Pid {
			t.Fatalf("running = %+v, %v", ji, err)
		}
		finish(t, fake, firstProc, first.ID, "ExecMainStatus", "3", "ActiveState", "failed", "SubState", "failed")
		ji, err = c.GetJob(ctx, first.ID)
		if err != nil || !ji.Exited || ji.ExitCode != 3 || ji.Signal != "" || ji.PID != firstProc.Process.Pid ||
			ji.EndedAt == nil || !ji.EndedAt.Equal(time.Unix(1700000100, 0)) {
			t.Fatalf("exited = %+v, %v", ji, err)
		}
		want := "systemctl show agentvm-job-" + first.ID + ".service -p ActiveState,SubState,MainPID,ExecMainPID,ExecMainStatus,ExecMainCode,Result,ExecMainExitTimestamp,LoadState --timestamp=unix"
		if s := fake.shows(); s[len(s)-1] != want {
			t.Fatalf("show = %q", s[len(s)-1])
		}
		// The final status is kept: systemd is not asked again.
		n := len(fake.shows())
		ji2, err := c.GetJob(ctx, first.ID)
		if err != nil || ji2.ExitCode != 3 || !ji2.Exited || len(fake.shows()) != n {
			t.Fatalf("final = %+v, %v (%d shows)", ji2, err, len(fake.shows())-n)
		}
		fake.takeCalls()
	})

	t.Run("killed", func(t *testing.T) {
		ji, proc := startJob(t, guest.ExecRequest{Shell: "sleep 100"})
		if strings.Join(ji.Argv, "|") != "/bin/sh|-c|sleep 100" || ji.User != "root" {
			t.Fatalf("job = %+v", ji)
		}
		finish(t, fake, proc, ji.ID, "ExecMainCode", "2", "ExecMainStatus", "9", "ActiveState", "failed", "SubState", "failed", "Result", "signal")
		ji, err := c.GetJob(ctx, ji.ID)
		if err != nil || !ji.Exited || ji.ExitCode != 137 || ji.Signal != "SIGKILL" {
			t.Fatalf("killed = %+v, %v", ji, err)
		}
		fake.takeCalls()
	})

	t.Run("logs", func(t *testing.T) {
		dir := filepath.Join(jobsRoot, first.ID)
		os.WriteFile(filepath.Join(dir, "stdout"), []byte("hello\nworld\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "stderr"), []byte("err\n"), 0o644)
		for _, tc := range []struct {
			stream string
			offset int64
			follow bool
			want   string
		}{
			{"", 0, false, "hello\nworld\n"},
			{"stdout", 6, false, "world\n"},
			{"stderr", 0, false, "err\n"},
			{"both", 0, false, "hello\nworld\nerr\n"},
			{"both", 13, false, "rr\n"},
			{"both", 12, false, "err\n"},
			{"both", 100, false, ""},
			{"stdout", 100, false, ""},
			{"stdout", 0, true, "hello\nworld\n"}, // exited: drained, then the end
			{"stderr", 1, true, "rr\n"},
		} {
			rc, err := c.JobLogs(ctx, first.ID, tc.stream, tc.offset, tc.follow)
			if err != nil {
				t.Fatalf("%+v: %v", tc, err)
			}
			if got := string(readAll(t, rc)); got != tc.want {
				t.Errorf("%+v: got %q", tc, got)
			}
		}
		_, err := c.JobLogs(ctx, first.ID, "both", 0, true)
		wantAPIError(t, err, 400, "invalid", "single stream")
		_, err = c.JobLogs(ctx, first.ID, "stdin", 0, false)
		wantAPIError(t, err, 400, "invalid", "stream")
		_, err = c.JobLogs(ctx, "j00000000", "", 0, false)
		wantAPIError(t, err, 404, "not_found")
		resp, err := c.HTTPClient().Get("http://agentvm/v1/jobs/" + first.ID + "/logs?offset=-1")
		if err != nil || resp.StatusCode != 400 {
			t.Fatalf("offset=-1: %v %v", resp, err)
		}
		resp.Body.Close()
		// A symlink planted by the job's user is not followed.
		os.Remove(filepath.Join(dir, "stderr"))
		os.Symlink(filepath.Join(e.root, "etc/passwd"), filepath.Join(dir, "stderr"))
		rc, err := c.JobLogs(ctx, first.ID, "stderr", 0, false)
		if err == nil {
			b := readAll(t, rc)
			t.Fatalf("read through a symlink: %q", b)
		}
		wantAPIError(t, err, 500, "internal")
		os.Remove(filepath.Join(dir, "stderr"))
		fake.takeCalls()
	})

	t.Run("follow", func(t *testing.T) {
		ji, proc := startJob(t, guest.ExecRequest{Argv: []string{"true"}})
		out := filepath.Join(jobsRoot, ji.ID, "stdout")
		// Following before the file exists.
		rc, err := c.JobLogs(ctx, ji.ID, "stdout", 0, true)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		br := bufio.NewReader(rc)
		shows := len(fake.shows())
		for _, line := range []string{"one\n", "two\n"} {
			appendOrCreate(t, out, line)
			got, err := br.ReadString('\n')
			if err != nil || got != line {
				t.Fatalf("read %q, %v", got, err)
			}
		}
		time.Sleep(300 * time.Millisecond)
		// While the main process lives, systemd is rarely asked.
		if n := len(fake.shows()) - shows; n > 2 {
			t.Errorf("%d systemctl show calls while following a live job", n)
		}
		appendOrCreate(t, out, "three\n")
		finish(t, fake, proc, ji.ID)
		rest, err := io.ReadAll(br)
		if err != nil || string(rest) != "three\n" {
			t.Fatalf("rest %q, %v", rest, err)
		}
		// Resuming at an offset.
		rc2, err := c.JobLogs(ctx, ji.ID, "stdout", 4, true)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(readAll(t, rc2)); got != "two\nthree\n" {
			t.Fatalf("resumed %q", got)
		}

		// A client that goes away ends the follow.
		ji, _ = startJob(t, guest.ExecRequest{Argv: []string{"true"}})
		fctx, cancel := context.WithCancel(ctx)
		rc3, err := c.JobLogs(fctx, ji.ID, "stderr", 0, true)
		if err != nil {
			t.Fatal(err)
		}
		appendOrCreate(t, filepath.Join(jobsRoot, ji.ID, "stderr"), "x\n")
		b := make([]byte, 2)
		if _, err := io.ReadFull(rc3, b); err != nil || string(b) != "x\n" {
			t.Fatalf("read %q, %v", b, err)
		}
		cancel()
		rc3.Close()
		checkNoJobGoroutines(t)
		fake.takeCalls()
	})

	t.Run("wait", func(t *testing.T) {
		ji, proc := startJob(t, guest.ExecRequest{Argv: []string{"true"}})
		start := time.Now()
		w, err := c.WaitJob(ctx, ji.ID, 300*time.Millisecond)
		if err != nil || w.Exited || time.Since(start) < 300*time.Millisecond {
			t.Fatalf("wait timeout = %+v, %v after %v", w, err, time.Since(start))
		}
		go func() {
			time.Sleep(300 * time.Millisecond)
			finish(t, fake, proc, ji.ID, "ExecMainStatus", "7")
		}()
		w, err = c.WaitJob(ctx, ji.ID, 0)
		if err != nil || !w.Exited || w.ExitCode != 7 {
			t.Fatalf("wait = %+v, %v", w, err)
		}
		w, err = c.WaitJob(ctx, ji.ID, time.Second) // already exited
		if err != nil || !w.Exited {
			t.Fatalf("wait again = %+v, %v", w, err)
		}
		// A waiter that goes away.
		ji, _ = startJob(t, guest.ExecRequest{Argv: []string{"true"}})
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err = c.WaitJob(wctx, ji.ID, 0)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("wait with a deadline: %v", err)
		}
		checkNoJobGoroutines(t)
		_, err = c.WaitJob(ctx, "j00000000", 0)
		wantAPIError(t, err, 404, "not_found")
		resp, err := c.HTTPClient().Post("http://agentvm/v1/jobs/"+ji.ID+"/wait?timeout_ms=x", "", nil)
		if err != nil || resp.StatusCode != 400 {
			t.Fatalf("timeout_ms=x: %v %v", resp, err)
		}
		resp.Body.Close()
		fake.takeCalls()
	})

	var running *api.JobInfo
	t.Run("signal", func(t *testing.T) {
		running, _ = startJob(t, guest.ExecRequest{Argv: []string{"true"}})
		fake.takeCalls()
		if err := c.SignalJob(ctx, running.ID, "TERM"); err != nil {
			t.Fatal(err)
		}
		if err := c.SignalJob(ctx, running.ID, "9"); err != nil {
			t.Fatal(err)
		}
		if err := c.SignalJob(ctx, running.ID, "SIGRTMIN+1"); err == nil {
			t.Fatal("SIGRTMIN+1 accepted") // guest.ParseSignal takes names and numbers
		}
		if err := c.SignalJob(ctx, running.ID, "40"); err != nil {
			t.Fatal(err)
		}
		unit := jobUnit(running.ID)
		wantCalls(t, fake, "systemctl kill --signal=SIGTERM "+unit, "systemctl kill --signal=SIGKILL "+unit, "systemctl kill --signal=40 "+unit)
		wantAPIError(t, c.SignalJob(ctx, running.ID, "NOPE"), 400, "invalid")
		wantAPIError(t, c.SignalJob(ctx, "j00000000", "TERM"), 404, "not_found")
		// An exited job: nothing to do.
		if err := c.SignalJob(ctx, first.ID, "TERM"); err != nil {
			t.Fatal(err)
		}
		wantCalls(t, fake)
	})

	t.Run("list", func(t *testing.T) {
		fake.takeCalls()
		list, err := c.ListJobs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ents, _ := os.ReadDir(jobsRoot)
		if len(list) != len(ents) || len(list) < 5 || list[0].ID != first.ID || list[len(list)-1].ID != running.ID {
			t.Fatalf("list = %+v", list)
		}
		for i := 1; i < len(list); i++ {
			if list[i].StartedAt.Before(list[i-1].StartedAt) {
				t.Fatalf("not oldest first: %+v", list)
			}
		}
		s := fake.shows()
		if len(s) != 1 || strings.Contains(s[0], first.ID) || !strings.Contains(s[0], running.ID) {
			t.Fatalf("shows = %q", s)
		}
	})

	t.Run("delete", func(t *testing.T) {
		fake.takeCalls()
		unit := jobUnit(running.ID)
		if err := c.DeleteJob(ctx, running.ID); err != nil {
			t.Fatal(err)
		}
		wantCalls(t, fake, "systemctl kill --signal=SIGKILL "+unit, "systemctl stop "+unit, "systemctl reset-failed "+unit)
		if _, err := os.Stat(filepath.Join(jobsRoot, running.ID)); !os.IsNotExist(err) {
			t.Fatalf("job dir left: %v", err)
		}
		_, err := c.GetJob(ctx, running.ID)
		wantAPIError(t, err, 404, "not_found")
		wantAPIError(t, c.DeleteJob(ctx, running.ID), 404, "not_found")
		// A finished job is not killed.
		if err := c.DeleteJob(ctx, first.ID); err != nil {
			t.Fatal(err)
		}
		wantCalls(t, fake, "systemctl stop "+jobUnit(first.ID), "systemctl reset-failed "+jobUnit(first.ID))
	})

	t.Run("unit gone", func(t *testing.T) {
		ji, _ := startJob(t, guest.ExecRequest{Argv: []string{"true"}})
		fake.mu.Lock()
		delete(fake.units, jobUnit(ji.ID)) // as after a reboot
		fake.mu.Unlock()
		ji, err := c.GetJob(ctx, ji.ID)
		if err != nil || !ji.Exited || ji.ExitCode != -1 {
			t.Fatalf("job = %+v, %v", ji, err)
		}
		if err := c.DeleteJob(ctx, ji.ID); err != nil {
			t.Fatal(err)
		}
		fake.takeCalls()
	})

	t.Run("invalid", func(t *testing.T) {
		for _, tc := range []struct {
			req guest.ExecRequest
			msg string
		}{
			{guest.ExecRequest{Argv: []string{"cat"}, Stdin: true}, "stdin"},
			{guest.ExecRequest{}, "argv or shell is required"},
			{guest.ExecRequest{Argv: []string{"true"}, Shell: "true"}, "not both"},
			{guest.ExecRequest{Argv: []string{"true"}, User: "nosuchuser"}, "unknown user"},
			{guest.ExecRequest{Argv: []string{"no-such-command-xyz"}}, "command not found"},
			{guest.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A-B": "x"}}, "invalid env name"},
			{guest.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A": "x\x01"}}, "control character"},
			{guest.ExecRequest{Argv: []string{"true"}, Cwd: "/nonexistent-dir"}, "cwd"},
			{guest.ExecRequest{Argv: []string{"true"}, TimeoutMS: -1}, "timeout_ms"},
		} {
			_, err := c.StartJob(ctx, tc.req)
			wantAPIError(t, err, 400, "invalid", tc.msg)
		}
		// JSON carries only valid UTF-8 (Go's encoder replaces the rest);
		// the check is for the agent's own base environment.
		if err := checkJobSpec(&execSpec{argv: []string{"true", "bad\xff"}, dir: "/"}); err == nil || !strings.Contains(err.Error(), "UTF-8") {
			t.Fatalf("invalid UTF-8: %v", err)
		}
		if err := checkJobSpec(&execSpec{argv: []string{"true", "nul\x00"}, dir: "/"}); err == nil {
			t.Fatal("NUL accepted")
		}
		if err := checkJobSpec(&execSpec{argv: []string{"true"}, dir: "/", env: []string{"A=tab\tnew\nline"}}); err != nil {
			t.Fatalf("tab and newline refused: %v", err)
		}
		for _, id := range []string{"j0000000", "J00000000", "x", "j0000000g"} {
			_, err := c.GetJob(ctx, id)
			wantAPIError(t, err, 404, "not_found")
		}
		resp, err := c.HTTPClient().Get("http://agentvm/v1/jobs/..%2F..%2Fetc")
		if err != nil || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("traversal: %v %v", resp, err)
		}
		resp.Body.Close()
		// systemd-run failing leaves nothing behind.
		before, _ := os.ReadDir(jobsRoot)
		fake.mu.Lock()
		fake.fail["systemd-run"] = errors.New("systemd-run: Failed to start transient service unit: boom")
		fake.mu.Unlock()
		_, err = c.StartJob(ctx, guest.ExecRequest{Argv: []string{"true"}})
		fake.mu.Lock()
		delete(fake.fail, "systemd-run")
		fake.mu.Unlock()
		wantAPIError(t, err, 500, "systemd", "boom")
		after, _ := os.ReadDir(jobsRoot)
		if len(after) != len(before) {
			t.Fatalf("job dirs %d -> %d", len(before), len(after))
		}
		fake.takeCalls()
	})
}

func appendOrCreate(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// checkSystemdRunParses runs the real systemd-run with args where no
// systemd runs (it then parses its options and fails to reach the bus), to
// check the options against its parser. Where systemd runs it would start
// the job for real, so it is skipped.
func checkSystemdRunParses(t *testing.T, args []string) {
	t.Helper()
	if _, err := os.Stat("/run/systemd/system"); err == nil {
		t.Log("systemd is running here: systemd-run options not checked")
		return
	}
	if _, err := exec.LookPath("systemd-run"); err != nil {
		t.Log("no systemd-run: options not checked")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "systemd-run", args...).CombinedOutput()
	s := string(out)
	if err == nil || !strings.Contains(s, "Failed to connect to bus") {
		t.Fatalf("systemd-run %q: %v\n%s", args, err, s)
	}
	if strings.Contains(s, "option") || strings.Contains(s, "nvalid") {
		t.Fatalf("systemd-run refused its options:\n%s", s)
	}
	t.Logf("systemd-run parsed the options: %s", strings.TrimSpace(s))
}
