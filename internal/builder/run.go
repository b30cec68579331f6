package builder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// run is one build's execution: the machine, its steps, its output.
type run struct {
	b     *Builder
	req   Request
	p     *plan
	files *buildContext
	out   func(Event)
	total int // steps shown: FROM, each step, the start

	step  int        // the step under way (1-based)
	cur   *step      // and its plan (nil: FROM, or the start command)
	log   []byte     // the build's output, its last maxLog bytes
	lines lineWriter // a step's output, its lines sent as notes (emit: note)
	made  map[string]bool
}

const (
	maxLog    = 64 << 10
	tailLines = 20
)

// heading sends a step's heading.
func (r *run) heading(step int, text string, cached bool) {
	r.step = step
	r.lines.lines = nil
	r.out(Event{Step: step, Of: r.total, Instruction: text, Cached: cached})
	mark := ""
	if cached {
		mark = " (cached)"
	}
	r.keep(fmt.Sprintf("[%d/%d] %s%s\n", step, r.total, text, mark))
}

// Write takes a step's output (stdout and stderr), sent a line at a time.
func (r *run) Write(b []byte) (int, error) { return r.lines.Write(b) }

func (r *run) flush() { r.lines.flush() }

// lineWriter splits a command's output into lines (one longer than 4 KiB
// is cut), gives each, "\n"-ended, to emit, and keeps the last tailLines
// for an error to show.
type lineWriter struct {
	emit  func(line string)
	part  []byte // a line not ended yet
	lines []string
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.part = append(w.part, b...)
	for {
		i := bytes.IndexByte(w.part, '\n')
		if i < 0 && len(w.part) < 4096 {
			break
		}
		if i < 0 {
			i = len(w.part) - 1
		}
		line := string(w.part[:i+1])
		w.part = w.part[i+1:]
		w.line(line)
	}
	return len(b), nil
}

func (w *lineWriter) flush() {
	if len(w.part) > 0 {
		w.line(string(w.part) + "\n")
		w.part = nil
	}
}

func (w *lineWriter) line(l string) {
	w.emit(l)
	w.lines = append(w.lines, strings.TrimRight(l, "\n"))
	if len(w.lines) > tailLines {
		w.lines = w.lines[len(w.lines)-tailLines:]
	}
}

// tail is the last lines written.
func (w *lineWriter) tail() string { return strings.Join(w.lines, "\n") }

// note is a line of the builder's own.
func (r *run) note(l string) {
	r.out(Event{Step: r.step, Log: l})
	r.keep(l)
}

func (r *run) keep(s string) {
	r.log = append(r.log, s...)
	if len(r.log) > maxLog {
		r.log = r.log[len(r.log)-maxLog:]
	}
}

func (r *run) logTail() string { return string(r.log) }

func (r *run) fail(s *step, exit int, reason string) error {
	r.flush()
	text, line := r.startText(), r.p.startLine // the start command's, unless a step's
	if s != nil {
		text, line = s.text, s.line
	}
	return &StepError{Step: r.step, Line: line, Instruction: text, ExitCode: exit, Output: r.lines.tail(), Reason: reason}
}

// ended is the error of a build whose context ended during step s (nil:
// the start command's wait): its time limit, or a cancel.
func (r *run) ended(ctx context.Context, s *step) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return r.fail(s, -1, fmt.Sprintf("the build's time limit (%s) ran out", r.req.Timeout))
	}
	return r.fail(s, -1, "the build was cancelled (its client went away, or the daemon is stopping)")
}

// cached returns the snapshot a cached step left, "" if none; a step whose
// snapshot was removed is forgotten.
func (r *run) cached(ctx context.Context, key string) string {
	if r.req.NoCache {
		return ""
	}
	l, err := r.b.store.GetLayer(ctx, key)
	if err != nil {
		return ""
	}
	sn, err := r.b.m.GetSnapshot(ctx, l.SnapshotID)
	if err != nil {
		if errors.Is(err, vm.ErrNotFound) {
			r.b.store.DeleteLayer(ctx, key)
		}
		return ""
	}
	if sn.Node != r.b.node && sn.StoredAt.IsZero() { // another node's, and not in the object store
		return ""
	}
	return l.SnapshotID
}

// execute runs what is not cached and returns the final snapshot.
func (r *run) execute(ctx context.Context, parentSnap *store.Snapshot, baseKey, final string, cpus int, mem, disk int64) (string, error) {
	steps := r.p.steps
	if snap := r.cached(ctx, final); snap != "" {
		r.heading(1, r.p.text[0], true)
		for i, s := range steps {
			r.heading(i+2, s.text, true)
		}
		r.heading(r.total, r.startText(), true)
		return snap, nil
	}
	from, fromSnap := -1, ""
	for i := len(steps) - 1; i >= 0; i-- {
		if snap := r.cached(ctx, steps[i].key); snap != "" {
			from, fromSnap = i, snap
			break
		}
	}
	r.heading(1, r.p.text[0], from >= 0)
	o := vm.CreateOptions{Name: "build-" + randHex(5), CPUs: cpus, MemoryMiB: mem, DiskBytes: disk,
		Labels: map[string]string{BuildLabel: r.req.Name}, Env: map[string]string{}}
	var v *store.VM
	var err error
	switch {
	case fromSnap != "":
		v, _, err = r.b.m.CreateFrom(ctx, fromSnap, o)
	case parentSnap != nil:
		v, _, err = r.b.m.CreateFrom(ctx, parentSnap.ID, o)
	default:
		o.Image = r.p.image
		v, _, err = r.b.m.Create(ctx, o)
	}
	if v != nil {
		defer func() {
			if err := r.b.m.Delete(context.WithoutCancel(ctx), v.ID); err != nil {
				r.b.log.Warn("deleting a build's VM", "vm", v.ID, "err", err)
			}
		}()
	}
	if err != nil {
		return "", fmt.Errorf("starting the build's VM: %w", err)
	}
	_, g, err := r.b.m.Guest(ctx, v.ID)
	if err != nil {
		return "", fmt.Errorf("the build's VM: %w", err)
	}
	r.made = map[string]bool{"/": true}
	parent := baseKey
	for i, s := range steps {
		r.heading(i+2, s.text, i <= from)
		if i <= from {
			parent = s.key
			continue
		}
		r.cur = s
		if err := r.runStep(ctx, g, s); err != nil {
			return "", err
		}
		if _, err := r.layer(ctx, v.ID, s.key, parent, s.text); err != nil {
			return "", err
		}
		parent = s.key
	}
	r.heading(r.total, r.startText(), false)
	r.cur = nil
	if err := r.start(ctx, g); err != nil {
		return "", err
	}
	return r.layer(ctx, v.ID, final, parent, r.startText())
}

func (r *run) startText() string {
	switch {
	case len(r.p.start) == 0:
		return "snapshot (no start command)"
	case r.p.startText == "":
		return "start " + strings.Join(r.p.start, " ") + " (the base template's)"
	}
	return "start " + strings.Join(r.p.start, " ")
}

// layer snapshots the machine as the cached step key.
func (r *run) layer(ctx context.Context, vmID, key, parent, text string) (string, error) {
	sn, err := r.b.m.Snapshot(ctx, vmID, "layer-"+key[:16]+"-"+randHex(3))
	if err != nil {
		return "", fmt.Errorf("step %d: saving its result: %w", r.step, err)
	}
	r.note(fmt.Sprintf("saved as %s (%d MiB of memory state, guest paused %d ms)\n", sn.Name, sn.Bytes>>20, sn.PausedMs))
	bg := context.WithoutCancel(ctx)
	if old, gerr := r.b.store.GetLayer(bg, key); gerr == nil && (r.req.NoCache || r.cached(bg, key) == "") {
		// A build without the cache replaces what it finds cached, as
		// does one whose cached step it could not use (another node's):
		// the old machine stays as a superseded step until no template
		// uses it (a prune removes it then).
		if err := r.b.store.PutLayer(bg, &store.Layer{Key: "superseded-" + randHex(8) + "-" + key[:16], SnapshotID: old.SnapshotID,
			Parent: old.Parent, Step: old.Step, CreatedAt: old.CreatedAt}); err != nil {
			r.b.m.DeleteSnapshot(bg, sn.ID)
			return "", err
		}
		if err := r.b.store.DeleteLayer(bg, key); err != nil {
			r.b.m.DeleteSnapshot(bg, sn.ID)
			return "", err
		}
	}
	err = r.b.store.PutLayer(bg, &store.Layer{Key: key, SnapshotID: sn.ID, Parent: parent, Step: text, CreatedAt: time.Now().UTC()})
	if errors.Is(err, store.ErrConflict) { // another build cached the same step meanwhile
		if l, gerr := r.b.store.GetLayer(bg, key); gerr == nil {
			r.b.m.DeleteSnapshot(bg, sn.ID)
			return l.SnapshotID, nil
		}
	}
	if err != nil {
		r.b.m.DeleteSnapshot(context.WithoutCancel(ctx), sn.ID)
		return "", err
	}
	return sn.ID, nil
}

// mkdirScript makes $1 with its missing parents, gives those it made to
// $2 (when set: a COPY --chown's owner, as BuildKit does), and prints the
// directory's real path.
const mkdirScript = `set -e
d=$1 made=
while [ ! -e "$d" ] && [ "$d" != / ]; do made="$d
$made"; d=$(dirname -- "$d"); done
mkdir -p -- "$1"
if [ -n "$2" ]; then printf '%s' "$made" | while IFS= read -r x; do [ -z "$x" ] || chown -- "$2" "$x"; done; fi
readlink -f -- "$1"`

// ensureDir makes a directory as root, the parts it made owned by owner
// when given (a COPY's --chown, a RUN's USER: as BuildKit makes them). A
// failure is s's (nil: the start command's).
func (r *run) ensureDir(ctx context.Context, g *guest.Client, s *step, dir, owner string) (string, error) {
	out := &limitedBuffer{max: 8 << 10} // a path; a hostile guest gets no more
	st, err := g.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", mkdirScript, "sh", dir, owner}, User: "root"}, nil, out, r)
	if err != nil {
		return "", r.fail(s, -1, fmt.Sprintf("making %s: %v", dir, err))
	}
	if st.ExitCode != 0 {
		return "", r.fail(s, st.ExitCode, "making directory "+dir)
	}
	r.made[dir] = true
	return strings.TrimSpace(out.String()), nil
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (r *run) runStep(ctx context.Context, g *guest.Client, s *step) error {
	if s.copy != nil {
		return r.copyStep(ctx, g, s)
	}
	if !r.made[s.cwd] {
		if _, err := r.ensureDir(ctx, g, s, s.cwd, ownerOf(s.user)); err != nil {
			return err
		}
	}
	user := s.user
	if user == "" {
		user = "root"
	}
	st, err := g.Run(ctx, guest.ExecRequest{Argv: s.argv, Env: s.env, Cwd: s.cwd, User: user}, nil, r, r)
	r.flush()
	if ctx.Err() != nil { // the guest kills a command whose call ended
		return r.ended(ctx, s)
	}
	if err != nil {
		return r.fail(s, -1, err.Error())
	}
	if st.ExitCode != 0 || st.Signal != "" {
		reason := fmt.Sprintf("exited with code %d", st.ExitCode)
		if st.Signal != "" {
			reason = "killed by " + st.Signal
		}
		return r.fail(s, st.ExitCode, reason)
	}
	return nil
}

func (r *run) copyStep(ctx context.Context, g *guest.Client, s *step) error {
	cs := s.copy
	dir, err := r.ensureDir(ctx, g, s, cs.destDir, cs.owner)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(cs.writeTar(pw, r.files)) }()
	res, err := g.WriteTar(ctx, "root", dir, pr)
	pr.Close()
	if err != nil {
		return r.fail(s, -1, err.Error())
	}
	r.note(fmt.Sprintf("copied %d entries to %s\n", res.Files, path.Clean(cs.destDir)))
	return nil
}

// start runs the start command as the service StartService and waits for
// it to be ready.
func (r *run) start(ctx context.Context, g *guest.Client) error {
	wd := orRoot(r.p.workdir)
	if !r.made[wd] {
		if _, err := r.ensureDir(ctx, g, nil, wd, ownerOf(r.p.user)); err != nil {
			return err
		}
	}
	if err := g.DeleteService(ctx, StartService); err != nil && !isNotFound(err) {
		return r.fail(nil, -1, "replacing the base's start command: "+err.Error())
	}
	if len(r.p.start) == 0 {
		return nil
	}
	user := r.p.user
	if user == "" {
		user = "root"
	}
	if _, err := g.CreateService(ctx, api.ServiceCreate{Name: StartService, Argv: r.p.start, Env: r.p.env, Cwd: wd, User: user}); err != nil {
		return r.fail(nil, -1, "starting the start command: "+err.Error())
	}
	deadline := time.Now().Add(r.req.ReadyTimeout)
	check, what := r.readyCheck(g, wd, user)
	r.note(fmt.Sprintf("waiting until %s (up to %s)\n", what, r.req.ReadyTimeout))
	for {
		info, err := g.GetService(ctx, StartService)
		if err != nil {
			return r.fail(nil, -1, "the start command's service: "+err.Error())
		}
		if info.ActiveState == "failed" || info.ActiveState == "inactive" && info.SubState != "auto-restart" {
			return r.fail(nil, -1, fmt.Sprintf("the start command exited (service %s/%s)%s", info.ActiveState, info.SubState, r.serviceLog(ctx, g)))
		}
		if info.ActiveState == "active" {
			ok, err := check(ctx)
			if err != nil {
				return err
			}
			if ok {
				r.note("ready\n")
				return nil
			}
		}
		if time.Now().After(deadline) {
			return r.fail(nil, -1, fmt.Sprintf("not ready after %s: %s%s", r.req.ReadyTimeout, what, r.serviceLog(ctx, g)))
		}
		select {
		case <-ctx.Done():
			return r.ended(ctx, nil)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// readyCheck is the start command's ready check: the HEALTHCHECK command
// if any, else every EXPOSEd port accepting connections, else the service
// staying up for two seconds.
func (r *run) readyCheck(g *guest.Client, wd, user string) (func(context.Context) (bool, error), string) {
	switch {
	case len(r.p.ready) > 0:
		return func(ctx context.Context) (bool, error) {
			st, err := g.Run(ctx, guest.ExecRequest{Argv: r.p.ready, Env: r.p.env, Cwd: wd, User: user, TimeoutMS: 30_000}, nil, io.Discard, io.Discard)
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			return err == nil && st.ExitCode == 0, nil
		}, "the HEALTHCHECK command succeeds"
	case len(r.p.expose) > 0:
		return func(ctx context.Context) (bool, error) {
			for _, port := range r.p.expose {
				c, err := g.DialTCP(ctx, "127.0.0.1", port)
				if err != nil {
					return false, nil
				}
				c.Close()
			}
			return true, nil
		}, fmt.Sprintf("port(s) %s accept connections", strings.Trim(fmt.Sprint(r.p.expose), "[]"))
	default:
		var up time.Time
		return func(ctx context.Context) (bool, error) {
			if up.IsZero() {
				up = time.Now()
			}
			return time.Since(up) >= 2*time.Second, nil
		}, "the start command has run for 2 s"
	}
}

func (r *run) serviceLog(ctx context.Context, g *guest.Client) string {
	rc, err := g.ServiceLogs(ctx, StartService, tailLines, false)
	if err != nil {
		return ""
	}
	defer rc.Close()
	b, _ := io.ReadAll(io.LimitReader(rc, 16<<10))
	if len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	return "; its log:\n" + strings.TrimRight(string(b), "\n")
}

// ownerOf is who a WORKDIR made for user belongs to ("" for root).
func ownerOf(user string) string {
	if user == "" || user == "root" {
		return ""
	}
	return user
}

func isNotFound(err error) bool {
	var ae *guest.APIError
	return errors.As(err, &ae) && ae.Status == 404
}
