package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordingQMP is a fake QEMU that records every call and answers from
// reply (nil: an empty return), and a Machine of this package on it.
type recordingQMP struct {
	mu    sync.Mutex
	calls []qmpCall
}

func (r *recordingQMP) named(cmd string) []qmpCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []qmpCall
	for _, c := range r.calls {
		if c.Execute == cmd {
			out = append(out, c)
		}
	}
	return out
}

func fakeMachine(t *testing.T, reply func(m qmpCall) string) (*Machine, *recordingQMP) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	rec := &recordingQMP{}
	serveFakeQMP(t, sock, func(m qmpCall) ([]string, bool) {
		rec.mu.Lock()
		rec.calls = append(rec.calls, m)
		rec.mu.Unlock()
		if reply != nil {
			if l := reply(m); l != "" {
				return []string{l}, false
			}
		}
		return []string{qmpReturn(m, `{}`)}, false
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := DialQMP(ctx, sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return &Machine{qmp: q, done: make(chan struct{}), cfg: Config{Accel: "tcg"}}, rec
}

// PrepareFreeze makes the overlay on the live top before the save; commit
// is only blockdev-snapshot; abort closes the node and removes the file,
// but leaves a file whose node QEMU would not let go of.
func TestPrepareFreeze(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed")
	}
	dir := t.TempDir()
	top := filepath.Join(dir, "top.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", top, "64M").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	delFails := false
	topName := top
	m, rec := fakeMachine(t, func(c qmpCall) string {
		switch c.Execute {
		case "query-block":
			return qmpReturn(c, `[{"device": "disk0", "inserted": {"file": `+jsonString(topName)+`, "image": {"virtual-size": 67108864}}}]`)
		case "blockdev-del":
			if delFails {
				return qmpError(c, "GenericError", "Node is in use")
			}
		}
		return ""
	})
	ctx := context.Background()

	newTop := filepath.Join(dir, "new.qcow2")
	commit, abort, err := m.PrepareFreeze(ctx, newTop)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", newTop).Output()
	if err != nil || !strings.Contains(string(out), `"full-backing-filename": "`+top+`"`) || !strings.Contains(string(out), `"virtual-size": 67108864`) {
		t.Fatalf("the overlay does not name the live top as its backing file: %v %s", err, out)
	}
	add := rec.named("blockdev-add")
	if len(add) != 1 || add[0].Arguments["backing"] != nil || add[0].Arguments["driver"] != "qcow2" {
		t.Fatalf("blockdev-add: %+v", add)
	}
	node := add[0].Arguments["node-name"]
	if err := commit(ctx); err != nil {
		t.Fatal(err)
	}
	if s := rec.named("blockdev-snapshot"); len(s) != 1 || s[0].Arguments["node"] != "disk0" || s[0].Arguments["overlay"] != node {
		t.Fatalf("blockdev-snapshot: %+v", s)
	}
	abort() // committed: nothing to undo
	if len(rec.named("blockdev-del")) != 0 {
		t.Fatal("abort after the commit closed the guest's disk")
	}
	if _, err := os.Stat(newTop); err != nil {
		t.Fatalf("abort after the commit removed the new top: %v", err)
	}

	// Not committed: the node goes, and its file.
	other := filepath.Join(dir, "other.qcow2")
	_, abort, err = m.PrepareFreeze(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	abort()
	if len(rec.named("blockdev-del")) != 1 {
		t.Fatal("abort did not close the node")
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Fatalf("abort left the file: %v", err)
	}
	// QEMU keeps the node (it may be the disk after all): the file stays.
	delFails = true
	_, abort, err = m.PrepareFreeze(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	abort()
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("abort removed a file QEMU still holds: %v", err)
	}

	// A top that is no file path is no backing file.
	topName = `json:{"driver": "qcow2"}`
	if _, _, err := m.PrepareFreeze(ctx, filepath.Join(dir, "third.qcow2")); err == nil || !strings.Contains(err.Error(), "not a file path") {
		t.Fatalf("json: top: %v", err)
	}
	// A QEMU that is gone holds nothing: its file goes.
	topName = top
	gone := filepath.Join(dir, "gone.qcow2")
	if _, abort, err = m.PrepareFreeze(ctx, gone); err != nil {
		t.Fatal(err)
	}
	m.qmp.Close()
	<-m.qmp.Done()
	abort()
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Fatalf("abort kept the file of a QEMU that is gone: %v", err)
	}
}

// Every save turns mapped-ram and multifd off on a QEMU that has them; one
// without them is not asked.
func TestSaveResetsMappedRAM(t *testing.T) {
	for _, c := range []struct {
		version string
		asked   bool
	}{{`{"qemu": {"major": 10, "minor": 0, "micro": 2}}`, true}, {`{"qemu": {"major": 7, "minor": 2, "micro": 22}}`, false}} {
		m, rec := fakeMachine(t, func(q qmpCall) string {
			if q.Execute == "query-version" {
				return qmpReturn(q, c.version)
			}
			return ""
		})
		if err := m.setFileMigration(context.Background(), false, 50); err != nil {
			t.Fatal(err)
		}
		var caps []string
		for _, call := range rec.named("migrate-set-capabilities") {
			b, _ := json.Marshal(call.Arguments)
			caps = append(caps, string(b))
		}
		got := strings.Join(caps, " ")
		mapped := strings.Contains(got, `{"capability":"mapped-ram","state":false}`) && strings.Contains(got, `{"capability":"multifd","state":false}`)
		if mapped != c.asked || strings.Contains(got, `"state":true`) {
			t.Errorf("QEMU %s: capabilities set %s", c.version, got)
		}
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// A live save whose guest dirties memory faster than it is written is made
// to finish: after convergeSyncs passes the downtime limit goes to QEMU's
// maximum. A stopped save is never touched.
func TestLiveSaveConverges(t *testing.T) {
	for _, live := range []bool{true, false} {
		var mu sync.Mutex
		syncs, forced, polls := 0, false, 0
		m, rec := fakeMachine(t, func(q qmpCall) string {
			mu.Lock()
			defer mu.Unlock()
			switch q.Execute {
			case "migrate-set-parameters":
				if d, ok := q.Arguments["downtime-limit"].(float64); ok && d == maxDowntimeMs {
					forced = true
				}
			case "query-migrate":
				polls++
				// The guest never converges by itself; the stopped save
				// completes after as many polls as the live one needs.
				if forced || (!live && polls > convergeSyncs+2) {
					return qmpReturn(q, `{"status": "completed", "ram": {"transferred": 4096}}`)
				}
				syncs++
				return qmpReturn(q, fmt.Sprintf(`{"status": "active", "ram": {"dirty-sync-count": %d}}`, syncs))
			}
			return ""
		})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		n, err := m.waitMigration(ctx, live)
		cancel()
		if err != nil || n != 4096 {
			t.Fatalf("live %v: %d bytes, %v", live, n, err)
		}
		raised := len(rec.named("migrate-set-parameters"))
		if live && (raised != 1 || syncs != convergeSyncs) {
			t.Fatalf("live save: downtime raised %d times, after %d passes", raised, syncs)
		}
		if !live && raised != 0 {
			t.Fatal("a stopped save's downtime limit was raised")
		}
	}
}
