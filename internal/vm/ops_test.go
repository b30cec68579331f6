package vm

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

// A user-requested operation that succeeds is recorded once, with who asked
// and how long it took; failures, no-ops and internal calls are not.
func TestOperationsRecordThemselves(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "agentvm.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := &Service{store: st, cfg: Config{DataDir: t.TempDir(), RunDir: t.TempDir()}, log: slog.Default()}
	s.journal = &journal{store: st, log: s.log, logPath: func(id string) string { return s.paths(id).Log }}
	var samples []string
	s.OnOp(func(op string, took time.Duration) { samples = append(samples, op) })

	user := WithActor(context.Background(), "token:tok_1")
	ok := func() (*OpResult, error) { return &OpResult{VM: &store.VM{ID: "vm1"}}, nil }
	if _, err := record(s, user, opPause, ok, opVM); err != nil {
		t.Fatal(err)
	}
	record(s, user, opResume, func() (*OpResult, error) { return nil, errors.New("no") }, opVM)
	record(s, user, opSuspend, ok, func(*OpResult) (string, string) { return "", "" }) // did nothing
	record(s, context.Background(), opStop, ok, opVM)                                  // the daemon's own

	es, err := st.ListEvents(context.Background(), "vm1", 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Actor != "token:tok_1" || es[0].Type != "lifecycle" || es[0].Data["op"] != "pause" {
		t.Fatalf("events: %+v", es)
	}
	if len(samples) != 1 || samples[0] != "pause" {
		t.Fatalf("latency samples: %v", samples)
	}
}

// The service's writes outlive a caller that hung up.
func TestWritesOutliveTheCaller(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "agentvm.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	d := durable{st}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v := &store.VM{ID: "vm1", Name: "web", State: "running", NetIndex: 1, CreatedAt: time.Now()}
	if err := d.CreateVM(ctx, v); err != nil {
		t.Fatalf("create with a cancelled context: %v", err)
	}
	v.State = "stopped"
	if err := d.UpdateVM(ctx, v); err != nil {
		t.Fatalf("update with a cancelled context: %v", err)
	}
	if got, err := st.GetVM(context.Background(), "vm1"); err != nil || got.State != "stopped" {
		t.Fatalf("record: %+v %v", got, err)
	}
}
