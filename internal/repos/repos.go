// Package repos hosts git repositories: bare repositories in the data dir,
// served over git's smart HTTP protocol by git's own http-backend (repos
// never parses a pack), with the pushes a token may make checked by a
// pre-receive hook, each push recorded as an event and sent to the
// repository's webhooks.
package repos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/network"
	"github.com/agentvm/agentvm/internal/store"
)

var (
	// ErrInvalid is a bad request (a name, a URL, a hook).
	ErrInvalid = errors.New("invalid")
	// ErrNotFound is an unknown repository or hook.
	ErrNotFound = errors.New("not found")
	// ErrConflict is a name already taken.
	ErrConflict = errors.New("conflict")
	// ErrUnavailable: the host has no git (the daemon runs without
	// hosted repositories).
	ErrUnavailable = errors.New("unavailable")
)

// DefaultMaxPush bounds what one push may send (git's receive.maxInputSize).
const DefaultMaxPush = 1 << 30

// Config configures the service.
type Config struct {
	// Dir holds the repositories (NAME.git) and what the service keeps
	// beside them (.hooks, .home, .pushes).
	Dir   string
	Store *store.Store
	Log   *slog.Logger
	// MaxPush bounds one push's size in bytes (0: DefaultMaxPush).
	MaxPush int64
	// Event records an event: vmID is "repo:NAME" for a repository's own
	// log, or the id of a VM that pushed.
	Event func(vmID, typ, actor string, data map[string]string, format string, args ...any)
}

// Service owns the hosted repositories.
type Service struct {
	cfg     Config
	git     string // the git binary
	backend string // git http-backend
	hooks   *hookSender
	missing error // why there are no repositories here (no git), or nil

	mu   sync.Mutex
	live map[string]map[*context.CancelFunc]struct{} // requests under way, by repository
}

// hookScripts are the hooks every repository runs (core.hooksPath points at
// them): pre-receive refuses refs outside the pushing token's branch glob,
// post-receive writes what changed for the daemon to record. Both take
// their input from the environment the daemon gives http-backend; a
// repository's own hooks directory is never used.
var hookScripts = map[string]string{
	"pre-receive": `#!/bin/sh
# agentvm: a token limited to some branches pushes only to those.
[ -z "$AGENTVM_BRANCHES" ] && exit 0
while read -r old new ref; do
	case "$ref" in
	refs/heads/$AGENTVM_BRANCHES) ;;
	*)
		echo "agentvm: this token may only push to branches matching '$AGENTVM_BRANCHES', not $ref" >&2
		exit 1
		;;
	esac
done
exit 0
`,
	"post-receive": `#!/bin/sh
# agentvm: tell the daemon which refs this push changed.
[ -n "$AGENTVM_PUSH_LOG" ] && cat >> "$AGENTVM_PUSH_LOG"
exit 0
`,
}

// New prepares the service's directory and finds git. A host without git
// gets a service whose every call fails with ErrUnavailable, saying so.
func New(cfg Config) (*Service, error) {
	if cfg.MaxPush <= 0 {
		cfg.MaxPush = DefaultMaxPush
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Event == nil {
		cfg.Event = func(string, string, string, map[string]string, string, ...any) {}
	}
	s := &Service{cfg: cfg, hooks: newHookSender(cfg.Log)}
	if s.git, s.backend, s.missing = findGit(); s.missing != nil {
		cfg.Log.Warn("no hosted git repositories", "err", s.missing)
		return s, nil
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, ".hooks"), filepath.Join(cfg.Dir, ".home"), filepath.Join(cfg.Dir, ".pushes")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	for name, text := range hookScripts {
		if err := os.WriteFile(filepath.Join(cfg.Dir, ".hooks", name), []byte(text), 0o700); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// findGit finds git and its http-backend.
func findGit() (git, backend string, err error) {
	git, err = exec.LookPath("git")
	if err != nil {
		return "", "", fmt.Errorf("%w: hosted repositories need git, which this host lacks (apt-get install git)", ErrUnavailable)
	}
	out, err := exec.Command(git, "--exec-path").Output()
	if err != nil {
		return "", "", fmt.Errorf("%w: git --exec-path: %v", ErrUnavailable, err)
	}
	backend = filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	if _, err := os.Stat(backend); err != nil {
		return "", "", fmt.Errorf("%w: hosted repositories need git's http-backend: %v", ErrUnavailable, err)
	}
	return git, backend, nil
}

// Close stops the webhook deliveries under way.
func (s *Service) Close() { s.hooks.close() }

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidName checks a repository name: lower-case letters, digits, - and _,
// at most 63 characters, starting with a letter or digit (no dots, so no
// "..", no ".git" suffix and no hidden names).
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: repository name %q: use 1-63 lower-case letters, digits, - and _, starting with a letter or digit", ErrInvalid, name)
	}
	return nil
}

// path is the repository's directory.
func (s *Service) path(name string) string { return filepath.Join(s.cfg.Dir, name+".git") }

// env is the environment of every git the service runs: no user or
// system configuration, no prompts, only http(s) for fetches.
func (s *Service) env(extra ...string) []string {
	env := []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + filepath.Join(s.cfg.Dir, ".home"),
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=/bin/false",
		"GIT_PROTOCOL_FROM_USER=0",
		"LC_ALL=C",
	}
	return append(env, extra...)
}

// run runs git in dir and returns its output; its error names the command
// and git's own message.
func (s *Service) run(ctx context.Context, dir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, s.git, args...)
	cmd.Dir, cmd.Env = dir, s.env()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 2000 {
			msg = msg[len(msg)-2000:]
		}
		return out, fmt.Errorf("git %s: %v: %s", args[0], err, msg)
	}
	return out, nil
}

// Create makes an empty repository (default branch main), or a copy of
// the one at fromURL (every branch and tag). A URL that resolves to a
// loopback, private or link-local address is refused unless allowPrivate.
func (s *Service) Create(ctx context.Context, name, fromURL string, allowPrivate bool) (*api.Repo, error) {
	if s.missing != nil {
		return nil, s.missing
	}
	if err := ValidName(name); err != nil {
		return nil, err
	}
	var pin string
	if fromURL != "" {
		var err error
		if pin, err = checkURL(ctx, fromURL, allowPrivate); err != nil {
			return nil, err
		}
	}
	rec := &store.Repo{Name: name, CreatedAt: time.Now().UTC()}
	if err := s.cfg.Store.CreateRepo(ctx, rec); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("%w: a repository named %q already exists", ErrConflict, name)
		}
		return nil, err
	}
	if err := s.initDir(ctx, name, fromURL, pin); err != nil {
		s.cfg.Store.DeleteRepo(context.WithoutCancel(ctx), name)
		return nil, err
	}
	return s.Get(ctx, name)
}

// initDir makes the repository's directory in a temporary place, then
// renames it into place, so that a failed create leaves nothing.
func (s *Service) initDir(ctx context.Context, name, fromURL, pin string) error {
	final := s.path(name)
	os.RemoveAll(final) // a directory left by a crash between a rename and its record
	tmp, err := os.MkdirTemp(s.cfg.Dir, ".new-"+name+"-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "repo.git")
	if fromURL == "" {
		_, err = s.run(ctx, tmp, "init", "--quiet", "--bare", "--initial-branch=main", dir)
	} else {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
		defer cancel()
		args := []string{"-c", "protocol.allow=never", "-c", "protocol.http.allow=always", "-c", "protocol.https.allow=always",
			"-c", "http.followRedirects=false", "-c", "credential.helper="}
		if pin != "" {
			// git connects to the address checked, whatever the name
			// resolves to by then.
			args = append(args, "-c", "http.curloptResolve="+pin)
		}
		_, err = s.run(ctx, tmp, append(args, "clone", "--quiet", "--bare", "--no-local", "--", fromURL, dir)...)
		if err == nil {
			// Keep no trace of where it came from (a URL may hold a login).
			_, err = s.run(ctx, dir, "remote", "remove", "origin")
		}
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return os.Rename(dir, final)
}

// checkURL admits http and https URLs whose host does not resolve to an
// address the daemon must not fetch from, and returns the pin that makes
// git connect to the address checked (curl's HOST:PORT:ADDRESS; "" for
// an allowed private URL).
func checkURL(ctx context.Context, raw string, allowPrivate bool) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%w: from_url %q: an http:// or https:// URL", ErrInvalid, raw)
	}
	if allowPrivate {
		return "", nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", u.Hostname())
	if err != nil || len(addrs) == 0 {
		return "", fmt.Errorf("%w: from_url: %v", ErrInvalid, err)
	}
	for _, a := range addrs {
		if forbidden(a) {
			return "", fmt.Errorf("%w: from_url: %s resolves to %s, a loopback, private or link-local address (allow it with allow_private)", ErrInvalid, u.Hostname(), a)
		}
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	a := addrs[0].Unmap()
	addr := a.String()
	if a.Is6() {
		addr = "[" + addr + "]"
	}
	return u.Hostname() + ":" + port + ":" + addr, nil
}

// forbidden reports whether a is an address a hook or a fetch may not
// reach without allow_private.
func forbidden(a netip.Addr) bool { return network.IsForbidden(a, network.Policy{}) }

// Get describes a repository (its branches and size are read from git).
func (s *Service) Get(ctx context.Context, name string) (*api.Repo, error) {
	if err := s.Check(ctx, name); err != nil {
		return nil, err
	}
	rec, err := s.record(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.describe(ctx, rec)
}

// Check answers whether the repository exists (and the host can serve
// it), from its record alone: no git runs.
func (s *Service) Check(ctx context.Context, name string) error {
	if s.missing != nil {
		return s.missing
	}
	_, err := s.record(ctx, name)
	return err
}

// record is the repository's record, ErrNotFound naming it when there is none.
func (s *Service) record(ctx context.Context, name string) (*store.Repo, error) {
	rec, err := s.cfg.Store.GetRepo(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: no repository %q", ErrNotFound, name)
	}
	return rec, err
}

func (s *Service) describe(ctx context.Context, rec *store.Repo) (*api.Repo, error) {
	dir := s.path(rec.Name)
	out := &api.Repo{Name: rec.Name, URL: "/git/" + rec.Name + ".git", Branches: map[string]string{}, CreatedAt: rec.CreatedAt}
	refs, err := s.run(ctx, dir, "for-each-ref", "--format=%(objectname) %(refname)", "refs/heads/")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(refs)), "\n") {
		if sha, ref, ok := strings.Cut(line, " "); ok {
			out.Branches[strings.TrimPrefix(ref, "refs/heads/")] = sha
		}
	}
	if head, err := s.run(ctx, dir, "symbolic-ref", "--short", "HEAD"); err == nil {
		out.Head = strings.TrimSpace(string(head))
	}
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				out.SizeBytes += fi.Size()
			}
		}
		return nil
	})
	for _, h := range rec.Hooks {
		out.Hooks = append(out.Hooks, api.RepoHook{ID: h.ID, URL: h.URL, AllowPrivate: h.AllowPrivate, CreatedAt: h.CreatedAt})
	}
	return out, nil
}

// List describes every repository.
func (s *Service) List(ctx context.Context) ([]api.Repo, error) {
	if s.missing != nil {
		return nil, s.missing
	}
	recs, err := s.cfg.Store.ListRepos(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Repo, 0, len(recs))
	for _, rec := range recs {
		r, err := s.describe(ctx, rec)
		if err != nil {
			return nil, fmt.Errorf("repository %s: %w", rec.Name, err)
		}
		out = append(out, *r)
	}
	return out, nil
}

// Delete removes a repository, its tokens and its VMs' access to it. The
// caller revokes the tokens' open connections (auth.Service.RevokeRepo)
// before: their clones and pushes end.
func (s *Service) Delete(ctx context.Context, name string) error {
	if s.missing != nil {
		return s.missing
	}
	if err := ValidName(name); err != nil {
		return err
	}
	if err := s.cfg.Store.DeleteRepo(ctx, name); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: no repository %q", ErrNotFound, name)
		}
		return err
	}
	s.endAll(name) // the clones and pushes under way, the VMs' too
	s.cfg.Store.DeleteEvents(ctx, "repo:"+name)
	// Renamed first: a clone that starts now finds nothing half-removed.
	gone := filepath.Join(s.cfg.Dir, ".gone-"+name+"-"+time.Now().Format("150405.000000000"))
	if err := os.Rename(s.path(name), gone); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.RemoveAll(gone)
}
