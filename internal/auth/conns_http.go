package auth

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
)

// TrackHTTP registers a request made with p's token (see Track) for its
// whole length: a revoke or expiry cancels the request's context, which ends
// streamed answers (followed logs and events, proxied responses), and closes
// the connection if the handler took it over (exec and TCP upgrades,
// terminal and preview WebSockets), whose own contexts no longer follow the
// request's. Handlers use the returned writer and request; call done when
// the handler returns. For the admin it returns w and r unchanged. It fails
// with ErrTooMany as Track does; the request must then be refused.
func (s *Service) TrackHTTP(w http.ResponseWriter, r *http.Request, p *Principal) (http.ResponseWriter, *http.Request, func(), error) {
	if p == nil || p.TokenID == "" {
		return w, r, func() {}, nil
	}
	revoked := make(chan struct{})
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), revokedKey{}, (<-chan struct{})(revoked)))
	tw := &trackedWriter{ResponseWriter: w}
	var once sync.Once
	untrack, err := s.Track(p, func() {
		once.Do(func() { close(revoked) })
		cancel()
		tw.closeConn()
	})
	if err != nil {
		cancel()
		return w, r, nil, err
	}
	return tw, r.WithContext(ctx), func() {
		untrack()
		cancel()
	}, nil
}

type revokedKey struct{}

// Revoked returns a channel that is closed when the token of the request
// with this context (see TrackHTTP) is revoked or expires; nil (never
// ready) for requests no token limits. Unlike the request's context, it
// does not end when the client half-closes a connection the handler took
// over.
func Revoked(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(revokedKey{}).(<-chan struct{})
	return ch
}

// trackedWriter remembers the connection a handler hijacks, so that it can
// be closed from outside.
type trackedWriter struct {
	http.ResponseWriter
	mu     sync.Mutex
	conn   net.Conn
	closed bool
}

func (w *trackedWriter) closeConn() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.conn != nil {
		w.conn.Close()
	}
}

// Hijack is http.Hijacker, through http.ResponseController so that wrapped
// writers work too.
func (w *trackedWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		c.Close() // revoked while upgrading: the handler sees a dead connection
	}
	w.conn = c
	return c, brw, nil
}

// Flush is http.Flusher (streamed answers flush through it).
func (w *trackedWriter) Flush() {
	http.NewResponseController(w.ResponseWriter).Flush()
}

// ReadFrom keeps the underlying writer's fast path (sendfile) for downloads.
func (w *trackedWriter) ReadFrom(src io.Reader) (int64, error) {
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(writerOnly{w.ResponseWriter}, src)
}

// Unwrap lets http.ResponseController reach the other optional methods
// (deadlines, full duplex).
func (w *trackedWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writerOnly hides ReadFrom so io.Copy does not loop back into it.
type writerOnly struct{ io.Writer }
