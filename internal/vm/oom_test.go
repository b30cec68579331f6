package vm

import (
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
