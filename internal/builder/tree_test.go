package builder

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

type tarEntry struct {
	hdr  tar.Header
	body string
}

func entriesTar(t *testing.T, entries ...tarEntry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return &buf
}

func TestExtractTree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tree")
	in := entriesTar(t,
		tarEntry{hdr: tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}},
		tarEntry{hdr: tar.Header{Name: "./usr/", Typeflag: tar.TypeDir, Mode: 0o755}},
		tarEntry{hdr: tar.Header{Name: "./usr/bin/", Typeflag: tar.TypeDir, Mode: 0o555}},
		tarEntry{hdr: tar.Header{Name: "./usr/bin/su", Typeflag: tar.TypeReg, Mode: 0o4755}, body: "su"},
		tarEntry{hdr: tar.Header{Name: "./usr/bin/ping", Typeflag: tar.TypeReg, Mode: 0o755, Uid: 7, Gid: 8,
			PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}}, body: "ping"},
		tarEntry{hdr: tar.Header{Name: "./bin", Typeflag: tar.TypeSymlink, Linkname: "usr/bin"}},
		tarEntry{hdr: tar.Header{Name: "./etc/", Typeflag: tar.TypeDir, Mode: 0o755}},
		tarEntry{hdr: tar.Header{Name: "./etc/abs", Typeflag: tar.TypeSymlink, Linkname: "/etc/shadow"}},
		tarEntry{hdr: tar.Header{Name: "./usr/bin/su2", Typeflag: tar.TypeLink, Linkname: "./usr/bin/su"}},
		tarEntry{hdr: tar.Header{Name: "./etc/fifo", Typeflag: tar.TypeFifo, Mode: 0o600}},
		tarEntry{hdr: tar.Header{Name: "./etc/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}},
	)
	if err := extractTree(context.Background(), in, dir, 1<<20); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "usr/bin/su"))
	if err != nil || st.Mode()&os.ModeSetuid == 0 || st.Mode().Perm() != 0o755 {
		t.Fatalf("su: %v %v (want setuid 0755)", st.Mode(), err)
	}
	if st, _ := os.Stat(filepath.Join(dir, "usr/bin")); st.Mode().Perm() != 0o555 {
		t.Fatalf("usr/bin mode %v, want its own 0555 (applied last)", st.Mode())
	}
	var sys syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "usr/bin/ping"), &sys); err != nil || sys.Uid != 7 || sys.Gid != 8 {
		t.Fatalf("ping owner %d:%d %v, want 7:8", sys.Uid, sys.Gid, err)
	}
	buf := make([]byte, 64)
	if n, err := syscall.Getxattr(filepath.Join(dir, "usr/bin/ping"), "security.capability", buf); err != nil || n != 20 {
		t.Fatalf("ping's capability: %d bytes, %v", n, err)
	}
	if l, err := os.Readlink(filepath.Join(dir, "etc/abs")); err != nil || l != "/etc/shadow" {
		t.Fatalf("a symlink is kept as written: %q %v", l, err)
	}
	var a, b syscall.Stat_t
	syscall.Stat(filepath.Join(dir, "usr/bin/su"), &a)
	syscall.Stat(filepath.Join(dir, "usr/bin/su2"), &b)
	if a.Ino != b.Ino {
		t.Fatal("the hard link is not one")
	}
	if st, err := os.Lstat(filepath.Join(dir, "etc/fifo")); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("fifo: %v %v", st, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "etc/null")); !os.IsNotExist(err) {
		t.Fatalf("a device node was made: %v", err)
	}
}

// TestExtractTreeHostile: a tree from a VM cannot write outside its
// directory or past its size.
func TestExtractTreeHostile(t *testing.T) {
	outside := t.TempDir()
	for name, c := range map[string]struct {
		entries []tarEntry
		want    string
	}{
		"dotdot":   {[]tarEntry{{hdr: tar.Header{Name: "../x", Typeflag: tar.TypeReg}, body: "x"}}, "leaves the tree"},
		"absolute": {[]tarEntry{{hdr: tar.Header{Name: "/etc/x", Typeflag: tar.TypeReg}, body: "x"}}, "leaves the tree"},
		"through a symlink": {[]tarEntry{
			{hdr: tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: outside}},
			{hdr: tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644}, body: "x"},
		}, "out/x"},
		"through a relative symlink": {[]tarEntry{
			{hdr: tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "../../../../../../../../" + outside}},
			{hdr: tar.Header{Name: "out/x", Typeflag: tar.TypeReg, Mode: 0o644}, body: "x"},
		}, "out/x"},
		"over a symlink": {[]tarEntry{
			{hdr: tar.Header{Name: "f", Typeflag: tar.TypeSymlink, Linkname: outside + "/x"}},
			{hdr: tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644}, body: "x"},
		}, "/f"},
		"a long name": {[]tarEntry{{hdr: tar.Header{Name: strings.Repeat("d/", 2100) + "f", Typeflag: tar.TypeReg, Mode: 0o644}, body: "x"}}, "longer than 4096"},
		"too deep":    {[]tarEntry{{hdr: tar.Header{Name: strings.Repeat("d/", 300) + "f", Typeflag: tar.TypeReg, Mode: 0o644}, body: "x"}}, "directories deep"},
		"names add up": {[]tarEntry{
			{hdr: tar.Header{Name: "a", Typeflag: tar.TypeDir, Mode: 0o755}},
			{hdr: tar.Header{Name: "b", Typeflag: tar.TypeDir, Mode: 0o755}},
			{hdr: tar.Header{Name: "c", Typeflag: tar.TypeDir, Mode: 0o755}},
			{hdr: tar.Header{Name: "d", Typeflag: tar.TypeDir, Mode: 0o755}},
			{hdr: tar.Header{Name: "e", Typeflag: tar.TypeDir, Mode: 0o755}},
		}, "larger than its disk"},
		"hard link out": {[]tarEntry{{hdr: tar.Header{Name: "l", Typeflag: tar.TypeLink, Linkname: "../../../../etc/passwd"}}}, "out of the tree"},
		"twice": {[]tarEntry{
			{hdr: tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644}, body: "x"},
			{hdr: tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644}, body: "y"},
		}, "/f"},
		"too big": {[]tarEntry{{hdr: tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644}, body: strings.Repeat("x", 4096)}}, "larger than its disk"},
	} {
		t.Run(name, func(t *testing.T) {
			err := extractTree(context.Background(), entriesTar(t, c.entries...), filepath.Join(t.TempDir(), "tree"), 2048)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("written outside: %v", ents)
			}
		})
	}
}
