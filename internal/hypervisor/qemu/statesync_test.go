package qemu

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSyncState(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "suspend.state")
	if err := SyncState(path); err == nil {
		t.Fatal("synced a state that does not exist")
	}
	os.WriteFile(path, []byte("state"), 0o600)
	os.WriteFile(path+RAMSuffix, []byte("ram"), 0o600)
	if StateSynced(path) {
		t.Fatal("synced before SyncState")
	}
	if err := SyncState(path); err != nil {
		t.Fatal(err)
	}
	if !StateSynced(path) {
		t.Fatal("not synced after SyncState")
	}
	// A later save renamed over the path: the old marker does not count.
	os.WriteFile(path+".tmp", []byte("newer state"), 0o600)
	if err := RenameState(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	if StateSynced(path) {
		t.Fatal("an earlier state's marker counts for a new one")
	}
	SyncState(path) // a stream state: no RAM file
	if !StateSynced(path) {
		t.Fatal("stream-format state not synced")
	}
	RemoveState(path)
	if _, err := os.Stat(path + SyncedSuffix); err == nil {
		t.Fatal("RemoveState left the marker")
	}
	if BootID() == "" {
		t.Fatal("no boot id")
	}
}
