package store

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/pgtest"
)

// A statement made while PostgreSQL restarts waits for it (it failed
// before it was sent, so it is tried again) instead of failing; one that
// outlasts retryBudget says the database is unreachable.
func TestRetryAcrossRestart(t *testing.T) {
	if os.Getenv(pgtest.SkipEnv) == "1" {
		t.Skip(pgtest.SkipEnv + "=1")
	}
	pg := pgtest.StartT(t) // its own server: the shared one serves other tests
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := OpenContext(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateVM(ctx, &VM{ID: "vm-1", Name: "one", State: StateRunning, CreatedAt: time.Now(), NetIndex: 1}); err != nil {
		t.Fatal(err)
	}
	restarted := make(chan error, 1)
	go func() { restarted <- pg.Restart(ctx, time.Second) }()
	time.Sleep(200 * time.Millisecond) // (not a deadline: lands the statements in the restart)
	if v, err := s.GetVM(ctx, "one"); err != nil || v.ID != "vm-1" {
		t.Fatalf("a read while the database restarts: %+v %v", v, err)
	}
	if err := s.CreateVM(ctx, &VM{ID: "vm-2", Name: "two", State: StateRunning, CreatedAt: time.Now(), NetIndex: 2}); err != nil {
		t.Fatalf("a write while the database restarts: %v", err)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}

	s.retryFor = time.Second
	go func() { restarted <- pg.Restart(ctx, 5*time.Second) }()
	time.Sleep(200 * time.Millisecond)
	if _, err := s.GetVM(ctx, "one"); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a read while the database is down for longer than the budget: %v", err)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetVM(ctx, "two"); err != nil {
		t.Fatalf("a read once the database is back: %v", err)
	}
}
