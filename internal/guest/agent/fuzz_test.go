package agent

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"

	"github.com/agentvm/agentvm/internal/guest"
)

// Limits of one fuzz input, so that an input stays a few milliseconds of work.
const (
	fuzzTarMaxInput = 64 << 10
	fuzzTarMaxData  = 256 << 10 // logical sizes: a sparse entry can claim much more than it carries
)

// tarBytes is an archive of hdrs; a regular entry's body is its name.
func tarBytes(hdrs ...*tar.Header) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Name))
		}
		if err := tw.WriteHeader(h); err != nil {
			panic(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, h.Name)
		}
	}
	tw.Close()
	return b.Bytes()
}

// treeState records every entry below root (not following symlinks) with
// its metadata and content, except the subtree skip.
func treeState(t *testing.T, root, skip string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == skip {
			return filepath.SkipDir
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("mode %o uid %d gid %d nlink %d size %d ino %d mtime %d ctime %d",
			st.Mode, st.Uid, st.Gid, st.Nlink, st.Size, st.Ino, st.Mtim.Nano(), st.Ctim.Nano())
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		case syscall.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" sha256 %x", sha256.Sum256(b))
		}
		out[p] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var tempNameRe = regexp.MustCompile(`^\..*\.agentvm-[0-9a-f]{12}$`)

// FuzzUntar extracts arbitrary archives (as root, with ownership) into dest
// next to an outside directory, a sibling file and a symlink to outside:
// no panic, nothing outside dest changes (content, metadata, link counts),
// and no temporary file is left in dest.
func FuzzUntar(f *testing.F) {
	if os.Getuid() != 0 {
		f.Skip("extraction applies the archive's ownership: needs root")
	}
	root := f.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	for _, name := range []string{"passwd", "group"} {
		if b, err := os.ReadFile("/etc/" + name); err == nil {
			os.WriteFile(filepath.Join(root, "etc", name), b, 0o644)
		}
	}
	a, err := New(Options{Root: root, NoSystem: true, Logf: func(string, ...any) {},
		Open: func() (io.ReadWriteCloser, error) { return nil, errors.New("no port in this test") }})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { a.devnull.Close() })

	reg := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeReg} }
	dir := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755} }
	sym := func(name, to string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: to}
	}
	hard := func(name, to string) *tar.Header {
		return &tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: to}
	}
	for _, hdrs := range [][]*tar.Header{
		{dir("d/"), reg("d/f"), sym("d/l", "f"), hard("d/h", "d/f"), {Name: "d/x", Typeflag: tar.TypeReg, Mode: 0o4755, Uname: "root", Uid: 1000, Gid: 1000}},
		{reg("./a"), dir("./"), dir("b/c/d/"), reg("b/c/d/e"), dir("b/"), {Name: "b/fifo", Typeflag: tar.TypeFifo}},
		{reg("../evil")},
		{reg("../outside/victim")},
		{reg("a/../../sibling")},
		{reg("/tmp/agentvm-fuzz-evil")},
		{sym("l", "../outside"), reg("l/victim")},
		{sym("l", "../outside"), dir("l/"), reg("l/sub/evil")},
		{sym("l", "../outside/victim"), reg("l")},
		{sym("up", "../"), reg("up/sibling")},
		{reg("outlink/victim")}, // outlink is a symlink that is already in dest
		{reg("outlink")},
		{hard("h", "../outside/victim")},
		{sym("l", "../outside/victim"), hard("h", "l"), reg("h")},
		{sym("l", "../outside"), hard("h", "l/victim")},
		{reg("f"), reg("f/g")},
		{reg("f"), dir("f/")},
		{dir("d/"), reg("d")},
		{dir("d/"), {Name: "d/", Typeflag: tar.TypeDir, Mode: 0}},
		{{Name: "long/" + string(bytes.Repeat([]byte("n"), 200)) + "/file", Typeflag: tar.TypeReg, Format: tar.FormatPAX}},
		{{Name: string(bytes.Repeat([]byte("g"), 150)), Typeflag: tar.TypeReg, Format: tar.FormatGNU}},
		{{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
	} {
		f.Add(tarBytes(hdrs...))
	}
	f.Add([]byte{})
	f.Add(tarBytes(reg("truncated"))[:700])
	f.Add(bytes.Repeat([]byte{0}, 1024))

	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > fuzzTarMaxInput {
			return
		}
		names := map[string]bool{}
		tr := tar.NewReader(bytes.NewReader(data))
		for size := int64(0); ; {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if size += max(h.Size, 0); h.Size > fuzzTarMaxData || size > fuzzTarMaxData {
				return
			}
			names[path.Base(h.Name)] = true
		}

		base := t.TempDir()
		outside, dest := filepath.Join(base, "outside"), filepath.Join(base, "dest")
		for _, d := range []string{outside, filepath.Join(outside, "sub"), dest} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		os.WriteFile(filepath.Join(outside, "victim"), []byte("keep"), 0o644)
		os.WriteFile(filepath.Join(base, "sibling"), []byte("keep"), 0o600)
		os.Symlink(outside, filepath.Join(dest, "outlink"))
		before := treeState(t, base, dest)

		w := httptest.NewRecorder()
		a.handleTarWrite(w, httptest.NewRequest("PUT", guest.PathFilesTar+"?path="+url.QueryEscape(dest), bytes.NewReader(data)))

		after := treeState(t, base, dest)
		for p, was := range before {
			if now, ok := after[p]; !ok {
				t.Errorf("%s was removed (answer %d %s)", p, w.Code, w.Body)
			} else if now != was {
				t.Errorf("%s changed: %s, now %s (answer %d %s)", p, was, now, w.Code, w.Body)
			}
		}
		for p := range after {
			if _, ok := before[p]; !ok {
				t.Errorf("%s was created outside the destination (answer %d %s)", p, w.Code, w.Body)
			}
		}
		if st, err := os.Lstat(dest); err != nil || !st.IsDir() {
			t.Fatalf("destination is no longer a directory: %v", err)
		}
		filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
			if err == nil && tempNameRe.MatchString(d.Name()) && !names[d.Name()] {
				t.Errorf("temporary file left: %s", p)
			}
			return nil
		})
	})
}
