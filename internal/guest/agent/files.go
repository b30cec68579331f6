package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

// copyBufSize is the buffer of every bulk copy (file bodies, tar data).
const copyBufSize = 1 << 20

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

func getCopyBuf() *[]byte  { return copyBufs.Get().(*[]byte) }
func putCopyBuf(b *[]byte) { copyBufs.Put(b) }

// noReadFrom and noWriteTo hide ReadFrom/WriteTo so that io.CopyBuffer
// really uses our large buffer (http.response.ReadFrom and os.File.ReadFrom
// fall back to 32 KiB copies on the agent's non-TCP connections).
type noReadFrom struct{ io.Writer }
type noWriteTo struct{ io.Reader }

// registerFiles adds the file endpoints (see guest.PathFiles).
func (a *Agent) registerFiles(mux *http.ServeMux) {
	mux.HandleFunc("POST "+guest.PathSFTP, a.handleSFTP)
	mux.HandleFunc("GET "+guest.PathFilesStat, a.handleFileStat)
	mux.HandleFunc("GET "+guest.PathFilesList, a.handleFileList)
	mux.HandleFunc("GET "+guest.PathFiles, a.handleFileRead)
	mux.HandleFunc("PUT "+guest.PathFiles, a.handleFileWrite)
	mux.HandleFunc("DELETE "+guest.PathFiles, a.handleFileDelete)
	mux.HandleFunc("POST "+guest.PathFilesMkdir, a.handleFileMkdir)
	mux.HandleFunc("POST "+guest.PathFilesMove, a.handleFileRename)
	mux.HandleFunc("POST "+guest.PathWatch, a.handleWatch)
	mux.HandleFunc("POST "+guest.PathWatchSync, a.handleWatchSync)
	mux.HandleFunc("GET "+guest.PathFilesTar, a.handleTarRead)
	mux.HandleFunc("PUT "+guest.PathFilesTar, a.handleTarWrite)
}

// fileError is an API error of the file endpoints.
type fileError struct {
	status int
	code   string
	msg    string
}

func (e *fileError) Error() string { return e.msg }

func errInvalid(format string, args ...any) error {
	return &fileError{http.StatusBadRequest, guest.CodeInvalid, fmt.Sprintf(format, args...)}
}

// errAbort makes a handler abort the connection: the response was already
// started, so the client must see a broken stream rather than a clean end.
var errAbort = errors.New("abort response")

// errnoStatus maps an errno to the API status and code.
func errnoStatus(e syscall.Errno) (int, string) {
	switch e {
	case syscall.ENOENT:
		return http.StatusNotFound, guest.CodeNotFound
	case syscall.EACCES, syscall.EPERM, syscall.EROFS:
		return http.StatusForbidden, guest.CodePermission
	case syscall.EEXIST:
		return http.StatusConflict, guest.CodeExists
	case syscall.ENOTEMPTY:
		return http.StatusConflict, guest.CodeNotEmpty
	case syscall.EISDIR:
		return http.StatusConflict, guest.CodeIsDirectory
	case syscall.ENOTDIR:
		return http.StatusConflict, guest.CodeNotDirectory
	case syscall.ENOSPC, syscall.EDQUOT:
		return http.StatusInsufficientStorage, guest.CodeNoSpace
	case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.ELOOP, syscall.EXDEV:
		return http.StatusBadRequest, guest.CodeInvalid
	}
	return http.StatusInternalServerError, "internal"
}

// pathError turns err into a fileError whose message names p, e.g.
// "/etc/nope: no such file or directory". fileErrors pass through; nil
// stays nil.
func pathError(p string, err error) error {
	if err == nil {
		return nil
	}
	var fe *fileError
	if errors.As(err, &fe) || err == errAbort {
		return err
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		status, code := errnoStatus(errno)
		return &fileError{status, code, p + ": " + errno.Error()}
	}
	return &fileError{http.StatusInternalServerError, "internal", p + ": " + err.Error()}
}

func isErrno(err error, e syscall.Errno) bool { return errors.Is(err, e) }

func writeFileError(w http.ResponseWriter, err error) {
	if err == errAbort {
		panic(http.ErrAbortHandler)
	}
	var fe *fileError
	if errors.As(err, &fe) {
		writeError(w, fe.status, fe.code, fe.msg)
		return
	}
	writeError(w, http.StatusInternalServerError, "internal", err.Error())
}

// resolvePath validates p and makes it absolute (relative to the home).
func resolvePath(u *userInfo, p string) (string, error) {
	if p == "" {
		return "", errInvalid("path is required")
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errInvalid("path %q contains a NUL byte", p)
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(u.Home, p)
	}
	return filepath.Clean(p), nil
}

// fileTarget reads the user and path query parameters; on failure it has
// answered the request.
func (a *Agent) fileTarget(w http.ResponseWriter, r *http.Request) (*userInfo, string, bool) {
	q := r.URL.Query()
	u, err := a.users.lookup(q.Get("user"))
	if err != nil {
		writeError(w, http.StatusBadRequest, userCode(err), err.Error())
		return nil, "", false
	}
	p, err := resolvePath(u, q.Get("path"))
	if err != nil {
		writeFileError(w, err)
		return nil, "", false
	}
	return u, p, true
}

func fileBoolParam(s string) bool {
	b, err := strconv.ParseBool(s)
	return err == nil && b
}

// parseFileMode parses an octal permission parameter ("" = not given).
func parseFileMode(s string) (uint32, bool, error) {
	if s == "" {
		return 0, false, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, false, errInvalid("bad mode %q (want octal permission bits, e.g. 0644)", s)
	}
	return uint32(m), true, nil
}

func statTime(ts unix.Timespec) time.Time { return time.Unix(ts.Unix()) }

// fileHeaders sets X-File-Mode and X-File-Mtime.
func fileHeaders(h http.Header, st *unix.Stat_t) {
	h.Set(guest.HeaderFileMode, fmt.Sprintf("%04o", st.Mode&0o7777))
	h.Set(guest.HeaderFileMtime, statTime(st.Mtim).UTC().Format(time.RFC3339Nano))
}

// parseRange parses a single "bytes=a-b" range against size. ok is false
// when the header should be ignored (absent, multiple ranges, garbage).
func parseRange(h string, size int64) (off, n int64, ok, satisfiable bool) {
	spec, found := strings.CutPrefix(h, "bytes=")
	if !found || strings.Contains(spec, ",") {
		return 0, 0, false, false
	}
	first, last, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return 0, 0, false, false
	}
	if first == "" { // suffix: last N bytes
		k, err := strconv.ParseInt(last, 10, 64)
		if err != nil || k < 0 {
			return 0, 0, false, false
		}
		if k == 0 {
			return 0, 0, true, false
		}
		k = min(k, size)
		return size - k, k, true, size > 0
	}
	a, err := strconv.ParseInt(first, 10, 64)
	if err != nil || a < 0 {
		return 0, 0, false, false
	}
	end := size - 1
	if last != "" {
		b, err := strconv.ParseInt(last, 10, 64)
		if err != nil || b < a {
			return 0, 0, false, false
		}
		end = min(b, size-1)
	}
	if a >= size {
		return 0, 0, true, false
	}
	return a, end - a + 1, true, true
}

func (a *Agent) handleFileRead(w http.ResponseWriter, r *http.Request) {
	u, p, ok := a.fileTarget(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	offset, length := int64(0), int64(-1)
	if s := q.Get("offset"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			writeError(w, http.StatusBadRequest, guest.CodeInvalid, "bad offset "+strconv.Quote(s))
			return
		}
		offset = v
	}
	if s := q.Get("length"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			writeError(w, http.StatusBadRequest, guest.CodeInvalid, "bad length "+strconv.Quote(s))
			return
		}
		length = v
	}
	var f *os.File
	var st unix.Stat_t
	err := asUser(u, func() error {
		var err error
		// O_NONBLOCK: a FIFO must not block the open.
		f, err = os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		if err != nil {
			return pathError(p, err)
		}
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			f.Close()
			return pathError(p, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			return nil
		case unix.S_IFDIR:
			f.Close()
			return &fileError{http.StatusConflict, guest.CodeIsDirectory, p + ": is a directory"}
		}
		f.Close()
		return errInvalid("%s: not a regular file", p)
	})
	if err != nil {
		writeFileError(w, err)
		return
	}
	defer f.Close()

	size := st.Size
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Accept-Ranges", "bytes")
	h.Set(guest.HeaderFileSize, strconv.FormatInt(size, 10))
	fileHeaders(h, &st)
	status := http.StatusOK
	if !q.Has("offset") && !q.Has("length") && r.Header.Get("Range") != "" {
		off, n, ok, satisfiable := parseRange(r.Header.Get("Range"), size)
		if ok && !satisfiable {
			h.Set("Content-Range", fmt.Sprintf("bytes */%d", size))
			writeError(w, http.StatusRequestedRangeNotSatisfiable, guest.CodeInvalid, p+": range not satisfiable")
			return
		}
		if ok {
			offset, length, status = off, n, http.StatusPartialContent
			h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, off+n-1, size))
		}
	}
	var src io.Reader
	if size == 0 && offset == 0 && length < 0 {
		// Size unknown (e.g. /proc files): stream to EOF, chunked.
		src = f
	} else if offset == 0 && (length < 0 || length >= size) {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
		src = newDirectReader(f)
		if d, ok := src.(*directReader); ok {
			defer d.release()
		}
	} else {
		offset = min(offset, size)
		n := size - offset
		if length >= 0 && length < n {
			n = length
		}
		h.Set("Content-Length", strconv.FormatInt(n, 10))
		src = io.NewSectionReader(f, offset, n)
	}
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	buf := getCopyBuf()
	defer putCopyBuf(buf)
	if _, err := io.CopyBuffer(noReadFrom{w}, noWriteTo{src}, *buf); err != nil {
		a.logf("files: read %s: %v", p, err)
		panic(http.ErrAbortHandler)
	}
}

// writeInPlace rewrites the file (created when missing) as envd does:
// watchers see it created (or written), its owner set and then written, not
// a temporary renamed over it. Nothing is cut before the steps that can
// fail are done; a failed upload leaves a part.
func writeInPlace(target string, u *userInfo, exists bool, st *unix.Stat_t, body io.Reader, mode uint32, modeGiven bool, meta map[string]string) error {
	perm := os.FileMode(0o644)
	if modeGiven {
		perm = os.FileMode(mode)
	}
	// O_NONBLOCK: a FIFO swapped in since the check must not block the open.
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, perm)
	if err != nil {
		return pathError(target, err)
	}
	defer f.Close()
	fd := int(f.Fd())
	var now unix.Stat_t
	if err := unix.Fstat(fd, &now); err != nil {
		return pathError(target, err)
	}
	if now.Mode&unix.S_IFMT != unix.S_IFREG {
		return errInvalid("%s: not a regular file", target)
	}
	if !exists {
		// A new file is the user's already (fs credentials); setting it
		// again is the owner change envd makes, which watchers see.
		if err := unix.Fchown(fd, int(now.Uid), int(now.Gid)); err != nil {
			return pathError(target, err)
		}
	}
	if modeGiven {
		if err := unix.Fchmod(fd, mode); err != nil {
			return pathError(target, err)
		}
	}
	if err := setMeta(fd, meta); err != nil {
		return pathError(target, err)
	}
	// Truncated as O_TRUNC does, only when there is something to cut: a
	// truncate is a change watchers see, and envd's new file is seen
	// created, its owner set, written (three events), no more.
	if now.Size > 0 {
		if err := unix.Ftruncate(fd, 0); err != nil {
			return pathError(target, err)
		}
	}
	n, fromBody, err := copyToFile(f, body)
	if err != nil {
		if fromBody {
			return errInvalid("%s: upload interrupted: %v", target, err)
		}
		return pathError(target, err)
	}
	// Another writer may have grown the file since the size was read:
	// what lies past this write goes, as after O_TRUNC.
	var after unix.Stat_t
	if err := unix.Fstat(fd, &after); err != nil {
		return pathError(target, err)
	}
	if after.Size > n {
		if err := unix.Ftruncate(fd, n); err != nil {
			return pathError(target, err)
		}
	}
	return pathError(target, f.Close())
}

// tempName returns a hidden temporary name next to base (NAME_MAX safe).
func tempName(base string) string {
	var b [6]byte
	rand.Read(b[:])
	if len(base) > 200 {
		base = base[:200]
	}
	return "." + base + ".agentvm-" + hex.EncodeToString(b[:])
}

// readErrReader remembers the error of the underlying reader, to tell a
// failed upload from a failed disk write.
type readErrReader struct {
	r   io.Reader
	err error
}

func (r *readErrReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}

func fsyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (a *Agent) handleFileWrite(w http.ResponseWriter, r *http.Request) {
	u, p, ok := a.fileTarget(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	mode, modeGiven, err := parseFileMode(q.Get("mode"))
	if err != nil {
		writeFileError(w, err)
		return
	}
	mkdirs := fileBoolParam(q.Get("mkdirs"))
	inplace := fileBoolParam(q.Get("inplace"))
	meta, err := parseMeta(q["meta"])
	if err != nil {
		writeFileError(w, err)
		return
	}
	names := a.names()
	var fi api.FileInfo
	err = asUser(u, func() error {
		target := p
		var st unix.Stat_t
		exists := unix.Stat(target, &st) == nil // follows symlinks
		if exists {
			var lst unix.Stat_t
			if unix.Lstat(target, &lst) == nil && lst.Mode&unix.S_IFMT == unix.S_IFLNK {
				// Write through a symlink to its target, like "cat > link".
				real, err := filepath.EvalSymlinks(target)
				if err != nil {
					return pathError(p, err)
				}
				target = real
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
			case unix.S_IFDIR:
				return &fileError{http.StatusConflict, guest.CodeIsDirectory, p + ": is a directory"}
			default:
				return errInvalid("%s: not a regular file", p)
			}
		}
		dir, base := filepath.Dir(target), filepath.Base(target)
		if mkdirs {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return pathError(dir, err)
			}
		}
		if inplace {
			if err := writeInPlace(target, u, exists, &st, r.Body, mode, modeGiven, meta); err != nil {
				return err
			}
			var err error
			fi, err = statPath(target, names)
			return err
		}
		tmp := filepath.Join(dir, tempName(base))
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return pathError(p, err)
		}
		done := false
		defer func() {
			if !done {
				f.Close()
				os.Remove(tmp)
			}
		}()
		if _, fromBody, err := copyToFile(f, r.Body); err != nil {
			if fromBody {
				return errInvalid("%s: upload interrupted: %v", p, err)
			}
			return pathError(p, err)
		}
		fd := int(f.Fd())
		perm := uint32(0o644)
		if exists {
			perm = st.Mode & 0o7777
			if u.UID == 0 {
				if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil {
					return pathError(p, err)
				}
			}
		}
		if modeGiven {
			perm = mode
		}
		if err := unix.Fchmod(fd, perm); err != nil {
			return pathError(p, err)
		}
		if err := setMeta(fd, meta); err != nil {
			return pathError(p, err)
		}
		if err := f.Sync(); err != nil {
			return pathError(p, err)
		}
		if err := f.Close(); err != nil {
			return pathError(p, err)
		}
		if err := os.Rename(tmp, target); err != nil {
			return pathError(p, err)
		}
		done = true
		if err := fsyncDir(dir); err != nil {
			a.logf("files: fsync %s: %v", dir, err)
		}
		fi, err = statPath(target, names)
		return err
	})
	if err != nil {
		writeFileError(w, err)
		return
	}
	writeJSON(w, fi)
}
