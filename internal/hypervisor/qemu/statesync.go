package qemu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// SyncedSuffix names the marker SyncState leaves once a state is on disk.
const SyncedSuffix = ".synced"

// SyncState makes the state at path durable (its RAM file, the state file
// and their directory), then writes path+SyncedSuffix naming the state
// file's inode. Saves do not wait for this (a suspend would take as long
// as the disk needs to write the guest's RAM): the daemon runs it after
// them, and a state whose host rebooted before its marker was written may
// have lost writes (StateSynced).
func SyncState(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return err
	}
	for _, p := range []string{path + RAMSuffix, path} {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) && p != path {
			continue // a stream-format state has no RAM file
		}
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("sync %s: %w", p, err)
		}
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return err
	}
	// The marker names the inode: a marker left by an earlier state at this
	// path (a later save renamed a new file over it) does not match.
	if err := os.WriteFile(path+SyncedSuffix, []byte(strconv.FormatUint(st.Ino, 10)+"\n"), 0o600); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// StateSynced reports whether SyncState finished for the state now at path.
func StateSynced(path string) bool {
	b, err := os.ReadFile(path + SyncedSuffix)
	if err != nil {
		return false
	}
	var st unix.Stat_t
	return unix.Stat(path, &st) == nil && strings.TrimSpace(string(b)) == strconv.FormatUint(st.Ino, 10)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// BootID is this host's boot id (/proc/sys/kernel/random/boot_id), "" if
// unreadable: a state saved under another boot id and never synced may
// have lost writes in a host crash.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
