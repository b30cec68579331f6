package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/pkg/sftp"
	"golang.org/x/sys/unix"
)

const (
	testUser = "agvtest"
	testUID  = 4242
)

// startFilesAgent starts an agent, connects a client and registers a test
// user (uid 4242) whose home is a fresh directory it owns.
func startFilesAgent(t *testing.T) (*env, string) {
	t.Helper()
	e := startAgent(t)
	e.connect(e.port.Attach(t), "")
	home := userDir(t)
	appendFile(t, filepath.Join(e.root, "etc/passwd"), fmt.Sprintf("%s:x:%d:%d:agentvm test:%s:/bin/sh\n", testUser, testUID, testUID, home))
	appendFile(t, filepath.Join(e.root, "etc/group"), fmt.Sprintf("%s:x:%d:\n", testUser, testUID))
	return e, home
}

// userDir returns a new directory owned by the test user, whose parents it
// can traverse.
func userDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	// t.TempDir's per-test parent is 0700.
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, testUID, testUID); err != nil {
		t.Fatal(err)
	}
	return dir
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func wantAPIError(t *testing.T, err error, status int, code string, msgHas ...string) {
	t.Helper()
	var ae *guest.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v, want API error %d %s", err, status, code)
	}
	if ae.Status != status || ae.Code != code {
		t.Fatalf("err = %v, want %d %s", err, status, code)
	}
	for _, s := range msgHas {
		if !strings.Contains(ae.Message, s) {
			t.Fatalf("message %q does not contain %q", ae.Message, s)
		}
	}
}

func mustWrite(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(path, uint32(mode)); err != nil { // raw bits: 04000 is setuid
		t.Fatal(err)
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func readAll(t *testing.T, rc io.ReadCloser) []byte {
	t.Helper()
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func lstat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

// tempFiles lists the atomic-write temporaries left in dir.
func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.Contains(e.Name(), ".agentvm-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// failingReader returns n random bytes, then an error.
type failingReader struct{ n int }

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, errors.New("upload source failed")
	}
	k := min(len(p), r.n)
	rand.Read(p[:k])
	r.n -= k
	return k, nil
}

func TestFiles(t *testing.T) {
	e, home := startFilesAgent(t)
	c := e.c
	ctx := context.Background()
	dir := t.TempDir()
	content := randBytes(1000)
	mustWrite(t, filepath.Join(dir, "a.txt"), content, 0o640)
	os.Symlink("a.txt", filepath.Join(dir, "ln"))
	os.Mkdir(filepath.Join(dir, "c"), 0o755)
	mustWrite(t, filepath.Join(dir, "b"), nil, 0o600)

	t.Run("stat", func(t *testing.T) {
		fi, err := c.Stat(ctx, "", filepath.Join(dir, "a.txt"))
		if err != nil {
			t.Fatal(err)
		}
		st := lstat(t, filepath.Join(dir, "a.txt"))
		if fi.Name != "a.txt" || fi.Path != filepath.Join(dir, "a.txt") || fi.Type != guest.FileTypeFile ||
			fi.Size != 1000 || fi.Mode != 0o640 || fi.UID != 0 || fi.Owner != "root" || fi.Group != "root" ||
			!fi.ModTime.Equal(time.Unix(st.Mtim.Unix())) || fi.LinkTarget != "" {
			t.Fatalf("stat = %+v", fi)
		}
		fi, err = c.Stat(ctx, "root", filepath.Join(dir, "ln"))
		if err != nil || fi.Type != guest.FileTypeSymlink || fi.LinkTarget != "a.txt" {
			t.Fatalf("symlink stat = %+v, %v", fi, err)
		}
		fi, err = c.Stat(ctx, "", dir+"/c/")
		if err != nil || fi.Type != guest.FileTypeDir || fi.Path != dir+"/c" {
			t.Fatalf("dir stat = %+v, %v", fi, err)
		}
		_, err = c.Stat(ctx, "", dir+"/nope")
		wantAPIError(t, err, 404, guest.CodeNotFound, dir+"/nope: no such file or directory")
		_, err = c.Stat(ctx, "no-such-user-xyz", dir)
		wantAPIError(t, err, 400, guest.CodeUnknownUser, "no-such-user-xyz")
		_, err = c.Stat(ctx, "", "")
		wantAPIError(t, err, 400, guest.CodeInvalid, "path")
		_, err = c.Stat(ctx, "", "a\x00b")
		wantAPIError(t, err, 400, guest.CodeInvalid, "NUL")
		// Relative paths are relative to the user's home.
		os.WriteFile(filepath.Join(home, "rel"), []byte("x"), 0o644)
		fi, err = c.Stat(ctx, testUser, "rel")
		if err != nil || fi.Path != filepath.Join(home, "rel") {
			t.Fatalf("relative stat = %+v, %v", fi, err)
		}
	})

	t.Run("list", func(t *testing.T) {
		l, err := c.List(ctx, "", dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, en := range l.Entries {
			names = append(names, en.Name+":"+en.Type)
			if en.Path != filepath.Join(dir, en.Name) {
				t.Errorf("entry path %q", en.Path)
			}
		}
		want := []string{"a.txt:file", "b:file", "c:dir", "ln:symlink"}
		if l.Path != dir || !slices.Equal(names, want) {
			t.Fatalf("list %s = %v, want %v", l.Path, names, want)
		}
		if l.Entries[3].LinkTarget != "a.txt" || l.Entries[0].Mode != 0o640 || l.Entries[0].Size != 1000 {
			t.Fatalf("entries %+v", l.Entries)
		}
		l, err = c.List(ctx, "", dir+"/c")
		if err != nil || l.Entries == nil || len(l.Entries) != 0 {
			t.Fatalf("empty list = %+v, %v", l, err)
		}
		_, err = c.List(ctx, "", dir+"/a.txt")
		wantAPIError(t, err, 409, guest.CodeNotDirectory, dir+"/a.txt")
		_, err = c.List(ctx, "", dir+"/nope")
		wantAPIError(t, err, 404, guest.CodeNotFound, dir+"/nope")
	})

	t.Run("read", func(t *testing.T) {
		p := filepath.Join(dir, "a.txt")
		for _, tc := range []struct {
			off, n int64
			want   []byte
		}{
			{0, -1, content}, {100, 50, content[100:150]}, {990, 100, content[990:]},
			{1000, -1, nil}, {5000, 10, nil}, {0, 0, nil}, {999, -1, content[999:]},
		} {
			rc, fi, err := c.ReadFile(ctx, "", p, tc.off, tc.n)
			if err != nil {
				t.Fatalf("read %d+%d: %v", tc.off, tc.n, err)
			}
			if got := readAll(t, rc); !bytes.Equal(got, tc.want) {
				t.Fatalf("read %d+%d: got %d bytes, want %d", tc.off, tc.n, len(got), len(tc.want))
			}
			st := lstat(t, p)
			if fi.Size != 1000 || fi.Mode != 0o640 || !fi.ModTime.Equal(time.Unix(st.Mtim.Unix())) {
				t.Fatalf("read info %+v", fi)
			}
		}
		// Through a symlink.
		rc, _, err := c.ReadFile(ctx, "", filepath.Join(dir, "ln"), 0, -1)
		if err != nil || !bytes.Equal(readAll(t, rc), content) {
			t.Fatalf("read via symlink: %v", err)
		}
		// Files whose size is unknown (proc) are read to EOF.
		rc, fi, err := c.ReadFile(ctx, "", "/proc/self/status", 0, -1)
		if err != nil || fi.Size != 0 || !bytes.Contains(readAll(t, rc), []byte("Uid:")) {
			t.Fatalf("proc read: %+v %v", fi, err)
		}
		_, _, err = c.ReadFile(ctx, "", dir, 0, -1)
		wantAPIError(t, err, 409, guest.CodeIsDirectory, dir+": is a directory")
		_, _, err = c.ReadFile(ctx, "", dir+"/nope", 0, -1)
		wantAPIError(t, err, 404, guest.CodeNotFound, dir+"/nope")

		get := func(query string, hdr map[string]string) (*http.Response, []byte) {
			req, _ := http.NewRequest("GET", "http://agentvm"+guest.PathFiles+"?path="+p+query, nil)
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := c.HTTPClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			return resp, readAll(t, resp.Body)
		}
		for _, q := range []string{"&offset=-1", "&offset=abc", "&length=-5", "&length=1x"} {
			if resp, _ := get(q, nil); resp.StatusCode != 400 {
				t.Fatalf("%s: status %d", q, resp.StatusCode)
			}
		}
		resp, body := get("", map[string]string{"Range": "bytes=10-19"})
		if resp.StatusCode != 206 || !bytes.Equal(body, content[10:20]) || resp.Header.Get("Content-Range") != "bytes 10-19/1000" {
			t.Fatalf("range: %d %q %d bytes", resp.StatusCode, resp.Header.Get("Content-Range"), len(body))
		}
		resp, body = get("", map[string]string{"Range": "bytes=-10"})
		if resp.StatusCode != 206 || !bytes.Equal(body, content[990:]) {
			t.Fatalf("suffix range: %d %d bytes", resp.StatusCode, len(body))
		}
		if resp, _ = get("", map[string]string{"Range": "bytes=2000-"}); resp.StatusCode != 416 {
			t.Fatalf("unsatisfiable range: %d", resp.StatusCode)
		}
		resp, body = get("&offset=5&length=5", map[string]string{"Range": "bytes=10-19"})
		if resp.StatusCode != 200 || !bytes.Equal(body, content[5:10]) || resp.Header.Get("Content-Length") != "5" ||
			resp.Header.Get("Content-Type") != "application/octet-stream" || resp.Header.Get(guest.HeaderFileMode) != "0640" ||
			resp.Header.Get(guest.HeaderFileSize) != "1000" {
			t.Fatalf("query params beat Range: %d %v", resp.StatusCode, resp.Header)
		}
	})

	t.Run("write", func(t *testing.T) {
		wd := t.TempDir()
		p := filepath.Join(wd, "new.txt")
		fi, err := c.WriteFile(ctx, "", p, strings.NewReader("hello"), 0, false)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode != 0o644 || fi.Size != 5 || fi.Type != guest.FileTypeFile || fi.Path != p {
			t.Fatalf("new file %+v", fi)
		}
		if b, _ := os.ReadFile(p); string(b) != "hello" {
			t.Fatalf("content %q", b)
		}
		// Replacing keeps the mode; a given mode wins (setuid included).
		os.Chmod(p, 0o600)
		if fi, err = c.WriteFile(ctx, "", p, strings.NewReader("second"), 0, false); err != nil || fi.Mode != 0o600 || fi.Size != 6 {
			t.Fatalf("replace: %+v %v", fi, err)
		}
		if fi, err = c.WriteFile(ctx, "", p, strings.NewReader("third"), 0o4755, false); err != nil || fi.Mode != 0o4755 {
			t.Fatalf("mode: %+v %v", fi, err)
		}
		// Root keeps the owner of the file it replaces.
		os.Chown(p, 65534, 65534) // clears the setuid bit
		syscall.Chmod(p, 0o4755)
		if fi, err = c.WriteFile(ctx, "", p, strings.NewReader("fourth"), 0, false); err != nil || fi.UID != 65534 || fi.GID != 65534 || fi.Mode != 0o4755 {
			t.Fatalf("owner kept: %+v %v", fi, err)
		}
		// Empty body.
		if fi, err = c.WriteFile(ctx, "", filepath.Join(wd, "empty"), nil, 0, false); err != nil || fi.Size != 0 {
			t.Fatalf("empty: %+v %v", fi, err)
		}
		// mkdirs.
		deep := filepath.Join(wd, "x/y/z.txt")
		_, err = c.WriteFile(ctx, "", deep, strings.NewReader("z"), 0, false)
		wantAPIError(t, err, 404, guest.CodeNotFound, deep)
		if fi, err = c.WriteFile(ctx, "", deep, strings.NewReader("z"), 0, true); err != nil || fi.Size != 1 {
			t.Fatalf("mkdirs: %+v %v", fi, err)
		}
		if st := lstat(t, filepath.Join(wd, "x/y")); st.Mode&0o777 != 0o755 {
			t.Fatalf("mkdirs mode %o", st.Mode)
		}
		_, err = c.WriteFile(ctx, "", wd, strings.NewReader("z"), 0, false)
		wantAPIError(t, err, 409, guest.CodeIsDirectory, wd)
		// Through a symlink: the target is written, the link stays.
		os.Symlink("new.txt", filepath.Join(wd, "link"))
		if _, err = c.WriteFile(ctx, "", filepath.Join(wd, "link"), strings.NewReader("via link"), 0, false); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); string(b) != "via link" || lstat(t, filepath.Join(wd, "link")).Mode&syscall.S_IFMT != syscall.S_IFLNK {
			t.Fatalf("write via link: %q", b)
		}
		// A failed upload leaves the old content and no temporary file.
		_, err = c.WriteFile(ctx, "", p, &failingReader{n: 3 << 20}, 0, false)
		if err == nil {
			t.Fatal("failed upload succeeded")
		}
		deadline := time.Now().Add(testWait)
		for len(tempFiles(t, wd)) > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if tf := tempFiles(t, wd); len(tf) > 0 {
			t.Fatalf("temporary files left: %v", tf)
		}
		if b, _ := os.ReadFile(p); string(b) != "via link" {
			t.Fatalf("content after failed upload: %q", b)
		}
		_, err = c.WriteFile(ctx, "", p, strings.NewReader("x"), 0o17777, false)
		wantAPIError(t, err, 400, guest.CodeInvalid, "mode")
	})

	t.Run("mkdir", func(t *testing.T) {
		md := t.TempDir()
		p := filepath.Join(md, "m1/m2/m3")
		fi, err := c.Mkdir(ctx, api.MkdirRequest{Path: p})
		if err != nil || fi.Type != guest.FileTypeDir || fi.Mode != 0o755 || fi.Path != p {
			t.Fatalf("mkdir -p: %+v %v", fi, err)
		}
		if _, err = c.Mkdir(ctx, api.MkdirRequest{Path: p}); err != nil {
			t.Fatalf("existing dir: %v", err)
		}
		if fi, err = c.Mkdir(ctx, api.MkdirRequest{Path: md + "/private", Mode: 0o700}); err != nil || fi.Mode != 0o700 {
			t.Fatalf("mode: %+v %v", fi, err)
		}
		os.WriteFile(md+"/file", nil, 0o644)
		_, err = c.Mkdir(ctx, api.MkdirRequest{Path: md + "/file"})
		wantAPIError(t, err, 409, guest.CodeExists, md+"/file")
		_, err = c.Mkdir(ctx, api.MkdirRequest{Path: md + "/file/sub"})
		wantAPIError(t, err, 409, guest.CodeNotDirectory, md+"/file")
		os.Symlink("nowhere", md+"/dangling")
		_, err = c.Mkdir(ctx, api.MkdirRequest{Path: md + "/dangling"})
		wantAPIError(t, err, 409, guest.CodeExists, md+"/dangling")
		// Relative to the user's home, owned by the user.
		fi, err = c.Mkdir(ctx, api.MkdirRequest{Path: "mine/sub", User: testUser})
		if err != nil || fi.Path != filepath.Join(home, "mine/sub") || fi.UID != testUID || fi.Owner != testUser {
			t.Fatalf("user mkdir: %+v %v", fi, err)
		}
	})

	t.Run("rename", func(t *testing.T) {
		rd := t.TempDir()
		os.WriteFile(rd+"/a", []byte("A"), 0o644)
		os.WriteFile(rd+"/b", []byte("B"), 0o644)
		_, err := c.Rename(ctx, api.RenameRequest{From: rd + "/a", To: rd + "/b"})
		wantAPIError(t, err, 409, guest.CodeExists, rd+"/b")
		fi, err := c.Rename(ctx, api.RenameRequest{From: rd + "/a", To: rd + "/b", Overwrite: true})
		if err != nil || fi.Path != rd+"/b" || fi.Size != 1 {
			t.Fatalf("overwrite: %+v %v", fi, err)
		}
		if b, _ := os.ReadFile(rd + "/b"); string(b) != "A" {
			t.Fatalf("b = %q", b)
		}
		if fi, err = c.Rename(ctx, api.RenameRequest{From: rd + "/b", To: rd + "/c"}); err != nil || fi.Name != "c" {
			t.Fatalf("rename: %+v %v", fi, err)
		}
		_, err = c.Rename(ctx, api.RenameRequest{From: rd + "/nope", To: rd + "/d"})
		wantAPIError(t, err, 404, guest.CodeNotFound, rd+"/nope")
		os.MkdirAll(rd+"/full/x", 0o755)
		os.Mkdir(rd+"/d", 0o755)
		_, err = c.Rename(ctx, api.RenameRequest{From: rd + "/d", To: rd + "/full", Overwrite: true})
		wantAPIError(t, err, 409, guest.CodeNotEmpty, rd+"/full")
	})

	t.Run("delete", func(t *testing.T) {
		dd := t.TempDir()
		os.MkdirAll(dd+"/tree/a/b", 0o755)
		os.WriteFile(dd+"/tree/a/b/f", []byte("x"), 0o644)
		os.WriteFile(dd+"/file", []byte("x"), 0o644)
		os.Symlink("tree", dd+"/dirlink")
		if err := c.Remove(ctx, "", dd+"/file", false); err != nil {
			t.Fatal(err)
		}
		_, err := c.Stat(ctx, "", dd+"/file")
		wantAPIError(t, err, 404, guest.CodeNotFound)
		err = c.Remove(ctx, "", dd+"/file", false)
		wantAPIError(t, err, 404, guest.CodeNotFound, dd+"/file")
		if err := c.Remove(ctx, "", dd+"/dirlink", true); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dd + "/tree/a/b/f"); err != nil {
			t.Fatalf("removing a symlink touched its target: %v", err)
		}
		err = c.Remove(ctx, "", dd+"/tree", false)
		wantAPIError(t, err, 409, guest.CodeNotEmpty, dd+"/tree")
		if err := c.Remove(ctx, "", dd+"/tree", true); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(dd + "/tree"); !os.IsNotExist(err) {
			t.Fatalf("tree still there: %v", err)
		}
		os.Mkdir(dd+"/empty", 0o755)
		if err := c.Remove(ctx, "", dd+"/empty", false); err != nil {
			t.Fatal(err)
		}
		err = c.Remove(ctx, "", "/", true)
		wantAPIError(t, err, 400, guest.CodeInvalid, "/")
		err = c.Remove(ctx, "", "/tmp/../", true)
		wantAPIError(t, err, 400, guest.CodeInvalid, "/")
	})

	t.Run("permissions", func(t *testing.T) {
		pd := userDir(t) // 0755, owned by the test user
		os.Chown(pd, 0, 0)
		secret := filepath.Join(pd, "secret")
		mustWrite(t, secret, []byte("s3cret"), 0o600)
		os.Mkdir(pd+"/private", 0o700)
		os.WriteFile(pd+"/private/f", []byte("x"), 0o644)

		if _, err := c.Stat(ctx, testUser, secret); err != nil {
			t.Fatalf("stat needs no read permission: %v", err)
		}
		_, _, err := c.ReadFile(ctx, testUser, secret, 0, -1)
		wantAPIError(t, err, 403, guest.CodePermission, secret+": permission denied")
		_, err = c.WriteFile(ctx, testUser, pd+"/new", strings.NewReader("x"), 0, false)
		wantAPIError(t, err, 403, guest.CodePermission, pd+"/new")
		_, err = c.WriteFile(ctx, testUser, secret, strings.NewReader("x"), 0, false)
		wantAPIError(t, err, 403, guest.CodePermission, secret)
		err = c.Remove(ctx, testUser, secret, false)
		wantAPIError(t, err, 403, guest.CodePermission, secret)
		_, err = c.List(ctx, testUser, pd+"/private")
		wantAPIError(t, err, 403, guest.CodePermission, pd+"/private")
		_, err = c.ReadTar(ctx, testUser, pd+"/private")
		wantAPIError(t, err, 403, guest.CodePermission, pd+"/private")
		// Unreadable entries below a readable root are skipped.
		os.WriteFile(pd+"/pub", []byte("pub"), 0o644)
		rc, err := c.ReadTar(ctx, testUser, pd)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		tr := tar.NewReader(bytes.NewReader(readAll(t, rc)))
		for h, err := tr.Next(); err == nil; h, err = tr.Next() {
			names = append(names, h.Name)
		}
		if !slices.Equal(names, []string{"pub"}) {
			t.Fatalf("user tar entries %q", names)
		}
		_, err = c.Mkdir(ctx, api.MkdirRequest{Path: pd + "/d", User: testUser})
		wantAPIError(t, err, 403, guest.CodePermission)
		_, err = c.Rename(ctx, api.RenameRequest{From: secret, To: home + "/stolen", User: testUser})
		wantAPIError(t, err, 403, guest.CodePermission)
		if b, _ := os.ReadFile(secret); string(b) != "s3cret" {
			t.Fatal("secret changed")
		}

		// In its home the user writes files it owns.
		fi, err := c.WriteFile(ctx, testUser, "mine.txt", strings.NewReader("mine"), 0, false)
		if err != nil || fi.UID != testUID || fi.GID != testUID || fi.Owner != testUser || fi.Group != testUser || fi.Path != home+"/mine.txt" {
			t.Fatalf("user write: %+v %v", fi, err)
		}
		rc, _, err = c.ReadFile(ctx, testUser, "mine.txt", 0, -1)
		if err != nil || string(readAll(t, rc)) != "mine" {
			t.Fatalf("user read: %v", err)
		}
		// A tar extracted by the user ignores the archive's ownership.
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		tw.WriteHeader(&tar.Header{Name: "t/", Typeflag: tar.TypeDir, Mode: 0o755, Uname: "root"})
		tw.WriteHeader(&tar.Header{Name: "t/f", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 2, Uname: "root", Gname: "root"})
		tw.Write([]byte("hi"))
		tw.Close()
		res, err := c.WriteTar(ctx, testUser, "untar", &tb)
		if err != nil || res.Files != 1 || res.Dirs != 1 || res.Bytes != 2 {
			t.Fatalf("user tar: %+v %v", res, err)
		}
		for _, p := range []string{"untar", "untar/t", "untar/t/f"} {
			if st := lstat(t, filepath.Join(home, p)); st.Uid != testUID || st.Gid != testUID {
				t.Fatalf("%s owned by %d:%d", p, st.Uid, st.Gid)
			}
		}
		if st := lstat(t, home+"/untar/t/f"); st.Mode&0o7777 != 0o4755 {
			t.Fatalf("mode %o", st.Mode&0o7777)
		}
		_, err = c.WriteTar(ctx, testUser, pd+"/untar", bytes.NewReader(tb.Bytes()))
		wantAPIError(t, err, 403, guest.CodePermission, pd+"/untar")
	})

	t.Run("tar-roundtrip", func(t *testing.T) { testTarRoundTrip(t, c, home) })
	t.Run("tar-attacks", func(t *testing.T) { testTarAttacks(t, c) })
	t.Run("tar-skips-proc", func(t *testing.T) {
		root := t.TempDir()
		os.Mkdir(root+"/proc", 0o555)
		os.WriteFile(root+"/f", []byte("f"), 0o644)
		if err := unix.Mount("proc", root+"/proc", "proc", 0, ""); err != nil {
			t.Skipf("cannot mount proc: %v", err)
		}
		defer unix.Unmount(root+"/proc", unix.MNT_DETACH)
		rc, err := c.ReadTar(ctx, "", root)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		tr := tar.NewReader(bytes.NewReader(readAll(t, rc)))
		for h, err := tr.Next(); err == nil; h, err = tr.Next() {
			names = append(names, h.Name)
		}
		if !slices.Equal(names, []string{"f", "proc/"}) {
			t.Fatalf("entries %q", names)
		}
	})

	t.Run("big", func(t *testing.T) {
		const size = 64 << 20
		data := randBytes(size)
		want := sha256.Sum256(data)
		p := filepath.Join(t.TempDir(), "big.bin")
		start := time.Now()
		fi, err := c.WriteFile(ctx, "", p, bytes.NewReader(data), 0, false)
		if err != nil || fi.Size != size {
			t.Fatalf("write: %+v %v", fi, err)
		}
		wt := time.Since(start)
		start = time.Now()
		rc, _, err := c.ReadFile(ctx, "", p, 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, rc)
		rc.Close()
		rt := time.Since(start)
		if err != nil || n != size || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("read back %d bytes, %v, sha mismatch=%v", n, err, !bytes.Equal(h.Sum(nil), want[:]))
		}
		mib := float64(size) / (1 << 20)
		t.Logf("64 MiB through the fake port: write %.0f MiB/s (%v, incl. fsync), read %.0f MiB/s (%v)",
			mib/wt.Seconds(), wt.Round(time.Millisecond), mib/rt.Seconds(), rt.Round(time.Millisecond))
	})
}

type treeEntry struct {
	typ     uint32
	mode    uint32
	uid     uint32
	gid     uint32
	mtime   int64
	link    string
	content [32]byte
}

// snapshot describes a tree by relative name (mtimes in seconds).
func snapshot(t *testing.T, root string) map[string]treeEntry {
	t.Helper()
	m := map[string]treeEntry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		st := lstat(t, p)
		en := treeEntry{typ: st.Mode & syscall.S_IFMT, mode: st.Mode & 0o7777, uid: st.Uid, gid: st.Gid, mtime: st.Mtim.Sec}
		switch en.typ {
		case syscall.S_IFLNK:
			en.link, _ = os.Readlink(p)
		case syscall.S_IFREG:
			b, _ := os.ReadFile(p)
			en.content = sha256.Sum256(b)
		case syscall.S_IFDIR:
		default:
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		m[rel] = en
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func setMtime(t *testing.T, p string, tm time.Time) {
	t.Helper()
	ts := []unix.Timespec{unix.NsecToTimespec(tm.UnixNano()), unix.NsecToTimespec(tm.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

func testTarRoundTrip(t *testing.T, c *guest.Client, home string) {
	ctx := context.Background()
	base := t.TempDir()
	src := filepath.Join(base, "src")
	long := strings.Repeat("long-name-", 15)
	for _, d := range []string{"sub/deep", "empty", long} {
		os.MkdirAll(filepath.Join(src, d), 0o755)
	}
	mustWrite(t, src+"/a.txt", []byte("alpha\n"), 0o640)
	mustWrite(t, src+"/sub/deep/b.bin", randBytes(3<<20+17), 0o600)
	mustWrite(t, src+"/suid", []byte("#!/bin/sh\n"), 0o4755)
	mustWrite(t, src+"/sgid-sticky", nil, 0o3775)
	mustWrite(t, filepath.Join(src, long, long+".txt"), []byte("long"), 0o644)
	mustWrite(t, src+"/owned", []byte("nobody's"), 0o644)
	os.Chown(src+"/owned", 65534, 65534)
	os.Symlink("a.txt", src+"/link")
	os.Symlink("sub", src+"/dirlink")
	os.Symlink("/etc/passwd", src+"/sub/abs-link")
	syscall.Mkfifo(src+"/fifo", 0o644)
	os.Chmod(src+"/empty", 0o700)
	tm := time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)
	for i, p := range []string{"a.txt", "sub/deep/b.bin", "suid", "link", "dirlink", "owned", "sub/deep", "sub", "empty", long} {
		setMtime(t, filepath.Join(src, p), tm.Add(time.Duration(i)*time.Hour+123456789))
	}
	before := snapshot(t, src)

	rc, err := c.ReadTar(ctx, "", src)
	if err != nil {
		t.Fatal(err)
	}
	archive := readAll(t, rc)
	var names []string
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if strings.HasPrefix(h.Name, "./") || strings.HasPrefix(h.Name, "/") || (h.Typeflag == tar.TypeDir) != strings.HasSuffix(h.Name, "/") {
			t.Errorf("bad entry name %q (type %c)", h.Name, h.Typeflag)
		}
		if h.Name == "owned" && (h.Uid != 65534 || h.Uname != "nobody") {
			t.Errorf("owned: %d %q", h.Uid, h.Uname)
		}
		if h.Name == "a.txt" && (h.Uname != "root" || h.Gname != "root") {
			t.Errorf("a.txt: %q %q", h.Uname, h.Gname)
		}
	}
	if slices.Contains(names, "fifo") || len(names) != len(before) {
		t.Fatalf("entries %q, want %d", names, len(before))
	}

	dst := filepath.Join(base, "dst/new")
	res, err := c.WriteTar(ctx, "", dst, bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	if res.Dirs != 4 || res.Files != 9 || res.Bytes != 3<<20+17+6+10+4+8 {
		t.Fatalf("result %+v", res)
	}
	after := snapshot(t, dst)
	if len(after) != len(before) {
		t.Fatalf("%d entries extracted, want %d", len(after), len(before))
	}
	for name, want := range before {
		if got, ok := after[name]; !ok || got != want {
			t.Errorf("%s: got %+v, want %+v", name, got, want)
		}
	}
	if tf := tempFiles(t, dst); len(tf) > 0 {
		t.Fatalf("temporary files: %v", tf)
	}

	// Extracting again over the existing tree replaces the files.
	os.WriteFile(dst+"/a.txt", []byte("changed"), 0o600)
	if _, err := c.WriteTar(ctx, "", dst, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst + "/a.txt"); string(b) != "alpha\n" {
		t.Fatalf("not replaced: %q", b)
	}

	// A single file: one entry named by its base name.
	req, _ := http.NewRequest("GET", "http://agentvm"+guest.PathFilesTar+"?path="+src+"/suid", nil)
	resp, err := c.HTTPClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	one := readAll(t, resp.Body)
	if resp.Header.Get(guest.HeaderFileType) != "file" || resp.Header.Get(guest.HeaderFileMode) != "4755" ||
		resp.Header.Get("Content-Type") != "application/x-tar" {
		t.Fatalf("headers %v", resp.Header)
	}
	tr = tar.NewReader(bytes.NewReader(one))
	h, err := tr.Next()
	if err != nil || h.Name != "suid" || h.Mode != 0o4755 || h.Size != 10 {
		t.Fatalf("single entry %+v %v", h, err)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Fatalf("second entry: %v", err)
	}
	_, err = c.ReadTar(ctx, "", src+"/nope")
	wantAPIError(t, err, 404, guest.CodeNotFound, src+"/nope")
}

func tarOf(t *testing.T, hdrs ...*tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = 4
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("evil"))
		}
	}
	tw.Close()
	return b.Bytes()
}

func testTarAttacks(t *testing.T, c *guest.Client) {
	ctx := context.Background()
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	os.Mkdir(outside, 0o755)
	reg := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeReg} }
	for i, tc := range []struct {
		bad     string
		archive []*tar.Header
	}{
		{"../evil", []*tar.Header{reg("ok"), reg("../evil")}},
		{"../outside/evil", []*tar.Header{reg("../outside/evil")}},
		{"a/../../evil", []*tar.Header{reg("a/../../evil")}},
		{outside + "/evil", []*tar.Header{reg(outside + "/evil")}},
		{"link/evil", []*tar.Header{{Name: "link", Typeflag: tar.TypeSymlink, Linkname: outside}, reg("link/evil")}},
		{"link/sub/evil", []*tar.Header{{Name: "link", Typeflag: tar.TypeSymlink, Linkname: outside}, reg("link/sub/evil")}},
		{"link/", []*tar.Header{{Name: "link", Typeflag: tar.TypeSymlink, Linkname: outside}, {Name: "link/", Typeflag: tar.TypeDir}}},
		{"d/link/evil", []*tar.Header{{Name: "d/", Typeflag: tar.TypeDir}, {Name: "d/link", Typeflag: tar.TypeSymlink, Linkname: "../../outside"}, reg("d/link/evil")}},
		{"hl", []*tar.Header{{Name: "hl", Typeflag: tar.TypeLink, Linkname: "../outside/x"}}},
	} {
		dest := filepath.Join(base, fmt.Sprintf("dest%d", i))
		_, err := c.WriteTar(ctx, "", dest, bytes.NewReader(tarOf(t, tc.archive...)))
		wantAPIError(t, err, 400, guest.CodeInvalid, fmt.Sprintf("%q", tc.bad))
		for _, p := range []string{base + "/evil", outside + "/evil", outside + "/sub"} {
			if _, err := os.Lstat(p); err == nil {
				t.Fatalf("case %d: %s was written", i, p)
			}
		}
		if tf := tempFiles(t, dest); len(tf) > 0 {
			t.Fatalf("case %d: temporary files %v", i, tf)
		}
	}
	// A symlink already in the destination is not followed either.
	dest := filepath.Join(base, "pre")
	os.Mkdir(dest, 0o755)
	os.Symlink(outside, dest+"/planted")
	_, err := c.WriteTar(ctx, "", dest, bytes.NewReader(tarOf(t, reg("planted/evil"))))
	wantAPIError(t, err, 400, guest.CodeInvalid, `"planted/evil"`)
	// A file entry replaces a symlink instead of writing through it.
	os.WriteFile(outside+"/target", []byte("keep"), 0o644)
	os.Symlink(outside+"/target", dest+"/ln")
	if _, err := c.WriteTar(ctx, "", dest, bytes.NewReader(tarOf(t, reg("ln")))); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(outside + "/target"); string(b) != "keep" {
		t.Fatalf("wrote through a symlink: %q", b)
	}
	if st := lstat(t, dest+"/ln"); st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		t.Fatal("symlink not replaced")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Fatalf("outside has %d entries", len(ents))
	}
	// Hard links inside the destination work.
	res, err := c.WriteTar(ctx, "", dest, bytes.NewReader(tarOf(t, reg("sub/f"), &tar.Header{Name: "sub/h", Typeflag: tar.TypeLink, Linkname: "sub/f"})))
	if err != nil || res.Files != 2 || res.Bytes != 4 {
		t.Fatalf("hard link: %+v %v", res, err)
	}
	if a, b := lstat(t, dest+"/sub/f"), lstat(t, dest+"/sub/h"); a.Ino != b.Ino {
		t.Fatal("hard link is a copy")
	}
	// Garbage is an invalid archive; a file where a directory is needed
	// conflicts.
	_, err = c.WriteTar(ctx, "", dest, strings.NewReader(strings.Repeat("garbage!", 200)))
	wantAPIError(t, err, 400, guest.CodeInvalid)
	_, err = c.WriteTar(ctx, "", dest, bytes.NewReader(tarOf(t, reg("ln/x"))))
	wantAPIError(t, err, 409, guest.CodeNotDirectory, `"ln/x"`)
}

// TestAsUser checks that asUser applies the user's permissions to its own
// thread only.
func TestAsUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root")
	}
	u := &userInfo{Name: testUser, UID: testUID, GID: testUID, Groups: []uint32{testUID}}
	dir := userDir(t)
	secret := filepath.Join(t.TempDir(), "secret")
	mustWrite(t, secret, []byte("s3cret"), 0o600)
	groupsBefore, _ := unix.Getgroups()

	err := asUser(u, func() error { _, err := os.ReadFile(secret); return err })
	if !errors.Is(err, syscall.EACCES) {
		t.Fatalf("user read a 0600 root file: %v", err)
	}
	err = asUser(u, func() error { return os.WriteFile(dir+"/mine", []byte("x"), 0o644) })
	if err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, dir+"/mine"); st.Uid != testUID || st.Gid != testUID {
		t.Fatalf("owned by %d:%d", st.Uid, st.Gid)
	}
	err = asUser(u, func() error { return os.Chown(dir+"/mine", 0, 0) })
	if !errors.Is(err, syscall.EPERM) {
		t.Fatalf("user chowned to root: %v", err)
	}
	// no capability is left on the user's thread; the test's thread keeps its own
	var capEff string
	asUser(u, func() error {
		b, err := os.ReadFile("/proc/thread-self/status")
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "CapEff:") {
				capEff = strings.TrimSpace(strings.TrimPrefix(l, "CapEff:"))
			}
		}
		return err
	})
	if strings.Trim(capEff, "0") != "" || capEff == "" {
		t.Fatalf("user thread capabilities: %q", capEff)
	}
	if b, _ := os.ReadFile("/proc/thread-self/status"); strings.Contains(string(b), "CapEff:\t0000000000000000") {
		t.Fatal("the test's own thread lost its capabilities")
	}
	err = asUser(u, func() error { panic("boom") })
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("panic: %v", err)
	}

	// Concurrent root and user operations never mix credentials.
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := 0; i < 50; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := asUser(u, func() error { _, err := os.ReadFile(secret); return err }); !errors.Is(err, syscall.EACCES) {
				errs <- fmt.Errorf("user read: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			if _, err := os.ReadFile(secret); err != nil {
				errs <- fmt.Errorf("root read: %v", err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	groupsAfter, _ := unix.Getgroups()
	if !slices.Equal(groupsBefore, groupsAfter) {
		t.Fatalf("groups changed: %v -> %v", groupsBefore, groupsAfter)
	}
	if fsuid, _ := unix.SetfsuidRetUid(-1); fsuid != 0 {
		t.Fatalf("fsuid %d leaked to another thread", fsuid)
	}
}

func TestServeSFTP(t *testing.T) {
	dir := t.TempDir()
	cl, finish := sftpOverPipes(t, func(r io.Reader, w io.WriteCloser) error { return ServeSFTP(r, w, dir) })
	if wd, err := cl.Getwd(); err != nil || wd != dir {
		t.Fatalf("getwd %q %v", wd, err)
	}
	data := randBytes(16 << 20)
	start := time.Now()
	f, err := cl.Create("up.bin") // relative: in the working directory
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFrom(bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	put := time.Since(start)
	if b, err := os.ReadFile(filepath.Join(dir, "up.bin")); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("put: %d bytes, %v", len(b), err)
	}
	start = time.Now()
	g, err := cl.Open(dir + "/up.bin")
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, err := g.WriteTo(&got); err != nil {
		t.Fatal(err)
	}
	g.Close()
	get := time.Since(start)
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("get: %d bytes", got.Len())
	}
	if err := cl.MkdirAll("a/b"); err != nil {
		t.Fatal(err)
	}
	if fis, err := cl.ReadDir("."); err != nil || len(fis) != 2 {
		t.Fatalf("readdir: %d %v", len(fis), err)
	}
	t.Logf("sftp over pipes, 16 MiB: put %.0f MiB/s, get %.0f MiB/s", 16/put.Seconds(), 16/get.Seconds())
	finish()
}

// sftpOverPipes runs serve on a pair of pipes and returns a pkg/sftp client
// for it; finish closes the client and checks that serve then returns nil.
func sftpOverPipes(t *testing.T, serve func(io.Reader, io.WriteCloser) error) (cl *sftp.Client, finish func()) {
	t.Helper()
	c2sR, c2sW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s2cR, s2cW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		defer c2sR.Close()
		done <- serve(c2sR, s2cW)
	}()
	if cl, err = sftp.NewClientPipe(s2cR, c2sW); err != nil {
		t.Fatal(err)
	}
	return cl, func() {
		t.Helper()
		cl.Close()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("serve: %v", err)
			}
		case <-time.After(testWait):
			t.Fatal("server did not exit after the client disconnected")
		}
		s2cR.Close()
	}
}
