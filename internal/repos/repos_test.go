package repos

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

type event struct{ vm, typ, actor, msg string }

type events struct {
	mu  sync.Mutex
	all []event
}

func (e *events) add(vm, typ, actor string, _ map[string]string, format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = append(e.all, event{vm, typ, actor, fmt.Sprintf(format, args...)})
}

func (e *events) find(typ, sub string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range e.all {
		if ev.typ == typ && strings.Contains(ev.msg, sub) {
			return true
		}
	}
	return false
}

func newService(t *testing.T, maxPush int64) (*Service, *events) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ev := &events{}
	s, err := New(Config{Dir: t.TempDir(), Store: st, MaxPush: maxPush, Event: ev.add})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, ev
}

// serve answers git on an httptest server with one Access for every request.
func serve(t *testing.T, s *Service, acc Access) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, rest, err := SplitPath(strings.TrimPrefix(r.URL.Path, "/git/"))
		if err != nil {
			http.Error(w, err.Error(), 404)
			return
		}
		s.Serve(w, r, name, rest, acc)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/git/"
}

func git(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t",
		"GIT_CONFIG_NOSYSTEM=1", "HOME="+dir, "GIT_TERMINAL_PROMPT=0")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func localRepo(t *testing.T) string {
	dir := t.TempDir()
	for _, a := range [][]string{{"init", "-q", "-b", "main"}, {"commit", "-q", "--allow-empty", "-m", "one"}} {
		if out, err := git(t, dir, a...); err != nil {
			t.Fatal(out, err)
		}
	}
	return dir
}

func TestNames(t *testing.T) {
	for _, bad := range []string{"", "..", ".git", "a.git", "A", "-a", "a/b", "a b", strings.Repeat("a", 64), "a\x00"} {
		if ValidName(bad) == nil {
			t.Errorf("name %q accepted", bad)
		}
	}
	for _, good := range []string{"a", "app", "my-app_2", strings.Repeat("a", 63)} {
		if err := ValidName(good); err != nil {
			t.Errorf("name %q: %v", good, err)
		}
	}
	for in, want := range map[string][2]string{"app.git/info/refs": {"app", "/info/refs"}, "app/git-upload-pack": {"app", "/git-upload-pack"}} {
		n, r, err := SplitPath(in)
		if err != nil || n != want[0] || r != want[1] {
			t.Errorf("SplitPath(%q) = %q %q %v", in, n, r, err)
		}
	}
	for _, bad := range []string{"../x.git/info/refs", "..%2fetc/info/refs", ".hooks/pre-receive"} {
		if _, _, err := SplitPath(bad); err == nil {
			t.Errorf("SplitPath(%q) accepted", bad)
		}
	}
}

// A push over the limit, a corrupt pack and the dumb protocol are refused
// and change nothing; a branch glob refuses other refs with git's own
// message; a push is recorded with its refs.
func TestServe(t *testing.T) {
	s, ev := newService(t, 256<<10)
	ctx := context.Background()
	if _, err := s.Create(ctx, "app", "", false); err != nil {
		t.Fatal(err)
	}
	base := serve(t, s, Access{Write: true, Branches: "agent/*", Actor: "token:t1"})
	src := localRepo(t)
	if out, err := git(t, src, "push", base+"app.git", "main"); err == nil || !strings.Contains(out, "may only push to branches matching 'agent/*'") {
		t.Fatalf("push to main under agent/*: %v %s", err, out)
	}
	if out, err := git(t, src, "push", base+"app.git", "main:agent/x"); err != nil {
		t.Fatalf("push to agent/x: %v %s", err, out)
	}
	if !ev.find("push", "refs/heads/agent/x") {
		t.Fatalf("no push event: %+v", ev.all)
	}
	if r, _ := s.Get(ctx, "app"); r.Head != "agent/x" || len(r.Branches) != 1 {
		t.Fatalf("after the first push (HEAD moves to the pushed branch): %+v", r)
	}
	// Under agent/* nothing else moves: a tag, a note, a deletion of another branch.
	git(t, src, "tag", "v1")
	for _, refspec := range []string{"refs/tags/v1", "main:refs/notes/x", "main:refs/heads/agentx", ":refs/heads/main"} {
		if out, err := git(t, src, "push", base+"app.git", refspec); err == nil || !strings.Contains(out, "may only push to branches matching") && !strings.Contains(out, "does not exist") && !strings.Contains(out, "unable to delete") {
			t.Errorf("push %s under agent/*: %v %s", refspec, err, out)
		}
	}
	if r, _ := s.Get(ctx, "app"); len(r.Branches) != 1 {
		t.Fatalf("refs other than agent/* moved: %+v", r.Branches)
	}
	// Keep (the VMs' route): no rewrite, no deletion.
	keep := serve(t, s, Access{Write: true, Keep: true, Actor: "vm:x"})
	if out, err := git(t, src, "commit", "-q", "--allow-empty", "--amend", "-m", "rewritten"); err != nil {
		t.Fatal(out, err)
	}
	if out, err := git(t, src, "push", "-f", keep+"app.git", "main:agent/x"); err == nil {
		t.Fatalf("a forced push through Keep: %s", out)
	}
	if out, err := git(t, src, "push", keep+"app.git", ":agent/x"); err == nil {
		t.Fatalf("a deletion through Keep: %s", out)
	}
	// Over the limit: incompressible data past 256 KiB.
	f, _ := os.CreateTemp("", "rnd")
	io.CopyN(f, randReader{}, 1<<20)
	f.Close()
	defer os.Remove(f.Name())
	b, _ := os.ReadFile(f.Name())
	os.WriteFile(filepath.Join(src, "big"), b, 0o644)
	git(t, src, "add", "big")
	git(t, src, "commit", "-q", "-m", "big")
	if out, err := git(t, src, "push", base+"app.git", "main:agent/big"); err == nil {
		t.Fatalf("a push over the limit worked: %s", out)
	}
	if r, _ := s.Get(ctx, "app"); r.Branches["agent/big"] != "" {
		t.Fatal("the push over the limit made its branch")
	}
	// A corrupt pack.
	cmd := strings.Repeat("0", 40) + " " + strings.Repeat("1", 40) + " refs/heads/agent/bad\x00 report-status\n"
	resp, err := http.Post(base+"app.git/git-receive-pack", "application/x-git-receive-pack-request",
		strings.NewReader(fmt.Sprintf("%04x%s0000PACK\x00\x00\x00\x02\x00\x00\x00\x01garbage", len(cmd)+4, cmd)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "unpack") || strings.Contains(string(body), "unpack ok") {
		t.Fatalf("a corrupt pack: %d %q", resp.StatusCode, body)
	}
	if r, _ := s.Get(ctx, "app"); r.Branches["agent/bad"] != "" {
		t.Fatal("the corrupt pack made its branch")
	}
	for _, p := range []string{"app.git/HEAD", "app.git/objects/info/packs", "app.git/config"} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404 (no dumb protocol)", p, resp.StatusCode)
		}
	}
	// Read-only access: no push, and git sees the 403.
	ro := serve(t, s, Access{Actor: "token:t2"})
	if out, err := git(t, src, "push", ro+"app.git", "main:agent/ro"); err == nil || !strings.Contains(out, "403") {
		t.Fatalf("a read-only push: %v %s", err, out)
	}
	if out, err := git(t, t.TempDir(), "clone", "-q", ro+"app.git", "c"); err != nil {
		t.Fatalf("a read-only clone: %v %s", err, out)
	}
}

type randReader struct{}

func (randReader) Read(p []byte) (int, error) { return rand.Read(p) }

// A failed create leaves no record and no directory.
func TestCreateFails(t *testing.T) {
	s, _ := newService(t, 0)
	ctx := context.Background()
	for _, u := range []string{"file:///etc", "ftp://x/y", "ext::sh -c id", "http://127.0.0.1:1/x.git", "http://169.254.169.254/x"} {
		if _, err := s.Create(ctx, "x", u, false); err == nil {
			t.Errorf("from_url %q accepted", u)
		}
	}
	if _, err := s.Create(ctx, "x", "http://127.0.0.1:1/x.git", true); err == nil {
		t.Error("a clone from a closed port worked")
	}
	if _, err := s.Get(ctx, "x"); err == nil {
		t.Error("a failed create left its record")
	}
	ents, _ := os.ReadDir(s.cfg.Dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") || strings.HasPrefix(e.Name(), ".new-") {
			t.Errorf("left in the repositories' directory: %s", e.Name())
		}
	}
}

// Webhooks: signed, retried until they answer 2xx; a redirect and a
// private address without allow_private are failures, recorded.
func TestHooks(t *testing.T) {
	hookBackoff, hookTimeout = 10*time.Millisecond, 300*time.Millisecond
	defer func() { hookBackoff, hookTimeout = time.Second, 10*time.Second }()
	s, ev := newService(t, 0)
	ctx := context.Background()
	if _, err := s.Create(ctx, "app", "", false); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got [][]byte
	var sigs []string
	tries := 0
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		tries++
		if tries == 1 {
			http.Error(w, "not yet", 500)
			return
		}
		b, _ := io.ReadAll(r.Body)
		got, sigs = append(got, b), append(sigs, r.Header.Get(SignatureHeader))
	}))
	defer recv.Close()
	redirect := httptest.NewServer(http.RedirectHandler(recv.URL, http.StatusFound))
	defer redirect.Close()
	hang := make(chan struct{})
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-hang }))
	defer hanging.Close()
	defer close(hang)
	ok, err := s.AddHook(ctx, "app", api.AddRepoHookRequest{URL: recv.URL, AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddHook(ctx, "app", api.AddRepoHookRequest{URL: redirect.URL, AllowPrivate: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddHook(ctx, "app", api.AddRepoHookRequest{URL: recv.URL}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddHook(ctx, "app", api.AddRepoHookRequest{URL: hanging.URL, AllowPrivate: true}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "ftp://x", "/relative", "http://"} {
		if _, err := s.AddHook(ctx, "app", api.AddRepoHookRequest{URL: bad}); err == nil {
			t.Errorf("hook %q accepted", bad)
		}
	}
	base := serve(t, s, Access{Write: true, Actor: "admin"})
	if out, err := git(t, localRepo(t), "push", base+"app.git", "main"); err != nil {
		t.Fatal(out, err)
	}
	deadline := time.Now().Add(time.Minute)
	for !(ev.find("webhook", "delivered") && ev.find("webhook", "no redirects") && ev.find("webhook", "private") && ev.find("webhook", "deadline exceeded")) {
		if time.Now().After(deadline) {
			t.Fatalf("webhook outcomes: %+v", ev.all)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Fatalf("%d deliveries reached the receiver, want 1 (the redirect and the private one must not)", len(got))
	}
	m := hmac.New(sha256.New, []byte(ok.Secret))
	m.Write(got[0])
	if sigs[0] != "sha256="+hex.EncodeToString(m.Sum(nil)) {
		t.Fatalf("signature %q", sigs[0])
	}
	var p api.RepoPush
	if err := json.Unmarshal(got[0], &p); err != nil || p.Repo != "app" || len(p.Refs) != 1 || p.Refs[0].Ref != "refs/heads/main" || p.Pusher != "admin" {
		t.Fatalf("body %s %v", got[0], err)
	}
}
