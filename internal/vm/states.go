package vm

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

// statePool marks a warm-pool VM: a running VM no caller has yet (hidden
// from Get and List).
const statePool = store.StatePool

// Operations of the state table.
const (
	opStart    = "start"
	opStop     = "stop"
	opExec     = "exec"
	opPause    = "pause"
	opResume   = "resume"
	opSuspend  = "suspend"
	opWake     = "wake"
	opSnapshot = "snapshot"
	opFork     = "fork"
	opResize   = "resize"
	opDelete   = "delete"
	opDiff     = "diff"
)

// rule is one operation's row of the state table.
type rule struct {
	from   []store.State // the states it may start from
	noop   []store.State // the states in which it is already done: it succeeds and changes nothing
	during store.State   // the state recorded while it runs ("": the state it started from)
	to     store.State   // the state it leaves the VM in ("": the state it started from)
}

// table is the VM state machine: every user-facing operation's row. The
// operations read their start, no-op and target states from it; the proxy
// reads it through Reachable.
// Internal transitions: create records creating, then running (pool for a
// warm-pool VM); an exit nobody asked for records crashed, or stopped after
// a clean guest shutdown; a restart of the daemon finishes or rolls back
// what it finds (Reconcile).
var table = map[string]rule{
	opStart:    {from: []store.State{store.StateStopped, store.StateCrashed}, noop: []store.State{store.StateRunning}, to: store.StateRunning},
	opStop:     {from: []store.State{store.StateRunning, store.StatePaused, store.StateSuspended}, noop: []store.State{store.StateStopped}, to: store.StateStopped},
	opExec:     {from: []store.State{store.StateRunning}},
	opPause:    {from: []store.State{store.StateRunning}, noop: []store.State{store.StatePaused}, to: store.StatePaused},
	opResume:   {from: []store.State{store.StatePaused}, noop: []store.State{store.StateRunning}, to: store.StateRunning},
	opSuspend:  {from: []store.State{store.StateRunning, store.StatePaused}, noop: []store.State{store.StateSuspended}, to: store.StateSuspended},
	opWake:     {from: []store.State{store.StatePaused, store.StateSuspended}, noop: []store.State{store.StateRunning}, to: store.StateRunning},
	opSnapshot: {from: []store.State{store.StateRunning, store.StatePaused}},
	opFork:     {from: []store.State{store.StateRunning, store.StatePaused}},
	opResize:   {from: []store.State{store.StateRunning, store.StatePaused, store.StateStopped, store.StateCrashed}},
	opDiff:     {from: []store.State{store.StateRunning, store.StatePaused, store.StateStopped, store.StateCrashed, store.StateSuspended}},
	opDelete:   {from: []store.State{store.StateRunning, store.StatePaused, store.StateStopped, store.StateCrashed, store.StateError, store.StateSuspended}, during: store.StateDeleting},
}

// checkTransition answers whether op may start from v's state, with a 409
// that says why not and what to do.
func checkTransition(op string, v *store.VM) error {
	r, ok := table[op]
	if !ok {
		return fmt.Errorf("unknown operation %q", op) // a programming error
	}
	if slices.Contains(r.from, v.State) {
		return nil
	}
	hint := ""
	switch {
	case op == opExec && (v.State == store.StateStopped || v.State == store.StateCrashed):
		hint = "; start it first with: agentvm start " + v.Name
	case v.State == store.StateCreating:
		hint = "; it is still being created"
	}
	return fmt.Errorf("%w: cannot %s VM %s: it is %s%s", ErrConflict, op, v.Name, v.State, hint)
}

// done reports whether op has nothing to do in v's state.
func done(op string, v *store.VM) bool { return slices.Contains(table[op].noop, v.State) }

// Reachable reports whether a VM in state st can serve a request: it runs,
// or a wake brings it back on its own. Stopped, crashed, failed and
// half-made VMs cannot.
func Reachable(st store.State) bool {
	return slices.Contains(table[opExec].from, st) || slices.Contains(table[opWake].from, st)
}

// internal are the transitions nobody asks for, each with its reason: the
// rest of the service's moves come from table.
var internal = []struct {
	from []store.State
	to   store.State
	why  string
}{
	{[]store.State{store.StateCreating}, store.StateRunning, "a create (or a fork's child) is done"},
	{[]store.State{statePool}, store.StateCreating, "a warm-pool VM is claimed"},
	{[]store.State{store.StateRunning, store.StatePaused, store.StateCreating}, store.StateCrashed, "QEMU exited unasked, or was lost while the daemon was down"},
	{[]store.State{store.StateRunning, store.StatePaused, store.StateCreating}, store.StateStopped, "the guest powered off"},
	{[]store.State{store.StateRunning, store.StatePaused}, store.StateSuspended, "a restart finds a suspend whose state was written but not recorded"},
	{[]store.State{store.StateSuspended, store.StatePaused}, store.StateStopped, "a wake finds the memory state lost"},
	{[]store.State{store.StateCrashed}, store.StateStopped, "a start of a crashed VM failed: it is stopped, with the error"},
}

// takeovers are the moves of a VM between cluster nodes (revive.go): the
// store makes them (store.ReviveVM, store.GiveBackVM) in one conditional
// statement with the change of node, after checkTakeover. No other path
// may make them: they are not in allowed.
var takeovers = map[string]struct {
	from []store.State
	to   []store.State
}{
	// A lost node's VM that was live is this node's, crashed, until its
	// snapshot is restored (then a start's move: crashed to running).
	opRevive: {from: []store.State{store.StateRunning, store.StatePaused, store.StateSuspended}, to: []store.State{store.StateCrashed}},
	// A revive that failed gives the VM back to its lost node as it was.
	opGiveBack: {from: []store.State{store.StateCrashed}, to: []store.State{store.StateRunning, store.StatePaused, store.StateSuspended}},
}

// Takeover moves (takeovers).
const (
	opRevive   = "revive"
	opGiveBack = "give back"
)

// checkTakeover answers whether takeover op may move a VM from one state
// to another; a refusal is a programming error, and the store is not asked.
func checkTakeover(op string, from, to store.State) error {
	m, ok := takeovers[op]
	if !ok || !slices.Contains(m.from, from) || !slices.Contains(m.to, to) {
		return fmt.Errorf("no %s from %s to %s in the state machine", op, from, to)
	}
	return nil
}

// allowed reports whether a VM may move from one state to another: the
// moves of table (from a start state to the during state, and on to the
// target) and the internal ones.
func allowed(from, to store.State) bool {
	for _, r := range table {
		if !slices.Contains(r.from, from) {
			continue
		}
		if to == r.during || (to == r.to && r.to != "") {
			return true
		}
	}
	for _, m := range internal {
		if to == m.to && slices.Contains(m.from, from) {
			return true
		}
	}
	return false
}

// enter is the one way a VM's recorded state changes: it checks the move
// against the state machine and records the held VM, with the new state, in one
// write that does not depend on the caller staying (the effect it records
// has happened). Operations enter their during state before their effect
// and their target after it. On an error the record keeps its old state.
func (h *held) enter(ctx context.Context, to store.State) error {
	s, v := h.s, h.v
	from := v.State
	if from != to && !allowed(from, to) {
		// A programming error: the record stays as it was.
		s.log.Error("state change not in the state machine", "vm", v.ID, "from", from, "to", to)
		return fmt.Errorf("VM %s: no transition from %s to %s", v.Name, from, to)
	}
	v.State = to
	// A stored suspended state is stale once the VM leaves that state.
	stored, storedAt := v.StoredManifest, v.StoredAt
	if to != store.StateSuspended {
		v.StoredManifest, v.StoredAt = "", time.Time{}
	}
	if err := s.store.UpdateVM(ctx, v); err != nil { // durable: outlives the caller
		v.State, v.StoredManifest, v.StoredAt = from, stored, storedAt
		return err
	}
	if v.StoredManifest != stored {
		s.unstoreVM(v.ID, stored)
	}
	return nil
}
