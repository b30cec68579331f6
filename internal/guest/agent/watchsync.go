package agent

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"github.com/agentvm/agentvm/internal/guest"
	"golang.org/x/sys/unix"
)

// Watch syncs (guest.PathWatchSync). A watch opened with sync=<id> also
// watches a directory of its own, syncDir/<id>, for created files, on the
// same inotify queue as the user's directories. A sync creates a file
// there named by its mark, and removes it: the kernel queues the creation
// behind every change the watch had seen, so when the stream reports the
// mark, every one of those changes has gone out before it. The files are
// the agent's (root's), in a directory no user can read.

// syncDir holds the sync directories (a tmpfs in the guest), under the
// agent's Root.
const syncDir = "/run/agentvm-watch"

// syncName is what a sync id and a mark may be: they name files.
var syncName = regexp.MustCompile(`^[0-9a-f]{1,64}$`)

// watchSyncs are the open watches' sync directories, by id.
var watchSyncs = struct {
	sync.Mutex
	dirs map[string]string
}{dirs: map[string]string{}}

// addSync makes watch wt's sync directory for id in base and watches it;
// done removes it.
func (wt *watcher) addSync(base, id string) (done func(), err error) {
	if !syncName.MatchString(id) {
		return nil, &fileError{http.StatusBadRequest, guest.CodeInvalid, "sync: not a hex id of at most 64 characters"}
	}
	dir := filepath.Join(base, id)
	watchSyncs.Lock()
	_, taken := watchSyncs.dirs[id]
	if !taken {
		watchSyncs.dirs[id] = dir
	}
	watchSyncs.Unlock()
	if taken {
		return nil, &fileError{http.StatusConflict, guest.CodeInvalid, "sync: a watch with this id is open"}
	}
	forget := func() {
		watchSyncs.Lock()
		delete(watchSyncs.dirs, id)
		watchSyncs.Unlock()
		os.RemoveAll(dir)
	}
	if err := os.MkdirAll(base, 0o700); err != nil {
		forget()
		return nil, pathError(base, err)
	}
	os.RemoveAll(dir)
	if err := os.Mkdir(dir, 0o700); err != nil {
		forget()
		return nil, pathError(dir, err)
	}
	wd, err := unix.InotifyAddWatch(wt.fd, dir, unix.IN_CREATE|unix.IN_ONLYDIR|unix.IN_DONT_FOLLOW)
	if err != nil {
		forget()
		return nil, pathError(dir, err)
	}
	wt.syncWd = wd
	return forget, nil
}

// handleWatchSync puts a mark in an open watch's queue.
func (a *Agent) handleWatchSync(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	id, mark := q.Get("id"), q.Get("mark")
	if !syncName.MatchString(id) || !syncName.MatchString(mark) {
		writeError(w, http.StatusBadRequest, guest.CodeInvalid, "id and mark: hex, at most 64 characters")
		return
	}
	watchSyncs.Lock()
	dir, ok := watchSyncs.dirs[id]
	watchSyncs.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, guest.CodeNotFound, "no open watch has this sync id")
		return
	}
	p := filepath.Join(dir, mark)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) { // the watch ended meanwhile
			writeError(w, http.StatusNotFound, guest.CodeNotFound, "no open watch has this sync id")
			return
		}
		writeFileError(w, pathError(p, err))
		return
	}
	f.Close()
	os.Remove(p)
	w.WriteHeader(http.StatusNoContent)
}
