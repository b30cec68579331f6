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
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/hashicorp/yamux"
)

// ProtoVersion is the protocol version spoken by this package. The host
// refuses a guest whose protocol major differs.
const ProtoVersion = 1

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
}

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

// Exec frame types. A frame is 1 byte type + 4 byte big-endian length + payload.
const (
	FrameStdin    byte = 1 // host->guest: stdin bytes
	FrameStdinEOF byte = 2 // host->guest: close stdin
	FrameStdout   byte = 3 // guest->host
	FrameStderr   byte = 4 // guest->host
	FrameExit     byte = 5 // guest->host: JSON ExitStatus, last frame
	FrameError    byte = 6 // guest->host: JSON ErrorBody
	FrameSignal   byte = 7 // host->guest: decimal signal number, sent to the process group
)

// FrameHeaderLen is the size of a frame header.
const FrameHeaderLen = 5

// MaxFramePayload bounds frame payloads accepted by ReadFrame.
const MaxFramePayload = 16 << 20

// ErrFrameTooLarge is returned by ReadFrame for an oversized frame.
var ErrFrameTooLarge = errors.New("guest: frame too large")

// Frame is one decoded exec frame.
type Frame struct {
	Type byte
	Data []byte
}

// PutFrameHeader writes a frame header into b[:5].
func PutFrameHeader(b []byte, typ byte, n int) {
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:5], uint32(n))
}

// AppendFrame appends an encoded frame to b.
func AppendFrame(b []byte, typ byte, payload []byte) []byte {
	var h [FrameHeaderLen]byte
	PutFrameHeader(h[:], typ, len(payload))
	b = append(b, h[:]...)
	return append(b, payload...)
}

// WriteFrame writes one frame with a single Write call.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	_, err := w.Write(AppendFrame(make([]byte, 0, FrameHeaderLen+len(payload)), typ, payload))
	return err
}

// WriteJSONFrame writes a frame whose payload is v encoded as JSON.
func WriteJSONFrame(w io.Writer, typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFrame(w, typ, b)
}

// ReadFrame reads one frame. It returns io.EOF only on a clean end of stream
// before a header, io.ErrUnexpectedEOF for a truncated frame.
func ReadFrame(r io.Reader) (Frame, error) {
	var h [FrameHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(h[1:5])
	if n > MaxFramePayload {
		return Frame{}, ErrFrameTooLarge
	}
	f := Frame{Type: h[0]}
	if n > 0 {
		var err error
		if f.Data, err = readPayload(r, int(n)); err != nil {
			return Frame{}, err
		}
	}
	return f, nil
}

// frameAllocStep is the most ReadFrame allocates ahead of payload bytes
// actually arriving. A length field is only the peer's claim: allocating it
// up front would let a guest that announces 16 MiB frames and then stalls
// pin 16 MiB per stream in the daemon for 5 bytes sent. The agent's exec
// chunks (256 KiB) still take a single allocation.
const frameAllocStep = 256 << 10

// readPayload reads n bytes, growing the slice (doubling) as they arrive.
func readPayload(r io.Reader, n int) ([]byte, error) {
	b := make([]byte, min(n, frameAllocStep))
	got := 0
	for {
		m, err := io.ReadFull(r, b[got:])
		got += m
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if got == n {
			return b, nil
		}
		b = slices.Grow(b, min(n-got, got))[:got+min(n-got, got)]
	}
}

// ReadFrameReuse is ReadFrame reading the payload into *buf (grown as
// needed) instead of a new slice: f.Data is valid until the next call.
func ReadFrameReuse(r io.Reader, buf *[]byte) (Frame, error) {
	var h [FrameHeaderLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(h[1:5])
	if n > MaxFramePayload {
		return Frame{}, ErrFrameTooLarge
	}
	if uint32(cap(*buf)) < n {
		*buf = make([]byte, n)
	}
	f := Frame{Type: h[0], Data: (*buf)[:n]}
	if _, err := io.ReadFull(r, f.Data); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return f, nil
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
