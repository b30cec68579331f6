package store

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/pgtest"
)

// A statement made while PostgreSQL is down waits for it (it was not
// done, so it is tried again) instead of failing; one that outlasts the
// retry budget says the database is unreachable.
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
	// Down for a second: statements wait for it, then go on.
	pg.Down()
	up := make(chan error, 1)
	go func() {
		time.Sleep(time.Second) // (not a deadline: how long the database is down)
		up <- pg.Up(ctx)
	}()
	if v, err := s.GetVM(ctx, "one"); err != nil || v.ID != "vm-1" {
		t.Fatalf("a read while the database is down: %+v %v", v, err)
	}
	if err := s.CreateVM(ctx, &VM{ID: "vm-2", Name: "two", State: StateRunning, CreatedAt: time.Now(), NetIndex: 2}); err != nil {
		t.Fatalf("a write while the database restarts: %v", err)
	}
	if err := <-up; err != nil {
		t.Fatal(err)
	}
	// Connections the server ended in its shutdown (the pool's idle ones)
	// are not statements lost: the next ones go on.
	if err := pg.Restart(ctx, 0); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := s.GetVM(ctx, "two"); err != nil {
			t.Fatalf("a read after a restart: %v", err)
		}
	}

	// Down for longer than the budget: the database is unreachable.
	s.SetRetryBudget(500 * time.Millisecond)
	pg.Down()
	_, err = s.GetVM(ctx, "one")
	if uerr := pg.Up(ctx); uerr != nil {
		t.Fatal(uerr)
	}
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("a read while the database is down for longer than the budget: %v", err)
	}
	if _, err := s.GetVM(ctx, "two"); err != nil {
		t.Fatalf("a read once the database is back: %v", err)
	}
}
