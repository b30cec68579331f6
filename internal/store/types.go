package store

// State is the recorded lifecycle state of a VM. The state table that
// decides which operation may move a VM from which state to which is the VM
// service's (internal/vm/states.go); the public API has its own type with
// the same values (store.State), and the server maps one onto the other.
type State string

// VM states. StatePool is a warm VM nobody has claimed yet: the VM service
// hides it from listings.
const (
	StateCreating  State = "creating"
	StateRunning   State = "running"
	StatePaused    State = "paused"
	StateSuspended State = "suspended"
	StateStopped   State = "stopped"
	StateCrashed   State = "crashed"
	StateDeleting  State = "deleting"
	StateError     State = "error"
	StatePool      State = "pool"
)

// States lists every state a VM can be seen in through the API (StatePool
// is not one of them).
var States = []State{StateCreating, StateRunning, StatePaused, StateSuspended, StateStopped, StateCrashed, StateDeleting, StateError}

// Egress is an egress policy as recorded for a VM, a network or a snapshot.
// Mode is public (the internet), deny (nothing) or allow (only Allow: CIDRs,
// addresses and domain names); AllowHost lists the host's loopback ports
// the VM may reach through its gateway.
type Egress struct {
	Mode      string   `json:"mode,omitempty"`
	Allow     []string `json:"allow,omitempty"`
	AllowHost []int    `json:"allow_host,omitempty"`
}
