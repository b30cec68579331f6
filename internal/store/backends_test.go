package store

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/agentvm/agentvm/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	os.Exit(code)
}

// backends are the stores every test of the suite runs against: a SQLite
// file in the test's temp dir, and a fresh database on the PostgreSQL
// server the test process starts (pgtest).
var backends = []struct {
	name string
	dsn  func(t *testing.T) string
}{
	{"sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "agentvm.db") }},
	{"postgres", func(t *testing.T) string { return pgtest.Database(t) }},
}

// eachStore runs f as a subtest per backend, each with a new empty store.
func eachStore(t *testing.T, f func(t *testing.T, s *Store)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			s, err := Open(b.dsn(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if s.Backend() != b.name {
				t.Fatalf("opened a %s store for %s", s.Backend(), b.name)
			}
			f(t, s)
		})
	}
}
