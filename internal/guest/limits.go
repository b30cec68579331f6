package guest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/hashicorp/yamux"
)

// Limits on what the host accepts from a guest agent. Everything the guest
// says is untrusted (the VM's owner controls the agent binary): a hostile
// agent answering with an endless JSON string grew the daemon's heap by
// 262 MiB before these existed. Every non-streaming read from the guest is
// bounded; streaming bodies (file downloads, logs, exec and terminal output)
// are bounded by yamux flow control instead, and the number of streams by
// MaxStreams.
const (
	// MaxReplyBytes bounds a JSON reply (the largest real ones, process and
	// directory listings, are well under 1 MiB).
	MaxReplyBytes = 4 << 20
	// MaxErrorBodyBytes bounds an error body; the rest is dropped.
	MaxErrorBodyBytes = 64 << 10
	// MaxHeaderBytes bounds the header block of a guest HTTP response
	// (net/http's client default is 10 MiB).
	MaxHeaderBytes = 64 << 10
	// maxLineBytes bounds a newline-terminated message on an upgraded
	// stream (the TCP listener's announcements); it is also the size of
	// the buffer those streams are read through.
	maxLineBytes = 64 << 10
	// maxExecErrorBytes bounds the error-frame messages Wait collects.
	maxExecErrorBytes = 64 << 10
)

// Stream accounting. A host-side stream buffers up to
// YamuxConfig().MaxStreamWindowSize (16 MiB) that the guest may send before
// the host reads it, so the host must bound how many streams a session
// holds: MaxStreams * 16 MiB = 4 GiB is the most one VM can make the daemon
// buffer in stream windows (plus one frame of up to 16 MiB being read by
// the session's receive loop). Streams the guest opens are refused outright
// (see NewClient), so they add nothing.
const MaxStreams = 256

// ErrTooManyStreams is returned when a session already holds MaxStreams
// streams. It fails fast instead of queueing: the caller (an API request)
// can retry, and a guest that never closes its side cannot pile up
// waiters in the daemon.
var ErrTooManyStreams = errors.New("too many concurrent streams to this VM")

// ReplyTooLargeError is returned when a guest reply exceeds its limit.
type ReplyTooLargeError struct{ Limit int64 }

func (e *ReplyTooLargeError) Error() string {
	return fmt.Sprintf("guest reply exceeds %d bytes", e.Limit)
}

// boundedReader reads at most n more bytes from r. Reading past the bound
// fails with a *ReplyTooLargeError rather than io.EOF, so a cut reply is
// never mistaken for a complete one. Setting n to math.MaxInt64 lifts the
// bound (after an upgrade's headers, the stream is flow-controlled).
type boundedReader struct {
	r     io.Reader
	n     int64
	limit int64
}

func newBoundedReader(r io.Reader, limit int64) *boundedReader {
	return &boundedReader{r: r, n: limit, limit: limit}
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.n <= 0 {
		// Exactly limit bytes followed by EOF is a valid reply: probe one
		// byte to tell that apart from a longer one.
		var one [1]byte
		m, err := b.r.Read(one[:])
		if m > 0 {
			return 0, &ReplyTooLargeError{Limit: b.limit}
		}
		return 0, err
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	m, err := b.r.Read(p)
	b.n -= int64(m)
	return m, err
}

func (b *boundedReader) unbound() { b.n = math.MaxInt64 }

// drainBounded reads r to its end, failing once more than limit bytes came.
func drainBounded(r io.Reader, limit int64) error {
	n, err := io.CopyN(io.Discard, r, limit+1)
	if n > limit {
		return &ReplyTooLargeError{Limit: limit}
	}
	if err == io.EOF {
		err = nil
	}
	return err
}

// readGuestLine reads one '\n'-terminated line of at most br.Size() bytes
// (the buffer is the bound: nothing is accumulated beyond it).
func readGuestLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		return nil, &ReplyTooLargeError{Limit: int64(br.Size())}
	}
	return bytes.Clone(line), err
}

// streamGate caps the streams of one session. The session's own count
// (NumStreams) is the measure, not a count of opens and closes: a stream the
// host has closed stays in the session, still receiving into its window,
// until the guest closes its side too or StreamCloseTimeout passes, and that
// memory is what the cap bounds.
type streamGate struct {
	sess *yamux.Session
	max  int

	mu      sync.Mutex
	opening int // opens past the check whose stream may not be in NumStreams yet
}

func (g *streamGate) open() (*yamux.Stream, error) {
	g.mu.Lock()
	if n := g.sess.NumStreams() + g.opening; n >= g.max {
		g.mu.Unlock()
		return nil, fmt.Errorf("guest: %w (%d open, limit %d)", ErrTooManyStreams, n, g.max)
	}
	g.opening++
	g.mu.Unlock()
	// OpenStream registers the stream before it returns, so between that
	// and the decrement the stream is counted twice, never zero times.
	st, err := g.sess.OpenStream()
	g.mu.Lock()
	g.opening--
	g.mu.Unlock()
	return st, err
}
