package e2e

import (
	"context"
	"database/sql"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/internal/pgtest"
)

// The daemon on a PostgreSQL store (a real server from Debian's package):
// a VM is created, runs a command, survives a restart of the daemon and is
// deleted, its record and events kept in PostgreSQL and nothing in a SQLite
// file; the URL's password is never logged.
func TestPostgresStore(t *testing.T) {
	t.Parallel()
	testenv.Require(t)
	pg := pgtest.StartT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dsn, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// The socket trusts its users: the password is never asked for, but it
	// is in the URL the daemon gets, which must not show it.
	const password = "pw-never-logged"
	u, _ := url.Parse(dsn)
	u.User = url.UserPassword(u.User.Username(), password)

	s := testenv.Start(t, "", "--store", u.String())
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "pg1"})
	if r := s.Exec(ctx, v.ID, "echo hello from $(hostname)"); r.ExitCode != 0 || !strings.Contains(r.Stdout, "hello from") {
		t.Fatalf("exec: %+v", r)
	}
	var name, state string
	if err := db.QueryRowContext(ctx, `SELECT name, state FROM vms WHERE id = $1`, v.ID).Scan(&name, &state); err != nil || name != "pg1" || state != "running" {
		t.Fatalf("the VM's row in PostgreSQL: %q %q %v", name, state, err)
	}
	var events int
	db.QueryRowContext(ctx, `SELECT count(*) FROM events WHERE vm_id = $1`, v.ID).Scan(&events)
	if events == 0 {
		t.Fatal("no event of the VM in PostgreSQL")
	}
	// A restarted daemon finds its VM in PostgreSQL: suspended at the
	// stop, woken at the start with what it held in memory.
	s.Exec(ctx, v.ID, "echo kept > /dev/shm/mark")
	s.Terminate()
	s.Restart()
	// The wake runs in the background after the start.
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		got, err := s.Client.GetVM(ctx, "pg1")
		if err == nil && got.ID == v.ID && got.State == api.StateRunning {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("after a restart: %+v %v", got, err)
		}
	}
	if r := s.Exec(ctx, v.ID, "cat /dev/shm/mark"); strings.TrimSpace(r.Stdout) != "kept" {
		t.Fatalf("memory after a restart: %+v", r)
	}
	// A second daemon (another data dir) on the same database is refused:
	// it would take the first one's VMs for its own crashed ones.
	cmd := exec.Command(filepath.Join(testenv.Binaries(t), "agentvm"), "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
		"--no-warm", "--ssh-listen", "", "--proxy-listen", "", "--store", u.String())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "belongs to another agentvm") || strings.Contains(string(out), password) {
		t.Fatalf("a second daemon on the same database: %v\n%s", err, out)
	}
	if r := s.Exec(ctx, v.ID, "true"); r.ExitCode != 0 {
		t.Fatalf("the first daemon after the second was refused: %+v", r)
	}
	if err := s.Client.DeleteVM(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	var left int
	db.QueryRowContext(ctx, `SELECT count(*) FROM vms`).Scan(&left)
	if left != 0 {
		t.Fatalf("%d VM rows after the delete", left)
	}
	if _, err := os.Stat(filepath.Join(s.DataDir, "agentvm.db")); err == nil {
		t.Fatal("a SQLite database was made beside the PostgreSQL store")
	}
	logs := s.Logs()
	if !strings.Contains(logs, "backend=postgres") {
		t.Fatalf("the start-up log names no PostgreSQL store:\n%s", logs)
	}
	if strings.Contains(logs, password) {
		t.Fatal("the server log shows the store's password")
	}
}

// An unreachable database stops the start-up with an error that names the
// database (without its password) and exits non-zero.
func TestPostgresStoreUnreachable(t *testing.T) {
	t.Parallel()
	testenv.Require(t)
	bin := testenv.Binaries(t)
	const password = "pw-never-shown"
	cmd := exec.Command(filepath.Join(bin, "agentvm"), "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
		"--no-warm", "--ssh-listen", "", "--proxy-listen", "",
		"--store", "postgres://agentvm:"+password+"@127.0.0.1:1/agentvm?connect_timeout=5")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("serve started on an unreachable database:\n%s", out)
	}
	if !strings.Contains(string(out), "cannot connect to PostgreSQL") || !strings.Contains(string(out), "127.0.0.1:1") {
		t.Fatalf("unclear start-up error:\n%s", out)
	}
	if strings.Contains(string(out), password) {
		t.Fatalf("the error shows the password:\n%s", out)
	}
}
