package agent

import (
	"errors"
	"io"
	"sync"
	"testing"
	"time"
)

// scriptDev is a port device whose reads follow read.
type scriptDev struct{ read func([]byte) (int, error) }

func (d scriptDev) Read(b []byte) (int, error)  { return d.read(b) }
func (d scriptDev) Write(b []byte) (int, error) { return len(b), nil }
func (d scriptDev) Close() error                { return nil }

// startPort runs a port over dev until the test ends and returns a view of it
// that ends on EOF (as a session's does).
func startPort(t *testing.T, dev scriptDev, stop chan struct{}) *view {
	t.Helper()
	p := newPort(func() (io.ReadWriteCloser, error) { return dev, nil }, t.Logf)
	done := make(chan struct{})
	loopDone := make(chan struct{})
	go func() { defer close(loopDone); p.readLoop(done) }()
	v := newView(p)
	t.Cleanup(func() {
		v.close()
		close(done)
		close(stop)
		<-loopDone
	})
	return v
}

// readView reads one chunk from v, failing the test if it takes more than 10 s.
func readView(t *testing.T, v *view) (string, error) {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	c := make(chan res, 1)
	go func() {
		b := make([]byte, 64)
		n, err := v.Read(b)
		c <- res{string(b[:n]), err}
	}()
	select {
	case r := <-c:
		return r.s, r.err
	case <-time.After(time.Minute):
		t.Fatal("view read did not return")
		return "", nil
	}
}

// After a restore the guest's port may read "no host" for an instant while
// a session with the new host is already running (the host-closed event of
// QEMU's post-load handled late, the host-open one right after it): such a
// blip must not end the session.
func TestPortIgnoresEOFBlip(t *testing.T) {
	var mu sync.Mutex
	step, blipEnd := 0, time.Time{}
	stop := make(chan struct{})
	dev := scriptDev{read: func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		switch step {
		case 0:
			step, blipEnd = 1, time.Now().Add(eofDebounce/4)
			return copy(b, "a"), nil
		case 1:
			if time.Now().Before(blipEnd) {
				return 0, io.EOF
			}
			step = 2
			return copy(b, "b"), nil
		default:
			mu.Unlock()
			<-stop
			mu.Lock()
			return 0, errors.New("closed")
		}
	}}
	v := startPort(t, dev, stop)
	if s, err := readView(t, v); s != "a" || err != nil {
		t.Fatalf("first read: %q %v", s, err)
	}
	if s, err := readView(t, v); s != "b" || err != nil {
		t.Fatalf("second read: %q %v (an EOF blip ended the session)", s, err)
	}
}

// A host that is gone for good is still reported, once it lasted eofDebounce.
func TestPortReportsLastingEOF(t *testing.T) {
	var mu sync.Mutex
	first := true
	stop := make(chan struct{})
	dev := scriptDev{read: func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if first {
			first = false
			return copy(b, "a"), nil
		}
		return 0, io.EOF
	}}
	start := time.Now() // before the first EOF read can happen
	v := startPort(t, dev, stop)
	if s, err := readView(t, v); s != "a" || err != nil {
		t.Fatalf("first read: %q %v", s, err)
	}
	if _, err := readView(t, v); err != io.EOF {
		t.Fatalf("got %v, want EOF", err)
	}
	if d := time.Since(start); d < eofDebounce {
		t.Fatalf("EOF reported after %s, before the %s debounce", d, eofDebounce)
	}
}
