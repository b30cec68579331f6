package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRuntimeBase(t *testing.T) {
	if got := runtimeBase(1000, "/run/user/1000", "/tmp"); got != "/run/user/1000/agentvm" {
		t.Errorf("with XDG_RUNTIME_DIR: %s", got)
	}
	if got := runtimeBase(1000, "", "/tmp"); got != "/tmp/agentvm-1000" {
		t.Errorf("without XDG_RUNTIME_DIR: %s", got)
	}
	if isDir("/run") {
		if got := runtimeBase(0, "/run/user/1000", "/tmp"); got != "/run/agentvm" {
			t.Errorf("root: %s", got)
		}
	}
}

// The run directory must be ours and 0700: a directory someone else made
// first (at a predictable /tmp path) would hand them every VM socket.
func TestRunDirMustBePrivate(t *testing.T) {
	base := t.TempDir()
	fresh := filepath.Join(base, "fresh", "run")
	got, err := prepareRunDir(fresh, "")
	if err != nil || got != fresh {
		t.Fatalf("new run dir: %q %v", got, err)
	}
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("new run dir mode: %v %v", fi.Mode(), err)
	}
	if _, err := prepareRunDir(fresh, ""); err != nil {
		t.Fatalf("our own run dir again: %v", err)
	}

	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o700)
	os.Chmod(open, 0o777)
	if _, err := prepareRunDir(open, ""); err == nil || !strings.Contains(err.Error(), "0700") {
		t.Errorf("a 0777 run dir was accepted: %v", err)
	}

	link := filepath.Join(base, "link")
	os.Symlink(fresh, link)
	if _, err := prepareRunDir(link, ""); err == nil {
		t.Error("a symlinked run dir was accepted")
	}

	if err := checkPrivateDir(fresh, os.Geteuid()+1); err == nil || !strings.Contains(err.Error(), "belongs to uid") {
		t.Errorf("a run dir of another user was accepted: %v", err)
	}
	if os.Geteuid() == 0 {
		theirs := filepath.Join(base, "theirs")
		os.Mkdir(theirs, 0o700)
		if err := os.Chown(theirs, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := prepareRunDir(theirs, ""); err == nil {
			t.Error("a run dir owned by nobody was accepted")
		}
	}

	// the default: under $XDG_RUNTIME_DIR for a non-root user, base and
	// per-data-dir directory both checked
	if os.Geteuid() != 0 {
		xdg := t.TempDir()
		t.Setenv("XDG_RUNTIME_DIR", xdg)
		got, err := prepareRunDir("", filepath.Join(base, "data"))
		if err != nil || !strings.HasPrefix(got, filepath.Join(xdg, "agentvm")+"/") {
			t.Fatalf("default run dir: %q %v", got, err)
		}
		os.Chmod(filepath.Join(xdg, "agentvm"), 0o755)
		if _, err := prepareRunDir("", filepath.Join(base, "data")); err == nil {
			t.Error("a 0755 base was accepted")
		}
	}
}

// A non-root daemon upgraded with its QEMUs kept running finds their sockets
// in the run dir of the version before: it keeps that one while it is in
// use, private and ours.
func TestLegacyRunDirInUse(t *testing.T) {
	base := filepath.Join(t.TempDir(), "agentvm-1000")
	legacy := filepath.Join(base, "abc")
	current := filepath.Join(t.TempDir(), "agentvm", "abc")
	if runDirInUse(legacy, current) {
		t.Fatal("a missing legacy dir counted as in use")
	}
	os.MkdirAll(legacy, 0o700)
	if runDirInUse(legacy, current) {
		t.Fatal("an empty legacy dir counted as in use")
	}
	os.Mkdir(filepath.Join(legacy, "vm-1"), 0o700)
	if !runDirInUse(legacy, current) {
		t.Fatal("a legacy dir with VM sockets was not kept")
	}
	if runDirInUse(legacy, legacy) {
		t.Fatal("the current dir counted as a legacy one")
	}
	os.Chmod(base, 0o755)
	if runDirInUse(legacy, current) {
		t.Fatal("a legacy dir under a 0755 base was kept")
	}
}
