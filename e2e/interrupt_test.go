package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/internal/server"
)

// TestDaemonInterruptedLifecycle stops the daemon (SIGTERM and kill -9) in
// the middle of lifecycle operations, at several points of each, and checks
// after every restart that the VM answers with its files and that exactly
// the QEMU processes the records name are running.
func TestDaemonInterruptedLifecycle(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "r1"})
	if r := s.Exec(ctx, "r1", "echo kept > /root/mark && sync"); r.ExitCode != 0 {
		t.Fatalf("write mark: %+v", r)
	}
	check := func(stage string) {
		t.Helper()
		r, err := s.Client.Exec(ctx, "r1", api.ExecRequest{Shell: "cat /root/mark"})
		if err != nil || r.ExitCode != 0 || strings.TrimSpace(r.Stdout) != "kept" {
			t.Fatalf("%s: exec: %v %+v\n%s", stage, err, r, tailLog(s))
		}
		vms, err := s.Client.ListVMs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		owned := map[int]string{}
		for _, vm := range vms {
			if vm.PID > 0 {
				owned[vm.PID] = vm.Name
			}
			if vm.ID == v.ID && (vm.State != "running" || vm.PID == 0) {
				t.Fatalf("%s: r1 is %s (pid %d)", stage, vm.State, vm.PID)
			}
		}
		for _, vm := range vms {
			pids := testenv.QEMUProcesses(vm.ID)
			if vm.PID > 0 && (len(pids) != 1 || pids[0] != vm.PID) || vm.PID == 0 && len(pids) != 0 {
				t.Fatalf("%s: %s (%s, pid %d) has QEMU processes %v", stage, vm.Name, vm.State, vm.PID, pids)
			}
		}
		// Children of interrupted forks that made it are removed, so each
		// round starts with r1 alone.
		for _, vm := range vms {
			if vm.ID != v.ID {
				if err := s.Client.DeleteVM(ctx, vm.ID); err != nil {
					t.Fatalf("%s: delete %s: %v", stage, vm.Name, err)
				}
			}
		}
	}

	// A save that QEMU carries on after the daemon died completes later and
	// stops the guest: the restarted daemon must end it. The test plays the
	// dead daemon's part over QMP: a live save into a pipe that drains only
	// once the daemon is back (the gate), so it is still running then.
	s.Kill9()
	dir := t.TempDir()
	gate, done := filepath.Join(dir, "gate"), filepath.Join(dir, "save-over")
	qmp(t, filepath.Join(server.RunDir(s.DataDir), v.ID, "qmp.sock"),
		`{"execute":"migrate","arguments":{"uri":"exec:until [ -e `+gate+` ]; do sleep 0.1; done; cat >/dev/null; touch `+done+`"}}`)
	s.Restart()
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(done); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the save QEMU carried on never ended")
		}
	}
	check("a save still running inside QEMU when the daemon restarts")

	// SIGTERM suspends r1 for the shutdown; the next daemon wakes it; a
	// SIGTERM at several points of that wake, then a third daemon.
	for _, d := range []time.Duration{0, 200 * time.Millisecond, 700 * time.Millisecond, 2 * time.Second} {
		s.Terminate()
		s.Restart()
		time.Sleep(d)
		s.Terminate()
		s.Restart()
		check(fmt.Sprintf("SIGTERM %v into the wake after a restart", d))
	}

	// kill -9 of the daemon at several points of each operation.
	ops := []struct {
		name string
		run  func(context.Context) error
	}{
		{"suspend", func(c context.Context) error { _, err := s.Client.SuspendVM(c, "r1"); return err }},
		{"snapshot", func(c context.Context) error { _, err := s.Client.Snapshot(c, "r1", ""); return err }},
		{"fork", func(c context.Context) error { _, err := s.Client.Fork(c, "r1", 1); return err }},
	}
	for _, op := range ops {
		for _, d := range []time.Duration{50 * time.Millisecond, 400 * time.Millisecond, 1500 * time.Millisecond} {
			done := make(chan struct{})
			go func() {
				defer close(done)
				op.run(ctx) // cut off by the kill, or done before it
			}()
			time.Sleep(d)
			s.Kill9()
			<-done
			s.Restart()
			check(fmt.Sprintf("kill -9 %v into %s", d, op.name))
		}
	}
	// A kill -9 during the wake of a suspended VM.
	for _, d := range []time.Duration{100 * time.Millisecond, 800 * time.Millisecond} {
		if _, err := s.Client.SuspendVM(ctx, "r1"); err != nil {
			t.Fatal(err)
		}
		go s.Client.WakeVM(ctx, "r1")
		time.Sleep(d)
		s.Kill9()
		s.Restart()
		check(fmt.Sprintf("kill -9 %v into a wake", d))
	}
}

func tailLog(s *testenv.Server) string { return testenv.Tail(s.Logs(), 4000) }

// qmp runs one command on a QEMU's QMP socket (the daemon must be down: the
// socket takes one client) and fails the test unless QEMU accepts it.
func qmp(t *testing.T, sock, cmd string) {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	r := bufio.NewReader(c)
	reply := func() map[string]json.RawMessage {
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				t.Fatalf("qmp %s: %v", cmd, err)
			}
			var m map[string]json.RawMessage
			json.Unmarshal(line, &m)
			if m["event"] == nil {
				return m
			}
		}
	}
	reply() // greeting
	for _, l := range []string{`{"execute":"qmp_capabilities"}`, cmd} {
		fmt.Fprintln(c, l)
		if m := reply(); m["return"] == nil {
			t.Fatalf("qmp %s: %s", l, m["error"])
		}
	}
}
