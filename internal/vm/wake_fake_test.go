package vm

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWakeSetsClockInHandshake: a wake gives the agent the clock in the
// handshake and pushes no identity; a create pushes one. Create, wake and
// start each run their own list of launch steps.
func TestWakeSetsClockInHandshake(t *testing.T) {
	e := newFakeEnv(t)
	logf, err := os.Create(filepath.Join(t.TempDir(), "daemon.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	e.s.Close()
	e.cfg.Log = slog.New(slog.NewTextHandler(logf, nil))
	e.s = e.newService()
	v := e.create("w")
	launched := func() []string {
		b, err := os.ReadFile(logf.Name())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
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
	if _, err := e.s.Stop(e.ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Start(e.ctx, "w"); err != nil {
		t.Fatal(err)
	}
	// Each kind of launch ran its own list of steps, in order.
	want := []string{
		`steps="network,start,pid,attach,handshake,grow disk,identity,publish"`,              // create (restore)
		`steps=network,start,pid,attach,handshake,clock,publish`,                             // wake
		`steps="network,boot devices,start,pid,attach,handshake,grow disk,identity,publish"`, // start (boot)
	}
	l := launched()
	if len(l) != len(want) {
		t.Fatalf("launches: %q", l)
	}
	for i, w := range want {
		if !strings.Contains(l[i], w) {
			t.Errorf("launch %d: want %s in %q", i, w, l[i])
		}
	}
}
