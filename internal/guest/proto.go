// Package guest holds the host<->guest agent protocol: the types shared by
// both ends, the framing used by exec streams, the connection handshake and
// the host-side client.
//
// Transport: one virtio-serial port. The host dials the unix socket QEMU
// created for it, performs a nonce handshake (see handshake.go), then runs a
// yamux client session on the connection; the guest agent runs a yamux server
// session and serves plain net/http on it.
package guest

import (
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/yamux"
)

// ProtoVersion is the protocol version spoken by this package. The host
// refuses a guest whose protocol major differs.
const ProtoVersion = 1

// ProtoMinor is this package's protocol minor: 1 sets the guest's clock from
// the handshake's START line (handshake.go); 2 has watch syncs
// (PathWatchSync).
const ProtoMinor = 2

// Version is the agent version string; override with
// -ldflags "-X github.com/agentvm/agentvm/internal/guest.Version=...".
var Version = "0.1.0-dev"

// DevicePath is the guest-side virtio-serial port.
const DevicePath = "/dev/virtio-ports/agentvm.0"

// HTTP endpoints served by the guest agent.
const (
	PathInfo     = "/v1/info"
	PathIdentity = "/v1/identity"
	PathExec     = "/v1/exec"
	PathHealthz  = "/v1/healthz"

	// ExecUpgrade is the value of the Upgrade header of an exec request.
	ExecUpgrade = "agentvm-exec"
)

// Info is returned by GET /v1/info.
type Info struct {
	Version  string `json:"version"`
	Proto    int    `json:"proto"`
	Hostname string `json:"hostname"`
	BootID   string `json:"boot_id"`
	UptimeMS int64  `json:"uptime_ms"`
	// Tainted is the kernel's taint mask (/proc/sys/kernel/tainted); bit
	// TaintDie is set once the kernel has oopsed. Agents before it report 0.
	Tainted uint64 `json:"tainted,omitempty"`
}

// TaintDie is the taint bit of a kernel that oopsed (TAINT_DIE, 'D').
const TaintDie = 1 << 7

// Network is the static network identity pushed to a guest.
type Network struct {
	Address string   `json:"address"`           // CIDR, e.g. 10.200.3.2/24
	Gateway string   `json:"gateway,omitempty"` // e.g. 10.200.3.1
	DNS     []string `json:"dns,omitempty"`
}

// Identity is the body of POST /v1/identity.
type Identity struct {
	Hostname     string            `json:"hostname,omitempty"`
	TimeUnixNano int64             `json:"time_unix_nano,omitempty"`
	MachineID    string            `json:"machine_id,omitempty"` // 32 lowercase hex chars
	Seed         []byte            `json:"seed,omitempty"`       // base64 in JSON; written to /dev/urandom
	Env          map[string]string `json:"env,omitempty"`
	Network      *Network          `json:"network,omitempty"`
	DiskResize   bool              `json:"disk_resize,omitempty"`
}

// IdentityResult is the response of POST /v1/identity.
type IdentityResult struct {
	OK bool  `json:"ok"`
	MS int64 `json:"ms"`
	// StepsUS is the time each step took, in microseconds (diagnostics).
	StepsUS map[string]int64 `json:"steps_us,omitempty"`
}

// ExecRequest is the JSON body of POST /v1/exec.
type ExecRequest struct {
	Argv      []string          `json:"argv,omitempty"`
	Shell     string            `json:"shell,omitempty"` // run with /bin/sh -c
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	User      string            `json:"user,omitempty"` // default root
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	Stdin     bool              `json:"stdin,omitempty"` // false: stdin is /dev/null
}

// ExitStatus is the payload of an exit frame.
type ExitStatus struct {
	ExitCode   int    `json:"exit_code"`
	Signal     string `json:"signal"` // e.g. "SIGKILL" when killed by a signal, else ""
	TimedOut   bool   `json:"timed_out"`
	DurationMS int64  `json:"duration_ms"`
}

// ErrorBody is the payload of an error frame.
type ErrorBody struct {
	Message string `json:"message"`
}

// APIError is the HTTP error body {"error":{"code","message"}}; it is also
// returned by the client for non-2xx answers.
type APIError struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("guest agent: %s (%d): %s", e.Code, e.Status, e.Message)
}

// ErrorEnvelope wraps an APIError on the wire.
type ErrorEnvelope struct {
	Error *APIError `json:"error"`
}

// YamuxConfig returns the yamux configuration used by both ends. Keepalive
// is enabled only on the host side (the guest can be paused or snapshotted
// at any moment; it learns about a dead host from EOF or a bad frame).
func YamuxConfig(keepalive bool) *yamux.Config {
	cfg := yamux.DefaultConfig()
	cfg.AcceptBacklog = 256
	cfg.MaxStreamWindowSize = 16 << 20
	cfg.LogOutput = io.Discard
	cfg.EnableKeepAlive = keepalive
	cfg.KeepAliveInterval = 30 * time.Second
	cfg.ConnectionWriteTimeout = 30 * time.Second
	cfg.StreamOpenTimeout = 30 * time.Second
	return cfg
}
