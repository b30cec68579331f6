package vm

import (
	"context"
	"fmt"
	"slices"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

// statePool marks a warm-pool VM: a running VM no caller has yet (hidden
// from Get and List).
const statePool api.State = "pool"

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
)

// rule is one operation's row of the state table.
type rule struct {
	from   []api.State // the states it may start from
	noop   []api.State // the states in which it is already done: it succeeds and changes nothing
	during api.State   // the state recorded while it runs ("": the state it started from)
	to     api.State   // the state it leaves the VM in ("": the state it started from)
}

// table is the VM state machine: every user-facing operation's row. The
// operations read their start, no-op and target states from it; the proxy
// reads it through Reachable.
// Internal transitions: create records creating, then running (pool for a
// warm-pool VM); an exit nobody asked for records crashed, or stopped after
// a clean guest shutdown; a restart of the daemon finishes or rolls back
// what it finds (Reconcile).
var table = map[string]rule{
	opStart:    {from: []api.State{api.StateStopped, api.StateCrashed}, noop: []api.State{api.StateRunning}, to: api.StateRunning},
	opStop:     {from: []api.State{api.StateRunning, api.StatePaused, api.StateSuspended}, noop: []api.State{api.StateStopped}, to: api.StateStopped},
	opExec:     {from: []api.State{api.StateRunning}},
	opPause:    {from: []api.State{api.StateRunning}, noop: []api.State{api.StatePaused}, to: api.StatePaused},
	opResume:   {from: []api.State{api.StatePaused}, noop: []api.State{api.StateRunning}, to: api.StateRunning},
	opSuspend:  {from: []api.State{api.StateRunning, api.StatePaused}, noop: []api.State{api.StateSuspended}, to: api.StateSuspended},
	opWake:     {from: []api.State{api.StatePaused, api.StateSuspended}, noop: []api.State{api.StateRunning}, to: api.StateRunning},
	opSnapshot: {from: []api.State{api.StateRunning, api.StatePaused}},
	opFork:     {from: []api.State{api.StateRunning, api.StatePaused}},
	opResize:   {from: []api.State{api.StateRunning, api.StatePaused, api.StateStopped, api.StateCrashed}},
	opDelete:   {from: []api.State{api.StateRunning, api.StatePaused, api.StateStopped, api.StateCrashed, api.StateError, api.StateSuspended}, during: api.StateDeleting},
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
	case op == opExec && (v.State == api.StateStopped || v.State == api.StateCrashed):
		hint = "; start it first with: agentvm start " + v.Name
	case v.State == api.StateCreating:
		hint = "; it is still being created"
	}
	return fmt.Errorf("%w: cannot %s VM %s: it is %s%s", ErrConflict, op, v.Name, v.State, hint)
}

// done reports whether op has nothing to do in v's state.
func done(op string, v *store.VM) bool { return slices.Contains(table[op].noop, v.State) }

// Reachable reports whether a VM in state st can serve a request: it runs,
// or a wake brings it back on its own. Stopped, crashed, failed and
// half-made VMs cannot.
func Reachable(st api.State) bool {
	return slices.Contains(table[opExec].from, st) || slices.Contains(table[opWake].from, st)
}

// internal are the transitions nobody asks for, each with its reason: the
// rest of the service's moves come from table.
var internal = []struct {
	from []api.State
	to   api.State
	why  string
}{
	{[]api.State{api.StateCreating}, api.StateRunning, "a create (or a fork's child) is done"},
	{[]api.State{statePool}, api.StateCreating, "a warm-pool VM is claimed"},
	{[]api.State{api.StateRunning, api.StatePaused, api.StateCreating}, api.StateCrashed, "QEMU exited unasked, or was lost while the daemon was down"},
	{[]api.State{api.StateRunning, api.StatePaused, api.StateCreating}, api.StateStopped, "the guest powered off"},
	{[]api.State{api.StateRunning, api.StatePaused}, api.StateSuspended, "a restart finds a suspend whose state was written but not recorded"},
	{[]api.State{api.StateSuspended, api.StatePaused}, api.StateStopped, "a wake finds the memory state lost"},
	{[]api.State{api.StateCrashed}, api.StateStopped, "a start of a crashed VM failed: it is stopped, with the error"},
}

// allowed reports whether a VM may move from one state to another: the
// moves of table (from a start state to the during state, and on to the
// target) and the internal ones.
func allowed(from, to api.State) bool {
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
// against the state machine and records v, with the new state, in one
// write that does not depend on the caller staying (the effect it records
// has happened). Operations enter their during state before their effect
// and their target after it. On an error v keeps its old state.
func (s *Service) enter(ctx context.Context, v *store.VM, to api.State) error {
	from := v.State
	if from != to && !allowed(from, to) {
		// A programming error: the record stays as it was.
		s.log.Error("state change not in the state machine", "vm", v.ID, "from", from, "to", to)
		return fmt.Errorf("VM %s: no transition from %s to %s", v.Name, from, to)
	}
	v.State = to
	if err := s.store.UpdateVM(ctx, v); err != nil { // durable: outlives the caller
		v.State = from
		return err
	}
	return nil
}
