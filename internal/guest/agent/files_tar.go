package agent

import (
	"archive/tar"
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

// Tar archives carry mtimes in whole seconds (as docker cp does): sub-second
// mtimes would need a PAX record (1 KiB) for every entry. PAX records are
// still used where needed (long names, big ids or sizes).
const tarFormat = tar.FormatPAX

// stickyWriter remembers the first write error (the client went away).
type stickyWriter struct {
	w   io.Writer
	err error
}

func (s *stickyWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	if err != nil {
		s.err = err
	}
	return n, err
}

func (a *Agent) handleTarRead(w http.ResponseWriter, r *http.Request) {
	u, p, ok := a.fileTarget(w, r)
	if !ok {
		return
	}
	names := a.names()
	err := asUser(u, func() error {
		// The root itself is followed if it is a symlink; nothing below it is.
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			return pathError(p, err)
		}
		f := os.NewFile(uintptr(fd), p)
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return pathError(p, err)
		}
		var ents []string
		typ := guest.FileTypeFile
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			typ = guest.FileTypeDir
			// Read the top level now: an unreadable root fails the request
			// (no read permission), as does one that cannot be searched.
			if ents, err = f.Readdirnames(-1); err != nil {
				return pathError(p, err)
			}
			if len(ents) > 0 {
				var est unix.Stat_t
				if err := unix.Fstatat(fd, ents[0], &est, unix.AT_SYMLINK_NOFOLLOW); err != nil && !isErrno(err, syscall.ENOENT) {
					return pathError(p, err)
				}
			}
		case unix.S_IFREG:
		default:
			return errInvalid("%s: not a regular file or directory", p)
		}
		h := w.Header()
		h.Set("Content-Type", "application/x-tar")
		h.Set(guest.HeaderFileType, typ)
		fileHeaders(h, &st)
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return nil
		}
		sw := &stickyWriter{w: noReadFrom{w}}
		bw := bufio.NewWriterSize(sw, 256<<10)
		buf := getCopyBuf()
		defer putCopyBuf(buf)
		t := &tarWalker{tw: tar.NewWriter(bw), names: names, buf: *buf, out: sw, logf: a.logf}
		if typ == guest.FileTypeDir {
			err = t.walkDir(fd, p, "", ents)
		} else {
			err = t.addFile(f, &st, p, filepath.Base(p))
		}
		if err == nil {
			err = t.tw.Close()
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			if sw.err == nil {
				a.logf("files: tar %s: %v", p, err)
			}
			return errAbort
		}
		return nil
	})
	if err != nil {
		writeFileError(w, err)
	}
}

type tarWalker struct {
	tw    *tar.Writer
	names *idNames
	buf   []byte
	out   *stickyWriter
	logf  func(string, ...any)
}

func (t *tarWalker) header(name string, st *unix.Stat_t) *tar.Header {
	sec, _ := st.Mtim.Unix()
	return &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		Uname:   t.names.user[st.Uid],
		Gname:   t.names.group[st.Gid],
		ModTime: time.Unix(sec, 0),
		Format:  tarFormat,
	}
}

// walkDir archives the entries of the directory dirfd (at abs, archive
// name prefix rel) without following symlinks. Entries that cannot be read
// are skipped and logged; write errors abort. Pseudo file systems mounted
// below the root (proc, sysfs, ...) appear as empty directories.
func (t *tarWalker) walkDir(dirfd int, abs, rel string, ents []string) error {
	var dst unix.Stat_t
	if err := unix.Fstat(dirfd, &dst); err != nil {
		return err
	}
	dev := dst.Dev
	sort.Strings(ents)
	for _, name := range ents {
		entAbs, entRel := abs+"/"+name, name
		if rel != "" {
			entRel = rel + "/" + name
		}
		if abs == "/" {
			entAbs = "/" + name
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.logf("files: tar: skipping %s: %v", entAbs, err)
			continue
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				t.logf("files: tar: skipping %s: %v", entAbs, err)
				continue
			}
			d := os.NewFile(uintptr(fd), entAbs)
			sub, err := d.Readdirnames(-1)
			if err != nil {
				d.Close()
				t.logf("files: tar: skipping %s: %v", entAbs, err)
				continue
			}
			hdr := t.header(entRel+"/", &st)
			hdr.Typeflag = tar.TypeDir
			if err := t.tw.WriteHeader(hdr); err != nil {
				d.Close()
				return err
			}
			if st.Dev != dev && isPseudoFS(fd) {
				// A proc/sys/... mount below the root: its files are not
				// data (and /proc/kcore claims a size of terabytes).
				t.logf("files: tar: not descending into %s (pseudo file system)", entAbs)
				d.Close()
				continue
			}
			err = t.walkDir(fd, entAbs, entRel, sub)
			d.Close()
			if err != nil {
				return err
			}
		case unix.S_IFREG:
			fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.logf("files: tar: skipping %s: %v", entAbs, err)
				continue
			}
			f := os.NewFile(uintptr(fd), entAbs)
			if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
				f.Close()
				continue
			}
			err = t.addFile(f, &st, entAbs, entRel)
			f.Close()
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			hdr := t.header(entRel, &st)
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = readlinkat(dirfd, name)
			if err := t.tw.WriteHeader(hdr); err != nil {
				return err
			}
		default:
			// sockets, devices, FIFOs: skipped
		}
	}
	return nil
}

// addFile archives the open regular file f. A file that shrinks while it is
// read is padded with zeros (the header already promised its size).
func (t *tarWalker) addFile(f *os.File, st *unix.Stat_t, abs, name string) error {
	hdr := t.header(name, st)
	hdr.Typeflag = tar.TypeReg
	hdr.Size = st.Size
	if err := t.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(noReadFrom{t.tw}, io.LimitReader(f, st.Size), t.buf)
	if t.out.err != nil {
		return t.out.err
	}
	if err != nil || n < st.Size {
		t.logf("files: tar: %s: read %d of %d bytes (%v), padding with zeros", abs, n, st.Size, err)
		if _, err := io.CopyBuffer(noReadFrom{t.tw}, io.LimitReader(zeroReader{}, st.Size-n), t.buf); err != nil {
			return err
		}
	}
	return nil
}

// isPseudoFS reports whether the directory fd is on a kernel pseudo file
// system whose files are not data.
func isPseudoFS(fd int) bool {
	var sfs unix.Statfs_t
	if unix.Fstatfs(fd, &sfs) != nil {
		return false
	}
	switch uint32(sfs.Type) {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.DEVPTS_SUPER_MAGIC, unix.CGROUP_SUPER_MAGIC,
		unix.CGROUP2_SUPER_MAGIC, unix.DEBUGFS_MAGIC, unix.TRACEFS_MAGIC, unix.SECURITYFS_MAGIC,
		unix.BPF_FS_MAGIC, unix.PSTOREFS_MAGIC, unix.EFIVARFS_MAGIC, unix.BINFMTFS_MAGIC, unix.SELINUX_MAGIC:
		return true
	}
	return false
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
