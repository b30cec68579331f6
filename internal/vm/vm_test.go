package vm

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

func TestValidate(t *testing.T) {
	o := CreateOptions{}
	if err := o.Validate(); err != nil || o.CPUs != 1 || o.MemoryMiB != 1024 || o.DiskBytes != 8<<30 {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	bad := []CreateOptions{
		{Name: "Upper"}, {Name: "-x"}, {Name: "vm-0123456789ab"}, {Name: "a_b"}, {Name: string(make([]byte, 70))},
		{CPUs: 65}, {CPUs: -1}, {MemoryMiB: 64},
		{Labels: map[string]string{"": "x"}}, {Env: map[string]string{"A-B": "x"}},
		{IdempotencyKey: "k\x00"}, {IdempotencyKey: "k\xff"},
	}
	for _, b := range bad {
		if err := b.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", b, err)
		}
	}
	for _, n := range []string{"a", "box-1", "x0"} {
		if err := ValidateName(n); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

func TestTransitions(t *testing.T) {
	for _, c := range []struct {
		op    string
		state api.State
		ok    bool
	}{
		{"exec", "running", true}, {"exec", "stopped", false}, {"exec", "creating", false},
		{"start", "stopped", true}, {"start", "crashed", true}, {"start", "running", false},
		{"stop", "running", true}, {"stop", "crashed", false},
		{"delete", "crashed", true}, {"delete", "creating", false},
	} {
		err := checkTransition(c.op, &store.VM{Name: "v", State: c.state})
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrConflict)) {
			t.Errorf("%s from %s: %v", c.op, c.state, err)
		}
	}
}

// The table is consistent: an operation's no-op states are not states it
// starts from, its target is a real state, every state a VM can be in
// is either reachable or explicitly not, and every operation can start.
func TestStateTable(t *testing.T) {
	known := map[api.State]bool{statePool: true}
	for _, st := range api.States {
		known[st] = true
	}
	for op, r := range table {
		if len(r.from) == 0 {
			t.Errorf("%s starts from no state", op)
		}
		for _, st := range append(append([]api.State{}, r.from...), r.noop...) {
			if !known[st] {
				t.Errorf("%s names unknown state %q", op, st)
			}
		}
		for _, st := range r.noop {
			if slices.Contains(r.from, st) {
				t.Errorf("%s: %s is both a start state and a no-op", op, st)
			}
		}
		for _, st := range []api.State{r.to, r.during} {
			if st != "" && !known[st] {
				t.Errorf("%s leads to unknown state %q", op, st)
			}
		}
	}
	for st, want := range map[api.State]bool{api.StateRunning: true, api.StatePaused: true, api.StateSuspended: true,
		api.StateStopped: false, api.StateCrashed: false, api.StateError: false, api.StateCreating: false, api.StateDeleting: false} {
		if Reachable(st) != want {
			t.Errorf("Reachable(%s) = %v", st, !want)
		}
	}
}

func TestValidateSnapshotName(t *testing.T) {
	for _, ok := range []string{"base-1", "snap-test_ei9go2xj", "Team.v2", "a"} {
		if err := ValidateSnapshotName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-x", "_x", "a/b", "a b", "snap-0123456789ab", strings.Repeat("x", 129)} {
		if err := ValidateSnapshotName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
