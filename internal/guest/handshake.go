package guest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Handshake lines. Every connection starts with a fresh nonce so stale bytes
// queued in either direction (yamux frames of a previous session, replies to
// an old hello) are discarded:
//
//	host  -> guest: AGENTVM-HELLO <nonce> <hostProto>\n   (repeated every 25 ms)
//	guest -> host : AGENTVM-READY <nonce> <agentVersion> <proto>\n  (once per nonce)
//	host  -> guest: AGENTVM-START <nonce> [<unixnano>]\n
//
// then both ends run yamux (host = client, guest = server). Markers are
// searched anywhere in a line, so garbage without a trailing newline in
// front of a handshake line does not hide it.
//
// A START line may carry the host's wall clock (Unix nanoseconds), sent only
// to an agent whose protocol is 1.1 or later: such an agent sets the guest's
// clock to it before the session starts. A wake needs nothing else from the
// guest, so it saves the round trip of an identity push. Older agents read
// only the nonce, and a field they do not know is ignored.
const (
	helloMarker = "AGENTVM-HELLO "
	readyMarker = "AGENTVM-READY "
	startMarker = "AGENTVM-START "

	// MaxHandshakeLine caps the length of a handshake line; longer runs of
	// bytes without a newline are dropped in chunks.
	MaxHandshakeLine = 4096

	helloInterval = 25 * time.Millisecond
)

// NewNonce returns 16 random hex characters.
func NewNonce() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// HelloLine formats the host's hello.
func HelloLine(nonce string) string {
	return fmt.Sprintf("%s%s %d\n", helloMarker, nonce, ProtoVersion)
}

// ReadyLine formats the guest's reply.
func ReadyLine(nonce, agentVersion string) string {
	return fmt.Sprintf("%s%s %s %d.%d\n", readyMarker, nonce, agentVersion, ProtoVersion, ProtoMinor)
}

// StartLine formats the host's start line; a non-zero clock is sent along.
func StartLine(nonce string, clock time.Time) string {
	if clock.IsZero() {
		return startMarker + nonce + "\n"
	}
	return startMarker + nonce + " " + strconv.FormatInt(clock.UnixNano(), 10) + "\n"
}

// startClock reads the clock field of a START line's fields: zero when it
// is absent or not a positive decimal number.
func startClock(f []string) time.Time {
	if len(f) < 2 {
		return time.Time{}
	}
	ns, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || ns <= 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// lineFields returns the fields following the last occurrence of marker in
// line, or nil when the marker is absent.
func lineFields(line []byte, marker string) []string {
	i := bytes.LastIndex(line, []byte(marker))
	if i < 0 {
		return nil
	}
	f := strings.Fields(string(line[i+len(marker):]))
	if len(f) == 0 {
		return nil
	}
	return f
}

// readLine returns the next line (including '\n') or, for longer runs, a
// chunk of MaxHandshakeLine bytes, which callers treat as garbage-or-line.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return line, nil
	}
	return line, err
}

// ProtoMajor returns the major number of a protocol version string ("1", "1.2").
func ProtoMajor(v string) (int, error) {
	if i := strings.IndexByte(v, '.'); i >= 0 {
		v = v[:i]
	}
	return strconv.Atoi(v)
}

// protoMinor returns the minor number of a protocol version string: 0 for
// "1" and for anything it cannot read.
func protoMinor(v string) int {
	i := strings.IndexByte(v, '.')
	if i < 0 {
		return 0
	}
	n, err := strconv.Atoi(v[i+1:])
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// GuestHandshake is the guest side of the handshake ("scanning mode").
// The zero value is ready to use; it remembers the last answered nonce across
// calls so a nonce is never answered twice.
type GuestHandshake struct {
	AgentVersion string // defaults to Version
	// Clock is the host's wall clock from the START line Scan returned
	// after, zero when the host sent none.
	Clock     time.Time
	lastNonce string
}

// Scan reads lines from br (which must have a buffer of at least
// MaxHandshakeLine bytes), answers each new hello on w and returns the nonce
// once the matching START line has been consumed (and g.Clock set from it).
// Bytes after the START line stay buffered in br.
func (g *GuestHandshake) Scan(br *bufio.Reader, w io.Writer) (string, error) {
	ver := g.AgentVersion
	if ver == "" {
		ver = Version
	}
	for {
		line, err := readLine(br)
		if len(line) > 0 && line[len(line)-1] == '\n' {
			if f := lineFields(line, startMarker); f != nil && g.lastNonce != "" && f[0] == g.lastNonce {
				g.Clock = startClock(f)
				return g.lastNonce, nil
			}
			if f := lineFields(line, helloMarker); f != nil && validNonce(f[0]) && f[0] != g.lastNonce {
				g.lastNonce = f[0]
				if _, werr := io.WriteString(w, ReadyLine(f[0], ver)); werr != nil {
					return "", werr
				}
			}
		}
		if err != nil {
			return "", err
		}
	}
}

func validNonce(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// HandshakeResult describes the guest found by HostHandshake.
type HandshakeResult struct {
	Nonce        string
	AgentVersion string
	Proto        string
	// ClockSent: the START line carried the host's clock, which the agent
	// sets before it serves the session.
	ClockSent bool
}

// HandshakeOptions are what the host asks of the guest in a handshake.
type HandshakeOptions struct {
	// SetClock sends the host's wall clock in the START line, to an agent
	// that sets it (protocol 1.1 on); HandshakeResult.ClockSent says whether
	// it went.
	SetClock bool
}

// ErrProtoMismatch is wrapped by HostHandshake when the guest speaks another
// protocol major.
var ErrProtoMismatch = errors.New("guest agent protocol mismatch")

// HostHandshake performs the host side of the handshake on conn and returns
// a net.Conn that yields every byte the guest sent after its READY line
// (nothing is lost to buffering). ctx bounds the handshake.
func HostHandshake(ctx context.Context, conn net.Conn, o HandshakeOptions) (net.Conn, *HandshakeResult, error) {
	nonce := NewNonce()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stopCtx := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stopCtx()

	var (
		wmu     sync.Mutex
		stopped bool
		werr    error
	)
	hello := []byte(HelloLine(nonce))
	sendHello := func() bool {
		wmu.Lock()
		defer wmu.Unlock()
		if stopped {
			return false
		}
		if _, err := conn.Write(hello); err != nil {
			werr = err
			return false
		}
		return true
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		if !sendHello() {
			return
		}
		// The first repeat comes sooner: after a restore the guest's old
		// yamux session swallows the first hello as a bad frame.
		t := time.NewTimer(helloInterval / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if !sendHello() {
					return
				}
				t.Reset(helloInterval)
			}
		}
	}()

	br := bufio.NewReaderSize(conn, MaxHandshakeLine)
	var res *HandshakeResult
	for res == nil {
		line, err := readLine(br)
		if len(line) > 0 && line[len(line)-1] == '\n' {
			if f := lineFields(line, readyMarker); len(f) >= 3 && f[0] == nonce {
				res = &HandshakeResult{Nonce: nonce, AgentVersion: f[1], Proto: f[2]}
				break
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			wmu.Lock()
			if werr != nil {
				err = fmt.Errorf("%w (write hello: %v)", err, werr)
			}
			wmu.Unlock()
			return nil, nil, fmt.Errorf("guest handshake: waiting for agent: %w", err)
		}
	}
	major, err := ProtoMajor(res.Proto)
	if err != nil || major != ProtoVersion {
		return nil, res, fmt.Errorf("%w: guest agent %s speaks protocol %q, host speaks %d",
			ErrProtoMismatch, res.AgentVersion, res.Proto, ProtoVersion)
	}
	var clock time.Time
	if o.SetClock && protoMinor(res.Proto) >= 1 {
		res.ClockSent = true
		clock = time.Now()
	}
	wmu.Lock()
	stopped = true
	_, err = io.WriteString(conn, StartLine(nonce, clock))
	wmu.Unlock()
	if err != nil {
		return nil, nil, fmt.Errorf("guest handshake: write start: %w", err)
	}
	stopCtx()
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	conn.SetDeadline(time.Time{})
	rest, _ := br.Peek(br.Buffered())
	return &prefixConn{Conn: conn, r: io.MultiReader(bytes.NewReader(bytes.Clone(rest)), conn)}, res, nil
}

// prefixConn replays buffered bytes before reading from the connection.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(p []byte) (int, error) { return c.r.Read(p) }
