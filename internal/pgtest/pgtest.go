// Package pgtest runs a throwaway PostgreSQL server (Debian's postgresql
// package, a data dir of its own, a unix socket only) for the tests of the
// store and of the daemon: one server per test process, one fresh database
// per test.
package pgtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// SkipEnv, when set to 1, makes Database skip its test instead of failing
// where PostgreSQL is not installed.
const SkipEnv = "AGENTVM_TEST_NO_POSTGRES"

// superuser is the role initdb makes; trust authentication on the socket.
const superuser = "agentvm"

// Server is one running postgres process.
type Server struct {
	dir   string // data dir, socket and log live under it
	sock  string
	bin   string
	cred  *syscall.Credential
	cmd   *exec.Cmd
	done  chan struct{} // closed when cmd has exited
	admin *sql.DB

	mu sync.Mutex
	n  int
}

// binGlob is where Debian's postgresql package puts each version's programs.
var binGlob = "/usr/lib/postgresql/*/bin"

// BinDir returns the newest /usr/lib/postgresql/<version>/bin that has
// initdb and postgres.
func BinDir() (string, error) {
	dirs, _ := filepath.Glob(binGlob)
	var ok []string
	for _, d := range dirs {
		if fileExists(filepath.Join(d, "initdb")) && fileExists(filepath.Join(d, "postgres")) {
			ok = append(ok, d)
		}
	}
	if len(ok) == 0 {
		return "", errors.New("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): run scripts/setup.sh, or set " + SkipEnv + "=1 to skip the PostgreSQL half of the tests")
	}
	version := func(d string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return v
	}
	sort.Slice(ok, func(i, j int) bool { return version(ok[i]) > version(ok[j]) })
	return ok[0], nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// runAs is who runs postgres: postgres refuses to run as root, so as root
// it is the postgres system user (or nobody).
func runAs() (*syscall.Credential, error) {
	if os.Getuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 == nil && err2 == nil {
			return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
		}
	}
	return nil, errors.New("running as root and there is no postgres or nobody user to run PostgreSQL as")
}

// Start initialises a data dir in a new temporary directory and starts
// postgres on a unix socket there. Stop ends it and removes the directory.
func Start(ctx context.Context) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	// /tmp, not $TMPDIR: the postgres user must reach it, and a socket's
	// path must stay short.
	dir, err := os.MkdirTemp("/tmp", "agentvm-pg-")
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	s := &Server{dir: dir, sock: dir, done: make(chan struct{})}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", superuser, "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	s.bin, s.cred = bin, cred
	if err := s.launch(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if s.admin, err = sql.Open("pgx", s.DSN("postgres")); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// launch starts postgres on the data dir (made by initdb).
func (s *Server) launch() error {
	logf, err := os.OpenFile(filepath.Join(s.dir, "postgres.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	// No TCP listener; durability is not wanted of a test database.
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", filepath.Join(s.dir, "data"), "-k", s.sock,
		"-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off",
		"-c", "full_page_writes=off", "-c", "max_connections=200")
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Pdeathsig: a test process that dies takes its postgres with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	return nil
}

// Restart shuts postgres down (fast: open connections are ended, as in a
// real restart), leaves it down for the given time, and starts it again on
// the same data and socket; it returns once it accepts connections.
func (s *Server) Restart(ctx context.Context, down time.Duration) error {
	s.Down()
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Up(ctx)
}

// Down shuts postgres down (fast), keeping its data for Up.
func (s *Server) Down() { s.shutdown() }

// Up starts postgres again after Down and returns once it accepts
// connections.
func (s *Server) Up(ctx context.Context) error {
	if err := s.launch(); err != nil {
		return err
	}
	return s.waitReady(ctx)
}

// shutdown ends postgres: a fast shutdown, then a kill.
func (s *Server) shutdown() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.Thaw() // a frozen server cannot shut down
	s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
}

func (s *Server) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.admin.PingContext(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("postgres exited at start:\n%s", s.Log())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres did not accept connections in 2 minutes (%v):\n%s", err, s.Log())
		}
	}
}

// Log returns the end of the server's log.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// DSN is the URL of database db on this server.
func (s *Server) DSN(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(superuser), Path: "/" + db, RawQuery: "host=" + url.QueryEscape(s.sock)}
	return u.String()
}

// NewDatabase creates an empty database and returns its URL.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	s.mu.Lock()
	s.n++
	name := fmt.Sprintf("test_%d", s.n)
	s.mu.Unlock()
	// name is ours: digits and a prefix.
	if _, err := s.admin.ExecContext(ctx, `CREATE DATABASE `+name); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return s.DSN(name), nil
}

// Freeze stops every postgres process (SIGSTOP to the postmaster and
// each of its descendants, which run in sessions of their own):
// connections stay open and queries hang, as across a network partition.
// Thaw lets them go on.
func (s *Server) Freeze() error { return s.signalAll(syscall.SIGSTOP) }

// Thaw continues a frozen server.
func (s *Server) Thaw() error { return s.signalAll(syscall.SIGCONT) }

// signalAll sends sig to the postmaster, then to its descendants.
func (s *Server) signalAll(sig syscall.Signal) error {
	root := s.cmd.Process.Pid
	if err := syscall.Kill(root, sig); err != nil {
		return err
	}
	children := map[int][]int{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	for todo := children[root]; len(todo) > 0; {
		pid := todo[0]
		todo = append(todo[1:], children[pid]...)
		syscall.Kill(pid, sig)
	}
	return nil
}

// Stop ends postgres (fast shutdown, then a kill) and removes its directory.
func (s *Server) Stop() {
	if s.admin != nil {
		s.admin.Close()
	}
	s.shutdown()
	os.RemoveAll(s.dir)
}

var (
	shared    *Server
	sharedErr error
	sharedMu  sync.Mutex
)

// Database returns the URL of a fresh database on the test process's
// server, started on first use (StopShared, from TestMain, stops it). Where
// PostgreSQL is missing the test fails saying to run scripts/setup.sh,
// unless AGENTVM_TEST_NO_POSTGRES=1 skips it.
func Database(t testing.TB) string {
	t.Helper()
	if os.Getenv(SkipEnv) == "1" {
		t.Skip(SkipEnv + "=1: the PostgreSQL half is skipped")
	}
	sharedMu.Lock()
	if shared == nil && sharedErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		shared, sharedErr = Start(ctx)
		cancel()
	}
	srv, err := shared, sharedErr
	sharedMu.Unlock()
	if err != nil {
		t.Fatalf("PostgreSQL for the tests: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// StartT starts a server of the test's own, stopped at its end, with
// Database's rules for a missing PostgreSQL.
func StartT(t testing.TB) *Server {
	t.Helper()
	if os.Getenv(SkipEnv) == "1" {
		t.Skip(SkipEnv + "=1: the PostgreSQL tests are skipped")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := Start(ctx)
	if err != nil {
		t.Fatalf("PostgreSQL for the test: %v", err)
	}
	t.Cleanup(srv.Stop)
	return srv
}

// StopShared stops the server Database started, if any.
func StopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		shared.Stop()
		shared = nil
	}
}
