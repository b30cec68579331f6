package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return guest.FileTypeFile
	case unix.S_IFDIR:
		return guest.FileTypeDir
	case unix.S_IFLNK:
		return guest.FileTypeSymlink
	}
	return guest.FileTypeOther
}

func makeFileInfo(p string, st *unix.Stat_t, names *idNames) api.FileInfo {
	return api.FileInfo{
		Name:    filepath.Base(p),
		Path:    p,
		Type:    fileType(st.Mode),
		Size:    st.Size,
		Mode:    st.Mode & 0o7777,
		UID:     st.Uid,
		GID:     st.Gid,
		Owner:   names.user[st.Uid],
		Group:   names.group[st.Gid],
		ModTime: statTime(st.Mtim),
	}
}

// statPath lstats p (as the current thread's user).
func statPath(p string, names *idNames) (api.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return api.FileInfo{}, pathError(p, err)
	}
	fi := makeFileInfo(p, &st, names)
	if fi.Type == guest.FileTypeSymlink {
		if t, err := os.Readlink(p); err == nil {
			fi.LinkTarget = t
		}
	}
	fi.Metadata = readMeta(p)
	return fi, nil
}

func (a *Agent) handleFileStat(w http.ResponseWriter, r *http.Request) {
	u, p, ok := a.fileTarget(w, r)
	if !ok {
		return
	}
	names := a.names()
	var fi api.FileInfo
	err := asUser(u, func() (err error) {
		fi, err = statPath(p, names)
		return err
	})
	if err != nil {
		writeFileError(w, err)
		return
	}
	writeJSON(w, fi)
}

func (a *Agent) handleFileList(w http.ResponseWriter, r *http.Request) {
	u, p, ok := a.fileTarget(w, r)
	if !ok {
		return
	}
	names := a.names()
	list := api.FileList{Path: p, Entries: []api.FileInfo{}}
	err := asUser(u, func() error {
		// Follows a symlink to a directory, like ls.
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			if isErrno(err, syscall.ENOTDIR) {
				return &fileError{http.StatusConflict, guest.CodeNotDirectory, p + ": not a directory"}
			}
			return pathError(p, err)
		}
		d := os.NewFile(uintptr(fd), p)
		defer d.Close()
		ents, err := d.Readdirnames(-1)
		if err != nil {
			return pathError(p, err)
		}
		sort.Strings(ents)
		for _, name := range ents {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				continue // vanished meanwhile
			}
			fi := makeFileInfo(filepath.Join(p, name), &st, names)
			if fi.Type == guest.FileTypeSymlink {
				fi.LinkTarget = readlinkat(fd, name)
			}
			fi.Metadata = readMeta(fi.Path)
			list.Entries = append(list.Entries, fi)
		}
		return nil
	})
	if err != nil {
		writeFileError(w, err)
		return
	}
	writeJSON(w, list)
}

func readlinkat(dirfd int, name string) string {
	for size := 256; ; size *= 2 {
		b := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, b)
		if err != nil {
			return ""
		}
		if n < size {
			return string(b[:n])
		}
	}
}

func (a *Agent) handleFileDelete(w http.ResponseWriter, r *http.Request) {
	u, p, ok := a.fileTarget(w, r)
	if !ok {
		return
	}
	if p == "/" {
		writeError(w, http.StatusBadRequest, guest.CodeInvalid, "refusing to delete /")
		return
	}
	recursive := fileBoolParam(r.URL.Query().Get("recursive"))
	err := asUser(u, func() error {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return pathError(p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return pathError(p, unix.Unlink(p))
		}
		if !recursive {
			err := unix.Rmdir(p)
			if isErrno(err, syscall.ENOTEMPTY) || isErrno(err, syscall.EEXIST) {
				return &fileError{http.StatusConflict, guest.CodeNotEmpty, p + ": directory not empty"}
			}
			if err != nil {
				return pathError(p, err)
			}
			return nil
		}
		if err := os.RemoveAll(p); err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) && pe.Path != p {
				return pathError(pe.Path, pe.Err)
			}
			return pathError(p, err)
		}
		return nil
	})
	if err != nil {
		writeFileError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeFileBody decodes an optional JSON body (empty = zero value).
func decodeFileBody(w http.ResponseWriter, r *http.Request, v any) error {
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(v)
	if err != nil && err != io.EOF {
		return errInvalid("bad JSON body: %v", err)
	}
	return nil
}

func (a *Agent) handleFileMkdir(w http.ResponseWriter, r *http.Request) {
	var req api.MkdirRequest
	if err := decodeFileBody(w, r, &req); err != nil {
		writeFileError(w, err)
		return
	}
	q := r.URL.Query()
	if req.User == "" {
		req.User = q.Get("user")
	}
	if req.Path == "" {
		req.Path = q.Get("path")
	}
	u, err := a.users.lookup(req.User)
	if err != nil {
		writeError(w, http.StatusBadRequest, guest.CodeInvalid, err.Error())
		return
	}
	p, err := resolvePath(u, req.Path)
	if err != nil {
		writeFileError(w, err)
		return
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o755
	}
	if mode > 0o7777 {
		writeError(w, http.StatusBadRequest, guest.CodeInvalid, fmt.Sprintf("bad mode %#o", req.Mode))
		return
	}
	names := a.names()
	var fi api.FileInfo
	err = asUser(u, func() error {
		exists := func() (bool, error) {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil {
				return false, nil
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return true, &fileError{http.StatusConflict, guest.CodeExists, p + ": exists and is not a directory"}
			}
			return true, nil
		}
		ok, err := exists()
		if err != nil {
			return err
		}
		if !ok {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				var pe *os.PathError
				if errors.As(err, &pe) {
					return pathError(pe.Path, pe.Err)
				}
				return pathError(p, err)
			}
			err := unix.Mkdir(p, mode&0o777)
			if err == nil {
				err = unix.Chmod(p, mode) // exact mode, not umasked
			} else if isErrno(err, syscall.EEXIST) {
				ok, err2 := exists()
				if err2 != nil {
					return err2
				}
				if !ok { // a dangling symlink
					return &fileError{http.StatusConflict, guest.CodeExists, p + ": exists and is not a directory"}
				}
				err = nil
			}
			if err != nil {
				return pathError(p, err)
			}
		}
		fi, err = statPath(p, names)
		return err
	})
	if err != nil {
		writeFileError(w, err)
		return
	}
	writeJSON(w, fi)
}

func (a *Agent) handleFileRename(w http.ResponseWriter, r *http.Request) {
	var req api.RenameRequest
	if err := decodeFileBody(w, r, &req); err != nil {
		writeFileError(w, err)
		return
	}
	if req.User == "" {
		req.User = r.URL.Query().Get("user")
	}
	u, err := a.users.lookup(req.User)
	if err != nil {
		writeError(w, http.StatusBadRequest, guest.CodeInvalid, err.Error())
		return
	}
	from, err := resolvePath(u, req.From)
	if err == nil {
		var to string
		to, err = resolvePath(u, req.To)
		req.To = to
	}
	if err != nil {
		writeFileError(w, err)
		return
	}
	to := req.To
	names := a.names()
	var fi api.FileInfo
	err = asUser(u, func() error {
		var st unix.Stat_t
		if err := unix.Lstat(from, &st); err != nil {
			return pathError(from, err)
		}
		if from != to {
			var err error
			if req.Overwrite {
				err = unix.Rename(from, to)
			} else {
				err = unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
				if isErrno(err, syscall.EINVAL) || isErrno(err, syscall.ENOSYS) {
					// File system without RENAME_NOREPLACE.
					if unix.Lstat(to, &st) == nil {
						err = syscall.EEXIST
					} else {
						err = unix.Rename(from, to)
					}
				}
			}
			if err != nil {
				e := pathError(to, err).(*fileError)
				switch {
				case isErrno(err, syscall.EEXIST):
					e.msg = to + ": already exists"
				case isErrno(err, syscall.ENOTEMPTY):
					e.msg = to + ": directory not empty"
				default:
					e.msg = "rename " + from + " to " + to + ": " + strings.TrimPrefix(e.msg, to+": ")
				}
				return e
			}
		}
		var err error
		fi, err = statPath(to, names)
		return err
	})
	if err != nil {
		writeFileError(w, err)
		return
	}
	writeJSON(w, fi)
}
