package vm

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/internal/store"
)

func TestOOMOrder(t *testing.T) {
	if !(oomScore(statePool) == 1000 && oomScore(store.StateRunning) > 0 && oomScore(store.StateRunning) < 1000) {
		t.Fatalf("OOM order: pool %d, VM %d", oomScore(statePool), oomScore(store.StateRunning))
	}
	for _, st := range []store.State{store.StateCreating, store.StateRunning, store.StateStopped} {
		if oomScore(st) != oomScoreVM {
			t.Fatalf("a VM %s scores %d", st, oomScore(st))
		}
	}
}

func TestSetOOMScoreOfAProcess(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep:", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if err := setOOMScore(cmd.Process.Pid, oomScorePool); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/oom_score_adj")
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(oomScorePool) {
		t.Fatalf("oom_score_adj %q %v", b, err)
	}
	if err := setOOMScore(1<<30, 0); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}
