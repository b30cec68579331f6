package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
)

// gitRun runs the host's git in dir with env added, and returns its
// combined output and error.
func gitRun(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GIT_TERMINAL_PROMPT=0", "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + dir}, env...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func hasEvent(evs []api.Event, typ, actor string) bool {
	for _, e := range evs {
		if e.Type == typ && e.Actor == actor {
			return true
		}
	}
	return false
}

// gitURL is the repository's URL with secret as the basic-auth password.
func gitURL(base, secret, repo string) string {
	return strings.Replace(base, "http://", "http://x:"+secret+"@", 1) + "/git/" + repo + ".git"
}

// hookReceiver records the webhooks it receives.
type hookReceiver struct {
	mu     sync.Mutex
	bodies [][]byte
	sigs   []string
	url    string
}

func newHookReceiver(t *testing.T) *hookReceiver {
	h := &hookReceiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.bodies, h.sigs = append(h.bodies, b), append(h.sigs, r.Header.Get("X-Agentvm-Signature"))
		h.mu.Unlock()
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	h.url = "http://" + ln.Addr().String() + "/hook"
	return h
}

// pushes returns the pushes received whose signature under secret is
// right, and how many were received in all.
func (h *hookReceiver) pushes(secret string) ([]api.RepoPush, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []api.RepoPush
	for i, b := range h.bodies {
		m := hmac.New(sha256.New, []byte(secret))
		m.Write(b)
		if h.sigs[i] != "sha256="+hex.EncodeToString(m.Sum(nil)) {
			continue
		}
		var p api.RepoPush
		if json.Unmarshal(b, &p) == nil {
			out = append(out, p)
		}
	}
	return out, len(h.bodies)
}

// slowProxy relays TCP connections to target at about rate bytes a
// second from the client, counting what it relayed: a push through it
// lasts long enough to be revoked in the middle.
func slowProxy(t *testing.T, target string, rate int) (addr string, relayed *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	relayed = &atomic.Int64{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go io.Copy(c, up)
				buf := make([]byte, rate/10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, werr := up.Write(buf[:n]); werr != nil {
							return
						}
						relayed.Add(int64(n))
						time.Sleep(100 * time.Millisecond)
					}
					if err != nil {
						up.(*net.TCPConn).CloseWrite()
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), relayed
}

// Hosted git, issue 34: repositories served by git http-backend under
// /git/, repository tokens (read, write, a branch glob) that end on
// revoke in the middle of a push, webhooks signed with their secret, and
// VMs that clone at create and push from inside with no credential, their
// forks to their own branches.
func TestGit(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	admin := s.Token

	// A local repository with two branches goes up with --from-dir.
	src := t.TempDir()
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"commit", "-q", "--allow-empty", "-m", "one"},
		{"checkout", "-q", "-b", "feature"}, {"commit", "-q", "--allow-empty", "-m", "feat"}, {"checkout", "-q", "main"}} {
		if out, err := gitRun(src, nil, args...); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	os.WriteFile(filepath.Join(src, "README"), []byte("hello from the host\n"), 0o644)
	if out, err := gitRun(src, nil, "add", "README"); err != nil {
		t.Fatal(err, out)
	}
	if out, err := gitRun(src, nil, "commit", "-q", "-m", "readme"); err != nil {
		t.Fatal(err, out)
	}
	if out, errOut, code := s.CLI("", "repo", "create", "app", "--from-dir", src); code != 0 {
		t.Fatalf("repo create --from-dir: %s %s", out, errOut)
	}
	r, err := s.Client.GetRepo(ctx, "app")
	if err != nil || len(r.Branches) != 2 || r.Head != "main" {
		t.Fatalf("the repository after --from-dir: %+v %v", r, err)
	}
	if _, errOut, code := s.CLI("", "repo", "create", "app"); code == 0 || !strings.Contains(errOut, "already exists") {
		t.Fatalf("a second repo create app: %d %s", code, errOut)
	}
	if _, errOut, code := s.CLI("", "repo", "create", "../etc"); code == 0 || !strings.Contains(errOut, "repository name") {
		t.Fatalf("repo create ../etc: %d %s", code, errOut)
	}
	if _, err := s.Client.CreateRepo(ctx, api.CreateRepoRequest{Name: "copy", FromURL: gitURL(s.URL, admin, "app")}); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("from_url on loopback without allow_private: %v", err)
	}
	if _, err := s.Client.CreateRepo(ctx, api.CreateRepoRequest{Name: "copy", FromURL: gitURL(s.URL, admin, "app"), AllowPrivate: true}); err != nil {
		t.Fatalf("from_url with allow_private: %v", err)
	}
	if c, err := s.Client.GetRepo(ctx, "copy"); err != nil || c.Branches["main"] != r.Branches["main"] || c.Branches["feature"] != r.Branches["feature"] {
		t.Fatalf("the copy %+v %v, want the branches of %+v", c, err, r.Branches)
	}

	hooks := newHookReceiver(t)
	hout, errOut, code := s.CLI("", "repo", "hook", "add", "app", hooks.url, "--allow-private")
	if code != 0 {
		t.Fatalf("repo hook add: %s", errOut)
	}
	hookSecret := strings.Fields(hout)[1]

	// No token, a bad one, a VM's token, a read token pushing: refused.
	work := t.TempDir()
	if out, err := gitRun(work, nil, "clone", "-q", s.URL+"/git/app.git", "anon"); err == nil {
		t.Fatalf("a clone without a token worked: %s", out)
	}
	if out, err := gitRun(work, nil, "clone", "-q", gitURL(s.URL, "avt_0000", "app"), "bad"); err == nil {
		t.Fatalf("a clone with a bad token worked: %s", out)
	}
	read, err := s.Client.CreateRepoToken(ctx, "app", api.CreateRepoTokenRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := gitRun(work, nil, "clone", "-q", gitURL(s.URL, read.Secret, "app"), "ro"); err != nil {
		t.Fatalf("clone with a read token: %v %s", err, out)
	}
	ro := filepath.Join(work, "ro")
	if b, _ := os.ReadFile(filepath.Join(ro, "README")); string(b) != "hello from the host\n" {
		t.Fatalf("README in the clone: %q", b)
	}
	gitRun(ro, nil, "commit", "-q", "--allow-empty", "-m", "from ro")
	if out, err := gitRun(ro, nil, "push", "-q", "origin", "main"); err == nil || !strings.Contains(out, "403") {
		t.Fatalf("a push with a read token: %v %s", err, out)
	}
	// A read token opens no VM endpoint either.
	rc := client.New(s.URL, read.Secret)
	if _, err := rc.ListVMs(ctx); err == nil {
		t.Fatal("a repository token listed VMs")
	}

	// A write token limited to agent/*.
	limited, err := s.Client.CreateRepoToken(ctx, "app", api.CreateRepoTokenRequest{Access: "write", Branches: "agent/*"})
	if err != nil {
		t.Fatal(err)
	}
	lim := gitURL(s.URL, limited.Secret, "app")
	if out, err := gitRun(ro, nil, "push", lim, "main"); err == nil || !strings.Contains(out, "may only push to branches matching 'agent/*'") {
		t.Fatalf("a limited token pushed to main: %v %s", err, out)
	}
	if out, err := gitRun(ro, nil, "push", "-q", lim, "main:agent/one"); err != nil {
		t.Fatalf("a limited token's push to agent/one: %v %s", err, out)
	}
	head, _ := gitRun(ro, nil, "rev-parse", "HEAD")
	head = strings.TrimSpace(head)
	waitUntil(t, "the webhook of the push to agent/one", 2*time.Minute, func() (bool, string) {
		ps, n := hooks.pushes(hookSecret)
		for _, p := range ps {
			if p.Repo == "app" && len(p.Refs) == 1 && p.Refs[0].Ref == "refs/heads/agent/one" && p.Refs[0].After == head &&
				p.Pusher == "token:"+limited.ID && strings.Trim(p.Refs[0].Before, "0") == "" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d webhooks received", n)
	})
	if _, n := hooks.pushes("not the secret"); n == 0 {
		t.Fatal("no webhook at all")
	} else if ps, _ := hooks.pushes("not the secret"); len(ps) != 0 {
		t.Fatal("a webhook's signature checks out under another secret")
	}

	// Revoked in the middle of a push: the push fails and changes nothing.
	big := filepath.Join(work, "big")
	if out, err := gitRun(work, nil, "clone", "-q", gitURL(s.URL, read.Secret, "app"), "big"); err != nil {
		t.Fatal(err, out)
	}
	junk := make([]byte, 12<<20)
	rand.Read(junk)
	os.WriteFile(filepath.Join(big, "junk.bin"), junk, 0o644)
	gitRun(big, nil, "add", "junk.bin")
	gitRun(big, nil, "commit", "-q", "-m", "big")
	writer, err := s.Client.CreateRepoToken(ctx, "app", api.CreateRepoTokenRequest{Access: "write"})
	if err != nil {
		t.Fatal(err)
	}
	proxy, relayed := slowProxy(t, strings.TrimPrefix(s.URL, "http://"), 1<<20)
	pushDone := make(chan error, 1)
	var pushOut string
	go func() {
		out, err := gitRun(big, nil, "push", gitURL("http://"+proxy, writer.Secret, "app"), "main:big")
		pushOut = out
		pushDone <- err
	}()
	waitUntil(t, "the slow push to be under way", 2*time.Minute, func() (bool, string) { return relayed.Load() > 2<<20, "" })
	if err := s.Client.RevokeToken(ctx, writer.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-pushDone:
		if err == nil {
			t.Fatalf("a push whose token was revoked in the middle succeeded: %s", pushOut)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the revoked push did not end")
	}
	if r, _ := s.Client.GetRepo(ctx, "app"); r.Branches["big"] != "" {
		t.Fatalf("the revoked push made branch big: %+v", r.Branches)
	}

	// A VM made with the repository: cloned, and it pushes with no credential.
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "nope", Memory: 512 << 20, Repo: "missing"}); err == nil || !strings.Contains(err.Error(), "no repository") {
		t.Fatalf("create --repo missing: %v", err)
	}
	if _, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "nope", Memory: 512 << 20, Repo: "app@nobranch"}); err == nil || !strings.Contains(err.Error(), "no branch") {
		t.Fatalf("create --repo app@nobranch: %v", err)
	}
	if _, err := s.Client.GetVM(ctx, "nope"); err == nil {
		t.Fatal("a refused create left a VM")
	}
	if out, errOut, code := s.CLI("", "create", "--name", "dev", "--memory", "512", "--repo", "app@main"); code != 0 {
		t.Fatalf("create --repo app@main: %s %s", out, errOut)
	}
	if r := s.Exec(ctx, "dev", "stat -c %U /home/agent/app/README && cat /home/agent/app/README && git -C /home/agent/app remote get-url origin"); r.ExitCode != 0 ||
		r.Stdout != "agent\nhello from the host\nhttp://git.agentvm.internal/app.git\n" {
		t.Fatalf("the clone in the VM: %+v", r)
	}
	push := func(vm, branch string) {
		t.Helper()
		res, err := s.Client.Exec(ctx, vm, api.ExecRequest{User: "agent", Cwd: "/home/agent/app",
			Shell: "echo " + vm + " > from-vm && git add from-vm && git commit -q -m " + vm + " && git push -q origin HEAD:" + branch + " && git rev-parse HEAD"})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("push from %s: %v %+v", vm, err, res)
		}
		r, _ := s.Client.GetRepo(ctx, "app")
		if got := r.Branches[branch]; got != strings.TrimSpace(res.Stdout) {
			t.Fatalf("branch %s after the push from %s: %q, want %q", branch, vm, got, res.Stdout)
		}
	}
	push("dev", "main")
	dev, _ := s.Client.GetVM(ctx, "dev")
	evs, _ := s.Client.RepoEvents(ctx, "app", 0)
	var pushes []api.Event
	for _, e := range evs {
		if e.Type == "push" {
			pushes = append(pushes, e)
		}
	}
	if last := pushes[len(pushes)-1]; last.Actor != "vm:"+dev.ID || last.Data["ref"] != "refs/heads/main" {
		t.Fatalf("the repository's last push: %+v", last)
	}
	if vevs, err := s.Client.Events(ctx, "dev", 0); err != nil || !hasEvent(vevs, "push", "vm:"+dev.ID) || !hasEvent(vevs, "repo", "admin") {
		t.Fatalf("the VM's events (want its clone and its push): %+v %v", vevs, err)
	}
	if r := s.Exec(ctx, "dev", "cd /home/agent/app && git pull -q && git log --oneline | wc -l"); r.ExitCode != 0 {
		t.Fatalf("git pull in the VM: %+v", r)
	}
	// Only its own repository.
	if r := s.Exec(ctx, "dev", "curl -s 'http://git.agentvm.internal/copy.git/info/refs?service=git-upload-pack'"); !strings.Contains(r.Stdout, "may only reach repository app") {
		t.Fatalf("the VM reached another repository: %+v", r)
	}
	// Forks push to their own branches.
	fr, err := s.Client.Fork(ctx, "dev", 2)
	if err != nil || len(fr.Children) != 2 {
		t.Fatalf("fork: %v %+v", err, fr)
	}
	for i, c := range fr.Children {
		push(c.Name, "fork-"+string(rune('a'+i)))
	}
	// A VM without a repository, and a VM's token on /git/: refused.
	if _, errOut, code := s.CLI("", "create", "--name", "plain", "--memory", "512"); code != 0 {
		t.Fatal(errOut)
	}
	if r := s.Exec(ctx, "plain", "curl -s 'http://git.agentvm.internal/app.git/info/refs?service=git-upload-pack'"); !strings.Contains(r.Stdout, "has no repository") {
		t.Fatalf("a VM without a repository: %+v", r)
	}
	vt, err := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := gitRun(work, nil, "clone", "-q", gitURL(s.URL, vt.Secret, "app"), "vmtok"); err == nil || !strings.Contains(out, "403") {
		t.Fatalf("a VM's token cloned: %v %s", err, out)
	}
	// Deleting the repository ends the VM's access.
	if _, errOut, code := s.CLI("", "repo", "rm", "app"); code != 0 {
		t.Fatal(errOut)
	}
	if r := s.Exec(ctx, "dev", "cd /home/agent/app && git fetch -q 2>&1; echo exit=$?"); strings.Contains(r.Stdout, "exit=0") {
		t.Fatalf("a fetch after repo rm: %+v", r)
	}
	if out, err := gitRun(work, nil, "clone", "-q", gitURL(s.URL, read.Secret, "app"), "gone"); err == nil {
		t.Fatalf("a clone after repo rm: %s", out)
	}
}
