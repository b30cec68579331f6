// Package api holds the public request and response types of the agentvm REST API.
// It is the contract shared by the server and the Go SDK and imports no internal package.
package api

import "time"

// State is a VM's lifecycle state. Which operation may start from which
// state, and where it leaves the VM, is the daemon's state table
// (internal/vm/states.go).
type State string

// VM states.
const (
	StateCreating  State = "creating"
	StateRunning   State = "running"
	StatePaused    State = "paused"
	StateSuspended State = "suspended"
	StateStopped   State = "stopped"
	StateCrashed   State = "crashed"
	StateDeleting  State = "deleting"
	StateError     State = "error"
)

// States lists every state a VM can be seen in.
var States = []State{StateCreating, StateRunning, StatePaused, StateSuspended, StateStopped, StateCrashed, StateDeleting, StateError}

// VM is the public view of a virtual machine.
type VM struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	State     State             `json:"state"`
	CPUs      int               `json:"cpus"`
	MemoryMiB int64             `json:"memory_mib"`
	DiskBytes int64             `json:"disk_bytes"`
	Labels    map[string]string `json:"labels,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	IP        string            `json:"ip,omitempty"`
	Subnet    string            `json:"subnet,omitempty"`
	Gateway   string            `json:"gateway,omitempty"`
	PID       int               `json:"pid,omitempty"`
	Accel     string            `json:"accel,omitempty"`
	Template  string            `json:"template,omitempty"`
	Error     string            `json:"error,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	StartedAt *time.Time        `json:"started_at,omitempty"`
	// Image is the image the VM was made from.
	Image string `json:"image"`
	// Source is the snapshot or parent VM this VM was made from.
	Source string `json:"source,omitempty"`
	// NextCPUs and NextMemoryMiB are sizes that apply at the next start.
	NextCPUs      int   `json:"next_cpus,omitempty"`
	NextMemoryMiB int64 `json:"next_memory_mib,omitempty"`
	// Op reports the timing of the operation that returned this VM (pause, resume,
	// suspend, wake).
	Op *OpStats `json:"op,omitempty"`
	// IdleTimeoutSec, DeleteAfterSec and Restart are the VM's policies.
	IdleTimeoutSec int64  `json:"idle_timeout_s,omitempty"`
	DeleteAfterSec int64  `json:"delete_after_s,omitempty"`
	Restart        string `json:"restart,omitempty"`
	// Network is the private network the VM is on ("" = its own only);
	// Egress its own egress policy (nil: the network's, else public).
	Network string  `json:"network,omitempty"`
	Egress  *Egress `json:"egress,omitempty"`
	// Ports are the VM's exposed ports (preview URLs and TCP mappings).
	Ports []Port `json:"ports,omitempty"`
	// CreateMs is how long the create took on the server: restore plus identity, and
	// the template's one-time cold boot when this was the first create of its shape.
	CreateMs int64 `json:"create_ms,omitempty"`
	// StateBytes is the disk space a suspended VM's saved memory and device
	// state takes (allocated bytes of all its files; absent when not suspended).
	StateBytes int64 `json:"state_bytes,omitempty"`
	// Node and NodeID name the cluster node the VM runs on (absent outside
	// a cluster).
	Node   string `json:"node,omitempty"`
	NodeID string `json:"node_id,omitempty"`
	// NodeLost says the VM's node is gone (its lease ran out): the VM is
	// not running anywhere, whatever its recorded state.
	NodeLost bool `json:"node_lost,omitempty"`
	// StoredAt is when the state of this suspended VM was all in the
	// object store (serve --objects): if its node is lost, any node asked
	// to act on it takes it over and wakes it from that state.
	StoredAt *time.Time `json:"stored_at,omitempty"`
	// RevivesFrom names, for a lost node's VM without a stored state of its
	// own, its newest stored snapshot: any node asked to act on the VM
	// takes it over and restores it from that snapshot.
	RevivesFrom *RevivePoint `json:"revives_from,omitempty"`
}

// RevivePoint is the snapshot a lost node's VM comes back from.
type RevivePoint struct {
	Snapshot string    `json:"snapshot"`
	TakenAt  time.Time `json:"taken_at"`
}

// Node is a cluster node (GET /v1/nodes).
type Node struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Address string `json:"address"`
	// PeerAddress is where other nodes forward requests for its VMs.
	PeerAddress string `json:"peer_address,omitempty"`
	// Generation grows at every join of the node.
	Generation int64 `json:"generation"`
	// Alive says its lease runs, by the database's clock; LeaseLeftMs is
	// how long it has left (negative: how long ago it ran out).
	Alive        bool      `json:"alive"`
	LeaseExpires time.Time `json:"lease_expires"`
	LeaseLeftMs  int64     `json:"lease_left_ms"`
	JoinedAt     time.Time `json:"joined_at"`
	// Self marks the node that answered.
	Self        bool   `json:"self,omitempty"`
	CPUs        int    `json:"cpus"`
	MemoryMiB   int64  `json:"memory_mib"`
	QEMUVersion string `json:"qemu_version"`
	MachineType string `json:"machine_type"`
	CPUModel    string `json:"cpu_model"`
	Accel       string `json:"accel"`
	// Draining: the node takes no new VMs (agentvm node drain), until it
	// joins again.
	Draining bool `json:"draining,omitempty"`
}

// DrainResponse is returned by POST /v1/nodes/{node}/drain: what became
// of each VM of the node.
type DrainResponse struct {
	Node string      `json:"node"`
	VMs  []DrainedVM `json:"vms"`
}

// DrainedVM is one VM of a drain: moved To a node (and woken there when it
// was running), or left on the drained node with the Error that kept it.
type DrainedVM struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	To    string `json:"to,omitempty"`
	State State  `json:"state"`
	Error string `json:"error,omitempty"`
}

// ListNodesResponse is returned by GET /v1/nodes.
type ListNodesResponse struct {
	Nodes []Node `json:"nodes"`
}

// CreateVMRequest creates a VM. Memory and Disk accept MiB as a bare number or a
// size with a K/M/G/T suffix ("1024", "1G", "512M").
type CreateVMRequest struct {
	Name           string            `json:"name,omitempty"`
	CPUs           int               `json:"cpus,omitempty"`
	Memory         Size              `json:"memory,omitempty"`
	Disk           Size              `json:"disk,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	// Network puts the VM on a private network (see /v1/networks).
	Network string `json:"network,omitempty"`
	// Egress is the VM's egress policy (default: its network's, else public).
	Egress *Egress `json:"egress,omitempty"`
	// From creates the VM from a snapshot (id or name) instead of the image.
	From string `json:"from,omitempty"`
	// Image is the image to create the VM from: "default" (the default) or
	// "code-interpreter" (alias "code-interpreter-v1"). Not with From.
	Image string `json:"image,omitempty"`
	// Template creates the VM from a template built from a Dockerfile: a
	// restore of its machine with the start command running, and the
	// template's ENV added to Env. Not with From or Image.
	Template string `json:"template,omitempty"`
	// IdleTimeout suspends the VM after that long without activity (API,
	// exec, terminals, SSH, preview traffic); DeleteAfter deletes it that
	// long after its creation. "15m", "24h"; default never.
	IdleTimeout Duration `json:"idle_timeout,omitempty"`
	DeleteAfter Duration `json:"delete_after,omitempty"`
	// Restart: never (default), on-failure or always, applied when its QEMU
	// process dies; repeated crashes back off.
	Restart string `json:"restart,omitempty"`
	// AntiAffinity, on a cluster, names one of the VM's labels: the VM
	// prefers a node where no VM holding memory (creating, running, paused)
	// has the same value of it, when one has room (else the roomiest, as
	// any create). A preference: two such creates at the same moment may
	// still meet on one node.
	AntiAffinity string `json:"anti_affinity,omitempty"`
	// Repo clones a hosted repository (NAME or NAME@BRANCH) into RepoDir
	// (default /home/agent/NAME) as the VM is made; the VM then pushes to
	// and pulls from it at http://git.agentvm.internal/NAME.git with no
	// credential. A clone that fails fails the create.
	Repo    string `json:"repo,omitempty"`
	RepoDir string `json:"repo_dir,omitempty"`
	// NoRecord turns off the recording of the VM's terminals and execs
	// (and its forks'); see POST /v1/vms/{id}/recordings/settings.
	NoRecord bool `json:"no_record,omitempty"`
}

// PolicyRequest is the body of POST /v1/vms/{id}/policy (absent fields
// stay as they are; 0 turns a timeout off).
type PolicyRequest struct {
	IdleTimeout *Duration `json:"idle_timeout,omitempty"`
	DeleteAfter *Duration `json:"delete_after,omitempty"`
	Restart     *string   `json:"restart,omitempty"`
}

// Event is one entry of a VM's event log.
type Event struct {
	Seq     int64             `json:"seq"`
	VM      string            `json:"vm"`
	Time    time.Time         `json:"time"`
	Type    string            `json:"type"`
	Actor   string            `json:"actor"`
	Message string            `json:"message"`
	Data    map[string]string `json:"data,omitempty"`
}

// ListEventsResponse is the body of GET /v1/vms/{id}/events.
type ListEventsResponse struct {
	Events []Event `json:"events"`
}

// OpStats is the timing of one lifecycle operation.
type OpStats struct {
	Name     string `json:"name"`
	TookMs   int64  `json:"took_ms"`
	PausedMs int64  `json:"paused_ms,omitempty"`
	Bytes    int64  `json:"bytes,omitempty"`
	Message  string `json:"message,omitempty"`
}

// SnapshotRequest is the body of POST /v1/vms/{id}/snapshot.
type SnapshotRequest struct {
	Name string `json:"name,omitempty"`
}

// Snapshot is a saved VM: memory, processes and disk.
type Snapshot struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	VMID      string    `json:"vm_id"`
	VMName    string    `json:"vm_name"`
	CPUs      int       `json:"cpus"`
	MemoryMiB int64     `json:"memory_mib"`
	DiskBytes int64     `json:"disk_bytes"`
	Bytes     int64     `json:"state_bytes"`
	PausedMs  int64     `json:"paused_ms"`
	CreatedAt time.Time `json:"created_at"`
	Image     string    `json:"image"`
	// Node and NodeID name the cluster node that keeps the snapshot's
	// files (absent outside a cluster).
	Node   string `json:"node,omitempty"`
	NodeID string `json:"node_id,omitempty"`
	// StoredAt is when the snapshot was all in the object store (serve
	// --objects), from where any compatible node restores it; absent
	// until then.
	StoredAt *time.Time `json:"stored_at,omitempty"`
}

// ListSnapshotsResponse is returned by GET /v1/snapshots.
type ListSnapshotsResponse struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// ForkRequest is the body of POST /v1/vms/{id}/fork.
type ForkRequest struct {
	Count int `json:"count,omitempty"`
}

// ForkResponse reports a live fork.
type ForkResponse struct {
	Parent        VM    `json:"parent"`
	Children      []VM  `json:"children"`
	ParentPauseMs int64 `json:"parent_pause_ms"`
	StateBytes    int64 `json:"state_bytes"`
	TookMs        int64 `json:"took_ms"`
}

// ResizeRequest is the body of POST /v1/vms/{id}/resize; omitted fields keep their value.
type ResizeRequest struct {
	CPUs   int  `json:"cpus,omitempty"`
	Memory Size `json:"memory,omitempty"`
	Disk   Size `json:"disk,omitempty"`
}

// ListVMsResponse is returned by GET /v1/vms.
type ListVMsResponse struct {
	VMs []VM `json:"vms"`
}

// ExecRequest runs a command in a VM. Exactly one of Cmd or Shell is set.
type ExecRequest struct {
	Cmd     []string          `json:"cmd,omitempty"`
	Shell   string            `json:"shell,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	User    string            `json:"user,omitempty"`
	Timeout Duration          `json:"timeout,omitempty"`
	// Stdin is sent to the process for non-interactive (JSON or NDJSON) calls.
	Stdin string `json:"stdin,omitempty"`
}

// ExecEvent is one line of a streaming (application/x-ndjson) exec response.
// Type is "stdout", "stderr", "exit" or "error"; output that is not valid UTF-8
// comes as "stdout_base64" or "stderr_base64" with base64 Data.
type ExecEvent struct {
	Type     string `json:"type"`
	Data     string `json:"data,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Message  string `json:"message,omitempty"`
}

// ExecResult is the buffered (non-streaming) exec response.
type ExecResult struct {
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	ExitCode   int    `json:"exit_code"`
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	DurationMs int64  `json:"duration_ms"`
	// StdoutTruncated and StderrTruncated report that the server kept only
	// the first 16 MiB of that stream (the command still ran to its end);
	// the streaming modes have no such cap.
	StdoutTruncated bool `json:"stdout_truncated,omitempty"`
	StderrTruncated bool `json:"stderr_truncated,omitempty"`
	// TruncatedBy says why output was cut: "cap" (16 MiB per stream) or
	// "memory_budget" (the daemon-wide budget, serve --memory-budget, was
	// in use by other requests: stream the output instead).
	TruncatedBy string `json:"truncated_by,omitempty"`
}

// Health is returned by GET /v1/health (no auth).
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
	Accel   string `json:"accel"`
	// Proxy is the preview proxy's address and Domain its host suffix
	// (http://<port>-<vm>.<domain>:<proxy port>/); SSH the SSH gateway's.
	Proxy  string `json:"proxy,omitempty"`
	Domain string `json:"domain,omitempty"`
	// ProxyTLS: the proxy serves HTTPS only.
	ProxyTLS bool   `json:"proxy_tls,omitempty"`
	SSH      string `json:"ssh,omitempty"`
	// WarmPool counts ready pool VMs per shape, keyed "<cpus>x<memory MiB>".
	WarmPool map[string]int `json:"warm_pool,omitempty"`
}

// Error is the body of every non-2xx response.
type Error struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody carries a stable machine code and a human message.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Error codes.
const (
	CodeInvalid      = "invalid_argument"
	CodeNotFound     = "not_found"
	CodeConflict     = "conflict"
	CodeUnauthorized = "unauthorized"
	CodeInsufficient = "insufficient_storage"
	CodeUnavailable  = "unavailable"
	CodeInternal     = "internal"
	CodeForbidden    = "forbidden"
	// CodeOtherNode answers 421: the VM runs on another cluster node,
	// which the message names.
	CodeOtherNode = "other_node"
	// CodeStateIncompatible answers 409: a snapshot or suspended VM was saved
	// by a QEMU (or machine type, accelerator, CPU model) that this server's
	// QEMU cannot restore, such as a newer QEMU.
	CodeStateIncompatible = "state_incompatible"
	// File operations answer with these too.
	CodePermission   = "permission_denied"
	CodeExists       = "exists"
	CodeNotEmpty     = "not_empty"
	CodeIsDirectory  = "is_directory"
	CodeNotDirectory = "not_directory"
	CodeNoSpace      = "no_space"
	// CodeTooMany answers 429: a token holds too many connections at once.
	CodeTooMany = "too_many_requests"
)

// ExecUpgrade is the Upgrade protocol for full-duplex exec (stdin streaming).
// After 101 both sides speak frames: 1 byte type, 4 byte big-endian length, payload.
const ExecUpgrade = "agentvm-exec"

// TCPUpgrade is the Upgrade protocol of GET /v1/vms/{id}/tcp/{port}: after 101 the
// connection is a raw TCP stream to that port inside the VM.
const TCPUpgrade = "agentvm-tcp"

// Exec frame types on the upgraded stream.
const (
	FrameStdin    byte = 1 // client -> server
	FrameStdinEOF byte = 2 // client -> server
	FrameStdout   byte = 3
	FrameStderr   byte = 4
	FrameExit     byte = 5 // JSON ExitStatus; the last frame
	FrameError    byte = 6 // JSON {"message"}
	FrameSignal   byte = 7 // client -> server, decimal signal number
)

// ExitStatus is the payload of an exit frame on the upgraded exec stream.
type ExitStatus struct {
	ExitCode   int    `json:"exit_code"`
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	DurationMs int64  `json:"duration_ms"`
}
