package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/repos"
)

// startRepos opens the hosted repositories and the route each VM has to
// its own (http://git.agentvm.internal/NAME.git): it must run before the
// VMs' networks open (Reconcile).
func (s *Server) startRepos() error {
	svc, err := repos.New(repos.Config{Dir: filepath.Join(s.cfg.DataDir, "repos"), Store: s.store, Log: s.log,
		MaxPush: s.cfg.GitMaxPush, Event: s.svc.EventData})
	if err != nil {
		return err
	}
	s.repos = svc
	s.guestGit = newGuestListener(http.HandlerFunc(s.serveGuestGit))
	s.svc.Networks().SetGuestServices(func(vmID string, port uint16) func(net.Conn) {
		if port != 80 {
			return nil
		}
		return func(c net.Conn) { s.guestGit.serve(c, vmID) }
	})
	s.svc.OnFork(func(parent, child string) {
		ctx := context.Background()
		if name, err := s.repos.VMRepo(ctx, parent); err == nil && name != "" {
			if err := s.repos.AttachVM(ctx, child, name); err != nil {
				s.log.Warn("give a fork its parent's repository", "vm", child, "repo", name, "err", err)
			}
		}
	})
	return nil
}

func (s *Server) repoRoutes(mux patternMux) {
	mux.HandleFunc("POST /v1/repos", admin(s.createRepo))
	mux.HandleFunc("GET /v1/repos", admin(s.listRepos))
	mux.HandleFunc("GET /v1/repos/{name}", admin(s.getRepo))
	mux.HandleFunc("DELETE /v1/repos/{name}", admin(s.deleteRepo))
	mux.HandleFunc("POST /v1/repos/{name}/tokens", admin(s.createRepoToken))
	mux.HandleFunc("POST /v1/repos/{name}/hooks", admin(s.addRepoHook))
	mux.HandleFunc("DELETE /v1/repos/{name}/hooks/{hook}", admin(s.removeRepoHook))
	mux.HandleFunc("GET /v1/repos/{name}/events", admin(s.repoEvents))
}

func (s *Server) createRepo(w http.ResponseWriter, r *http.Request) {
	var req api.CreateRepoRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	out, err := s.repos.Create(r.Context(), req.Name, req.FromURL, req.AllowPrivate)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listRepos(w http.ResponseWriter, r *http.Request) {
	list, err := s.repos.List(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, api.ListReposResponse{Repos: list})
}

func (s *Server) getRepo(w http.ResponseWriter, r *http.Request) {
	out, err := s.repos.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteRepo removes a repository; its tokens' open clones and pushes end
// first.
func (s *Server) deleteRepo(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.repos.Check(r.Context(), name); err != nil {
		writeErr(w, err)
		return
	}
	// The tokens go with the record first, then what they hold open ends:
	// a request authenticated in between is ended too (auth remembers).
	ids, err := s.store.RepoTokens(r.Context(), name)
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := s.repos.Delete(r.Context(), name); err != nil {
		writeErr(w, err)
		return
	}
	s.tokens.Ended(r.Context(), ids)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) createRepoToken(w http.ResponseWriter, r *http.Request) {
	var req api.CreateRepoTokenRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	name := r.PathValue("name")
	if err := s.repos.Check(r.Context(), name); err != nil {
		writeErr(w, err)
		return
	}
	t, err := s.tokens.CreateRepo(r.Context(), name, req)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

func (s *Server) addRepoHook(w http.ResponseWriter, r *http.Request) {
	var req api.AddRepoHookRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	h, err := s.repos.AddHook(r.Context(), r.PathValue("name"), req)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, h)
}

func (s *Server) removeRepoHook(w http.ResponseWriter, r *http.Request) {
	if err := s.repos.RemoveHook(r.Context(), r.PathValue("name"), r.PathValue("hook")); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// repoEvents lists a repository's pushes and webhook deliveries, oldest
// first (after=SEQ and limit=N as a VM's events).
func (s *Server) repoEvents(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := s.repos.Check(r.Context(), name); err != nil {
		writeErr(w, err)
		return
	}
	after, err := eventAfter(r.URL.Query().Get("after"))
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	limit, err := eventLimit(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	evs, err := s.svc.Events(r.Context(), "repo:"+name, after, limit)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ListEventsResponse{Events: []api.Event{}}
	for _, e := range evs {
		out.Events = append(out.Events, eventToAPI(e))
	}
	writeJSON(w, http.StatusOK, out)
}

// serveGit answers git's smart HTTP protocol under /git/ on the API
// listener. git sends its credential as HTTP basic auth (any user name, a
// token as the password); a Bearer header works too. Only the admin and
// repository tokens open a repository: a VM's token opens none.
func (s *Server) serveGit(w http.ResponseWriter, r *http.Request) {
	name, rest, err := repos.SplitPath(strings.TrimPrefix(r.URL.Path, "/git/"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	secret := bearer(r)
	if _, pass, ok := r.BasicAuth(); ok {
		secret = pass
	}
	if secret == "" {
		w.Header().Set("WWW-Authenticate", `Basic realm="agentvm git", charset="UTF-8"`)
		http.Error(w, "a token is needed: the admin token or a repository token (agentvm repo token NAME) as the password", http.StatusUnauthorized)
		return
	}
	p, err := s.tokens.Authenticate(r.Context(), secret)
	if err != nil {
		if errors.Is(err, auth.ErrUnauthenticated) {
			w.Header().Set("WWW-Authenticate", `Basic realm="agentvm git", charset="UTF-8"`)
			http.Error(w, "invalid, expired or revoked token", http.StatusUnauthorized)
			return
		}
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if err := p.CanRepo(name, false); err != nil {
		http.Error(w, strings.TrimPrefix(err.Error(), auth.ErrForbidden.Error()+": "), http.StatusForbidden)
		return
	}
	w, r, done, err := s.tokens.TrackHTTP(w, r, p)
	if err != nil {
		http.Error(w, err.Error(), http.StatusTooManyRequests)
		return
	}
	defer done()
	// A clone or push of a big repository takes a while: the API's
	// request deadlines are for API calls.
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Time{})
	rc.SetWriteDeadline(time.Time{})
	s.repos.Serve(w, r, name, rest, repos.Access{Write: p.CanRepo(name, true) == nil, Branches: p.Branches, Actor: p.Actor()})
}

// serveGuestGit answers a VM's own requests to
// http://git.agentvm.internal/NAME.git: the repository the VM was made
// with (or its parent was), read and write, with no credential. The
// connection came through that VM's own network stack, which is what
// identifies it.
func (s *Server) serveGuestGit(w http.ResponseWriter, r *http.Request) {
	vmID, _ := r.Context().Value(guestVMKey{}).(string)
	name, rest, err := repos.SplitPath(strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/git"), "/"))
	if err != nil || vmID == "" {
		http.Error(w, "agentvm: use http://"+network.GitName+"/NAME.git", http.StatusNotFound)
		return
	}
	attached, err := s.repos.VMRepo(r.Context(), vmID)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if attached != name {
		msg := "agentvm: this VM has no repository (create it with --repo NAME)"
		if attached != "" {
			msg = fmt.Sprintf("agentvm: this VM may only reach repository %s", attached)
		}
		http.Error(w, msg, http.StatusForbidden)
		return
	}
	if !s.guestGit.take(vmID) {
		http.Error(w, fmt.Sprintf("agentvm: this VM already has %d git requests under way", maxGuestGit), http.StatusTooManyRequests)
		return
	}
	defer s.guestGit.give(vmID)
	defer s.svc.Hold(vmID)()
	// No branch is rewritten or deleted through it: forks push beside
	// each other, none erases another's work.
	s.repos.Serve(w, r, name, rest, repos.Access{Write: true, Keep: true, Actor: "vm:" + vmID, VM: vmID})
}

// maxGuestGit bounds one VM's git requests under way (each is a git
// process on the host).
const maxGuestGit = 4

// take reserves one of the VM's git request turns.
func (l *guestListener) take(vmID string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.busy == nil {
		l.busy = map[string]int{}
	}
	if l.busy[vmID] >= maxGuestGit {
		return false
	}
	l.busy[vmID]++
	return true
}

func (l *guestListener) give(vmID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.busy[vmID]--; l.busy[vmID] <= 0 {
		delete(l.busy, vmID)
	}
}

// cloneRepo clones the repository spec (NAME or NAME@BRANCH) into dir in
// the VM vmID, as root, and gives the clone to the owner of the directory
// it is made in (/home/agent: agent).
func (s *Server) cloneRepo(ctx context.Context, actor, vmID, name, branch, dir string) error {
	_, gc, err := s.svc.Guest(ctx, vmID)
	if err != nil {
		return err
	}
	if err := s.repos.AttachVM(ctx, vmID, name); err != nil {
		return err
	}
	const script = `set -e
dir="$1" url="$2" branch="$3"
mkdir -p "$(dirname "$dir")"
if [ -n "$branch" ]; then git clone --quiet --branch "$branch" -- "$url" "$dir"; else git clone --quiet -- "$url" "$dir"; fi
chown -R --reference="$(dirname "$dir")" "$dir"
git config --system --add safe.directory "$dir"
git config --system user.name >/dev/null || git config --system user.name agentvm
git config --system user.email >/dev/null || git config --system user.email agent@agentvm.internal
`
	out := &repos.Tail{Max: 4096}
	st, err := gc.Run(ctx, guest.ExecRequest{Argv: []string{"/bin/sh", "-c", script, "clone", dir, "http://" + network.GitName + "/" + name + ".git", branch},
		TimeoutMS: 30 * 60 * 1000}, nil, out, out)
	if err != nil {
		return err
	}
	if st.ExitCode != 0 {
		return fmt.Errorf("%w: cloning repository %s into %s failed (exit %d): %s", repos.ErrInvalid, name, dir, st.ExitCode, out.String())
	}
	at := name
	if branch != "" {
		at += "@" + branch
	}
	s.svc.EventData(vmID, "repo", actor, map[string]string{"repo": name, "branch": branch, "dir": dir}, "cloned repository %s into %s", at, dir)
	return nil
}

// repoSpec reads a create request's repository: NAME[@BRANCH] and the
// directory to clone it into (default /home/agent/NAME).
func repoSpec(spec, dir string) (name, branch, into string, err error) {
	name, branch, _ = strings.Cut(spec, "@")
	if err := repos.ValidName(name); err != nil {
		return "", "", "", err
	}
	if branch != "" && (strings.HasPrefix(branch, "-") || auth.ValidBranches(branch) != nil || strings.ContainsAny(branch, "*?[]!")) {
		return "", "", "", fmt.Errorf("%w: repo %q: %q is not a branch name", repos.ErrInvalid, spec, branch)
	}
	if dir == "" {
		dir = "/home/agent/" + name
	}
	if !strings.HasPrefix(dir, "/") || path.Clean(dir) != dir || dir == "/" || strings.ContainsAny(dir, "\x00\n") {
		return "", "", "", fmt.Errorf("%w: repo_dir %q: an absolute, clean path such as /home/agent/work", repos.ErrInvalid, dir)
	}
	return name, branch, dir, nil
}

// guestVMKey carries, in a guest request's context, the VM it came from.
type guestVMKey struct{}

// guestListener serves HTTP on connections the VMs' networks hand over,
// each tagged with its VM.
type guestListener struct {
	srv   *http.Server
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once

	mu   sync.Mutex
	busy map[string]int // git requests under way per VM
}

func newGuestListener(h http.Handler) *guestListener {
	l := &guestListener{conns: make(chan net.Conn), done: make(chan struct{})}
	l.srv = &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: time.Minute,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if vc, ok := c.(*vmConn); ok {
				return context.WithValue(ctx, guestVMKey{}, vc.vmID)
			}
			return ctx
		}}
	go l.srv.Serve(l)
	return l
}

// serve hands c, from the VM vmID, to the HTTP server and returns when the
// server is done with it (the network closes it then).
func (l *guestListener) serve(c net.Conn, vmID string) {
	vc := &vmConn{Conn: c, vmID: vmID, closed: make(chan struct{})}
	select {
	case l.conns <- vc:
	case <-l.done:
		return
	}
	select {
	case <-vc.closed:
	case <-l.done:
	}
}

func (l *guestListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *guestListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *guestListener) close() {
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.srv.Shutdown(ctx)
}

func (l *guestListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// vmConn is a guest connection that knows its VM and tells when it is
// closed.
type vmConn struct {
	net.Conn
	vmID   string
	closed chan struct{}
	once   sync.Once
}

func (c *vmConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}
