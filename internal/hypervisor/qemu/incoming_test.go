package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeQMP answers a Machine's QMP like a QEMU restoring a state saved
// stopped: query-status says inmigrate, then paused. With dieAt set, it
// closes the connection when it receives that command (QEMU crashing there).
type fakeQMP struct {
	dieAt    string
	dieAtNth int      // die at the dieAtNth (1-based; 0: first) dieAt
	statuses []string // query-status's answers in turn (default inmigrate, paused)
	mu       sync.Mutex
	cmds     []string // command, or "command:capability=state" for capabilities
}

func (f *fakeQMP) serve(t *testing.T, l net.Listener) {
	c, err := l.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	c.Write([]byte(`{"QMP":{"version":{}}}` + "\n"))
	r := bufio.NewReader(c)
	statuses := f.statuses
	if statuses == nil {
		statuses = []string{"inmigrate", "paused"}
	}
	seen := 0
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var req struct {
			Execute   string `json:"execute"`
			Arguments struct {
				Capabilities []struct {
					Capability string `json:"capability"`
					State      bool   `json:"state"`
				} `json:"capabilities"`
			} `json:"arguments"`
			ID any `json:"id"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			t.Errorf("fake qmp: %v", err)
			return
		}
		name := req.Execute
		for _, c := range req.Arguments.Capabilities {
			if c.Capability == "mapped-ram" {
				name += ":mapped-ram=" + map[bool]string{true: "on", false: "off"}[c.State]
			}
		}
		f.mu.Lock()
		f.cmds = append(f.cmds, name)
		f.mu.Unlock()
		if req.Execute == f.dieAt {
			if seen++; seen >= f.dieAtNth {
				return
			}
		}
		var ret any = map[string]any{}
		switch req.Execute {
		case "query-status":
			ret = map[string]any{"status": statuses[0]}
			if len(statuses) > 1 {
				statuses = statuses[1:]
			}
		case "query-version":
			ret = map[string]any{"qemu": map[string]int{"major": 10, "minor": 0, "micro": 2}}
		}
		out, _ := json.Marshal(map[string]any{"return": ret, "id": req.ID})
		c.Write(append(out, '\n'))
	}
}

func (f *fakeQMP) commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.cmds)
}

func startFakeIncoming(t *testing.T, f *fakeQMP) (*Machine, error) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go f.serve(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	m := &Machine{cfg: Config{QMPSock: sock, Incoming: "/state", incomingMapped: true, LogPath: filepath.Join(t.TempDir(), "log")}, done: make(chan struct{})}
	if err := m.connect(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.qmp.Close() })
	return m, m.startIncoming(ctx)
}

// A mapped-ram restore turns mapped-ram off before it runs the guest: cont
// is its last command (it was sent before the switch, so a QEMU dying at
// the switch had already been told to run the guest).
func TestMappedIncomingRunsTheGuestLast(t *testing.T) {
	f := &fakeQMP{}
	if _, err := startFakeIncoming(t, f); err != nil {
		t.Fatal(err)
	}
	cmds := slices.DeleteFunc(f.commands(), func(c string) bool { return c == "qmp_capabilities" || c == "query-version" })
	want := []string{"migrate-set-capabilities:mapped-ram=on", "migrate-incoming", "query-status", "query-status", "migrate-set-capabilities:mapped-ram=off", "cont"}
	if !slices.Equal(cmds, want) {
		t.Fatalf("commands %q, want %q", cmds, want)
	}
	f = &fakeQMP{dieAt: "cont"}
	if _, err := startFakeIncoming(t, f); err == nil {
		t.Fatal("a QEMU that died at cont: no error")
	}
	// Dying at the switch that turns mapped-ram off: an error, and the
	// guest never told to run.
	f = &fakeQMP{dieAt: "migrate-set-capabilities", dieAtNth: 2}
	if _, err := startFakeIncoming(t, f); err == nil || slices.Contains(f.commands(), "cont") {
		t.Fatalf("a QEMU that died at the mapped-ram switch: err %v, commands %q", err, f.commands())
	}
	// A state saved running starts by itself: no cont.
	f = &fakeQMP{statuses: []string{"inmigrate", "running"}}
	if _, err := startFakeIncoming(t, f); err != nil || slices.Contains(f.commands(), "cont") {
		t.Fatalf("a restore that started the guest itself: err %v, commands %q", err, f.commands())
	}
}
