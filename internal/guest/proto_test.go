package guest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestGuestScan(t *testing.T) {
	garbage := "\x00\x01\x02junk without newline" + strings.Repeat("x", 9000) + "\nmore junk\n"
	in := garbage +
		"noise" + HelloLine("aaaa") + // marker after garbage on the same line
		HelloLine("aaaa") + // retransmission: not answered twice
		StartLine("bbbb", time.Unix(5, 0)) + // start for a nonce never answered: ignored
		"AGENTVM-HELLO zz-not-hex 1\n" +
		StartLine("aaaa", time.Time{}) + "YAMUX-BYTES"
	br := bufio.NewReaderSize(strings.NewReader(in), MaxHandshakeLine)
	var out bytes.Buffer
	g := GuestHandshake{AgentVersion: "v9"}
	nonce, err := g.Scan(br, &out)
	if err != nil || nonce != "aaaa" || !g.Clock.IsZero() {
		t.Fatalf("Scan = %q, %v, clock %v", nonce, err, g.Clock)
	}
	if want := "AGENTVM-READY aaaa v9 1.2\n"; out.String() != want {
		t.Fatalf("replies %q, want %q", out.String(), want)
	}
	rest, _ := io.ReadAll(br)
	if string(rest) != "YAMUX-BYTES" {
		t.Fatalf("rest %q", rest)
	}
	// The same nonce is never answered again, a new one is.
	out.Reset()
	clock := time.Unix(1_800_000_000, 123456789)
	br = bufio.NewReaderSize(strings.NewReader(HelloLine("aaaa")+HelloLine("cccc")+HelloLine("cccc")+StartLine("cccc", clock)), MaxHandshakeLine)
	if nonce, err := g.Scan(br, &out); err != nil || nonce != "cccc" || !g.Clock.Equal(clock) {
		t.Fatalf("second Scan = %q, %v, clock %v", nonce, err, g.Clock)
	}
	if want := "AGENTVM-READY cccc v9 1.2\n"; out.String() != want {
		t.Fatalf("replies %q, want %q", out.String(), want)
	}
	// A clock field that is not a positive number is no clock.
	for _, bad := range []string{"-5", "0", "12x", "99999999999999999999"} {
		g := GuestHandshake{}
		br = bufio.NewReaderSize(strings.NewReader(HelloLine("dddd")+"AGENTVM-START dddd "+bad+"\n"), MaxHandshakeLine)
		if nonce, err := g.Scan(br, io.Discard); err != nil || nonce != "dddd" || !g.Clock.IsZero() {
			t.Fatalf("START with clock %q: %q, %v, clock %v", bad, nonce, err, g.Clock)
		}
	}
}

// TestHostHandshakeClock: the host's clock goes in the START line to an
// agent of protocol 1.1 on when asked for, and never to an older one.
func TestHostHandshakeClock(t *testing.T) {
	for _, c := range []struct {
		proto    string
		setClock bool
		want     bool
	}{{"1.1", true, true}, {"1.2", true, true}, {"1", true, false}, {"1.x", true, false}, {"1.1", false, false}} {
		h, g := net.Pipe()
		starts := make(chan string, 1)
		go func() {
			// Answer the first hello only: net.Pipe's writes wait for the
			// reader, and the host reads nothing while it writes START.
			br := bufio.NewReader(g)
			answered := false
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				if f := lineFields([]byte(line), helloMarker); f != nil && !answered {
					answered = true
					g.Write([]byte(readyMarker + f[0] + " test " + c.proto + "\n"))
				}
				if strings.HasPrefix(line, startMarker) {
					starts <- line
					return
				}
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		before := time.Now()
		_, res, err := HostHandshake(ctx, h, HandshakeOptions{SetClock: c.setClock})
		cancel()
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		line := <-starts
		h.Close()
		g.Close()
		sent := startClock(strings.Fields(strings.TrimPrefix(line, startMarker)))
		if res.ClockSent != c.want || sent.IsZero() == c.want {
			t.Fatalf("%+v: ClockSent %v, START line %q", c, res.ClockSent, line)
		}
		if c.want && (sent.Before(before) || sent.After(time.Now())) {
			t.Fatalf("%+v: clock %v is not the host's at the handshake (%v)", c, sent, before)
		}
	}
}

// fakeGuest answers the handshake on conn after writing garbage, then echoes.
func fakeGuest(t *testing.T, conn net.Conn, proto string, after string) {
	br := bufio.NewReader(conn)
	conn.Write([]byte("\x00\x00stale yamux frame bytes\x01AGENTVM-READY 0000000000000000 old 1\n\x02\x03"))
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		if f := lineFields([]byte(line), helloMarker); f != nil {
			conn.Write([]byte("AGENTVM-READY " + f[0] + " test " + proto + "\n" + after))
			break
		}
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		if strings.HasPrefix(line, startMarker) {
			io.Copy(conn, br)
			return
		}
	}
}

func TestHostHandshake(t *testing.T) {
	h, g := net.Pipe()
	defer h.Close()
	defer g.Close()
	go fakeGuest(t, g, "1", "AFTER")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, res, err := HostHandshake(ctx, h, HandshakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.AgentVersion != "test" || res.Proto != "1" {
		t.Fatalf("res = %+v", res)
	}
	// Bytes the guest sent right after READY are not lost.
	buf := make([]byte, 5)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "AFTER" {
		t.Fatalf("after = %q, %v", buf, err)
	}
	// The connection is usable (echo after START).
	go conn.Write([]byte("ping"))
	buf = make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo = %q, %v", buf, err)
	}
}

func TestHostHandshakeProtoMismatch(t *testing.T) {
	h, g := net.Pipe()
	defer h.Close()
	defer g.Close()
	go fakeGuest(t, g, "2.0", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err := HostHandshake(ctx, h, HandshakeOptions{})
	if !errors.Is(err, ErrProtoMismatch) {
		t.Fatalf("err = %v", err)
	}
}

func TestHostHandshakeTimeout(t *testing.T) {
	h, g := net.Pipe()
	defer h.Close()
	defer g.Close()
	go io.Copy(io.Discard, g) // a guest that never answers
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := HostHandshake(ctx, h, HandshakeOptions{})
	// Without the deadline the handshake would wait for ever.
	if err == nil || time.Since(start) > time.Minute {
		t.Fatalf("err = %v after %v", err, time.Since(start))
	}
}
