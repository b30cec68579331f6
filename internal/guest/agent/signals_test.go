package agent

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestIgnoredSignalsNotInherited runs this test binary under nohup (SIGHUP
// ignored from the start) and checks that a process the agent's code starts
// has SIGHUP at its default disposition.
func TestIgnoredSignalsNotInherited(t *testing.T) {
	if os.Getenv("AGENTVM_TEST_NOHUP_CHILD") == "1" {
		uninheritIgnoredSignals()
		out, err := exec.Command("sh", "-c", "grep SigIgn /proc/self/status").Output()
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(out))
		mask, err := strconv.ParseUint(f[len(f)-1], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		if mask&(1<<(1-1)) != 0 { // SIGHUP is signal 1, bit 0
			t.Fatalf("child ignores SIGHUP: SigIgn %s", f[len(f)-1])
		}
		return
	}
	nohup, err := exec.LookPath("nohup")
	if err != nil {
		t.Skip("needs nohup (coreutils)")
	}
	cmd := exec.Command(nohup, os.Args[0], "-test.run=^TestIgnoredSignalsNotInherited$", "-test.v")
	cmd.Env = append(os.Environ(), "AGENTVM_TEST_NOHUP_CHILD=1")
	cmd.Dir = t.TempDir() // nohup may write nohup.out here
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}
