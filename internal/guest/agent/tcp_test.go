package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tcpServer accepts connections on 127.0.0.1 and runs handle on each.
func tcpServer(t *testing.T, handle func(*net.TCPConn)) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c.(*net.TCPConn))
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().(*net.TCPAddr).Port
}

type closeWriter interface{ CloseWrite() error }

func TestTCP(t *testing.T) {
	e := startAgent(t)
	e.connect(e.port.Attach(t), "")
	ctx := context.Background()

	// Echo until EOF, then close.
	echo := tcpServer(t, func(c *net.TCPConn) { io.Copy(c, c) })

	t.Run("echo-half-close", func(t *testing.T) {
		conn, err := e.c.DialTCP(ctx, "127.0.0.1", echo)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if conn.RemoteAddr().String() != net.JoinHostPort("127.0.0.1", strconv.Itoa(echo)) {
			t.Errorf("remote addr %v", conn.RemoteAddr())
		}
		buf := make([]byte, 5)
		for _, msg := range []string{"hello", "again"} {
			if _, err := conn.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != msg {
				t.Fatalf("read %q %v", buf, err)
			}
		}
		// Half-close: the server sees EOF, finishes and closes; we read EOF.
		if _, err := conn.Write([]byte("last")); err != nil {
			t.Fatal(err)
		}
		if err := conn.(closeWriter).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		rest, err := io.ReadAll(conn)
		if err != nil || string(rest) != "last" {
			t.Fatalf("after CloseWrite: %q %v", rest, err)
		}
	})

	t.Run("bulk", func(t *testing.T) {
		conn, err := e.c.DialTCP(ctx, "", echo) // default host
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		data := make([]byte, 4<<20)
		rand.Read(data)
		go func() {
			conn.Write(data)
			conn.(closeWriter).CloseWrite()
		}()
		got, err := io.ReadAll(conn)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("got %d bytes (equal %v), err %v", len(got), bytes.Equal(got, data), err)
		}
	})

	t.Run("server-closes", func(t *testing.T) {
		port := tcpServer(t, func(c *net.TCPConn) { c.Write([]byte("banner\n")) })
		conn, err := e.c.DialTCP(ctx, "127.0.0.1", port)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		b, err := io.ReadAll(conn)
		if err != nil || string(b) != "banner\n" {
			t.Fatalf("got %q %v", b, err)
		}
	})

	t.Run("host-close", func(t *testing.T) {
		sawEOF := make(chan error, 1)
		port := tcpServer(t, func(c *net.TCPConn) {
			c.Write([]byte("hi"))
			_, err := io.Copy(io.Discard, c)
			sawEOF <- err
		})
		conn, err := e.c.DialTCP(ctx, "127.0.0.1", port)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 2)
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatal(err)
		}
		// A pending Read ends when the conn is closed.
		readErr := make(chan error, 1)
		go func() { _, err := conn.Read(buf); readErr <- err }()
		time.Sleep(20 * time.Millisecond)
		conn.Close()
		select {
		case err := <-readErr:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("pending read: %v", err)
			}
		case <-time.After(testWait):
			t.Fatal("pending read not ended by Close")
		}
		select {
		case err := <-sawEOF:
			if err != nil {
				t.Fatalf("server: %v", err)
			}
		case <-time.After(testWait):
			t.Fatal("server did not see EOF")
		}
	})

	t.Run("deadline", func(t *testing.T) {
		conn, err := e.c.DialTCP(ctx, "127.0.0.1", echo)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err = conn.Read(make([]byte, 1))
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("read past deadline: %v", err)
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		_, err = e.c.DialTCP(ctx, "127.0.0.1", port)
		termWantErr(t, err, 502, "unreachable")
		if !strings.Contains(err.Error(), "refused") {
			t.Errorf("message: %v", err)
		}
	})

	t.Run("bad-port", func(t *testing.T) {
		for _, p := range []int{0, -1, 65536} {
			_, err := e.c.DialTCP(ctx, "127.0.0.1", p)
			termWantErr(t, err, 400, "invalid")
		}
	})

	t.Run("ctx-cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := e.c.DialTCP(cctx, "127.0.0.1", echo); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("listen-accept", func(t *testing.T) {
		l, err := e.c.ListenTCP(ctx, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if l.Port() == 0 {
			t.Fatal("no port")
		}
		// two connections in the guest, claimed in order, each both ways
		for i := 0; i < 2; i++ {
			c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(l.Port())))
			if err != nil {
				t.Fatal(err)
			}
			gc, remote, err := l.Accept(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if remote != c.LocalAddr().String() {
				t.Errorf("remote %q, want %q", remote, c.LocalAddr())
			}
			c.Write([]byte("ping"))
			c.(*net.TCPConn).CloseWrite()
			got, _ := io.ReadAll(gc)
			gc.Write([]byte("pong"))
			gc.Close()
			back, _ := io.ReadAll(c)
			c.Close()
			if string(got) != "ping" || string(back) != "pong" {
				t.Fatalf("conn %d: %q / %q", i, got, back)
			}
		}
		// the same port twice is a conflict
		_, err = e.c.ListenTCP(ctx, "127.0.0.1", l.Port())
		termWantErr(t, err, 409, "conflict")
		_, err = e.c.ListenTCP(ctx, "127.0.0.1", 70000)
		termWantErr(t, err, 400, "invalid")
		// closing the listen stream stops listening in the guest
		port := l.Port()
		l.Close()
		if _, _, err := l.Accept(ctx); err == nil {
			t.Fatal("accept after close")
		}
		deadline := time.Now().Add(testWait)
		for {
			c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil {
				break
			}
			c.Close()
			if time.Now().After(deadline) {
				t.Fatal("still listening after Close")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	checkNoTermGoroutines(t)
}
