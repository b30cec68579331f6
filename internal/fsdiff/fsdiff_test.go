package fsdiff

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, x := range tools {
		if _, err := exec.LookPath(x); err != nil {
			t.Skipf("no %s", x)
		}
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// image makes an ext4 file system of tree as a qcow2 file (over backing
// when it is set: then only the clusters that differ from it are written).
func image(t *testing.T, tree, out, backing string) {
	t.Helper()
	raw := out + ".raw"
	f, _ := os.Create(raw)
	f.Truncate(64 << 20)
	f.Close()
	run(t, "mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "root_owner=0:0", "-d", tree, raw)
	if backing == "" {
		run(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, out)
	} else {
		run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", backing, out, "64M")
		// Write only what differs: the overlay then holds the new file
		// system's changed clusters over the old one.
		run(t, "qemu-img", "convert", "-n", "-B", backing, "-F", "qcow2", "-f", "raw", "-O", "qcow2", raw, out)
	}
	os.Remove(raw)
}

func write(t *testing.T, root, p, content string) {
	t.Helper()
	full := filepath.Join(root, p)
	os.MkdirAll(filepath.Dir(full), 0o755)
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func openFS(t *testing.T, c *Chain) *FS {
	t.Helper()
	fs, err := OpenFS(c, c.Size())
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// Two file systems, the second an overlay of the first, compared with and
// without the fast path: the same added, changed and removed entries,
// text diffs that patch(1) applies, caches ignored.
func TestCompare(t *testing.T) {
	need(t, "mkfs.ext4", "qemu-img", "patch")
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	big := make([]byte, 3<<20)
	rand.Read(big)
	write(t, a, "etc/config", "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n")
	write(t, a, "etc/same", "unchanged\n")
	write(t, a, "gone/x", "x")
	write(t, a, "gone/deeper/y", "y")
	write(t, a, "mode.sh", "#!/bin/sh\n")
	write(t, a, "big.bin", string(big))
	write(t, a, "app/__pycache__/m.pyc", "cache")
	os.Symlink("etc/config", filepath.Join(a, "link"))
	run(t, "cp", "-a", a+"/.", b)
	write(t, b, "etc/config", "one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\nnine\nten\neleven\n")
	os.RemoveAll(filepath.Join(b, "gone"))
	write(t, b, "new/dir/file.txt", "hello\n")
	os.Chmod(filepath.Join(b, "mode.sh"), 0o755)
	big[2<<20] ^= 0xff
	write(t, b, "big.bin", string(big))
	later := time.Now().Add(time.Hour) // a change made later (the images keep whole seconds)
	os.Chtimes(filepath.Join(b, "big.bin"), later, later)
	write(t, b, "app/__pycache__/m.pyc", "cache changed")
	os.Remove(filepath.Join(b, "link"))
	os.Symlink("etc/same", filepath.Join(b, "link"))
	// The unchanged files keep their times in the copy.
	old := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, p := range []string{"etc/same"} {
		os.Chtimes(filepath.Join(a, p), old, old)
		os.Chtimes(filepath.Join(b, p), old, old)
	}
	ia, ib := filepath.Join(dir, "a.qcow2"), filepath.Join(dir, "b.qcow2")
	image(t, a, ia, "")
	image(t, b, ib, ia)

	chain, err := OpenChain(ib)
	if err != nil {
		t.Fatal(err)
	}
	defer chain.Close()
	if got := chain.Files(); len(got) != 2 || got[1] != ia {
		t.Fatalf("chain %v", got)
	}
	newer := openFS(t, chain)
	older := openFS(t, chain.Below(1))
	opts := Options{Ignore: []string{"/var/lib/apt/lists", "__pycache__", "node_modules/.cache"}, Diffs: true}
	fast, err := Compare(older, newer, chain, 1, opts)
	if err != nil {
		t.Fatal(err)
	}
	alone, err := OpenChain(ia)
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	slow, err := Compare(openFS(t, alone), newer, chain, -1, opts)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*Result{"fast": fast, "slow": slow} {
		paths := func(es []Entry) string {
			var s []string
			for _, e := range es {
				s = append(s, e.Path+":"+strings.Join(e.What, "+"))
			}
			return strings.Join(s, " ")
		}
		if got := paths(r.Added); got != "/new: /new/dir: /new/dir/file.txt:" {
			t.Errorf("%s: added %s", name, got)
		}
		if got := paths(r.Removed); got != "/gone: /gone/deeper: /gone/deeper/y: /gone/x:" {
			t.Errorf("%s: removed %s", name, got)
		}
		// Directories whose entries changed show as changed only when their
		// own mode or owner did: here none.
		want := "/big.bin:content /etc/config:content /link:target /mode.sh:mode"
		if got := paths(r.Changed); got != want {
			t.Errorf("%s: changed %s, want %s", name, got, want)
		}
		for _, e := range r.Changed {
			switch e.Path {
			case "/etc/config":
				// The diff applies to the old file and gives the new one.
				work := t.TempDir()
				write(t, work, "config", "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n")
				cmd := exec.Command("patch", "-s", filepath.Join(work, "config"))
				cmd.Stdin = strings.NewReader(e.Diff)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%s: patch: %v %s\n%s", name, err, out, e.Diff)
				}
				if got, _ := os.ReadFile(filepath.Join(work, "config")); string(got) != "one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\nnine\nten\neleven\n" {
					t.Fatalf("%s: patched %q\n%s", name, got, e.Diff)
				}
			case "/big.bin":
				if !e.Binary || e.Diff != "" || e.Size != 3<<20 {
					t.Errorf("%s: big.bin %+v", name, e)
				}
			case "/link":
				if e.Target != "etc/same" {
					t.Errorf("%s: link target %q", name, e.Target)
				}
			case "/mode.sh":
				if e.Mode&0o777 != 0o755 || e.OldMode&0o777 != 0o644 {
					t.Errorf("%s: modes %o %o", name, e.Mode, e.OldMode)
				}
			}
		}
		for _, e := range r.Added {
			if e.Path == "/new/dir/file.txt" && !strings.Contains(e.Diff, "--- /dev/null\n+++ b/new/dir/file.txt\n@@ -0,0 +1 @@\n+hello\n") {
				t.Errorf("%s: added file's diff %q", name, e.Diff)
			}
		}
	}
	if fast.Scanned == 0 {
		t.Fatal("nothing scanned")
	}
	// Without the ignore list, the cache shows.
	r, _ := Compare(older, newer, chain, 1, Options{})
	found := false
	for _, e := range r.Changed {
		found = found || e.Path == "/app/__pycache__/m.pyc"
	}
	if !found {
		t.Errorf("with no ignore list the cache change is missing: %+v", r.Changed)
	}
	// A bound on entries.
	r, _ = Compare(older, newer, chain, 1, Options{MaxEntries: 2})
	if !r.Truncated || len(r.Added)+len(r.Changed)+len(r.Removed) > 2 {
		t.Errorf("bounded compare: %+v", r)
	}
}

// A forged file system is an error, never a panic or a loop: random bytes
// over the superblock's neighbourhood, the group descriptors and the
// inode tables.
func TestHostileFS(t *testing.T) {
	need(t, "mkfs.ext4", "qemu-img")
	dir := t.TempDir()
	tree := filepath.Join(dir, "t")
	for i := 0; i < 50; i++ {
		write(t, tree, filepath.Join("d", string(rune('a'+i%26)), "f"), strings.Repeat("x", i*100))
	}
	img := filepath.Join(dir, "a.qcow2")
	image(t, tree, img, "")
	c, err := OpenChain(img)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	clean := make([]byte, 4<<20)
	c.ReadAt(clean, 0)
	for round := 0; round < 200; round++ {
		b := append([]byte(nil), clean...)
		junk := make([]byte, 64)
		for k := 0; k < 8; k++ {
			rand.Read(junk)
			var o [4]byte
			rand.Read(o[:])
			off := int(uint32(o[0])|uint32(o[1])<<8|uint32(o[2])<<16) % (len(b) - len(junk))
			if round%4 == 0 {
				off = 1024 + off%8192 // the superblock and descriptors
			}
			copy(b[off:], junk)
		}
		r := bytes.NewReader(b)
		done := make(chan struct{})
		go func() {
			defer close(done)
			fs, err := OpenFS(r, int64(len(b)))
			if err != nil {
				return
			}
			// Against the clean tree (size and time differ, so contents are
			// read), and against itself.
			cleanFS, err := OpenFS(bytes.NewReader(clean), int64(len(clean)))
			if err != nil {
				t.Error(err)
				return
			}
			Compare(cleanFS, fs, nil, -1, Options{Diffs: true, MaxEntries: 1000})
			Compare(fs, cleanFS, nil, -1, Options{Diffs: true, MaxEntries: 1000})
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: a forged file system kept the compare going", round)
		}
	}
}

// Forged structures aimed at the parser's arithmetic: an inode table at
// the end of the 64-bit block range, a descriptor table larger than the
// disk, and an extent tree whose child claims the depth of its parent.
func TestForgedStructures(t *testing.T) {
	need(t, "mkfs.ext4", "qemu-img")
	dir := t.TempDir()
	tree := filepath.Join(dir, "t")
	write(t, tree, "f", strings.Repeat("data", 5000))
	img := filepath.Join(dir, "a.qcow2")
	image(t, tree, img, "")
	c, err := OpenChain(img)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	clean := make([]byte, c.Size())
	c.ReadAt(clean, 0)
	sb := func(b []byte) []byte { return b[1024:2048] }
	// try compares the forged tree with the clean one and returns what
	// Compare said (an error, or the entry of /f).
	try := func(name string, b []byte) (string, error) {
		t.Helper()
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("%s: panic %v", name, p)
			}
		}()
		fs, err := OpenFS(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return "", err
		}
		cleanFS, _ := OpenFS(bytes.NewReader(clean), int64(len(clean)))
		r, err := Compare(cleanFS, fs, nil, -1, Options{Diffs: true})
		if err != nil {
			return "", err
		}
		for _, e := range r.Changed {
			if e.Path == "/f" {
				return e.DiffNote, nil
			}
		}
		return "", nil
	}
	// 64-bit descriptors with the first group's inode table at 2^64-1.
	b := append([]byte(nil), clean...)
	le.PutUint32(sb(b)[96:], le.Uint32(sb(b)[96:])|featIncomp64bit)
	le.PutUint16(sb(b)[254:], 64)
	gdt := b[4096:] // block 1 of a 4 KiB-block file system
	le.PutUint32(gdt[8:], 0xFFFFFFFF)
	le.PutUint32(gdt[0x28:], 0xFFFFFFFF)
	if _, err := try("inode table at the end of the block range", b); err == nil || !strings.Contains(err.Error(), "past the disk") {
		t.Errorf("an inode table at the end of the block range: %v", err)
	}
	// Descriptors larger than the disk.
	b = append([]byte(nil), clean...)
	le.PutUint32(sb(b)[96:], le.Uint32(sb(b)[96:])|featIncomp64bit)
	le.PutUint16(sb(b)[254:], 1024)
	le.PutUint32(sb(b)[0:], 1<<30)
	if _, err := OpenFS(bytes.NewReader(b), int64(len(b))); err == nil {
		t.Error("a descriptor table larger than the disk was read")
	}
	// The file's extent root says depth 1 and points at a node that also
	// says depth 1 (a cycle through itself).
	fs, _ := OpenFS(bytes.NewReader(clean), int64(len(clean)))
	root, _ := fs.Inode(rootInode)
	ents, _ := fs.ReadDir(root)
	var f *Inode
	for _, e := range ents {
		if e.Name == "f" {
			f, _ = fs.Inode(e.Inode)
		}
	}
	if f == nil {
		t.Fatal("no f")
	}
	b = append([]byte(nil), clean...)
	last := uint32(len(b)/4096 - 1) // a block the files do not use
	ib := b[f.Off+0x28:]
	le.PutUint16(ib[2:], 1) // one entry
	le.PutUint16(ib[6:], 1) // depth 1: an index
	le.PutUint32(ib[12+4:], last)
	le.PutUint16(ib[12+8:], 0)
	le.PutUint32(b[f.Off+4:], 20001) // another size: the content is read
	node := b[int64(last)*4096:]
	le.PutUint16(node[0:], extentMagic)
	le.PutUint16(node[2:], 1)
	le.PutUint16(node[6:], 1) // claims depth 1 again
	le.PutUint32(node[12+4:], last)
	if note, err := try("an extent node of its parent's depth", b); (err == nil) == (note == "") || !strings.Contains(note+fmt.Sprint(err), "extent node of depth 1") {
		t.Errorf("an extent node of its parent's depth: %q %v", note, err)
	}
}

func TestUnified(t *testing.T) {
	need(t, "patch")
	cases := [][2]string{
		{"", "a\n"},
		{"a\n", ""},
		{"a\nb\nc\n", "a\nc\n"},
		{"no newline", "no newline\nnow\n"},
		{strings.Repeat("x\n", 50) + "mid\n" + strings.Repeat("y\n", 50), strings.Repeat("x\n", 50) + "MID\n" + strings.Repeat("y\n", 49) + "z\n"},
	}
	for i, c := range cases {
		d := Unified("a/f", "b/f", c[0], c[1])
		work := t.TempDir()
		write(t, work, "f", c[0])
		cmd := exec.Command("patch", "-s", filepath.Join(work, "f"))
		cmd.Stdin = strings.NewReader(d)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("case %d: patch: %v %s\n%s", i, err, out, d)
		}
		if got, _ := os.ReadFile(filepath.Join(work, "f")); string(got) != c[1] {
			t.Fatalf("case %d: patched %q, want %q\n%s", i, got, c[1], d)
		}
	}
}
