package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
)

var qemuVersionRe = regexp.MustCompile(`version (\d+)\.(\d+)\.(\d+)`)

// qemuVersion runs bin --version: "7.2.22", or "" when it cannot tell.
func qemuVersion(bin string) (version string, parts [3]int) {
	out, err := exec.Command(bin, "--version").Output()
	m := qemuVersionRe.FindStringSubmatch(string(out))
	if err != nil || m == nil {
		return "", parts
	}
	fmt.Sscan(m[1], &parts[0])
	fmt.Sscan(m[2], &parts[1])
	fmt.Sscan(m[3], &parts[2])
	return m[1] + "." + m[2] + "." + m[3], parts
}

// vmQEMUVersion is the version of the QEMU process a VM runs in.
func vmQEMUVersion(t *testing.T, s *testenv.Server, ctx context.Context, vm string) string {
	t.Helper()
	v, err := s.Client.GetVM(ctx, vm)
	if err != nil || v.PID == 0 {
		t.Fatalf("%s: %v (pid %d)", vm, err, v.PID)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", v.PID))
	if err != nil {
		t.Fatal(err)
	}
	ver, _ := qemuVersion(exe)
	return ver
}

// A saved state crosses QEMU versions forward only: a VM suspended and a
// snapshot taken under the older QEMU come back under the newer one with
// their processes and memory; the newer QEMU's states get a clear 409
// (state_incompatible, naming both versions) from the older one, and the
// VM stays suspended with its state. It needs two QEMUs: the PATH's
// qemu-system-x86_64 and AGENTVM_QEMU (scripts/test.sh points it at QEMU 10
// unpacked by scripts/qemu-backports.sh --dir).
func TestStateAcrossQEMUVersions(t *testing.T) {
	t.Parallel()
	testenv.Require(t)
	a, b := "qemu-system-x86_64", os.Getenv("AGENTVM_QEMU")
	va, pa := qemuVersion(a)
	vb, pb := qemuVersion(b)
	if b == "" || va == "" || vb == "" || va == vb {
		t.Skipf("needs two QEMU versions: the PATH's qemu-system-x86_64 (%q) and another in AGENTVM_QEMU (%q, %q)", va, b, vb)
	}
	older, newer, vOld, vNew := a, b, va, vb
	if pb[0] < pa[0] || pb[0] == pa[0] && (pb[1] < pa[1] || pb[1] == pa[1] && pb[2] < pa[2]) {
		older, newer, vOld, vNew = b, a, vb, va
	}
	t.Logf("older QEMU %s (%s), newer QEMU %s (%s)", vOld, older, vNew, newer)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	s := testenv.Start(t, "", "--qemu", older)
	restartWith := func(bin string) {
		s.Terminate()
		s.Args = []string{"--qemu", bin}
		s.Restart()
	}

	// Under the older QEMU: a process and a file in memory only (tmpfs).
	s.CreateVM(ctx, api.CreateVMRequest{Name: "box"})
	if got := vmQEMUVersion(t, s, ctx, "box"); got != vOld {
		t.Fatalf("box runs QEMU %s, want %s", got, vOld)
	}
	r := s.Exec(ctx, "box", "nohup sleep 100000 >/dev/null 2>&1 & echo $! > /dev/shm/pid; echo from-"+vOld+" > /dev/shm/mark; echo ok")
	if r.Stdout != "ok\n" {
		t.Fatalf("seed: %+v", r)
	}
	alive := func(vm, mark string) {
		t.Helper()
		r := s.Exec(ctx, vm, `kill -0 "$(cat /dev/shm/pid)" && cat /dev/shm/mark`)
		if r.ExitCode != 0 || r.Stdout != mark+"\n" {
			t.Fatalf("%s lost its memory state: %+v", vm, r)
		}
	}
	if _, err := s.Client.Snapshot(ctx, "box", "old-snap"); err != nil {
		t.Fatal(err)
	}
	suspended := func(vm string) {
		t.Helper()
		v, err := s.Client.SuspendVM(ctx, vm)
		if err != nil || v.State != api.StateSuspended {
			t.Fatalf("suspend %s: %v", vm, err)
		}
		if v, err = s.Client.GetVM(ctx, vm); err != nil || v.StateBytes <= 0 {
			t.Fatalf("suspended %s reports no state on disk: %+v %v", vm, v, err)
		}
	}
	suspended("box")

	// Under the newer QEMU, both come back where they were.
	restartWith(newer)
	alive("box", "from-"+vOld) // the exec wakes it
	if got := vmQEMUVersion(t, s, ctx, "box"); got != vNew {
		t.Fatalf("woken box runs QEMU %s, want %s", got, vNew)
	}
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "copy", From: "old-snap"}); err != nil {
		t.Fatalf("create from a QEMU %s snapshot under QEMU %s: %v", vOld, vNew, err)
	}
	alive("copy", "from-"+vOld)
	if err := s.Client.DeleteVM(ctx, "copy"); err != nil {
		t.Fatal(err)
	}

	// The newer QEMU's states do not go back to the older one.
	s.Exec(ctx, "box", "echo from-"+vNew+" > /dev/shm/mark")
	if _, err := s.Client.Snapshot(ctx, "box", "new-snap"); err != nil {
		t.Fatal(err)
	}
	suspended("box")
	restartWith(older)
	refused := func(what string, err error) {
		t.Helper()
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusConflict || ae.Code != api.CodeStateIncompatible ||
			!strings.Contains(ae.Message, vOld) || !strings.Contains(ae.Message, vNew) {
			t.Fatalf("%s of a QEMU %s state under QEMU %s: %v, want a 409 state_incompatible naming both versions", what, vNew, vOld, err)
		}
		t.Logf("%s: %v", what, err)
	}
	_, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "back", From: "new-snap"})
	refused("create --from", err)
	_, err = s.Client.WakeVM(ctx, "box")
	refused("wake", err)
	v, err := s.Client.GetVM(ctx, "box")
	if err != nil || v.State != api.StateSuspended || v.StateBytes <= 0 || !strings.Contains(v.Error, vNew) {
		t.Fatalf("box after the refused wake: %+v %v", v, err)
	}
	// The CLI says the same, and the snapshot taken under the older QEMU still restores.
	if _, errOut, code := s.CLI("", "exec", "box", "--", "true"); code == 0 || !strings.Contains(errOut, vNew) {
		t.Fatalf("exec on a state of a newer QEMU: exit %d, %q", code, errOut)
	}
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "again", From: "old-snap"}); err != nil {
		t.Fatal(err)
	}
	alive("again", "from-"+vOld)
	if st := serverAlive(s); st != "" {
		t.Fatal(st)
	}
}

// serverAlive is "" when the server still answers its health check.
func serverAlive(s *testenv.Server) string {
	resp, err := http.Get(s.URL + "/v1/health")
	if err != nil {
		return "server gone: " + err.Error()
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Sprintf("health: %d", resp.StatusCode)
	}
	return ""
}
