package agent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
)

func TestReadProcFake(t *testing.T) {
	root := t.TempDir()
	old := procRoot
	procRoot = root
	defer func() { procRoot = old }()
	write := func(p, s string) {
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		os.WriteFile(filepath.Join(root, p), []byte(s), 0o644)
	}
	write("stat", "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n")
	write("uptime", "30.00 50.00\n")
	// comm with a space and parentheses; started 10 s after boot, 2 s of
	// CPU in its 20 s of life.
	write("123/stat", "123 (a) (b) S 7 123 123 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 1 0 1000 12345 678 18446744073709551615\n")
	write("123/cmdline", "")
	write("123/statm", "100 25 10 1 0 50 0\n")
	write("123/status", "Name:\ta) (b\nState:\tS (sleeping)\nUid:\t4242\t4242\t4242\t4242\nGid:\t4242\n")
	write("124/stat", "124 (sh) R 123 124 124 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 2500 1 1\n")
	write("124/cmdline", "/bin/sh\x00-c\x00echo hi\x00")
	write("124/status", "Uid:\t99999\t0\t0\t0\n")
	write("125/stat", "garbage")
	names := map[uint32]string{4242: "agvtest"}
	uidName := func(uid uint32) string {
		if n, ok := names[uid]; ok {
			return n
		}
		return "uid"
	}
	s := readProcSample()
	p, ok := readProc(123, &s, uidName)
	if !ok {
		t.Fatal("123 not read")
	}
	want := api.ProcessInfo{PID: 123, PPID: 7, User: "agvtest", State: "S", Command: "[a) (b]", CPUPercent: 10,
		RSSBytes: 25 * int64(os.Getpagesize()), StartedAt: time.Unix(1700000010, 0).UTC()}
	if !p.StartedAt.Equal(want.StartedAt) {
		t.Fatalf("started at %v, want %v", p.StartedAt, want.StartedAt)
	}
	p.StartedAt = want.StartedAt
	if p != want {
		t.Fatalf("got  %+v\nwant %+v", p, want)
	}
	p, ok = readProc(124, &s, uidName)
	if !ok || p.Command != "/bin/sh -c echo hi" || p.State != "R" || p.PPID != 123 || p.User != "uid" || p.CPUPercent != 0 || p.RSSBytes != 0 ||
		!p.StartedAt.Equal(time.Unix(1700000025, 0)) {
		t.Fatalf("124 = %+v", p)
	}
	if _, ok := readProc(125, &s, uidName); ok {
		t.Fatal("garbage stat accepted")
	}
	if _, ok := readProc(126, &s, uidName); ok {
		t.Fatal("missing process read")
	}
}

func findProc(ps []api.ProcessInfo, pid int) *api.ProcessInfo {
	for i := range ps {
		if ps[i].PID == pid {
			return &ps[i]
		}
	}
	return nil
}

func TestProcesses(t *testing.T) {
	e, _, home := startSvcAgent(t)
	ctx := context.Background()
	c := e.c
	cmd := exec.Command("sleep", "61")
	cmd.Dir = home
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: testUID, Gid: testUID}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid

	ps, err := c.ListProcesses(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !sort.SliceIsSorted(ps, func(i, j int) bool { return ps[i].PID < ps[j].PID }) {
		t.Fatal("not sorted by pid")
	}
	self := findProc(ps, os.Getpid())
	if self == nil {
		t.Fatalf("own pid %d not listed", os.Getpid())
	}
	exe := filepath.Base(os.Args[0])
	if self.User != "root" || self.PPID != os.Getppid() || !strings.Contains(self.Command, exe) || self.RSSBytes < 1<<20 ||
		self.State == "" || self.CPUPercent < 0 || self.StartedAt.After(time.Now()) || self.StartedAt.Before(time.Now().Add(-time.Hour)) {
		t.Fatalf("self = %+v", self)
	}
	// A busy machine may list the fresh child before it has gone to sleep
	// (state R, or still the forked test binary before exec): list again.
	var child *api.ProcessInfo
	waitFor(t, "the child asleep", func() bool {
		ps, err := c.ListProcesses(ctx)
		if err != nil {
			t.Fatal(err)
		}
		child = findProc(ps, pid)
		return child != nil && child.Command == "sleep 61" && child.State == "S"
	})
	if child.User != testUser || child.PPID != os.Getpid() {
		t.Fatalf("child = %+v", child)
	}

	if err := c.SignalProcess(ctx, pid, "TERM"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
			t.Fatalf("sleep ended with %v", err)
		}
	case <-time.After(testWait):
		t.Fatal("sleep did not die")
	}
	wantAPIError(t, c.SignalProcess(ctx, pid, "TERM"), 404, "not_found")
	wantAPIError(t, c.SignalProcess(ctx, 999999999, "TERM"), 404, "not_found")
	wantAPIError(t, c.SignalProcess(ctx, 1, "TERM"), 400, "invalid", "pid 1")
	wantAPIError(t, c.SignalProcess(ctx, os.Getpid(), "KILL"), 400, "invalid", "agent")
	wantAPIError(t, c.SignalProcess(ctx, 0, "TERM"), 400, "invalid")
	wantAPIError(t, c.SignalProcess(ctx, -1, "KILL"), 400, "invalid")
	wantAPIError(t, c.SignalProcess(ctx, os.Getppid(), "NOPE"), 400, "invalid", "unknown signal")
	resp, err := c.HTTPClient().Post("http://agentvm/v1/processes/abc/signal", "application/json", strings.NewReader(`{"signal":"TERM"}`))
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("pid abc: %v %v", resp, err)
	}
	resp.Body.Close()
}
