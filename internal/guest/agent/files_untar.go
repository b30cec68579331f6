package agent

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

func (a *Agent) handleTarWrite(w http.ResponseWriter, r *http.Request) {
	u, p, ok := a.fileTarget(w, r)
	if !ok {
		return
	}
	names := a.names()
	var res api.TarResult
	err := asUser(u, func() error {
		if err := os.MkdirAll(p, 0o755); err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				if isErrno(pe.Err, syscall.ENOTDIR) && pe.Path == p {
					return &fileError{http.StatusConflict, guest.CodeNotDirectory, p + ": not a directory"}
				}
				return pathError(pe.Path, pe.Err)
			}
			return pathError(p, err)
		}
		root, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return pathError(p, err)
		}
		buf := getCopyBuf()
		defer putCopyBuf(buf)
		x := &extractor{
			root: root, dest: p, chown: u.UID == 0, names: names, buf: *buf,
			cache: map[string]int{}, logf: a.logf,
		}
		defer x.close()
		body := &readErrReader{r: r.Body}
		tr := tar.NewReader(body)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				x.finishDirs()
				return errInvalid("%s: reading tar: %v", p, err)
			}
			if err := x.entry(hdr, tr, body); err != nil {
				x.finishDirs()
				return err
			}
		}
		x.finishDirs()
		// No fsync here: per-file fsyncs make trees of small files crawl,
		// and syncfs would wait for every dirty page of the file system.
		// Each entry is still replaced atomically (temporary + rename).
		res = x.res
		return nil
	})
	if err != nil {
		writeFileError(w, err)
		return
	}
	writeJSON(w, res)
}

// extractor writes tar entries below root, never following a symlink and
// never leaving the destination.
type extractor struct {
	root  int
	dest  string
	chown bool // acting user is root: apply the archive's ownership
	names *idNames
	buf   []byte
	cache map[string]int // open O_PATH fds of directories below root
	dirs  []dirMeta      // metadata applied once all entries are written
	res   api.TarResult
	logf  func(string, ...any)
}

type dirMeta struct {
	rel   string
	mode  uint32
	mtime time.Time
}

func (x *extractor) close() {
	for _, fd := range x.cache {
		unix.Close(fd)
	}
	x.cache = nil
	unix.Close(x.root)
}

func (x *extractor) abs(rel string) string { return filepath.Join(x.dest, rel) }

// openDir returns an fd of the directory rel (cleaned, relative, "" = root),
// creating missing components (0755). Every component is opened with
// O_NOFOLLOW: a symlink in the way is an error naming the entry.
func (x *extractor) openDir(rel, entry string) (int, error) {
	if rel == "" {
		return x.root, nil
	}
	if fd, ok := x.cache[rel]; ok {
		return fd, nil
	}
	if len(x.cache) >= 512 {
		for _, fd := range x.cache {
			unix.Close(fd)
		}
		clear(x.cache)
	}
	fd, cur := x.root, ""
	for _, comp := range strings.Split(rel, "/") {
		if cur == "" {
			cur = comp
		} else {
			cur += "/" + comp
		}
		if c, ok := x.cache[cur]; ok {
			fd = c
			continue
		}
		nfd, err := openDirAt(fd, comp)
		if isErrno(err, syscall.ENOENT) {
			if err := unix.Mkdirat(fd, comp, 0o755); err != nil && !isErrno(err, syscall.EEXIST) {
				return -1, pathError(x.abs(cur), err)
			}
			nfd, err = openDirAt(fd, comp)
		}
		if err != nil {
			var st unix.Stat_t
			if unix.Fstatat(fd, comp, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				if st.Mode&unix.S_IFMT == unix.S_IFLNK {
					return -1, errInvalid("tar entry %q: %s is a symlink", entry, cur)
				}
				if st.Mode&unix.S_IFMT != unix.S_IFDIR {
					return -1, &fileError{http.StatusConflict, guest.CodeNotDirectory,
						fmt.Sprintf("tar entry %q: %s is not a directory", entry, x.abs(cur))}
				}
			}
			return -1, pathError(x.abs(cur), err)
		}
		x.cache[cur] = nfd
		fd = nfd
	}
	return fd, nil
}

// openDirAt opens the directory name in dirfd without following a symlink.
func openDirAt(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return -1, syscall.ENOTDIR
	}
	return fd, nil
}

// owner returns the ownership to apply for hdr: the guest's ids of Uname and
// Gname when they exist, else the numeric ids.
func (x *extractor) owner(hdr *tar.Header) (int, int) {
	uid, gid := hdr.Uid, hdr.Gid
	if id, ok := x.names.uid[hdr.Uname]; ok && hdr.Uname != "" {
		uid = int(id)
	}
	if id, ok := x.names.gid[hdr.Gname]; ok && hdr.Gname != "" {
		gid = int(id)
	}
	return uid, gid
}

func (x *extractor) entry(hdr *tar.Header, tr *tar.Reader, body *readErrReader) error {
	name := hdr.Name
	if strings.IndexByte(name, 0) >= 0 {
		return errInvalid("tar entry %q: NUL byte in name", name)
	}
	if strings.HasPrefix(name, "/") {
		return errInvalid("tar entry %q: absolute path", name)
	}
	clean := path.Clean(name)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return errInvalid("tar entry %q: path escapes the destination", name)
	}
	if clean == "." {
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	default:
		return nil // devices, FIFOs, ...: skipped
	}
	dir, base := path.Split(clean)
	dirfd, err := x.openDir(strings.TrimSuffix(dir, "/"), name)
	if err != nil {
		return err
	}
	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.mkdir(dirfd, base, clean, hdr, mode)
	case tar.TypeReg:
		return x.file(dirfd, base, clean, hdr, mode, tr, body)
	case tar.TypeSymlink:
		if hdr.Linkname == "" {
			return errInvalid("tar entry %q: empty symlink target", name)
		}
		return x.replace(dirfd, base, clean, func(tmp string) error {
			if err := unix.Symlinkat(hdr.Linkname, dirfd, tmp); err != nil {
				return err
			}
			if x.chown {
				uid, gid := x.owner(hdr)
				if err := unix.Fchownat(dirfd, tmp, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return err
				}
			}
			return unix.UtimesNanoAt(dirfd, tmp, mtimeSpec(hdr.ModTime), unix.AT_SYMLINK_NOFOLLOW)
		})
	case tar.TypeLink:
		target := path.Clean(hdr.Linkname)
		if hdr.Linkname == "" || strings.HasPrefix(hdr.Linkname, "/") || target == "." || target == ".." || strings.HasPrefix(target, "../") {
			return errInvalid("tar entry %q: hard link target %q outside the destination", name, hdr.Linkname)
		}
		// Keep dirfd open: resolving the target may evict the cache.
		dirfd, err := unix.Dup(dirfd)
		if err != nil {
			return pathError(x.abs(clean), err)
		}
		defer unix.Close(dirfd)
		tdir, tbase := path.Split(target)
		tfd, err := x.openDir(strings.TrimSuffix(tdir, "/"), name)
		if err != nil {
			return err
		}
		return x.replace(dirfd, base, clean, func(tmp string) error {
			return unix.Linkat(tfd, tbase, dirfd, tmp, 0)
		})
	}
	return nil
}

// replace creates the entry under a temporary name with create, then
// renames it over base (replacing a file or symlink, never following it).
func (x *extractor) replace(dirfd int, base, rel string, create func(tmp string) error) error {
	tmp := tempName(base)
	if err := create(tmp); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return pathError(x.abs(rel), err)
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return pathError(x.abs(rel), err)
	}
	x.res.Files++
	return nil
}

func (x *extractor) mkdir(dirfd int, base, rel string, hdr *tar.Header, mode uint32) error {
	err := unix.Mkdirat(dirfd, base, mode&0o777|0o700)
	if isErrno(err, syscall.EEXIST) {
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathError(x.abs(rel), err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			err = nil
			if x.chown {
				uid, gid := x.owner(hdr)
				if uint32(uid) != st.Uid || uint32(gid) != st.Gid {
					if err := unix.Fchownat(dirfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
						return pathError(x.abs(rel), err)
					}
				}
			}
		case unix.S_IFLNK:
			return errInvalid("tar entry %q: %s is a symlink", hdr.Name, rel)
		default:
			return &fileError{http.StatusConflict, guest.CodeExists,
				fmt.Sprintf("tar entry %q: %s exists and is not a directory", hdr.Name, x.abs(rel))}
		}
	} else if err != nil {
		return pathError(x.abs(rel), err)
	} else if x.chown {
		uid, gid := x.owner(hdr)
		if err := unix.Fchownat(dirfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return pathError(x.abs(rel), err)
		}
	}
	x.dirs = append(x.dirs, dirMeta{rel: rel, mode: mode, mtime: hdr.ModTime})
	x.res.Dirs++
	return nil
}

func (x *extractor) file(dirfd int, base, rel string, hdr *tar.Header, mode uint32, tr *tar.Reader, body *readErrReader) error {
	tmp := tempName(base)
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return pathError(x.abs(rel), err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	fail := func(err error) error {
		f.Close()
		unix.Unlinkat(dirfd, tmp, 0)
		return err
	}
	n, err := io.CopyBuffer(noReadFrom{f}, noWriteTo{tr}, x.buf)
	if err != nil {
		if body.err != nil || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrHeader) {
			return fail(errInvalid("tar entry %q: reading data: %v", hdr.Name, err))
		}
		return fail(pathError(x.abs(rel), err))
	}
	if x.chown {
		uid, gid := x.owner(hdr)
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return fail(pathError(x.abs(rel), err))
		}
	}
	if err := unix.Fchmod(fd, mode); err != nil {
		return fail(pathError(x.abs(rel), err))
	}
	if err := futimens(fd, hdr.ModTime); err != nil {
		return fail(pathError(x.abs(rel), err))
	}
	if err := f.Close(); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return pathError(x.abs(rel), err)
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		if isErrno(err, syscall.EISDIR) {
			return &fileError{http.StatusConflict, guest.CodeIsDirectory,
				fmt.Sprintf("tar entry %q: %s is a directory", hdr.Name, x.abs(rel))}
		}
		return pathError(x.abs(rel), err)
	}
	x.res.Files++
	x.res.Bytes += n
	return nil
}

// finishDirs applies the modes and mtimes of the directory entries,
// deepest last-written first (best effort: failures are logged).
func (x *extractor) finishDirs() {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		dir, base := path.Split(d.rel)
		pfd, err := x.openDir(strings.TrimSuffix(dir, "/"), d.rel)
		if err == nil {
			var fd int
			fd, err = unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == nil {
				err = unix.Fchmod(fd, d.mode)
				if e := futimens(fd, d.mtime); err == nil {
					err = e
				}
				unix.Close(fd)
			}
		}
		if err != nil {
			x.logf("files: tar: %s: %v", x.abs(d.rel), err)
		}
	}
	x.dirs = nil
}

// mtimeSpec returns utimensat times: atime untouched, mtime t (untouched when
// zero).
func mtimeSpec(t time.Time) []unix.Timespec {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	if !t.IsZero() {
		if m, err := unix.TimeToTimespec(t); err == nil {
			ts[1] = m
		}
	}
	return ts
}

// futimens sets the mtime of an open file with nanosecond precision
// (utimensat(fd, NULL, ...)).
func futimens(fd int, t time.Time) error {
	ts := mtimeSpec(t)
	_, _, e := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
