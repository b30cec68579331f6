package server

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

// A suspended VM's saved state is reported in inspect and /metrics by the
// disk space its files take (the RAM file's holes take none); a running VM
// reports none.
func TestSuspendedStateFootprint(t *testing.T) {
	ts := newTestServer(t, nil)
	ctx := context.Background()
	v := &store.VM{ID: "vm2", Name: "sleepy", State: store.StateSuspended, CPUs: 1, MemoryMiB: 512, NetIndex: 2, CreatedAt: time.Now().UTC()}
	if err := ts.store.CreateVM(ctx, v); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(ts.dir, "vms", v.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "suspend.state")
	if err := os.WriteFile(state, make([]byte, 64<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	// A sparse RAM file: 64 MiB long, 128 KiB of it written.
	ram, err := os.Create(state + ".ram")
	if err != nil {
		t.Fatal(err)
	}
	ram.Truncate(64 << 20)
	ram.WriteAt(make([]byte, 128<<10), 32<<20)
	ram.Close()
	want := ts.svc.StateBytes(v)
	if want < (64+128)<<10 || want > 4<<20 {
		t.Fatalf("StateBytes = %d, want the allocated ~192 KiB, not the 64 MiB length", want)
	}

	var got api.VM
	resp := ts.do(t, "GET", "/v1/vms/sleepy", testAdmin)
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != 200 || got.StateBytes != want {
		t.Fatalf("inspect: %d, state_bytes %d, want %d", resp.StatusCode, got.StateBytes, want)
	}
	resp = ts.do(t, "GET", "/v1/vms/web", testAdmin)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(b), "state_bytes") {
		t.Fatalf("a running VM reports a saved state: %s", b)
	}

	resp = ts.do(t, "GET", "/metrics", testAdmin)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{
		`agentvm_vm_state_bytes{vm="vm2",name="sleepy"} ` + strconv.FormatInt(want, 10),
		"agentvm_suspended_state_bytes " + strconv.FormatInt(want, 10),
	} {
		if !strings.Contains(string(b), line+"\n") {
			t.Errorf("metrics lack %q:\n%s", line, b)
		}
	}
	if strings.Contains(string(b), `vm="vm1"`) {
		t.Errorf("metrics report a state for the running VM:\n%s", b)
	}
}
