package repos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
)

// Access is what one request may do to a repository.
type Access struct {
	Write    bool
	Branches string // the glob pushed branches must match ("" = any ref)
	// Keep refuses pushes that rewrite or delete a branch (the VMs' own
	// route: a fork cannot erase its siblings' work).
	Keep  bool
	Actor string // who: admin, admin:<id>, token:<id> or vm:<id>
	VM    string // the VM the request comes from, if it does
}

// SplitPath splits the path under /git/ into the repository's name and
// the rest ("app.git/info/refs" -> "app", "/info/refs"); ".git" is optional.
func SplitPath(p string) (name, rest string, err error) {
	first, rest, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
	name = strings.TrimSuffix(first, ".git")
	if err := ValidName(name); err != nil {
		return "", "", err
	}
	return name, "/" + rest, nil
}

// smart lists what the service answers: git's smart HTTP protocol, and
// nothing of the dumb one (the repository's files).
func smart(r *http.Request, rest string) (write, ok bool) {
	switch {
	case r.Method == http.MethodGet && rest == "/info/refs":
		svc := r.URL.Query().Get("service")
		return svc == "git-receive-pack", svc == "git-upload-pack" || svc == "git-receive-pack"
	case r.Method == http.MethodPost && rest == "/git-upload-pack":
		return false, true
	case r.Method == http.MethodPost && rest == "/git-receive-pack":
		return true, true
	}
	return false, false
}

// Serve answers one smart HTTP request for the repository name (rest is
// the path after its name, see SplitPath) with git http-backend, as acc
// allows. The request's context ends the git processes it started (a
// revoked token's push is cut off, and git discards what it received).
func (s *Service) Serve(w http.ResponseWriter, r *http.Request, name, rest string, acc Access) {
	if s.missing != nil {
		http.Error(w, s.missing.Error(), http.StatusServiceUnavailable)
		return
	}
	write, ok := smart(r, rest)
	if !ok {
		http.Error(w, "agentvm serves git's smart HTTP protocol only (clone, fetch, push); not "+r.Method+" "+rest, http.StatusNotFound)
		return
	}
	if _, err := s.cfg.Store.GetRepo(r.Context(), name); err != nil {
		http.Error(w, fmt.Sprintf("no repository %q", name), http.StatusNotFound)
		return
	}
	if write && !acc.Write {
		http.Error(w, fmt.Sprintf("this credential may only read repository %s: push needs write access", name), http.StatusForbidden)
		return
	}
	// Only what the smart protocol reads of the query goes on, checked.
	qs := ""
	if rest == "/info/refs" {
		qs = "service=" + r.URL.Query().Get("service")
	}
	ctx, done := s.inflight(r.Context(), name)
	defer done()
	r = r.WithContext(ctx)
	env := s.env(
		"GIT_PROJECT_ROOT="+s.cfg.Dir,
		"GIT_HTTP_EXPORT_ALL=1",
		"PATH_INFO=/"+name+".git"+rest,
		"REQUEST_METHOD="+r.Method,
		"QUERY_STRING="+qs,
		"CONTENT_TYPE="+r.Header.Get("Content-Type"),
		"REMOTE_USER="+acc.Actor,
		"REMOTE_ADDR="+r.RemoteAddr,
		"HTTP_CONTENT_ENCODING="+r.Header.Get("Content-Encoding"),
		"HTTP_GIT_PROTOCOL="+r.Header.Get("Git-Protocol"),
		"AGENTVM_BRANCHES="+acc.Branches,
	)
	if r.ContentLength >= 0 && r.Method == http.MethodPost {
		env = append(env, "CONTENT_LENGTH="+strconv.FormatInt(r.ContentLength, 10))
	}
	// The service's settings win over any the repository holds: its own
	// hooks never run, pushes are checked object by object and bounded.
	cfg := [][2]string{
		{"http.receivepack", strconv.FormatBool(acc.Write)},
		{"http.uploadpack", "true"},
		{"core.hooksPath", filepath.Join(s.cfg.Dir, ".hooks")},
		{"receive.fsckObjects", "true"},
		{"receive.maxInputSize", strconv.FormatInt(s.cfg.MaxPush, 10)},
		{"receive.denyDeleteCurrent", "true"},
		{"uploadpack.allowFilter", "true"},
		{"receive.denyNonFastForwards", strconv.FormatBool(acc.Keep)},
		{"receive.denyDeletes", strconv.FormatBool(acc.Keep)},
	}
	env = append(env, "GIT_CONFIG_COUNT="+strconv.Itoa(len(cfg)))
	for i, kv := range cfg {
		env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, kv[0]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, kv[1]))
	}
	var pushLog string
	if write && r.Method == http.MethodPost {
		f, err := os.CreateTemp(filepath.Join(s.cfg.Dir, ".pushes"), name+"-")
		if err != nil {
			http.Error(w, "cannot record the push: "+err.Error(), http.StatusInternalServerError)
			return
		}
		f.Close()
		pushLog = f.Name()
		defer os.Remove(pushLog)
		env = append(env, "AGENTVM_PUSH_LOG="+pushLog)
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxPush+1<<20)
	if err := s.cgi(w, r, body, env); err != nil {
		s.cfg.Log.Info("git request failed", "repo", name, "path", rest, "actor", acc.Actor, "err", err)
	}
	if pushLog != "" {
		s.pushed(name, pushLog, acc)
	}
}

// cgi runs git http-backend as a CGI program for r (RFC 3875: the request
// in env and on stdin, the answer's headers then its body on stdout), in
// its own process group, killed with the request's context.
func (s *Service) cgi(w http.ResponseWriter, r *http.Request, body io.Reader, env []string) error {
	cmd := exec.CommandContext(r.Context(), s.backend)
	cmd.Env = env
	cmd.Dir = s.cfg.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	stderr := &Tail{Max: 2048}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		http.Error(w, "cannot start git: "+err.Error(), http.StatusInternalServerError)
		return err
	}
	go func() {
		io.Copy(stdin, body)
		stdin.Close()
	}()
	br := bufio.NewReaderSize(stdout, 32<<10)
	hdr, err := textproto.NewReader(br).ReadMIMEHeader()
	if err != nil {
		cmd.Wait()
		http.Error(w, "git answered nothing: "+stderr.String(), http.StatusBadGateway)
		return fmt.Errorf("read git's headers: %w (%s)", err, stderr.String())
	}
	status := http.StatusOK
	if st := hdr.Get("Status"); st != "" {
		code, _, _ := strings.Cut(st, " ")
		if n, err := strconv.Atoi(code); err == nil && n >= 100 && n < 600 {
			status = n
		}
		hdr.Del("Status")
	}
	for k, vs := range hdr {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(status)
	_, copyErr := io.Copy(flushWriter{w}, br)
	waitErr := cmd.Wait()
	if err := r.Context().Err(); err != nil {
		return fmt.Errorf("ended: %w", context.Cause(r.Context()))
	}
	if waitErr != nil {
		return fmt.Errorf("git http-backend: %v: %s", waitErr, stderr.String())
	}
	return copyErr
}

// flushWriter flushes after each write: a clone's progress and pack reach
// the client as git writes them.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	http.NewResponseController(f.w).Flush()
	return n, err
}

// Tail keeps the last Max bytes written to it (a git's stderr, a clone's
// output), from several writers at once.
type Tail struct {
	Max int
	mu  sync.Mutex
	b   []byte
}

func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.Max {
		t.b = t.b[len(t.b)-t.Max:]
	}
	return len(p), nil
}

func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// maxRefsInEvent is how many of a push's refs its event names.
const maxRefsInEvent = 10

// maxPushLog bounds what a push's log may hold (each ref is one line of
// two hashes and a name).
const maxPushLog = 1 << 20

// pushed records a push that changed refs: an event on the repository
// (and on the VM that pushed), its webhooks, and the repository's HEAD
// when it names a branch that does not exist (the first push of a repo
// whose default branch is not main).
func (s *Service) pushed(name, logPath string, acc Access) {
	f, err := os.Open(logPath)
	if err != nil {
		return
	}
	b, _ := io.ReadAll(io.LimitReader(f, maxPushLog))
	f.Close()
	var refs []api.RefUpdate
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 {
			refs = append(refs, api.RefUpdate{Before: f[0], After: f[1], Ref: f[2]})
		}
	}
	if len(refs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.fixHead(ctx, name, refs)
	// One event per push, whatever its number of refs (a push of
	// thousands must not flush the VM's event log): the first few named.
	data := map[string]string{"repo": name, "refs": strconv.Itoa(len(refs)), "ref": refs[0].Ref, "before": refs[0].Before, "after": refs[0].After}
	var parts []string
	for i, u := range refs {
		if i == maxRefsInEvent {
			parts = append(parts, fmt.Sprintf("and %d more", len(refs)-i))
			break
		}
		parts = append(parts, fmt.Sprintf("%s %s -> %s", u.Ref, short(u.Before), short(u.After)))
	}
	msg := fmt.Sprintf("push to %s: %s", name, strings.Join(parts, ", "))
	s.cfg.Event("repo:"+name, "push", acc.Actor, data, "%s", msg)
	if acc.VM != "" {
		s.cfg.Event(acc.VM, "push", acc.Actor, data, "%s", msg)
	}
	rec, err := s.cfg.Store.GetRepo(ctx, name)
	if err != nil || len(rec.Hooks) == 0 {
		return
	}
	s.hooks.send(name, rec.Hooks, api.RepoPush{Repo: name, Pusher: acc.Actor, VM: acc.VM, Refs: refs, Time: time.Now().UTC()}, s.cfg.Event)
}

func short(sha string) string {
	if strings.Trim(sha, "0") == "" {
		return "(none)"
	}
	return sha[:min(len(sha), 12)]
}

// fixHead points HEAD at a pushed branch when the branch it names does not
// exist, so that clones check something out.
func (s *Service) fixHead(ctx context.Context, name string, refs []api.RefUpdate) {
	dir := s.path(name)
	head, err := s.run(ctx, dir, "symbolic-ref", "HEAD")
	if err != nil {
		return
	}
	if _, err := s.run(ctx, dir, "rev-parse", "--verify", "--quiet", strings.TrimSpace(string(head))); err == nil {
		return
	}
	for _, u := range refs {
		if strings.HasPrefix(u.Ref, "refs/heads/") && strings.Trim(u.After, "0") != "" {
			s.run(ctx, dir, "symbolic-ref", "HEAD", u.Ref)
			return
		}
	}
}

// inflight registers a request to repository name: Delete ends it.
func (s *Service) inflight(ctx context.Context, name string) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	if s.live == nil {
		s.live = map[string]map[*context.CancelFunc]struct{}{}
	}
	if s.live[name] == nil {
		s.live[name] = map[*context.CancelFunc]struct{}{}
	}
	s.live[name][&cancel] = struct{}{}
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		delete(s.live[name], &cancel)
		if len(s.live[name]) == 0 {
			delete(s.live, name)
		}
		s.mu.Unlock()
		cancel()
	}
}

// endAll ends the requests to repository name under way.
func (s *Service) endAll(name string) {
	s.mu.Lock()
	for c := range s.live[name] {
		(*c)()
	}
	s.mu.Unlock()
}

// HasBranch reports whether the repository has the branch ("" = its
// default branch exists).
func (s *Service) HasBranch(ctx context.Context, name, branch string) error {
	r, err := s.Get(ctx, name)
	if err != nil {
		return err
	}
	if branch == "" {
		return nil
	}
	if _, ok := r.Branches[branch]; !ok {
		names := make([]string, 0, len(r.Branches))
		for b := range r.Branches {
			names = append(names, b)
		}
		return fmt.Errorf("%w: repository %s has no branch %q (it has: %s)", ErrInvalid, name, branch, strings.Join(names, ", "))
	}
	return nil
}

// AttachVM lets the VM vmID reach the repository from inside (see
// GuestAccess), e.g. a VM made with --repo or the fork of one.
func (s *Service) AttachVM(ctx context.Context, vmID, name string) error {
	if _, err := s.record(ctx, name); err != nil {
		return err
	}
	return s.cfg.Store.AttachRepo(ctx, vmID, name)
}

// VMRepo is the repository the VM vmID may reach from inside ("" none).
func (s *Service) VMRepo(ctx context.Context, vmID string) (string, error) {
	return s.cfg.Store.VMRepo(ctx, vmID)
}

// ForgetVM ends a deleted VM's access.
func (s *Service) ForgetVM(ctx context.Context, vmID string) error {
	return s.cfg.Store.DetachRepo(ctx, vmID)
}
