package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
)

// randomReader yields n deterministic pseudo-random bytes.
func randomReader(n int64, seed int64) io.Reader {
	return io.LimitReader(rand.New(rand.NewSource(seed)), n)
}

func sha(r io.Reader) (string, int64) {
	h := sha256.New()
	n, _ := io.CopyBuffer(h, r, make([]byte, 1<<20))
	return hex.EncodeToString(h.Sum(nil)), n
}

func wantStatus(t *testing.T, err error, status int, code string) {
	t.Helper()
	ae, ok := err.(*client.APIError)
	if !ok || ae.Status != status || (code != "" && ae.Code != code) {
		t.Fatalf("want HTTP %d %s, got %v", status, code, err)
	}
	if ae.Message == "" {
		t.Fatalf("error without a message: %+v", ae)
	}
}

func TestFilesAPI(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "files1"})
	c := s.Client
	root := client.FileOptions{}

	t.Run("100MiB round trip", func(t *testing.T) {
		const size = 100 << 20
		want, _ := sha(randomReader(size, 1))
		start := time.Now()
		fi, err := c.WriteFile(ctx, v.ID, "/root/big.bin", randomReader(size, 1), size, client.WriteOptions{Mode: 0o640})
		if err != nil {
			t.Fatal(err)
		}
		up := time.Since(start)
		if fi.Size != size || fi.Mode != 0o640 || fi.Type != "file" {
			t.Fatalf("write answered %+v", fi)
		}
		start = time.Now()
		rc, info, err := c.ReadFile(ctx, v.ID, "/root/big.bin", 0, -1, root)
		if err != nil {
			t.Fatal(err)
		}
		got, n := sha(rc)
		rc.Close()
		down := time.Since(start)
		if got != want || n != size || info.Mode != 0o640 {
			t.Fatalf("download: sha %s n %d mode %o, want %s", got, n, info.Mode, want)
		}
		r := s.Exec(ctx, v.ID, "sha256sum /root/big.bin | cut -d' ' -f1")
		if strings.TrimSpace(r.Stdout) != want {
			t.Fatalf("sha256sum in the VM %q, want %s", r.Stdout, want)
		}
		t.Logf("files API: upload %.1f MiB/s, download %.1f MiB/s", 100/up.Seconds(), 100/down.Seconds())

		// a range
		rc, _, err = c.ReadFile(ctx, v.ID, "/root/big.bin", 1000, 100, root)
		if err != nil {
			t.Fatal(err)
		}
		part, _ := io.ReadAll(rc)
		rc.Close()
		full, _ := io.ReadAll(io.LimitReader(randomReader(size, 1), 1100))
		if !bytes.Equal(part, full[1000:]) {
			t.Fatalf("range read differs (%d bytes)", len(part))
		}
	})

	t.Run("atomic write keeps the old file when the upload breaks", func(t *testing.T) {
		if _, err := c.WriteFile(ctx, v.ID, "/root/keep.txt", strings.NewReader("old\n"), 4, client.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		bctx, bcancel := context.WithCancel(ctx)
		pr, pw := io.Pipe()
		go func() {
			pw.Write(bytes.Repeat([]byte("x"), 1<<20))
			time.Sleep(300 * time.Millisecond)
			bcancel() // the client goes away mid-upload
			pw.CloseWithError(io.ErrUnexpectedEOF)
		}()
		if _, err := c.WriteFile(bctx, v.ID, "/root/keep.txt", pr, 10<<20, client.WriteOptions{}); err == nil {
			t.Fatal("a broken upload succeeded")
		}
		// the old file is intact at once; the partial upload's temp file is
		// removed once the guest hears the client went away
		if r := s.Exec(ctx, v.ID, "cat /root/keep.txt"); r.Stdout != "old\n" {
			t.Fatalf("after a broken upload: %q", r.Stdout)
		}
		waitUntil(t, "the partial upload's file to go", time.Minute, func() (bool, string) {
			ls := s.Exec(ctx, v.ID, "ls -a /root").Stdout
			return !strings.Contains(ls, "agentvm"), fmt.Sprintf("%q", ls)
		})
	})

	t.Run("stat list mkdir rename remove", func(t *testing.T) {
		if _, err := c.Mkdir(ctx, v.ID, api.MkdirRequest{Path: "/srv/a/b/c"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteFile(ctx, v.ID, "/srv/a/b/c/f.txt", strings.NewReader("hi"), 2, client.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Rename(ctx, v.ID, api.RenameRequest{From: "/srv/a/b/c/f.txt", To: "/srv/a/g.txt"}); err != nil {
			t.Fatal(err)
		}
		fl, err := c.ListDir(ctx, v.ID, "/srv/a", root)
		if err != nil || len(fl.Entries) != 2 || fl.Entries[0].Name != "b" || fl.Entries[0].Type != "dir" || fl.Entries[1].Name != "g.txt" || fl.Entries[1].Size != 2 {
			t.Fatalf("list: %v %+v", err, fl)
		}
		st, err := c.Stat(ctx, v.ID, "/srv/a/g.txt", root)
		if err != nil || st.Owner != "root" || st.Mode != 0o644 {
			t.Fatalf("stat: %v %+v", err, st)
		}
		wantStatus(t, c.Remove(ctx, v.ID, "/srv/a", false, root), 409, api.CodeNotEmpty)
		if err := c.Remove(ctx, v.ID, "/srv/a", true, root); err != nil {
			t.Fatal(err)
		}
		_, err = c.Stat(ctx, v.ID, "/srv/a", root)
		wantStatus(t, err, 404, api.CodeNotFound)
	})

	t.Run("bad input and permissions", func(t *testing.T) {
		_, err := c.Stat(ctx, v.ID, "", root)
		wantStatus(t, err, 400, api.CodeInvalid)
		_, _, err = c.ReadFile(ctx, v.ID, "/nonexistent/file", 0, -1, root)
		wantStatus(t, err, 404, api.CodeNotFound)
		_, _, err = c.ReadFile(ctx, v.ID, "/etc", 0, -1, root)
		wantStatus(t, err, 409, api.CodeIsDirectory)
		_, _, err = c.ReadFile(ctx, v.ID, "/etc/shadow", 0, -1, client.FileOptions{User: "agent"})
		wantStatus(t, err, 403, api.CodePermission)
		_, err = c.WriteFile(ctx, v.ID, "/etc/agent-was-here", strings.NewReader("x"), 1, client.WriteOptions{FileOptions: client.FileOptions{User: "agent"}})
		wantStatus(t, err, 403, api.CodePermission)
		fi, err := c.WriteFile(ctx, v.ID, "notes.txt", strings.NewReader("mine"), 4, client.WriteOptions{FileOptions: client.FileOptions{User: "agent"}})
		if err != nil || fi.Path != "/home/agent/notes.txt" || fi.Owner != "agent" {
			t.Fatalf("agent's own file: %v %+v", err, fi)
		}
		_, err = c.Stat(ctx, v.ID, "/etc/passwd", client.FileOptions{User: "nosuchuser"})
		wantStatus(t, err, 400, api.CodeInvalid)
		// Paths are the VM's: a traversal reaches the guest's /tmp, never the host's.
		marker := "agentvm-e2e-host-check-" + v.ID
		if _, err := c.WriteFile(ctx, v.ID, "/root/../../../tmp/"+marker, strings.NewReader("x"), 1, client.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat("/tmp/" + marker); err == nil {
			t.Fatal("a guest path was written on the host")
		}
		if r := s.Exec(ctx, v.ID, "cat /tmp/"+marker); r.Stdout != "x" {
			t.Fatalf("guest file: %q", r.Stdout)
		}
		// A tar that tries to escape its destination is refused and writes nothing.
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "../escaped.txt", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
		tw.Write([]byte("x"))
		tw.Close()
		_, err = c.WriteTar(ctx, v.ID, "/srv/dest", &buf, root)
		wantStatus(t, err, 400, api.CodeInvalid)
		if r := s.Exec(ctx, v.ID, "test -e /srv/escaped.txt && echo yes || echo no"); r.Stdout != "no\n" {
			t.Fatal("tar entry escaped its destination")
		}
	})

	t.Run("cp both ways", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "proj")
		os.MkdirAll(filepath.Join(src, "sub", "deep"), 0o755)
		os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha\n"), 0o644)
		os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755)
		os.WriteFile(filepath.Join(src, "sub", "deep", "b.bin"), bytes.Repeat([]byte{7}, 3<<20), 0o600)
		os.Symlink("a.txt", filepath.Join(src, "link"))
		old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
		os.Chtimes(filepath.Join(src, "a.txt"), old, old)

		if _, errOut, code := s.CLI("", "cp", src, "files1:/home/agent/"); code != 0 {
			t.Fatalf("cp up: %d %s", code, errOut)
		}
		r := s.Exec(ctx, v.ID, "cd /home/agent/proj && ./run.sh && readlink link && stat -c '%a %s' sub/deep/b.bin && date -u -r a.txt +%Y && cat a.txt")
		if r.ExitCode != 0 || r.Stdout != "ran\na.txt\n600 3145728\n2020\nalpha\n" {
			t.Fatalf("in the VM after cp: %q %q", r.Stdout, r.Stderr)
		}
		back := t.TempDir()
		if _, errOut, code := s.CLI("", "cp", "files1:/home/agent/proj", back); code != 0 {
			t.Fatalf("cp down: %d %s", code, errOut)
		}
		compareTrees(t, src, filepath.Join(back, "proj"))

		// single files, both directions, into a directory and to a new name
		if _, errOut, code := s.CLI("", "cp", filepath.Join(src, "a.txt"), "files1:/tmp/renamed.txt"); code != 0 {
			t.Fatalf("cp file up: %s", errOut)
		}
		if _, errOut, code := s.CLI("", "cp", "files1:/tmp/renamed.txt", back); code != 0 {
			t.Fatalf("cp file down: %s", errOut)
		}
		if b, _ := os.ReadFile(filepath.Join(back, "renamed.txt")); string(b) != "alpha\n" {
			t.Fatalf("file copied back: %q", b)
		}
		_, errOut, code := s.CLI("", "cp", "files1:/nope", back)
		if code == 0 || !strings.Contains(errOut, "no such file") {
			t.Fatalf("cp of a missing file: %d %q", code, errOut)
		}
		_, errOut, code = s.CLI("", "cp", "a", "b")
		if code == 0 || !strings.Contains(errOut, "VM:PATH") {
			t.Fatalf("cp without a VM side: %d %q", code, errOut)
		}
	})
}

// compareTrees checks that two local trees have the same files, modes,
// contents and symlinks.
func compareTrees(t *testing.T, a, b string) {
	t.Helper()
	filepath.Walk(a, func(p string, fa os.FileInfo, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(a, p)
		fb, err := os.Lstat(filepath.Join(b, rel))
		if err != nil {
			t.Fatalf("%s missing in the copy: %v", rel, err)
		}
		if fa.Mode() != fb.Mode() {
			t.Fatalf("%s: mode %v, copy %v", rel, fa.Mode(), fb.Mode())
		}
		switch {
		case fa.Mode()&os.ModeSymlink != 0:
			la, _ := os.Readlink(p)
			lb, _ := os.Readlink(filepath.Join(b, rel))
			if la != lb {
				t.Fatalf("%s: link %q, copy %q", rel, la, lb)
			}
		case fa.Mode().IsRegular():
			ca, _ := os.ReadFile(p)
			cb, _ := os.ReadFile(filepath.Join(b, rel))
			if !bytes.Equal(ca, cb) {
				t.Fatalf("%s: content differs", rel)
			}
			if d := fa.ModTime().Sub(fb.ModTime()); d > time.Second || d < -time.Second { // tar keeps whole seconds
				t.Fatalf("%s: mtime %v, copy %v", rel, fa.ModTime(), fb.ModTime())
			}
		}
		return nil
	})
}
