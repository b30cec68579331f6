package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/hashicorp/yamux"
)

// newFakeGuest connects a Client over a unix socket pair to a guest that
// answers the handshake and serves h on a yamux server session, as the
// agent does. It returns the guest's session too. (Not net.Pipe: with no
// buffer between the two sessions, their send and receive loops can wait on
// each other until ConnectionWriteTimeout when many streams close at once.)
func newFakeGuest(t *testing.T, h http.Handler) (*Client, *yamux.Session) {
	t.Helper()
	hostEnd, guestEnd := socketPair(t)
	sessCh := make(chan *yamux.Session, 1)
	go func() {
		br := bufio.NewReaderSize(guestEnd, MaxHandshakeLine)
		var hs GuestHandshake
		if _, err := hs.Scan(br, guestEnd); err != nil {
			sessCh <- nil
			return
		}
		sess, err := yamux.Server(&prefixConn{Conn: guestEnd, r: br}, YamuxConfig(false))
		sessCh <- sess
		if err == nil {
			(&http.Server{Handler: h}).Serve(sess)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := NewClient(ctx, hostEnd, HandshakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gs := <-sessCh
	if gs == nil {
		t.Fatal("fake guest: handshake or yamux failed")
	}
	t.Cleanup(func() {
		c.Close()
		gs.Close()
	})
	return c, gs
}

func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "fake-guest")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return conns[0], conns[1]
}

// hijack101 answers an upgrade request with a 101 carrying extraHeader and
// returns the raw connection.
func hijack101(w http.ResponseWriter, extraHeader string) (net.Conn, error) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, err
	}
	_, err = io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n"+extraHeader+"\r\n")
	return conn, err
}

// TestGuestReplyLimits: a hostile agent's oversized answers are cut off
// with an error instead of being read into the daemon's memory.
func TestGuestReplyLimits(t *testing.T) {
	huge := strings.Repeat("a", 2*MaxReplyBytes)
	tests := []struct {
		name string
		h    http.HandlerFunc
		call func(context.Context, *Client) error
		// wantLimit is the *ReplyTooLargeError limit expected, or 0 for
		// any error (net/http's own header limit).
		wantLimit int64
	}{
		{"json reply", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `{"version":"`+huge+`"}`)
		}, func(ctx context.Context, c *Client) error {
			_, err := c.Info(ctx)
			return err
		}, MaxReplyBytes},
		{"ignored reply", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, huge)
		}, func(ctx context.Context, c *Client) error {
			return c.Healthz(ctx)
		}, MaxReplyBytes},
		{"file write reply", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `{"name":"`+huge+`"}`)
		}, func(ctx context.Context, c *Client) error {
			_, err := c.WriteFile(ctx, "", "/x", strings.NewReader("x"), 0, false)
			return err
		}, MaxReplyBytes},
		{"response headers", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Junk", huge[:1<<20])
			io.WriteString(w, `{}`)
		}, func(ctx context.Context, c *Client) error {
			_, err := c.Info(ctx)
			return err
		}, 0},
		{"upgrade headers", func(w http.ResponseWriter, r *http.Request) {
			if conn, err := hijack101(w, "X-Junk: "+huge+"\r\n"); err == nil {
				defer conn.Close()
			}
		}, func(ctx context.Context, c *Client) error {
			_, err := c.AttachTerm(ctx, "t", TermAttach{})
			return err
		}, MaxHeaderBytes},
		{"tcp listen line", func(w http.ResponseWriter, r *http.Request) {
			if conn, err := hijack101(w, ""); err == nil {
				defer conn.Close()
				fmt.Fprintf(conn, `{"listener":"%s","port":1}`+"\n", huge)
			}
		}, func(ctx context.Context, c *Client) error {
			_, err := c.ListenTCP(ctx, "", 0)
			return err
		}, maxLineBytes},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newFakeGuest(t, tc.h)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := tc.call(ctx, c)
			if err == nil {
				t.Fatal("oversized reply accepted")
			}
			if tc.wantLimit == 0 {
				return
			}
			var tl *ReplyTooLargeError
			if !errors.As(err, &tl) || tl.Limit != tc.wantLimit {
				t.Fatalf("err = %.300v, want a ReplyTooLargeError with limit %d", err, tc.wantLimit)
			}
			if want := fmt.Sprintf("guest reply exceeds %d bytes", tc.wantLimit); !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %.300v, want it to say %q", err, want)
			}
		})
	}
}

// TestGuestReplyAtLimit: a reply of exactly MaxReplyBytes is still valid.
func TestGuestReplyAtLimit(t *testing.T) {
	c, _ := newFakeGuest(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		prefix, suffix := `{"version":"`, `"}`
		io.WriteString(w, prefix+strings.Repeat("v", MaxReplyBytes-len(prefix)-len(suffix))+suffix)
	}))
	info, err := c.Info(context.Background())
	if err != nil || len(info.Version) != MaxReplyBytes-len(`{"version":""}`) {
		t.Fatalf("Info: %v", err)
	}
}

// TestExecErrorFramesBounded: error frames are collected only up to
// maxExecErrorBytes.
func TestExecErrorFramesBounded(t *testing.T) {
	c, _ := newFakeGuest(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := hijack101(w, "")
		if err != nil {
			return
		}
		defer conn.Close()
		bw := bufio.NewWriter(conn)
		msg := ErrorBody{Message: strings.Repeat("e", 1024)}
		for range 4096 { // 4 MiB of error messages
			api.WriteJSONFrame(bw, api.FrameError, msg)
		}
		api.WriteJSONFrame(bw, api.FrameExit, ExitStatus{ExitCode: 1})
		bw.Flush()
	}))
	st, err := c.Run(context.Background(), ExecRequest{Argv: []string{"x"}}, nil, nil, nil)
	var ee *ExecError
	if !errors.As(err, &ee) || st == nil || st.ExitCode != 1 {
		t.Fatalf("Run = %+v, %.200v", st, err)
	}
	if len(ee.Message) > maxExecErrorBytes+200 || !strings.Contains(ee.Message, "dropped") {
		t.Fatalf("error message is %d bytes (limit %d), tail %q", len(ee.Message), maxExecErrorBytes, ee.Message[max(0, len(ee.Message)-80):])
	}
}

// TestStreamCap: a session holds at most MaxStreams streams; one more fails
// fast with ErrTooManyStreams (also through the HTTP client), and a slot
// comes back once a stream is closed on both sides.
func TestStreamCap(t *testing.T) {
	c, _ := newFakeGuest(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"version":"v"}`)
	}))
	var streams []*yamux.Stream
	for range MaxStreams {
		st, err := c.gate.open()
		if err != nil {
			t.Fatalf("stream %d: %v", len(streams), err)
		}
		streams = append(streams, st)
	}
	if _, err := c.gate.open(); !errors.Is(err, ErrTooManyStreams) {
		t.Fatalf("stream %d: err = %v, want ErrTooManyStreams", MaxStreams+1, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.Info(ctx)
	if !errors.Is(err, ErrTooManyStreams) || !strings.Contains(err.Error(), "too many concurrent streams to this VM") {
		t.Fatalf("Info at the cap: err = %v", err)
	}
	// The guest's HTTP server closes its side on EOF; the slot is then free.
	streams[0].Close()
	for c.sess.NumStreams() >= MaxStreams {
		if ctx.Err() != nil {
			t.Fatal("closed stream never left the session")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.Info(ctx); err != nil {
		t.Fatalf("Info after a close: %v", err)
	}
	// End the streams before the sessions: yamux readers still blocked when
	// a session closes spin until Close reaches their stream, which with
	// 255 of them under the race detector takes up to a minute.
	for _, st := range streams[1:] {
		st.Close()
	}
	for c.sess.NumStreams() > 1 && ctx.Err() == nil { // the idle HTTP connection stays
		time.Sleep(10 * time.Millisecond)
	}
}

// TestGuestOpenedStreamRefused: a stream the guest opens toward the host is
// refused at once instead of waiting, buffered, in the accept backlog.
func TestGuestOpenedStreamRefused(t *testing.T) {
	c, gs := newFakeGuest(t, http.NotFoundHandler())
	st, err := gs.OpenStream()
	if err != nil {
		if !errors.Is(err, yamux.ErrRemoteGoAway) {
			t.Fatalf("OpenStream: %v", err)
		}
		return // refused before sending: the guest saw the host's GoAway
	}
	defer st.Close()
	st.Write([]byte("data the host should not keep"))
	st.SetReadDeadline(time.Now().Add(time.Minute))
	_, err = st.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("guest-opened stream still open on the host: read = %v", err)
	}
	if n := c.sess.NumStreams(); n != 0 {
		t.Fatalf("host session holds %d streams", n)
	}
}
