package pgtest

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Without PostgreSQL's programs the error says what to do.
func TestBinDirMissing(t *testing.T) {
	saved := binGlob
	binGlob = filepath.Join(t.TempDir(), "*", "bin")
	defer func() { binGlob = saved }()
	if _, err := BinDir(); err == nil || !strings.Contains(err.Error(), "scripts/setup.sh") || !strings.Contains(err.Error(), SkipEnv) {
		t.Fatalf("BinDir without PostgreSQL: %v", err)
	}
}

// A server starts, gives out separate databases, and leaves nothing once stopped.
func TestStartStop(t *testing.T) {
	if os.Getenv(SkipEnv) == "1" {
		t.Skip(SkipEnv + "=1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, err := srv.NewDatabase(ctx)
	if err != nil {
		srv.Stop()
		t.Fatal(err)
	}
	b, _ := srv.NewDatabase(ctx)
	if a == b {
		srv.Stop()
		t.Fatalf("the same database twice: %s", a)
	}
	db, _ := sql.Open("pgx", a)
	var name string
	err = db.QueryRowContext(ctx, `SELECT current_database()`).Scan(&name)
	db.Close()
	srv.Stop()
	if err != nil || !strings.HasSuffix(a, "/"+name+"?host="+strings.ReplaceAll(srv.sock, "/", "%2F")) {
		t.Fatalf("connected to %q (%v) through %s", name, err, a)
	}
	if _, err := os.Stat(srv.dir); !os.IsNotExist(err) {
		t.Fatalf("the server's directory is left: %v", err)
	}
}
