package agent

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"

	"github.com/pkg/sftp"
)

// userThread is one OS thread that carries a user's file-system credentials
// (see asUser) and runs path operations for that user one at a time. It
// lives as long as an SFTP session, so a session costs one thread, not one
// per operation; the thread is destroyed (never reused) when it ends.
type userThread struct {
	calls chan userCall
}

type userCall struct {
	fn   func() error
	done chan error
}

func newUserThread(u *userInfo) (*userThread, error) {
	t := &userThread{calls: make(chan userCall)}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread dies with this goroutine.
		if err := setThreadCreds(u); err != nil {
			ready <- err
			return
		}
		ready <- nil
		for c := range t.calls {
			c.done <- callSafely(u, c.fn)
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return t, nil
}

func callSafely(u *userInfo, fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic as user %s: %v\n%s", u.Name, p, debug.Stack())
		}
	}()
	return fn()
}

// do runs fn on the user's thread and returns its error.
func (t *userThread) do(fn func() error) error {
	done := make(chan error, 1)
	t.calls <- userCall{fn, done}
	return <-done
}

// close ends the thread; do must not be called afterwards.
func (t *userThread) close() { close(t.calls) }

// ServeSFTPAs serves SFTP for u inside the agent: every path operation runs
// on a thread with u's file-system credentials, so the kernel enforces u's
// permissions and new files belong to u, while file data moves through the
// opened files on any thread. It replaces a helper process running as u,
// and its two pipe copies in each direction.
// users (may be nil) names owners in long listings.
func ServeSFTPAs(r io.Reader, w io.WriteCloser, workDir string, u *userInfo, users *userDB) error {
	ut, err := newUserThread(u)
	if err != nil {
		w.Close()
		return err
	}
	defer ut.close()
	h := &userFS{t: ut, users: users}
	aw := newAsyncWriter(w, 1<<20)
	rwc := struct {
		io.Reader
		io.WriteCloser
	}{bufio.NewReaderSize(r, 256<<10), aw}
	srv := sftp.NewRequestServer(rwc, sftp.Handlers{FileGet: h, FilePut: h, FileCmd: h, FileList: h},
		sftp.WithStartDirectory(workDir), sftp.WithRSMaxTxPacket(sftpMaxTxPacket))
	err = srv.Serve()
	srv.Close()
	aw.Close()
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return err
}

// userFS implements pkg/sftp's request handlers on the real file system.
type userFS struct {
	t     *userThread
	users *userDB
}

// LookupUserName names a uid in long listings (ls -l in sftp).
func (h *userFS) LookupUserName(uid string) string {
	if h.users != nil {
		if u, err := h.users.lookup(uid); err == nil {
			return u.Name
		}
	}
	return uid
}

// LookupGroupName names a gid in long listings: the user whose private
// group it is (uid = gid = the group's id), else the number.
func (h *userFS) LookupGroupName(gid string) string {
	if h.users != nil {
		if u, err := h.users.lookup(gid); err == nil && strconv.FormatUint(uint64(u.GID), 10) == gid {
			return u.Name
		}
	}
	return gid
}

func (h *userFS) open(path string, flag int, perm os.FileMode) (*os.File, error) {
	var f *os.File
	err := h.t.do(func() (err error) {
		f, err = os.OpenFile(path, flag|syscall.O_CLOEXEC, perm)
		return err
	})
	return f, err
}

func (h *userFS) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	return h.open(r.Filepath, os.O_RDONLY, 0)
}

func (h *userFS) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	return h.OpenFile(r)
}

func (h *userFS) OpenFile(r *sftp.Request) (sftp.WriterAtReaderAt, error) {
	pf := r.Pflags()
	flag := 0
	switch {
	case pf.Read && pf.Write:
		flag = os.O_RDWR
	case pf.Write:
		flag = os.O_WRONLY
	default:
		flag = os.O_RDONLY
	}
	// Append is not passed on: the client sends each write's offset, and
	// WriteAt refuses a file opened with O_APPEND (as pkg/sftp's server does).
	if pf.Creat {
		flag |= os.O_CREATE
	}
	if pf.Trunc {
		flag |= os.O_TRUNC
	}
	if pf.Excl {
		flag |= os.O_EXCL
	}
	return h.open(r.Filepath, flag, openPerm(r.Attrs))
}

// openPerm is the mode a new file gets from an SFTP open's attributes.
// pkg/sftp (v1.13) hands the request server the attributes without their
// flags word, so the layout is inferred from the length: nothing (0644, as
// sftp-server with umask 022), the permissions alone (4 bytes), or the
// permissions and times (12 bytes), which are what OpenSSH's put and scp
// send. Anything else gets 0600, so that a file is never created more
// readable than its owner asked for.
func openPerm(attrs []byte) os.FileMode {
	switch len(attrs) {
	case 0:
		return 0o644
	case 4, 12:
		if m := os.FileMode(binary.BigEndian.Uint32(attrs) & 0o777); m != 0 {
			return m
		}
	}
	return 0o600
}

func (h *userFS) Filecmd(r *sftp.Request) error {
	p := r.Filepath
	return h.t.do(func() error {
		switch r.Method {
		case "Setstat":
			return setstat(p, r.AttrFlags(), r.Attributes())
		case "Rename":
			// SFTP rename does not replace an existing file (PosixRename does).
			if _, err := os.Lstat(r.Target); err == nil {
				return &os.LinkError{Op: "rename", Old: p, New: r.Target, Err: syscall.EEXIST}
			}
			return os.Rename(p, r.Target)
		case "Rmdir":
			return syscall.Rmdir(p)
		case "Remove":
			return syscall.Unlink(p)
		case "Mkdir":
			return os.Mkdir(p, 0o755)
		case "Link":
			return os.Link(p, r.Target)
		case "Symlink":
			return os.Symlink(p, r.Target) // Filepath is the target, Target the link
		}
		return fmt.Errorf("sftp: %s is not supported", r.Method)
	})
}

func (h *userFS) PosixRename(r *sftp.Request) error {
	return h.t.do(func() error { return os.Rename(r.Filepath, r.Target) })
}

func setstat(p string, fl sftp.FileAttrFlags, a *sftp.FileStat) error {
	if fl.Size {
		if err := os.Truncate(p, int64(a.Size)); err != nil {
			return err
		}
	}
	if fl.Permissions {
		if err := syscall.Chmod(p, a.Mode&0o7777); err != nil {
			return &os.PathError{Op: "chmod", Path: p, Err: err}
		}
	}
	if fl.UidGid {
		if err := os.Chown(p, int(a.UID), int(a.GID)); err != nil {
			return err
		}
	}
	if fl.Acmodtime {
		if err := os.Chtimes(p, a.AccessTime(), a.ModTime()); err != nil {
			return err
		}
	}
	return nil
}

// StatVFS answers statvfs@openssh.com (df in sftp), as the root server does.
func (h *userFS) StatVFS(r *sftp.Request) (*sftp.StatVFS, error) {
	var st syscall.Statfs_t
	if err := h.t.do(func() error { return syscall.Statfs(r.Filepath, &st) }); err != nil {
		return nil, &os.PathError{Op: "statfs", Path: r.Filepath, Err: err}
	}
	return &sftp.StatVFS{
		Bsize: uint64(st.Bsize), Frsize: uint64(st.Frsize), Blocks: st.Blocks, Bfree: st.Bfree,
		Bavail: st.Bavail, Files: st.Files, Ffree: st.Ffree, Favail: st.Ffree,
		Flag: uint64(st.Flags), Namemax: uint64(st.Namelen),
	}, nil
}

func (h *userFS) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	p := r.Filepath
	var out fileList
	err := h.t.do(func() error {
		switch r.Method {
		case "List":
			ents, err := os.ReadDir(p)
			if err != nil {
				return err
			}
			for _, e := range ents {
				if fi, err := e.Info(); err == nil {
					out = append(out, fi)
				}
			}
			return nil
		case "Stat":
			fi, err := os.Stat(p)
			out = fileList{fi}
			return err
		}
		return fmt.Errorf("sftp: %s is not supported", r.Method)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (h *userFS) Lstat(r *sftp.Request) (sftp.ListerAt, error) {
	var fi os.FileInfo
	err := h.t.do(func() (err error) {
		fi, err = os.Lstat(r.Filepath)
		return err
	})
	if err != nil {
		return nil, err
	}
	return fileList{fi}, nil
}

func (h *userFS) Readlink(p string) (string, error) {
	var target string
	err := h.t.do(func() (err error) {
		target, err = os.Readlink(p)
		return err
	})
	return target, err
}

// fileList is a ListerAt over a slice.
type fileList []os.FileInfo

func (l fileList) ListAt(dst []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(dst, l[off:])
	if n < len(dst) {
		return n, io.EOF
	}
	return n, nil
}
