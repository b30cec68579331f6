package vm

import (
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
