package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"path"
	"strconv"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
)

// envd's filesystem service over the agent's file endpoints and watches.

const (
	maxListEntries    = 100_000 // entries one ListDir returns
	maxWatcherBacklog = 10_000  // events a polling watcher keeps between polls
	maxWatchers       = 64      // polling watchers per sandbox
)

// entry converts the agent's file info.
func entry(fi *api.FileInfo) *entryInfo {
	e := &entryInfo{Name: fi.Name, Path: fi.Path, Size: strconv.FormatInt(fi.Size, 10), Mode: fi.Mode & 0o7777,
		Owner: fi.Owner, Group: fi.Group, Metadata: fi.Metadata}
	if e.Owner == "" {
		e.Owner = strconv.FormatUint(uint64(fi.UID), 10)
	}
	if e.Group == "" {
		e.Group = strconv.FormatUint(uint64(fi.GID), 10)
	}
	if !fi.ModTime.IsZero() {
		e.ModifiedTime = fi.ModTime.UTC().Format(time.RFC3339Nano)
	}
	mode := fs.FileMode(fi.Mode & 0o777)
	switch fi.Type {
	case guest.FileTypeFile:
		e.Type = fileTypeFile
	case guest.FileTypeDir:
		e.Type, mode = fileTypeDirectory, mode|fs.ModeDir
	case guest.FileTypeSymlink:
		e.Type, mode, e.IsSymlink = fileTypeSymlink, mode|fs.ModeSymlink, true
		target := fi.LinkTarget
		e.SymlinkTarget = &target
	default:
		e.Type = fileTypeOther
	}
	e.Permissions = mode.String()
	return e
}

// entryOf is entry, with a symlink shown as envd shows it: the target's
// type and mode, and the target's absolute path (one level resolved; a
// dangling link stays a symlink).
func (c *envdCall) entryOf(ctx context.Context, fi *api.FileInfo) *entryInfo {
	e := entry(fi)
	if fi.Type != guest.FileTypeSymlink {
		return e
	}
	target := fi.LinkTarget
	if !path.IsAbs(target) {
		target = path.Join(path.Dir(fi.Path), target)
	}
	target = path.Clean(target)
	e.SymlinkTarget = &target
	if t, err := c.g.Stat(ctx, c.user, target); err == nil && t.Type != guest.FileTypeSymlink {
		te := entry(t)
		e.Type, e.Mode, e.Permissions, e.Size = te.Type, te.Mode, te.Permissions, te.Size
	}
	return e
}

func (c *envdCall) stat(ctx context.Context, req *pathRequest) (*entryResponse, error) {
	if req.Path == "" {
		return nil, rpcErr(codeInvalidArgument, "path is required")
	}
	fi, err := c.g.Stat(ctx, c.user, req.Path)
	if err != nil {
		return nil, guestRPCError(err)
	}
	return &entryResponse{Entry: c.entryOf(ctx, fi)}, nil
}

func (c *envdCall) listDir(ctx context.Context, req *listDirRequest) (*listDirResponse, error) {
	if req.Path == "" {
		return nil, rpcErr(codeInvalidArgument, "path is required")
	}
	depth := int(max(req.Depth, 1))
	out := &listDirResponse{Entries: []*entryInfo{}}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		l, err := c.g.List(ctx, c.user, dir)
		if err != nil {
			return err
		}
		for i := range l.Entries {
			fi := &l.Entries[i]
			if len(out.Entries) >= maxListEntries {
				return rpcErr(codeResourceExhausted, "more than %d entries: list with a smaller depth", maxListEntries)
			}
			out.Entries = append(out.Entries, c.entryOf(ctx, fi))
			if fi.Type == guest.FileTypeDir && level < depth {
				if err := walk(fi.Path, level+1); err != nil {
					var ae *guest.APIError
					if errors.As(err, &ae) && ae.Code == guest.CodePermission {
						continue // what the user may not read is left out
					}
					return err
				}
			}
		}
		return nil
	}
	if err := walk(req.Path, 1); err != nil {
		return nil, guestRPCError(err)
	}
	return out, nil
}

func (c *envdCall) makeDir(ctx context.Context, req *pathRequest) (*entryResponse, error) {
	if req.Path == "" {
		return nil, rpcErr(codeInvalidArgument, "path is required")
	}
	if fi, err := c.g.Stat(ctx, c.user, req.Path); err == nil {
		if fi.Type == guest.FileTypeDir {
			return nil, rpcErr(codeAlreadyExists, "directory %s already exists", fi.Path)
		}
		return nil, rpcErr(codeInvalidArgument, "%s exists and is not a directory", fi.Path)
	}
	fi, err := c.g.Mkdir(ctx, api.MkdirRequest{Path: req.Path, User: c.user})
	if err != nil {
		return nil, guestRPCError(err)
	}
	return &entryResponse{Entry: entry(fi)}, nil
}

func (c *envdCall) move(ctx context.Context, req *moveRequest) (*entryResponse, error) {
	if req.Source == "" || req.Destination == "" {
		return nil, rpcErr(codeInvalidArgument, "source and destination are required")
	}
	fi, err := c.g.Rename(ctx, api.RenameRequest{From: req.Source, To: req.Destination, User: c.user, Overwrite: true})
	if err != nil {
		return nil, guestRPCError(err)
	}
	return &entryResponse{Entry: entry(fi)}, nil
}

func (c *envdCall) remove(ctx context.Context, req *pathRequest) (*empty, error) {
	if req.Path == "" {
		return nil, rpcErr(codeInvalidArgument, "path is required")
	}
	// As envd (os.RemoveAll): a path that is not there is removed already.
	if err := c.g.Remove(ctx, c.user, req.Path, true); err != nil && !isGuestCode(err, guest.CodeNotFound) {
		return nil, guestRPCError(err)
	}
	return &empty{}, nil
}

var watchOps = map[string]string{
	guest.WatchCreate: eventCreate, guest.WatchWrite: eventWrite, guest.WatchRemove: eventRemove,
	guest.WatchRename: eventRename, guest.WatchChmod: eventChmod,
}

// fsEvent converts a watch event, with the entry when asked (and still there).
func (c *envdCall) fsEvent(ctx context.Context, root string, ev guest.WatchEvent, withEntry bool) (filesystemEvent, bool) {
	typ, ok := watchOps[ev.Op]
	if !ok {
		return filesystemEvent{}, false
	}
	out := filesystemEvent{Name: ev.Name, Type: typ}
	if withEntry && ev.Op != guest.WatchRemove && ev.Op != guest.WatchRename {
		if fi, err := c.g.Stat(ctx, c.user, path.Join(root, ev.Name)); err == nil {
			out.Entry = entry(fi)
		}
	}
	return out, true
}

func (c *envdCall) watchDir(ctx context.Context, req *watchRequest, st *stream) error {
	if req.Path == "" {
		return rpcErr(codeInvalidArgument, "path is required")
	}
	ws, err := c.g.WatchDir(ctx, req.Path, c.user, req.Recursive)
	if err != nil {
		return guestRPCError(err)
	}
	defer ws.Close()
	if err := st.Send(watchDirResponse{Start: &empty{}}); err != nil {
		return err
	}
	events, errc, stopPull := pull(ws.Next)
	defer stopPull()
	tick := time.NewTicker(c.ka)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				err := <-errc
				c.abortIfGone(st.w)
				return rpcErr(codeUnavailable, "the watch ended: %v", err)
			}
			fe, ok := c.fsEvent(ctx, req.Path, ev, req.IncludeEntry)
			if !ok {
				continue
			}
			if err := st.Send(watchDirResponse{Filesystem: &fe}); err != nil {
				return err
			}
		case <-tick.C:
			if err := st.Send(watchDirResponse{Keepalive: &empty{}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// watcher is a watch polled with GetWatcherEvents (the Python SDK's sync
// client): its events wait in a bounded backlog. One that ended is dropped
// once its end was reported; one nobody polls for watcherIdle is dropped.
type watcher struct {
	vmID     string
	root     string
	user     string // who made it: its entries are stat-ed as that user
	entries  bool   // the events carry their entries, stat-ed when polled
	stop     context.CancelFunc
	ws       *guest.WatchStream
	mu       sync.Mutex
	events   []filesystemEvent
	err      error
	lastPoll time.Time
}

const watcherIdle = 2 * time.Minute

// reapWatchers drops idle watchers; s.mu is held.
func (s *Server) reapWatchersLocked(now time.Time) {
	for id, w := range s.watchers {
		w.mu.Lock()
		idle := now.Sub(w.lastPoll) > watcherIdle
		w.mu.Unlock()
		if idle {
			w.stop()
			delete(s.watchers, id)
		}
	}
}

func (c *envdCall) createWatcher(ctx context.Context, req *watchRequest) (*createWatcherResponse, error) {
	if req.Path == "" {
		return nil, rpcErr(codeInvalidArgument, "path is required")
	}
	s := c.s
	// One creation at a time, so that the count below holds until the insert.
	s.watcherCreate.Lock()
	defer s.watcherCreate.Unlock()
	s.mu.Lock()
	s.reapWatchersLocked(time.Now())
	n := 0
	for _, w := range s.watchers {
		if w.vmID == c.vm.ID {
			n++
		}
	}
	s.mu.Unlock()
	if n >= maxWatchers {
		return nil, rpcErr(codeResourceExhausted, "%d watchers are open in this sandbox: remove some first", n)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ws, err := c.g.WatchDir(wctx, req.Path, c.user, req.Recursive)
	if err != nil {
		cancel()
		return nil, guestRPCError(err)
	}
	b := make([]byte, 8)
	rand.Read(b)
	id := "w-" + hex.EncodeToString(b)
	w := &watcher{vmID: c.vm.ID, root: req.Path, user: c.user, entries: req.IncludeEntry, stop: cancel, ws: ws, lastPoll: time.Now()}
	s.mu.Lock()
	s.watchers[id] = w
	s.mu.Unlock()
	go func() {
		defer ws.Close()
		for {
			ev, err := ws.Next()
			if err != nil {
				w.mu.Lock()
				if wctx.Err() == nil {
					w.err = err
				}
				w.mu.Unlock()
				return
			}
			// No stat here: it would hold the event back from a poll
			// that comes right after the change (the SDK's tests poll so).
			fe, ok := c.fsEvent(wctx, req.Path, ev, false)
			if !ok {
				continue
			}
			w.mu.Lock()
			if len(w.events) >= maxWatcherBacklog {
				w.err = errors.New("more than 10000 changes waited for GetWatcherEvents: events were lost")
				w.mu.Unlock()
				cancel()
				return
			}
			w.events = append(w.events, fe)
			w.mu.Unlock()
		}
	}()
	return &createWatcherResponse{WatcherID: id}, nil
}

func (c *envdCall) watcher(id string) (*watcher, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	w := c.s.watchers[id]
	if w == nil || w.vmID != c.vm.ID {
		return nil, rpcErr(codeNotFound, "no watcher %q", id)
	}
	return w, nil
}

func (c *envdCall) getWatcherEvents(ctx context.Context, req *watcherIDRequest) (*watcherEventsResponse, error) {
	w, err := c.watcher(req.WatcherID)
	if err != nil {
		return nil, err
	}
	// Every change the agent's watch has seen (say, of the write this
	// caller just made) comes in first: a sync puts a mark behind them in
	// the watch's queue and returns once the stream has passed it. An
	// agent from before syncs gets a round trip instead, after which
	// those events have most likely come in, on their own stream.
	w.mu.Lock()
	pumping := w.err == nil // an ended watch reads no mark
	w.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if !pumping || w.ws.Sync(pctx) != nil {
		c.g.Ping(pctx)
	}
	cancel()
	w.mu.Lock()
	out := &watcherEventsResponse{Events: w.events}
	w.events, w.lastPoll = nil, time.Now()
	ended := w.err
	w.mu.Unlock()
	if out.Events == nil {
		if ended != nil {
			c.s.mu.Lock()
			delete(c.s.watchers, req.WatcherID) // its end is reported now
			c.s.mu.Unlock()
			return nil, rpcErr(codeUnavailable, "the watch ended: %v", ended)
		}
		out.Events = []filesystemEvent{}
	}
	if w.entries {
		c.addEntries(ctx, w.user, w.root, out.Events)
	}
	return out, nil
}

// maxEntryStats bounds the stats one poll makes for its events' entries;
// the entries of the rest stay empty, as envd's are for a path gone.
const maxEntryStats = 256

// addEntries gives polled events the entries of their paths as they are
// now (once per path), except removes and renames away, which have none
// (nor has an event whose path is gone by the poll).
func (c *envdCall) addEntries(ctx context.Context, user, root string, evs []filesystemEvent) {
	seen := map[string]*entryInfo{}
	for i := range evs {
		ev := &evs[i]
		if ev.Type == eventRemove || ev.Type == eventRename {
			continue
		}
		e, ok := seen[ev.Name]
		if !ok && len(seen) < maxEntryStats {
			if fi, err := c.g.Stat(ctx, user, path.Join(root, ev.Name)); err == nil {
				e = entry(fi)
			}
			seen[ev.Name] = e
		}
		ev.Entry = e
	}
}

func (c *envdCall) removeWatcher(ctx context.Context, req *watcherIDRequest) (*empty, error) {
	w, err := c.watcher(req.WatcherID)
	if err != nil {
		return nil, err
	}
	w.stop()
	c.s.mu.Lock()
	delete(c.s.watchers, req.WatcherID)
	c.s.mu.Unlock()
	return &empty{}, nil
}

func isGuestCode(err error, code string) bool {
	var ae *guest.APIError
	return errors.As(err, &ae) && ae.Code == code
}
