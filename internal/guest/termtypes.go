package guest

import (
	"errors"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Terminal endpoints served by the guest agent. A terminal is a named PTY
// session owned by the agent: it runs whether or not any client is
// attached, keeps its scrollback, and several clients may attach at once.
const (
	PathTerms = "/v1/terms" // GET TermList, POST TermCreate -> TermInfo
	// PathTerms + "/{name}": GET TermInfo, DELETE kills the process group
	// and removes the terminal.
	// PathTerms + "/{name}/attach": POST with Upgrade: agentvm-term (body
	// TermAttach), then frames (see below).
	// PathTerms + "/{name}/resize": POST TermSize.
	// PathTerms + "/{name}/signal": POST TermSignal.

	TermUpgrade = "agentvm-term"

	// TCPUpgrade: POST /v1/tcp?host=H&port=P with Upgrade: agentvm-tcp makes
	// the agent dial H:P from inside the guest (default host 127.0.0.1) and
	// turns the stream into that raw TCP connection.
	PathTCP    = "/v1/tcp"
	TCPUpgrade = "agentvm-tcp"

	// PathTCPListen: POST /v1/tcp/listen?host=H&port=P with Upgrade:
	// agentvm-tcp-listen makes the agent listen on H:P inside the guest
	// (default host 127.0.0.1, port 0 picks one) for as long as the stream
	// stays open. The agent first writes one JSON TCPListening line, then
	// one JSON TCPAccepted line per accepted connection; the host claims
	// each with POST /v1/tcp/accept?listener=L&conn=C (Upgrade: agentvm-tcp),
	// which turns that stream into the connection. Unclaimed connections
	// are closed after TCPClaimTimeout; closing the listen stream closes the
	// listener and its unclaimed connections.
	PathTCPListen    = "/v1/tcp/listen"
	PathTCPAccept    = "/v1/tcp/accept"
	TCPListenUpgrade = "agentvm-tcp-listen"
	TCPClaimTimeout  = 30 * time.Second
)

// TCPListening is the first line on a listen stream.
type TCPListening struct {
	Listener string `json:"listener"`
	Port     int    `json:"port"`
}

// TCPAccepted announces a connection waiting to be claimed.
type TCPAccepted struct {
	Conn   string `json:"conn"`
	Remote string `json:"remote"` // the peer's address inside the guest
}

// FrameResize is a host->guest frame on a terminal stream carrying JSON
// TermSize. On terminal streams api.FrameStdin carries input, api.FrameSignal a
// decimal signal number for the terminal's foreground process group,
// api.FrameStdout carries output (the scrollback replay first) and api.FrameExit
// (JSON ExitStatus) is sent when the terminal's process has exited, after
// which the guest closes the stream.
const FrameResize byte = 8

// DefaultScrollback is the output kept per terminal for reattaching clients.
const DefaultScrollback = 2 << 20

// TermCreate is the body of POST /v1/terms.
type TermCreate struct {
	Name string            `json:"name,omitempty"` // [A-Za-z0-9._-]{1,64}; generated when empty
	Argv []string          `json:"argv,omitempty"` // default: the user's login shell, as a login shell
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	User string            `json:"user,omitempty"` // default root
	Cols int               `json:"cols,omitempty"` // default 80
	Rows int               `json:"rows,omitempty"` // default 24
	// Ephemeral terminals get SIGHUP and are removed when their last
	// client detaches (an SSH session's shell).
	Ephemeral bool `json:"ephemeral,omitempty"`
}

// TermInfo describes a terminal.
type TermInfo struct {
	Name      string    `json:"name"`
	PID       int       `json:"pid"`
	User      string    `json:"user"`
	Argv      []string  `json:"argv"`
	Cols      int       `json:"cols"`
	Rows      int       `json:"rows"`
	Clients   int       `json:"clients"`
	CreatedAt time.Time `json:"created_at"`
	Ephemeral bool      `json:"ephemeral,omitempty"`
	// Exited is set once the process has exited; the terminal stays (with
	// its scrollback) until it is deleted.
	Exited   bool   `json:"exited"`
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
}

// TermList is the answer of GET /v1/terms (sorted by name).
type TermList struct {
	Terminals []TermInfo `json:"terminals"`
}

// TermSize is a terminal size.
type TermSize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// TermAttach is the body of the attach request.
type TermAttach struct {
	// Cols/Rows resize the terminal on attach when both are > 0.
	Cols int `json:"cols,omitempty"`
	Rows int `json:"rows,omitempty"`
	// NoScrollback skips the replay of earlier output.
	NoScrollback bool `json:"no_scrollback,omitempty"`
}

// TermSignal is the body of POST /v1/terms/{name}/signal: a name such as
// "INT", "SIGTERM" or a number.
type TermSignal struct {
	Signal string `json:"signal"`
}

// ParseSignal accepts "INT", "SIGINT", "sigint" or a number 1..64 (the
// signal names of the terminal, process and job endpoints and of the
// terminal WebSocket's control messages).
func ParseSignal(s string) (syscall.Signal, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, errors.New("signal number out of range: " + s)
		}
		return syscall.Signal(n), nil
	}
	u := strings.ToUpper(s)
	if !strings.HasPrefix(u, "SIG") {
		u = "SIG" + u
	}
	if sig := unix.SignalNum(u); sig != 0 {
		return sig, nil
	}
	return 0, errors.New("unknown signal " + strconv.Quote(s))
}
