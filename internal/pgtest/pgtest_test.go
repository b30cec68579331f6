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

// A restart ends the open connections; the data stays, and new
// connections are served again.
func TestRestart(t *testing.T) {
	if os.Getenv(SkipEnv) == "1" {
		t.Skip(SkipEnv + "=1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	dsn, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db, _ := sql.Open("pgx", dsn)
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	if err := srv.Restart(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := conn.PingContext(ctx); err == nil {
		t.Fatal("a connection from before the restart still answers")
	}
	conn.Close()
	var v int
	if err := db.QueryRowContext(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != 7 {
		t.Fatalf("after the restart: %d %v", v, err)
	}
}
