package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestServeSFTPAs drives the in-agent SFTP server for a non-root user with
// pkg/sftp's client: files it creates belong to the user, the kernel refuses
// what the user may not do, and the agent's other threads keep root.
func TestServeSFTPAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (switches file-system credentials)")
	}
	home := userDir(t)
	u := &userInfo{Name: testUser, UID: testUID, GID: testUID, Home: home, Groups: []uint32{testUID}}
	cl, finish := sftpOverPipes(t, func(r io.Reader, w io.WriteCloser) error { return ServeSFTPAs(r, w, home, u, nil) })
	if wd, err := cl.Getwd(); err != nil || wd != home {
		t.Fatalf("getwd %q %v", wd, err)
	}
	data := randBytes(8 << 20)
	start := time.Now()
	f, err := cl.Create("up.bin") // relative: in the home directory
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFrom(bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	put := time.Since(start)
	p := filepath.Join(home, "up.bin")
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil || st.Uid != testUID || st.Gid != testUID {
		t.Fatalf("owner of an uploaded file: %d:%d %v", st.Uid, st.Gid, err)
	}
	if b, _ := os.ReadFile(p); !bytes.Equal(b, data) {
		t.Fatal("uploaded content differs")
	}
	g, err := cl.Open("up.bin")
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	g.WriteTo(&got)
	g.Close()
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("download: %d bytes", got.Len())
	}
	// setstat: mode, size, times (last: a truncate sets the mtime)
	mt := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := cl.Chmod("up.bin", 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cl.Truncate("up.bin", 10); err != nil {
		t.Fatal(err)
	}
	if err := cl.Chtimes("up.bin", mt, mt); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 || !fi.ModTime().Equal(mt) || fi.Size() != 10 {
		t.Fatalf("after setstat: %v %v %d %v", fi.Mode(), fi.ModTime(), fi.Size(), err)
	}
	// directories, renames, links, listing
	if err := cl.MkdirAll("a/b"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(home, "other"), []byte("x"), 0o644)
	if err := cl.Rename("up.bin", "other"); err == nil {
		t.Fatal("rename over an existing file succeeded")
	}
	if err := cl.PosixRename("up.bin", "a/b/moved"); err != nil {
		t.Fatal(err)
	}
	if err := cl.Symlink("a/b/moved", "ln"); err != nil {
		t.Fatal(err)
	}
	if target, err := cl.ReadLink("ln"); err != nil || target != "a/b/moved" {
		t.Fatalf("readlink %q %v", target, err)
	}
	if fi, err := cl.Lstat("ln"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("lstat: %v %v", fi, err)
	}
	if fis, err := cl.ReadDir("."); err != nil || len(fis) != 3 { // a, other, ln
		t.Fatalf("readdir: %d %v", len(fis), err)
	}
	if err := cl.Remove("ln"); err != nil {
		t.Fatal(err)
	}
	if err := cl.RemoveDirectory("a"); err == nil {
		t.Fatal("rmdir of a non-empty directory succeeded")
	}
	// the kernel enforces the user's permissions
	secret := filepath.Join(t.TempDir(), "secret")
	os.Chmod(filepath.Dir(secret), 0o755)
	os.WriteFile(secret, []byte("root only"), 0o600)
	if _, err := cl.Open(secret); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("open of a root-only file: %v", err)
	}
	if _, err := cl.Create(filepath.Join(filepath.Dir(secret), "new")); !errors.Is(err, os.ErrPermission) {
		t.Fatalf("create in a root-owned directory: %v", err)
	}
	if _, err := cl.Stat("/nonexistent/x"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a missing file: %v", err)
	}
	if vfs, err := cl.StatVFS("."); err != nil || vfs.Blocks == 0 || vfs.Namemax == 0 {
		t.Fatalf("statvfs: %+v %v", vfs, err)
	}
	if fsuid, _ := unix.SetfsuidRetUid(-1); fsuid != 0 {
		t.Fatalf("fsuid %d leaked to the test's thread", fsuid)
	}
	t.Logf("user sftp over pipes, 8 MiB: put %.0f MiB/s", 8/put.Seconds())
	finish()
}

func TestOpenPerm(t *testing.T) {
	be := func(v ...uint32) []byte {
		var b []byte
		for _, x := range v {
			b = binary.BigEndian.AppendUint32(b, x)
		}
		return b
	}
	for _, c := range []struct {
		attrs []byte
		want  os.FileMode
	}{
		{nil, 0o644},
		{be(0o100600), 0o600},          // OpenSSH put of a private key
		{be(0o100755), 0o755},          // an executable
		{be(0o100640, 1, 2), 0o640},    // put -p: permissions, atime, mtime
		{be(0, 0, 0), 0o600},           // a layout we cannot read
		{be(0, 4096), 0o600},           // size only
		{be(1, 2, 3, 4, 0o644), 0o600}, // everything: unknown layout
	} {
		if got := openPerm(c.attrs); got != c.want {
			t.Errorf("openPerm(%x) = %o, want %o", c.attrs, got, c.want)
		}
	}
}
