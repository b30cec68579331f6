package vm

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

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
		state store.State
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
	known := map[store.State]bool{statePool: true}
	for _, st := range store.States {
		known[st] = true
	}
	for op, r := range table {
		if len(r.from) == 0 {
			t.Errorf("%s starts from no state", op)
		}
		for _, st := range append(append([]store.State{}, r.from...), r.noop...) {
			if !known[st] {
				t.Errorf("%s names unknown state %q", op, st)
			}
		}
		for _, st := range r.noop {
			if slices.Contains(r.from, st) {
				t.Errorf("%s: %s is both a start state and a no-op", op, st)
			}
		}
		for _, st := range []store.State{r.to, r.during} {
			if st != "" && !known[st] {
				t.Errorf("%s leads to unknown state %q", op, st)
			}
		}
	}
	for st, want := range map[store.State]bool{store.StateRunning: true, store.StatePaused: true, store.StateSuspended: true,
		store.StateStopped: false, store.StateCrashed: false, store.StateError: false, store.StateCreating: false, store.StateDeleting: false} {
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

// The moves the state machine allows: the table's (start state to during
// state and target) and the internal ones, nothing else.
func TestStateMoves(t *testing.T) {
	for _, c := range []struct {
		from, to store.State
		ok       bool
	}{
		{store.StateStopped, store.StateRunning, true},    // start
		{store.StateCrashed, store.StateRunning, true},    // start
		{store.StateRunning, store.StatePaused, true},     // pause
		{store.StateSuspended, store.StateRunning, true},  // wake
		{store.StatePaused, store.StateSuspended, true},   // suspend
		{store.StateCrashed, store.StateDeleting, true},   // delete's during state
		{store.StateCreating, store.StateRunning, true},   // a create is done
		{statePool, store.StateCreating, true},            // a claim
		{store.StateRunning, store.StateCrashed, true},    // an unasked exit
		{store.StateSuspended, store.StateStopped, true},  // a lost memory state
		{store.StateStopped, store.StatePaused, false},    // nothing pauses a stopped VM
		{store.StateDeleting, store.StateRunning, false},  // a delete is final
		{store.StateCrashed, store.StateSuspended, false}, // a crashed VM has no memory to save
		{store.StateStopped, store.StateSuspended, false},
		{store.StateCreating, store.StatePaused, false},
		{store.StateSuspended, store.StateCrashed, false},
	} {
		if got := allowed(c.from, c.to); got != c.ok {
			t.Errorf("%s -> %s: allowed %v, want %v", c.from, c.to, got, c.ok)
		}
	}
	// A revive's moves are its own, not allowed to any other path.
	if checkTakeover(opRevive, store.StateSuspended, store.StateCrashed) != nil ||
		checkTakeover(opGiveBack, store.StateCrashed, store.StateSuspended) != nil {
		t.Error("a revive's moves are refused")
	}
	if checkTakeover(opRevive, store.StateStopped, store.StateCrashed) == nil || checkTakeover(opRevive, store.StateCreating, store.StateCrashed) == nil ||
		checkTakeover(opGiveBack, store.StateCrashed, store.StateDeleting) == nil || checkTakeover("move", store.StateRunning, store.StateCrashed) == nil {
		t.Error("a takeover move outside the table is allowed")
	}
	known := map[store.State]bool{statePool: true}
	for _, st := range store.States {
		known[st] = true
	}
	for _, m := range internal {
		if !known[m.to] || m.why == "" {
			t.Errorf("internal move to %q: unknown state or no reason", m.to)
		}
		for _, st := range m.from {
			if !known[st] {
				t.Errorf("internal move from unknown state %q", st)
			}
		}
	}
}

// enter refuses a move the state machine does not know, and records
// nothing; a known move is recorded.
func TestEnterRecordsOnlyKnownMoves(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "agentvm.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := &Service{store: st, log: slog.New(slog.DiscardHandler)}
	ctx := context.Background()
	v := &store.VM{ID: "vm-000000000001", Name: "box", State: store.StateDeleting, CPUs: 1, MemoryMiB: 512}
	if err := st.CreateVM(ctx, v); err != nil {
		t.Fatal(err)
	}
	h := s.hold(v, func() {})
	if err := h.enter(ctx, store.StateRunning); err == nil || v.State != store.StateDeleting {
		t.Fatalf("deleting -> running: %v, state %s", err, v.State)
	}
	if got, _ := st.GetVM(ctx, v.ID); got.State != store.StateDeleting {
		t.Fatalf("recorded %s", got.State)
	}
	v.State = store.StateRunning // as if the row were running
	if err := h.enter(ctx, store.StateCrashed); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.GetVM(ctx, v.ID); got.State != store.StateCrashed {
		t.Fatalf("recorded %s, want crashed", got.State)
	}
}
