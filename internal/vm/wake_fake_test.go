package vm

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// lockedBuffer is a bytes.Buffer safe for the service's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWakeSetsClockInHandshake: a wake gives the agent the clock in the
// handshake and pushes no identity; a create pushes one.
func TestWakeSetsClockInHandshake(t *testing.T) {
	e := newFakeEnv(t)
	var logs lockedBuffer
	e.s.Close()
	e.cfg.Log = slog.New(slog.NewTextHandler(&logs, nil))
	e.s = e.newService()
	v := e.create("w")
	launched := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "msg=launched vm="+v.ID) {
				out = append(out, l)
			}
		}
		return out
	}
	if l := launched(); len(l) != 1 || !strings.Contains(l[0], "identity_ms=") || strings.Contains(l[0], "clock=handshake") {
		t.Fatalf("the create's launch: %q", l)
	}
	if _, err := e.s.Suspend(e.ctx, "w"); err != nil {
		t.Fatal(err)
	}
	e.exec("w", "true") // wakes it
	if l := launched(); len(l) != 2 || !strings.Contains(l[1], "clock=handshake") || strings.Contains(l[1], "identity_ms=") {
		t.Fatalf("the wake's launch: %q", l)
	}
}
