package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// remotePath splits "VM:PATH". A colon after a slash (./a:b) is a local path.
func remotePath(arg string) (vm, p string, ok bool) {
	i := strings.IndexByte(arg, ':')
	if i <= 0 || strings.ContainsRune(arg[:i], '/') {
		return "", arg, false
	}
	return arg[:i], arg[i+1:], true
}

func cpCmd() *cobra.Command {
	var (
		user     string
		quiet    bool
		progress bool
	)
	c := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files or directories between this machine and a VM (VM:PATH on one side)",
		Long: "Copies a file or a directory tree (recursively) in either direction; one side is VM:PATH.\n" +
			"Like cp -r: when DST is an existing directory the source is copied into it. Modes and mtimes are\n" +
			"kept; ownership is kept when root copies. Writes into the VM are atomic per file.",
		Example: "  agentvm cp ./src myvm:/home/agent/src\n  agentvm cp myvm:/var/log/syslog .",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			svm, sp, sRemote := remotePath(args[0])
			dvm, dp, dRemote := remotePath(args[1])
			if sRemote == dRemote {
				return errors.New("exactly one of SRC and DST must be VM:PATH")
			}
			show := progress || (!quiet && term.IsTerminal(int(os.Stderr.Fd())))
			cp := &copier{cl: client.FromEnv(), ctx: cmd.Context(), opts: client.FileOptions{User: user}, progress: show}
			if dRemote {
				return cp.upload(sp, dvm, dp)
			}
			return cp.download(svm, sp, dp)
		},
	}
	c.Flags().StringVar(&user, "user", "", "guest user the VM side is read or written as (default root, or the token's user)")
	c.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	c.Flags().BoolVar(&progress, "progress", false, "show the progress bar even when stderr is not a terminal")
	return c
}

type copier struct {
	cl       *client.Client
	ctx      context.Context
	opts     client.FileOptions
	progress bool
}

func (c *copier) bar(total int64, what string) *progressBar {
	if !c.progress || (total >= 0 && total < 4<<20) {
		return nil
	}
	return &progressBar{total: total, what: what, start: time.Now()}
}

func (c *copier) upload(local, vm, remote string) error {
	fi, err := os.Stat(local)
	if err != nil {
		return err
	}
	if remote == "" {
		remote = "."
	}
	target := remote
	if st, err := c.cl.Stat(c.ctx, vm, remote, c.opts); err == nil && st.Type == "dir" {
		target = path.Join(remote, filepath.Base(local))
	} else if err != nil && !client.IsNotFound(err) {
		return err
	} else if strings.HasSuffix(remote, "/") {
		return fmt.Errorf("%s:%s: no such directory", vm, remote)
	}
	if !fi.IsDir() {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		var r io.Reader = f
		bar := c.bar(fi.Size(), filepath.Base(local))
		if bar != nil {
			r = bar.reader(f)
			defer bar.done()
		}
		_, err = c.cl.WriteFile(c.ctx, vm, target, r, fi.Size(), client.WriteOptions{FileOptions: c.opts, Mode: modeBits(fi.Mode())})
		return err
	}
	total := dirSize(local)
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, local, nil, nil)) }()
	var r io.Reader = pr
	bar := c.bar(total, filepath.Base(local)+"/")
	if bar != nil {
		r = bar.reader(pr)
		defer bar.done()
	}
	_, err = c.cl.WriteTar(c.ctx, vm, target, r, c.opts)
	pr.CloseWithError(errors.New("upload ended"))
	return err
}

// modeBits maps a Go FileMode to Unix permission bits incl. setuid/setgid/sticky.
func modeBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

func goMode(b uint32) fs.FileMode {
	m := fs.FileMode(b & 0o777)
	if b&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if b&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if b&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// writeTar archives the contents of dir (names relative to it). skip, when
// set, leaves an entry out (a directory's entries are then judged one by
// one, unless it says not to walk in); more, when set, adds entries last.
func writeTar(w io.Writer, dir string, skip func(rel string, isDir bool) (leave, walkIn bool), more func(*tar.Writer) error) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		if skip != nil {
			if leave, walkIn := skip(filepath.ToSlash(rel), d.IsDir()); leave {
				if d.IsDir() && !walkIn {
					return filepath.SkipDir
				}
				return nil
			}
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil // sockets, devices, fifos
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyBuffer(tw, io.LimitReader(f, h.Size), make([]byte, 1<<20)) // a file that grows meanwhile is cut at its size
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	if more != nil {
		if err := more(tw); err != nil {
			return err
		}
	}
	return tw.Close()
}

func (c *copier) download(vm, remote, local string) error {
	st, err := c.cl.Stat(c.ctx, vm, remote, c.opts)
	if err != nil {
		return err
	}
	target := local
	if lfi, err := os.Stat(local); err == nil && lfi.IsDir() {
		target = filepath.Join(local, path.Base(st.Path))
	} else if strings.HasSuffix(local, "/") {
		return fmt.Errorf("%s: no such directory", local)
	}
	if st.Type != "dir" {
		rc, fi, err := c.cl.ReadFile(c.ctx, vm, remote, 0, -1, c.opts)
		if err != nil {
			return err
		}
		defer rc.Close()
		var r io.Reader = rc
		bar := c.bar(fi.Size, path.Base(remote))
		if bar != nil {
			r = bar.reader(rc)
			defer bar.done()
		}
		return writeLocalFile(target, r, goMode(fi.Mode), fi.ModTime, st)
	}
	rc, _, err := c.cl.ReadTar(c.ctx, vm, remote, c.opts)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := os.MkdirAll(target, goMode(st.Mode)|0o700); err != nil {
		return err
	}
	var r io.Reader = rc
	bar := c.bar(-1, path.Base(remote)+"/")
	if bar != nil {
		r = bar.reader(rc)
		defer bar.done()
	}
	if err := extractTar(r, target); err != nil {
		return err
	}
	os.Chmod(target, goMode(st.Mode))
	if os.Geteuid() == 0 {
		os.Lchown(target, int(st.UID), int(st.GID))
	}
	return os.Chtimes(target, st.ModTime, st.ModTime)
}

// writeLocalFile writes atomically (temp file + rename) with mode and mtime.
func writeLocalFile(target string, r io.Reader, mode fs.FileMode, mtime time.Time, st *api.FileInfo) error {
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".agentvm-*")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err := io.CopyBuffer(f, r, make([]byte, 1<<20)); err != nil {
		return err
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if os.Geteuid() == 0 && st != nil {
		f.Chown(int(st.UID), int(st.GID))
		f.Chmod(mode) // chown clears setuid bits
	}
	if err := f.Close(); err != nil {
		return err
	}
	if !mtime.IsZero() {
		os.Chtimes(f.Name(), mtime, mtime)
	}
	if err := os.Rename(f.Name(), target); err != nil {
		return err
	}
	ok = true
	return nil
}

// extractTar unpacks r under dir. It runs inside an os.Root, so no entry
// (nor a symlink planted by an earlier entry) can write outside dir.
func extractTar(r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	asRoot := os.Geteuid() == 0
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirs []dirTime
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." || path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("refusing tar entry %q: outside the destination", h.Name)
		}
		mode := goMode(uint32(h.Mode))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return err
			}
			root.Chmod(name, mode)
			dirs = append(dirs, dirTime{name, h.ModTime})
		case tar.TypeReg:
			if dir := path.Dir(name); dir != "." {
				if err := root.MkdirAll(dir, 0o755); err != nil {
					return err
				}
			}
			root.Remove(name)
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			_, err = io.CopyBuffer(f, tr, make([]byte, 1<<20))
			if err == nil && asRoot {
				f.Chown(h.Uid, h.Gid)
			}
			if err == nil {
				err = f.Chmod(mode)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			root.Chtimes(name, h.ModTime, h.ModTime)
		case tar.TypeSymlink:
			if dir := path.Dir(name); dir != "." {
				if err := root.MkdirAll(dir, 0o755); err != nil {
					return err
				}
			}
			root.Remove(name)
			if err := root.Symlink(h.Linkname, name); err != nil {
				return err
			}
			if asRoot {
				root.Lchown(name, h.Uid, h.Gid)
			}
		default:
			// hard links, devices, fifos: skipped
		}
		if asRoot && h.Typeflag == tar.TypeDir {
			root.Lchown(name, h.Uid, h.Gid)
			root.Chmod(name, mode)
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		root.Chtimes(dirs[i].name, dirs[i].t, dirs[i].t)
	}
	return nil
}

// progressBar prints "name  12.0 MiB / 100.0 MiB  12%  70.1 MiB/s" on stderr.
type progressBar struct {
	total, n int64
	what     string
	start    time.Time
	last     time.Time
}

type barReader struct {
	r io.Reader
	b *progressBar
}

func (br barReader) Read(p []byte) (int, error) {
	n, err := br.r.Read(p)
	br.b.n += int64(n)
	if time.Since(br.b.last) > 200*time.Millisecond {
		br.b.print()
	}
	return n, err
}

func (b *progressBar) reader(r io.Reader) io.Reader { return barReader{r, b} }

func (b *progressBar) print() {
	b.last = time.Now()
	el := time.Since(b.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(b.n) / el / (1 << 20)
	}
	if b.total > 0 {
		fmt.Fprintf(os.Stderr, "\r%s  %.1f / %.1f MiB  %3d%%  %.1f MiB/s   ", b.what, float64(b.n)/(1<<20), float64(b.total)/(1<<20), b.n*100/b.total, rate)
	} else {
		fmt.Fprintf(os.Stderr, "\r%s  %.1f MiB  %.1f MiB/s   ", b.what, float64(b.n)/(1<<20), rate)
	}
}

func (b *progressBar) done() {
	b.print()
	fmt.Fprintln(os.Stderr)
}
