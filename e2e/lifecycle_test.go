package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

func TestStopStartKeepsDisk(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "persist"})
	if r := s.Exec(ctx, "persist", "echo kept-across-stop > /root/note && sync && cat /root/note"); r.Stdout != "kept-across-stop\n" {
		t.Fatalf("write: %+v", r)
	}
	out, errOut, code := s.CLI("", "stop", "persist")
	if code != 0 || !strings.Contains(out, "stopped") {
		t.Fatalf("stop: %d %q %q", code, out, errOut)
	}
	if len(testenv.QEMUProcesses(v.ID)) != 0 {
		t.Fatal("QEMU still running after stop")
	}
	// exec on a stopped VM is a clear 409
	_, err := s.Client.Exec(ctx, "persist", api.ExecRequest{Cmd: []string{"true"}})
	if !isStatus(err, 409) || !strings.Contains(err.Error(), "stopped") {
		t.Fatalf("exec on stopped VM: %v", err)
	}
	_, errOut, code = s.CLI("", "exec", "persist", "--", "true")
	if code == 0 || !strings.Contains(errOut, "start it first") {
		t.Fatalf("cli exec on stopped VM: %d %q", code, errOut)
	}
	// start cold-boots the VM from its own disk
	if out, errOut, code := s.CLI("", "start", "persist"); code != 0 || !strings.Contains(out, "running") {
		t.Fatalf("start: %d %q %q", code, out, errOut)
	}
	r := s.Exec(ctx, "persist", "cat /root/note; hostname; ip -4 -o addr show eth0")
	if !strings.HasPrefix(r.Stdout, "kept-across-stop\npersist\n") || !strings.Contains(r.Stdout, v.IP+"/24") {
		t.Fatalf("after start: %q", r.Stdout)
	}
}

func TestDaemonKill9Reattach(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "survivor"})
	r := s.Exec(ctx, "survivor", "nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.2; done' >/dev/null 2>&1 & echo $!")
	pid := strings.TrimSpace(r.Stdout)
	if pid == "" {
		t.Fatalf("no pid: %+v", r)
	}
	time.Sleep(time.Second)
	var n0 int
	fmtSscan(s.Exec(ctx, "survivor", "cat /tmp/counter").Stdout, &n0)
	s.Kill9()
	qemuPids := testenv.QEMUProcesses(v.ID)
	if len(qemuPids) != 1 || qemuPids[0] != v.PID {
		t.Fatalf("QEMU did not outlive the daemon: %v (want %d)", qemuPids, v.PID)
	}
	time.Sleep(2 * time.Second) // the VM keeps running with no daemon
	s.Restart()
	got, err := s.Client.GetVM(ctx, "survivor")
	if err != nil || got.State != "running" || got.PID != v.PID {
		t.Fatalf("after restart: %v %+v", err, got)
	}
	c1 := s.Exec(ctx, "survivor", "kill -0 "+pid+" && cat /tmp/counter").Stdout
	var n1, n2 int
	fmtSscan(c1, &n1)
	if n1 <= n0 {
		t.Fatalf("background counter not alive across the daemon restart: %d before the kill, %d after", n0, n1)
	}
	waitUntil(t, "the background counter to run on after the daemon restart", time.Minute, func() (bool, string) {
		fmtSscan(s.Exec(ctx, "survivor", "cat /tmp/counter").Stdout, &n2)
		return n2 > n1, fmt.Sprintf("%d before the kill, then %d and %d", n0, n1, n2)
	})
	// the network came back with the daemon
	if r := s.Exec(ctx, "survivor", "getent hosts deb.debian.org"); r.ExitCode != 0 {
		t.Fatalf("DNS after reattach: %+v", r)
	}
	// a second server on the same data dir is refused clearly
	out, errOut, code := s.CLI("", "serve", "--data-dir", s.DataDir, "--listen", "127.0.0.1:0", "--no-warm")
	if code == 0 || !strings.Contains(out+errOut, "already using data dir") {
		t.Fatalf("second server: code %d %q %q", code, out, errOut)
	}
}

func TestGuestPoweroffAndQEMUCrash(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s.CreateVM(ctx, api.CreateVMRequest{Name: "off"})
	crash := s.CreateVM(ctx, api.CreateVMRequest{Name: "crash"})

	// A power-off from inside the guest is a clean stop.
	s.Client.Exec(ctx, "off", api.ExecRequest{Shell: "systemctl poweroff --no-block"})
	waitState(t, s, "off", "stopped", 2*time.Minute)

	// QEMU dying under the VM is a crash, reported with the reason.
	if err := syscall.Kill(crash.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	v := waitState(t, s, "crash", "crashed", time.Minute)
	if !strings.Contains(v.Error, "QEMU exited unexpectedly") {
		t.Fatalf("crash reason: %q", v.Error)
	}
	out, _, _ := s.CLI("", "logs", "crash")
	if !strings.Contains(out, "QEMU exited: crashed (QEMU signal: killed)") {
		t.Fatalf("log does not record the crash:\n%s", out)
	}
	// Both can be deleted; a crashed VM can also be started again from its disk.
	if err := s.Client.DeleteVM(ctx, "off"); err != nil {
		t.Fatal(err)
	}
}

func waitState(t *testing.T, s *testenv.Server, vm string, state api.State, timeout time.Duration) *api.VM {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v, err := s.Client.GetVM(context.Background(), vm)
		if err == nil && v.State == state {
			return v
		}
		// States nothing leaves on its own end the wait at once.
		if err == nil && v.State == api.StateError && state != api.StateError {
			t.Fatalf("%s is in state error, waiting for %s: %s", vm, state, v.Error)
		}
		if isStatus(err, http.StatusNotFound) {
			t.Fatalf("%s is gone, waiting for %s", vm, state)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not become %s: %+v %v", vm, state, v, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// The first create of a shape cold-boots its template once and saves it; every other
// test reuses cached templates, so this one starts from an empty template dir.
func TestTemplateColdBoot(t *testing.T) {
	t.Parallel()
	tpl := t.TempDir()
	s := testenv.Start(t, "", "--template-dir", tpl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "cold"})
	if r := s.Exec(ctx, "cold", "systemctl is-system-running; hostname"); !strings.HasSuffix(r.Stdout, "cold\n") {
		t.Fatalf("VM from a fresh template: %+v", r)
	}
	b, err := os.ReadFile(filepath.Join(tpl, v.Template, "template.json"))
	if err != nil || !strings.Contains(string(b), `"cold_boot_ms"`) {
		t.Fatalf("template not saved: %v %s", err, b)
	}
	for _, f := range []string{"ram", "state", "disk.qcow2"} {
		st, err := os.Stat(filepath.Join(tpl, v.Template, f))
		if err != nil || st.Mode().Perm()&0o222 != 0 {
			t.Fatalf("template file %s: %v %v (must exist, read-only)", f, err, st)
		}
	}
	// a second create restores the saved template instead of booting
	// (the daemon's log says where a VM came from; a time ratio would
	// depend on the machine's load)
	booted := strings.Count(s.Logs(), `msg="template booted"`)
	if booted != 1 {
		t.Fatalf("the first create logged %d template boots, want 1", booted)
	}
	w := s.CreateVM(ctx, api.CreateVMRequest{Name: "warm"})
	if w.Template != v.Template || strings.Count(s.Logs(), `msg="template booted"`) != booted {
		t.Errorf("the second create (%d ms, the cold one %d ms) booted a template instead of restoring %s (it has %s)", w.CreateMs, v.CreateMs, v.Template, w.Template)
	}
}
