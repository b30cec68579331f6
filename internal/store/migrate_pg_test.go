package store

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/pgtest"
)

func TestMigrationListsMatch(t *testing.T) {
	if len(pgMigrations) != len(migrations) {
		t.Fatalf("SQLite has %d schema steps, PostgreSQL %d: a step goes in both", len(migrations), len(pgMigrations))
	}
}

// Daemons opening one new database together migrate it once; reopening
// applies nothing and keeps the records; a database from a newer agentvm
// is refused.
func TestMigratePostgres(t *testing.T) {
	dsn := pgtest.Database(t)
	ctx := context.Background()
	const n = 6
	stores := make([]*Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); stores[i], errs[i] = Open(dsn) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d of %d together: %v", i, n, err)
		}
	}
	s := stores[0]
	for _, o := range stores[1:] {
		o.Close()
	}
	var version, rows int
	if err := s.db.QueryRow(`SELECT version FROM schema_version`).Scan(&version); err != nil || version != len(pgMigrations) {
		t.Fatalf("schema version %d (%v), want %d", version, err, len(pgMigrations))
	}
	s.db.QueryRow(`SELECT count(*) FROM schema_version`).Scan(&rows)
	if rows != 1 {
		t.Fatalf("%d schema_version rows", rows)
	}
	if err := s.CreateVM(ctx, &VM{ID: "vm1", Name: "web", State: "running", NetIndex: 1, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var state string
	s.db.QueryRow(`SELECT state FROM vms WHERE id='vm1'`).Scan(&state)
	if state != "running" {
		t.Fatalf("state column %q", state)
	}
	s.Close()

	if s, err := Open(dsn); err != nil {
		t.Fatal(err)
	} else {
		if v, err := s.GetVM(ctx, "web"); err != nil || v.ID != "vm1" {
			t.Fatalf("after reopening: %+v %v", v, err)
		}
		s.db.Exec(`UPDATE schema_version SET version = 99`)
		s.Close()
	}
	if _, err := Open(dsn); err == nil || !strings.Contains(err.Error(), "newer agentvm") {
		t.Fatalf("a newer database was opened: %v", err)
	}
}
