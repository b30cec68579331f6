package agent

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

// Directory watches (guest.PathWatch) on inotify. A recursive watch adds
// the directories created under it as they appear. Watches are added with
// the user's file-system credentials, so the kernel's read permission on
// each directory applies.

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

var watchStreams atomic.Int32

func (a *Agent) handleWatch(w http.ResponseWriter, r *http.Request) {
	u, root, ok := a.fileTarget(w, r)
	if !ok {
		return
	}
	recursive := fileBoolParam(r.URL.Query().Get("recursive"))
	if watchStreams.Add(1) > guest.MaxWatchStreams {
		watchStreams.Add(-1)
		writeError(w, http.StatusTooManyRequests, "too_many", "too many directory watches are open")
		return
	}
	defer watchStreams.Add(-1)
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", "inotify: "+err.Error())
		return
	}
	f := os.NewFile(uintptr(fd), "inotify") // in the runtime poller: Close ends a pending Read
	defer f.Close()
	wt := &watcher{u: u, fd: fd, dirs: map[int]string{}, tempMoves: map[uint32]bool{}, syncWd: -1}
	if err := wt.add(root, ""); err != nil {
		writeFileError(w, err)
		return
	}
	if id := r.URL.Query().Get("sync"); id != "" {
		// Without its sync directory the watch works, and its syncs
		// answer 404 (the host then does without).
		if done, err := wt.addSync(a.path(syncDir), id); err == nil {
			defer done()
		}
	}
	if recursive {
		if err := wt.addTree(root, ""); err != nil {
			writeFileError(w, err)
			return
		}
	}
	go func() { <-r.Context().Done(); f.Close() }()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	send := func(ev guest.WatchEvent) bool {
		if enc.Encode(ev) != nil {
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	}
	if !send(guest.WatchEvent{Op: guest.WatchStart}) {
		return
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		var evs []guest.WatchEvent
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameLen := int(raw.Len)
			end := off + unix.SizeofInotifyEvent + nameLen
			if end > n {
				break
			}
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:end]), "\x00")
			off = end
			if raw.Mask&unix.IN_Q_OVERFLOW != 0 {
				send(guest.WatchEvent{Op: guest.WatchError, Name: "too many changes at once: events were lost"})
				return
			}
			if int(raw.Wd) == wt.syncWd {
				if raw.Mask&unix.IN_CREATE != 0 {
					evs = append(evs, guest.WatchEvent{Op: guest.WatchSync, Name: name})
				}
				continue
			}
			rel, ok := wt.dirs[int(raw.Wd)]
			if !ok {
				continue
			}
			if raw.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
				if rel == "" {
					send(guest.WatchEvent{Op: guest.WatchError, Name: "the watched directory was removed or moved"})
					return
				}
				continue // its parent reports it
			}
			if raw.Mask&unix.IN_IGNORED != 0 {
				delete(wt.dirs, int(raw.Wd))
				continue
			}
			full := name
			if rel != "" {
				full = rel + "/" + name
			}
			// The agent writes files through a hidden temporary renamed
			// over the target: watchers see the target written, not the
			// temporary (as if it had been written in place).
			if agentTemp.MatchString(name) {
				if raw.Mask&unix.IN_MOVED_FROM != 0 {
					if len(wt.tempMoves) > 1024 { // moved out of the tree: never arriving
						clear(wt.tempMoves)
					}
					wt.tempMoves[raw.Cookie] = true
				}
				continue
			}
			if raw.Mask&unix.IN_MOVED_TO != 0 && wt.tempMoves[raw.Cookie] {
				delete(wt.tempMoves, raw.Cookie)
				evs = append(evs, guest.WatchEvent{Op: guest.WatchCreate, Name: full}, guest.WatchEvent{Op: guest.WatchWrite, Name: full})
				continue
			}
			op := ""
			switch {
			case raw.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
				op = guest.WatchCreate
				if recursive && raw.Mask&unix.IN_ISDIR != 0 {
					abs := filepath.Join(root, full)
					if wt.add(abs, full) == nil {
						wt.addTree(abs, full)
					}
				}
			case raw.Mask&unix.IN_MODIFY != 0:
				op = guest.WatchWrite
			case raw.Mask&unix.IN_DELETE != 0:
				op = guest.WatchRemove
			case raw.Mask&unix.IN_MOVED_FROM != 0:
				op = guest.WatchRename
			case raw.Mask&unix.IN_ATTRIB != 0:
				op = guest.WatchChmod
			default:
				continue
			}
			evs = append(evs, guest.WatchEvent{Op: op, Name: full})
		}
		for _, ev := range evs {
			if enc.Encode(ev) != nil {
				return
			}
		}
		if fl != nil {
			fl.Flush()
		}
	}
}

// watcher is the state of one watch stream (its reader goroutine only).
type watcher struct {
	u    *userInfo
	fd   int
	dirs map[int]string // watch descriptor -> path relative to the root
	// tempMoves are the cookies of renames away from the agent's own
	// temporaries (tempName), whose arrival is reported as a write.
	tempMoves map[uint32]bool
	syncWd    int // the watch of the sync directory (-1: none; watchsync.go)
}

// agentTemp matches tempName's names.
var agentTemp = regexp.MustCompile(`^\..*\.agentvm-[0-9a-f]{12}$`)

// add watches one directory with the user's credentials; below the root a
// symlink is never followed (it may have replaced the directory).
func (wt *watcher) add(abs, rel string) error {
	if len(wt.dirs) >= guest.MaxWatchDirs {
		return &fileError{http.StatusInsufficientStorage, guest.CodeNoSpace, "too many directories to watch"}
	}
	return asUser(wt.u, func() error {
		mask := uint32(watchMask)
		if rel != "" {
			mask |= unix.IN_DONT_FOLLOW
		}
		wd, err := unix.InotifyAddWatch(wt.fd, abs, mask)
		if err != nil {
			if errors.Is(err, syscall.ENOTDIR) {
				return &fileError{http.StatusConflict, guest.CodeNotDirectory, abs + ": not a directory"}
			}
			return pathError(abs, err)
		}
		wt.dirs[wd] = rel
		return nil
	})
}

// addTree watches the directories below abs (not following symlinks);
// directories it may not read are skipped.
func (wt *watcher) addTree(abs, rel string) error {
	var list []os.DirEntry
	if err := asUser(wt.u, func() (err error) { list, err = os.ReadDir(abs); return err }); err != nil {
		return nil
	}
	for _, e := range list {
		if !e.IsDir() {
			continue
		}
		sub, subRel := filepath.Join(abs, e.Name()), e.Name()
		if rel != "" {
			subRel = rel + "/" + e.Name()
		}
		if err := wt.add(sub, subRel); err != nil {
			var fe *fileError
			if errors.As(err, &fe) && fe.code == guest.CodeNoSpace {
				return err
			}
			continue
		}
		if err := wt.addTree(sub, subRel); err != nil {
			return err
		}
	}
	return nil
}
