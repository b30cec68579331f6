package server

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// The run directory holds the VMs' unix sockets: QMP (full control of
// QEMU), the guest agent's channel (root in the guest) and the network
// stream. Whoever can create or rename entries in it can hijack all of
// them, so it must be ours and private, and its path short (a unix socket
// path has 108 bytes).

// RunDir is the default per-data-dir directory for unix sockets. It only
// computes the path; the server creates and checks it at start.
func RunDir(dataDir string) string {
	abs, _ := filepath.Abs(dataDir)
	return filepath.Join(runtimeBase(os.Geteuid(), os.Getenv("XDG_RUNTIME_DIR"), os.TempDir()), shortHash(abs))
}

// runtimeBase is the directory under which run directories live:
//   - root: /run/agentvm, since /run is root's own and not world-writable
//     (a root shell often carries another user's XDG_RUNTIME_DIR through
//     sudo -E; that user could swap entries of their own directory);
//   - others: $XDG_RUNTIME_DIR/agentvm, the per-user 0700 directory the
//     login manager makes;
//   - others without it (and root without /run): <tmp>/agentvm-<uid>. That name is predictable in a
//     world-writable directory, so another user may have made it first;
//     checkPrivateDir refuses it then.
func runtimeBase(euid int, xdgRuntimeDir, tmpDir string) string {
	switch {
	case euid == 0 && isDir("/run"):
		return "/run/agentvm"
	case xdgRuntimeDir != "":
		return filepath.Join(xdgRuntimeDir, "agentvm")
	default:
		return filepath.Join(tmpDir, "agentvm-"+strconv.Itoa(euid))
	}
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// prepareRunDir creates (0700) and checks the run directory: dir when the
// configuration names one, else RunDir(dataDir), whose base is checked too.
func prepareRunDir(dir, dataDir string) (string, error) {
	if legacy := legacyRunDir(dataDir); dir == "" && os.Geteuid() != 0 && runDirInUse(legacy, RunDir(dataDir)) {
		// QEMUs kept running by an agentvm from before XDG_RUNTIME_DIR was
		// honoured have their sockets there: keep using it until it empties.
		return legacy, nil
	}
	if dir == "" {
		dir = RunDir(dataDir)
		if err := ensurePrivateDir(filepath.Dir(dir)); err != nil {
			return "", err
		}
	} else if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", fmt.Errorf("run directory: %w", err)
	}
	if err := ensurePrivateDir(dir); err != nil {
		return "", err
	}
	return dir, nil
}

// ensurePrivateDir makes dir (mode 0700) unless it exists, then refuses it
// unless it is a real directory (not a symlink) owned by us with mode 0700.
func ensurePrivateDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	switch {
	case err == nil:
		// the umask may have taken bits off; put exactly 0700
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("run directory: %w", err)
		}
	case !errors.Is(err, fs.ErrExist):
		return fmt.Errorf("run directory: %w", err)
	}
	return checkPrivateDir(dir, os.Geteuid())
}

func checkPrivateDir(dir string, euid int) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("run directory %s is not a directory (a symlink or file someone else may control): remove it, or set XDG_RUNTIME_DIR", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != euid {
		return fmt.Errorf("run directory %s belongs to uid %d, not to this user (uid %d): someone else may have created it to intercept agentvm's sockets; remove it, or set XDG_RUNTIME_DIR", dir, st.Uid, euid)
	}
	if perm := fi.Mode().Perm(); perm != 0o700 {
		return fmt.Errorf("run directory %s has mode %#o, want 0700 (other users could reach agentvm's sockets): chmod 700 %s", dir, perm, dir)
	}
	return nil
}

// legacyRunDir is where agentvm versions before XDG_RUNTIME_DIR was honoured
// put a non-root daemon's sockets.
func legacyRunDir(dataDir string) string {
	abs, _ := filepath.Abs(dataDir)
	return filepath.Join(os.TempDir(), "agentvm-"+strconv.Itoa(os.Geteuid()), shortHash(abs))
}

// runDirInUse reports whether legacy differs from current, is private and
// ours (its base too), and holds VM socket dirs.
func runDirInUse(legacy, current string) bool {
	if legacy == current || checkPrivateDir(filepath.Dir(legacy), os.Geteuid()) != nil || checkPrivateDir(legacy, os.Geteuid()) != nil {
		return false
	}
	ents, err := os.ReadDir(legacy)
	return err == nil && len(ents) > 0
}
