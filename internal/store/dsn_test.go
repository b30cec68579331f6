package store

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestOpenDSN(t *testing.T) {
	dir := t.TempDir()
	for _, dsn := range []string{filepath.Join(dir, "plain.db"), "sqlite:" + filepath.Join(dir, "a.db"), "sqlite://" + filepath.Join(dir, "b.db")} {
		s, err := Open(dsn)
		if err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		if s.Backend() != "sqlite" {
			t.Fatalf("%s: backend %s", dsn, s.Backend())
		}
		s.Close()
	}
	for _, f := range []string{"plain.db", "a.db", "b.db"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("the database file: %v", err)
		}
	}
	for _, c := range []struct{ dsn, want string }{
		{"", "no database"},
		{"sqlite:", "no file path"},
		{"mysql://u:hunter2@db/agentvm", `unknown kind of database "mysql"`},
		{"postgres://u:hunter2@db:notaport/agentvm", "store postgres://u:xxxxx@"},
	} {
		_, err := Open(c.dsn)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("open %q: want an error with %q, got %v", c.dsn, c.want, err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("open %q: the error shows the password: %v", c.dsn, err)
		}
	}
}

// A server that is not there fails the open, in the connect timeout, with
// a message that names the database but not its password.
func TestOpenPostgresUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Port 1 on loopback: nothing listens there, the connection is refused.
	for _, dsn := range []string{
		"postgres://agentvm:hunter2@127.0.0.1:1/agentvm?connect_timeout=5",
		"postgresql://agentvm@127.0.0.1:1/agentvm?password=hunter2&connect_timeout=5",
	} {
		_, err := OpenContext(ctx, dsn)
		if err == nil || !strings.Contains(err.Error(), "cannot connect to PostgreSQL") || !strings.Contains(err.Error(), "127.0.0.1:1") {
			t.Fatalf("open %s: %v", Redact(dsn), err)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Fatalf("the error shows the password: %v", err)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/agentvm/agentvm.db":                   "/var/lib/agentvm/agentvm.db",
		"postgres://u:pw@h:5432/db?sslmode=disable":     "postgres://u:xxxxx@h:5432/db?sslmode=disable",
		"postgres://u@h/db?password=pw&sslmode=require": "postgres://u@h/db?password=xxxxx&sslmode=require",
		"postgres://h/db":                               "postgres://h/db",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
