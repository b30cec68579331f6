package e2e

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// writeFiles writes name → content under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// buildVMs lists the VMs of template builds still there.
func buildVMs(t *testing.T, s *testenv.Server) []string {
	t.Helper()
	vms, err := s.Client.ListVMs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range vms {
		if _, ok := v.Labels[api.TemplateBuildLabel]; ok {
			out = append(out, v.Name)
		}
	}
	return out
}

const appDockerfile = `# every instruction kind a template build takes
ARG BASE=default
FROM ${BASE}
ARG GREETING=hello
ENV APP_HOME=/opt/app PORT=8000
LABEL team=agents
WORKDIR $APP_HOME
COPY --chown=user:user site/ ./
ADD --chmod=755 serve.sh /usr/local/bin/
COPY notes/*.txt /etc/app-notes/
RUN echo "$GREETING from $(pwd) as $(id -un)" > greeting.txt
USER user
RUN ["/bin/sh", "-c", "id -un > /tmp/built-by"]
SHELL ["/bin/bash", "-c"]
RUN echo "shell is $0" > /tmp/shell
EXPOSE 8000
HEALTHCHECK --interval=2s CMD curl -fsS http://127.0.0.1:8000/index.html
CMD ["serve.sh"]
`

func TestTemplates(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"app/site/index.html":     "<h1>from a template</h1>\n",
		"app/serve.sh":            "#!/bin/sh\nexec python3 -m http.server \"$PORT\" --directory \"$APP_HOME\"\n",
		"app/notes/a.txt":         "note a\n",
		"app/notes/b.md":          "not copied\n",
		"app/secret.key":          "must not reach the build\n",
		"app/.dockerignore":       "secret.key\n",
		"dockerfiles/app":         appDockerfile,
		"dockerfiles/volume":      "FROM default\nRUN true\nVOLUME /data\n",
		"dockerfiles/missing":     "FROM default\nCOPY nowhere.txt /x\n",
		"dockerfiles/oci":         "FROM 127.0.0.1:1/team/nothing:here\n",
		"dockerfiles/fails":       "FROM default\nRUN echo preparing; echo boom >&2; exit 3\n",
		"dockerfiles/slow":        "FROM default\nRUN echo started; sleep 600\n",
		"dockerfiles/child":       "FROM app\nRUN echo child > /tmp/child\n",
		"dockerfiles/selfish-cmd": "FROM default\nCMD [\"/bin/false\"]\n",
	})
	appDir := filepath.Join(dir, "app")
	df := func(name string) string { return filepath.Join(dir, "dockerfiles", name) }
	build := func(name, file string, extra ...string) (string, string, int) {
		t.Helper()
		return s.CLI("", append([]string{"template", "build", name, appDir, "-f", file, "--memory", "512"}, extra...)...)
	}

	t.Run("refused before any VM", func(t *testing.T) {
		for file, want := range map[string]string{
			"volume":  "Dockerfile line 3: VOLUME: not supported",
			"missing": "Dockerfile line 2: COPY: nowhere.txt: no such file or directory in the build context",
			"oci":     "Dockerfile line 1: FROM: 127.0.0.1:1/team/nothing:here is not an image (default, code-interpreter, browser) or a template, and as an OCI image: pulling",
		} {
			out, errOut, code := build("bad", df(file))
			if code == 0 || !strings.Contains(errOut, want) {
				t.Errorf("%s: exit %d, stdout %q, stderr %q; want a refusal with %q", file, code, out, errOut, want)
			}
		}
		if _, errOut, code := build("default", df("app")); code == 0 || !strings.Contains(errOut, "an image's name") {
			t.Errorf("a template named as an image: exit %d %q", code, errOut)
		}
		if vms := buildVMs(t, s); len(vms) != 0 {
			t.Fatalf("a refused build left VMs: %v", vms)
		}
	})

	t.Run("access", func(t *testing.T) {
		v := s.CreateVM(ctx, api.CreateVMRequest{Name: "tpl-token"})
		tok, err := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID})
		if err != nil {
			t.Fatal(err)
		}
		for who, c := range map[string]*client.Client{"a VM's token": client.New(s.URL, tok.Secret), "no token": client.New(s.URL, "")} {
			_, err := c.BuildTemplate(ctx, "x", strings.NewReader(""), client.BuildOptions{}, nil)
			var ae *client.APIError
			if !errors.As(err, &ae) || (ae.Status != 401 && ae.Status != 403) {
				t.Errorf("%s: build answered %v, want 401 or 403", who, err)
			}
			if _, err := c.ListTemplates(ctx); !errors.As(err, &ae) || (ae.Status != 401 && ae.Status != 403) {
				t.Errorf("%s: list answered %v, want 401 or 403", who, err)
			}
			if _, err := c.TagTemplate(ctx, "x", "v1"); !errors.As(err, &ae) || (ae.Status != 401 && ae.Status != 403) {
				t.Errorf("%s: tag answered %v, want 401 or 403", who, err)
			}
		}
		if err := s.Client.DeleteVM(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
	})

	var first *api.BuiltTemplate
	t.Run("build, create, serve", func(t *testing.T) {
		out, errOut, code := build("app", df("app"))
		if code != 0 {
			t.Fatalf("build: exit %d\n%s\n%s", code, out, errOut)
		}
		for _, want := range []string{"[1/8] FROM ${BASE}", "[2/8] COPY --chown=user:user site/ ./", "[5/8] RUN echo \"$GREETING", "[8/8] start serve.sh", "ready"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("the build's progress lacks %q:\n%s", want, errOut)
			}
		}
		if strings.Contains(errOut, "CACHED") {
			t.Errorf("a first build reported cached steps:\n%s", errOut)
		}
		var err error
		if first, err = s.Client.GetTemplate(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		if first.Base != "default" || first.Workdir != "/opt/app" || first.User != "user" || first.Env["PORT"] != "8000" || first.MemoryMiB != 512 ||
			len(first.Expose) != 1 || first.Ready != "curl -fsS http://127.0.0.1:8000/index.html" || !strings.Contains(first.BuildLog, "[8/8] start serve.sh") {
			t.Fatalf("the template: %+v", first)
		}
		if vms := buildVMs(t, s); len(vms) != 0 {
			t.Fatalf("the build left its VM: %v", vms)
		}
		out, errOut, code = s.CLI("", "create", "--template", "app", "--name", "tbox")
		if code != 0 {
			t.Fatalf("create --template: %d %q %q", code, out, errOut)
		}
		// No wait: the service was ready when the machine was saved.
		r := s.Exec(ctx, "tbox", "curl -sS --max-time 10 http://127.0.0.1:8000/index.html")
		if r.ExitCode != 0 || r.Stdout != "<h1>from a template</h1>\n" {
			t.Fatalf("the start command does not answer at once: %+v", r)
		}
		r = s.Exec(ctx, "tbox", `cat /opt/app/greeting.txt /tmp/built-by /tmp/shell /etc/app-notes/a.txt; stat -c '%U:%G %a %n' /opt/app/index.html /usr/local/bin/serve.sh;
ls /etc/app-notes; ls /opt/app; echo "env $PORT $APP_HOME"; systemctl is-active agentvm-template-start`)
		want := "hello from /opt/app as root\nuser\nshell is /bin/bash\nnote a\nuser:user 644 /opt/app/index.html\nroot:root 755 /usr/local/bin/serve.sh\n" +
			"a.txt\ngreeting.txt\nindex.html\nenv 8000 /opt/app\nactive\n"
		if r.Stdout != want {
			t.Fatalf("the built machine:\n%s\nwant:\n%s\nstderr %s", r.Stdout, want, r.Stderr)
		}
	})
	if first == nil {
		t.FailNow()
	}

	t.Run("rebuilds use the cache", func(t *testing.T) {
		_, errOut, code := build("app", df("app"))
		if code != 0 || strings.Count(errOut, "CACHED") != 8 {
			t.Fatalf("a no-op rebuild: exit %d, want 8 cached steps:\n%s", code, errOut)
		}
		if t2, _ := s.Client.GetTemplate(ctx, "app"); t2.Snapshot != first.Snapshot {
			t.Fatalf("a no-op rebuild changed the snapshot: %s → %s", first.Snapshot, t2.Snapshot)
		}
		changed := strings.Replace(appDockerfile, `echo "shell is $0"`, `echo "shell was $0"`, 1)
		writeFiles(t, dir, map[string]string{"dockerfiles/app2": changed})
		_, errOut, code = build("app", df("app2"))
		if code != 0 {
			t.Fatalf("rebuild: %d\n%s", code, errOut)
		}
		for _, l := range strings.Split(errOut, "\n") {
			if !strings.HasPrefix(l, "[") {
				continue
			}
			cached := strings.HasSuffix(l, "CACHED")
			late := strings.HasPrefix(l, "[7/8]") || strings.HasPrefix(l, "[8/8]")
			if cached == late {
				t.Errorf("rebuild with step 7 changed: %q", l)
			}
		}
		t2, _ := s.Client.GetTemplate(ctx, "app")
		if t2.Snapshot == first.Snapshot {
			t.Fatal("the rebuild kept the old snapshot")
		}
		// Without the cache every step runs again, and the next build's cache
		// holds what that build made.
		_, errOut, code = build("app", df("app2"), "--no-cache")
		if code != 0 || strings.Contains(errOut, "CACHED") {
			t.Fatalf("--no-cache: %d\n%s", code, errOut)
		}
		t3, _ := s.Client.GetTemplate(ctx, "app")
		if t3.Snapshot == t2.Snapshot {
			t.Fatal("a --no-cache build kept the cached machine")
		}
		_, errOut, code = build("app", df("app2"))
		if t4, _ := s.Client.GetTemplate(ctx, "app"); code != 0 || strings.Count(errOut, "CACHED") != 8 || t4.Snapshot != t3.Snapshot {
			t.Fatalf("the build after --no-cache: %d, snapshot %s (want %s)\n%s", code, t4.Snapshot, t3.Snapshot, errOut)
		}
		// VMs made from the old build are untouched.
		if r := s.Exec(ctx, "tbox", "cat /tmp/shell"); r.Stdout != "shell is /bin/bash\n" {
			t.Fatalf("the first build's VM changed: %+v", r)
		}
	})

	t.Run("tags", func(t *testing.T) {
		cur, err := s.Client.GetTemplate(ctx, "app")
		if err != nil {
			t.Fatal(err)
		}
		if out, errOut, code := s.CLI("", "template", "tag", "app", "v1", "stable"); code != 0 || out != "app:v1\napp:stable\n" {
			t.Fatalf("template tag: %d %q %q", code, out, errOut)
		}
		// A build as NAME:TAG is NAME's latest and that tag; the older tags stay.
		changed := strings.Replace(appDockerfile, `echo "shell is $0"`, `echo "shell now $0"`, 1)
		writeFiles(t, dir, map[string]string{"dockerfiles/app3": changed})
		if _, errOut, code := build("app:v2", df("app3")); code != 0 {
			t.Fatalf("build app:v2: %d\n%s", code, errOut)
		}
		latest, _ := s.Client.GetTemplate(ctx, "app")
		v1, _ := s.Client.GetTemplate(ctx, "app:v1")
		v2, _ := s.Client.GetTemplate(ctx, "app:v2")
		if latest.Snapshot == cur.Snapshot || v2.Snapshot != latest.Snapshot || v1.Snapshot != cur.Snapshot || v1.Name != "app:v1" {
			t.Fatalf("after a build as app:v2: app %s, app:v1 %s, app:v2 %s (before: %s)", latest.Snapshot, v1.Snapshot, v2.Snapshot, cur.Snapshot)
		}
		if _, errOut, code := s.CLI("", "create", "--template", "app:v1", "--name", "tagbox"); code != 0 {
			t.Fatalf("create --template app:v1: %s", errOut)
		}
		if r := s.Exec(ctx, "tagbox", "cat /tmp/shell"); r.Stdout != "shell was /bin/bash\n" {
			t.Fatalf("the VM of app:v1: %+v", r)
		}
		if err := s.Client.DeleteVM(ctx, "tagbox"); err != nil {
			t.Fatal(err)
		}
		out, _, _ := s.CLI("", "template", "ls")
		for _, n := range []string{"app:v1", "app:v2", "app:stable"} {
			if !strings.Contains(out, n) {
				t.Errorf("template ls lacks %s:\n%s", n, out)
			}
		}
		for args, want := range map[string]string{
			"tag app a/b": "invalid tag", "tag app:nope v3": "no template named", "rm app:nope": "no template named", "tag Bad:v1 v3": "invalid template name",
		} {
			if _, errOut, code := s.CLI("", append([]string{"template"}, strings.Fields(args)...)...); code == 0 || !strings.Contains(errOut, want) {
				t.Errorf("template %s: %d %q, want %q", args, code, errOut, want)
			}
		}
		// latest moves NAME to the tagged build; removing a tag leaves NAME.
		if _, errOut, code := s.CLI("", "template", "tag", "app:stable", "latest"); code != 0 {
			t.Fatalf("tag latest: %s", errOut)
		}
		if now, _ := s.Client.GetTemplate(ctx, "app"); now.Snapshot != cur.Snapshot {
			t.Fatalf("app after tagging app:stable latest: %s, want %s", now.Snapshot, cur.Snapshot)
		}
		if _, errOut, code := s.CLI("", "template", "rm", "app:v1", "app:v2", "app:stable"); code != 0 {
			t.Fatalf("rm tags: %s", errOut)
		}
		if _, err := s.Client.GetTemplate(ctx, "app"); err != nil {
			t.Fatalf("removing tags removed the template: %v", err)
		}
	})

	t.Run("a failing step", func(t *testing.T) {
		before, err := s.Client.GetTemplate(ctx, "app")
		if err != nil {
			t.Fatal(err)
		}
		_, errOut, code := build("app", df("fails"))
		if code == 0 || !strings.Contains(errOut, "step 2 (Dockerfile line 2)") || !strings.Contains(errOut, "exited with code 3") ||
			!strings.Contains(errOut, "preparing") || !strings.Contains(errOut, "boom") {
			t.Fatalf("a failing RUN: exit %d\n%s", code, errOut)
		}
		if after, _ := s.Client.GetTemplate(ctx, "app"); after.Snapshot != before.Snapshot {
			t.Fatal("a failed build replaced the template")
		}
		_, errOut, code = build("never", df("selfish-cmd"))
		if code == 0 || !strings.Contains(errOut, "the start command exited") {
			t.Fatalf("a start command that exits: %d\n%s", code, errOut)
		}
		if _, err := s.Client.GetTemplate(ctx, "never"); !client.IsNotFound(err) {
			t.Fatalf("a failed first build left a template: %v", err)
		}
		waitUntil(t, "no build VM left", time.Minute, func() (bool, string) {
			vms := buildVMs(t, s)
			return len(vms) == 0, strings.Join(vms, " ")
		})
	})

	t.Run("a template on a template", func(t *testing.T) {
		out, errOut, code := s.CLI("", "template", "build", "child", appDir, "-f", df("child"))
		if code != 0 {
			t.Fatalf("build: %d %q %q", code, out, errOut)
		}
		if _, errOut, code := s.CLI("", "create", "--template", "child", "--name", "cbox"); code != 0 {
			t.Fatalf("create: %s", errOut)
		}
		r := s.Exec(ctx, "cbox", "cat /tmp/child; curl -sS --max-time 10 http://127.0.0.1:8000/index.html; echo $PORT")
		if r.Stdout != "child\n<h1>from a template</h1>\n8000\n" {
			t.Fatalf("the child template's VM: %+v", r)
		}
		if _, errOut, code := s.CLI("", "template", "rm", "app"); code == 0 || !strings.Contains(errOut, "child is built on app") {
			t.Fatalf("removing a template another is built on: %d %q", code, errOut)
		}
	})

	t.Run("a spec", func(t *testing.T) {
		writeFiles(t, dir, map[string]string{"specs/web.toml": `from = "default"
[env]
GREETING = "$not expanded"

[[steps]]
copy = "site/index.html"
to = "/srv/www/"
owner = "user"

[[steps]]
run = 'echo "$GREETING" > /srv/www/g.txt'

[start]
cmd = ["python3", "-m", "http.server", "8001", "--directory", "/srv/www"]
ready = { url = "http://127.0.0.1:8001/index.html" }
`, "specs/bad.json": `{"from": "default", "steps": [{"run": "true"}, {"run": "echo from the spec; exit 7"}]}`})
		if out, errOut, code := s.CLI("", "template", "build", "spec-web", appDir, "--spec", filepath.Join(dir, "specs/web.toml"), "--memory", "512"); code != 0 {
			t.Fatalf("spec build: %d %q %q", code, out, errOut)
		}
		if _, errOut, code := s.CLI("", "create", "--template", "spec-web", "--name", "sbox"); code != 0 {
			t.Fatalf("create: %s", errOut)
		}
		r := s.Exec(ctx, "sbox", "curl -sS --max-time 10 http://127.0.0.1:8001/g.txt; stat -c %U /srv/www/index.html")
		if r.Stdout != "$not expanded\nuser\n" {
			t.Fatalf("the spec's VM: %+v", r)
		}
		_, errOut, code := s.CLI("", "template", "build", "spec-bad", appDir, "--spec", filepath.Join(dir, "specs/bad.json"), "--memory", "512")
		if code == 0 || !strings.Contains(errOut, "step 3 (spec steps[1])") || !strings.Contains(errOut, "exited with code 7") || !strings.Contains(errOut, "from the spec") {
			t.Fatalf("a failing spec step: %d %q", code, errOut)
		}
	})

	t.Run("MCP", func(t *testing.T) {
		cmd := s.CLICmd("", "mcp")
		cmd.Stdin = nil // the transport's pipe
		cmd.Env = append(cmd.Env, "AGENTVM_TOKEN="+s.Token)
		sess, err := sdk.NewClient(&sdk.Implementation{Name: "templates-test", Version: "1"}, nil).Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("agentvm mcp: %v", err)
		}
		defer sess.Close()
		call := func(name string, args map[string]any) string {
			t.Helper()
			r, err := sess.CallTool(ctx, &sdk.CallToolParams{Name: name, Arguments: args})
			var b strings.Builder
			if r != nil {
				for _, c := range r.Content {
					if tc, ok := c.(*sdk.TextContent); ok {
						b.WriteString(tc.Text)
					}
				}
			}
			if err != nil || r.IsError {
				t.Fatalf("%s %v: %v %s", name, args, err, b.String())
			}
			return b.String()
		}
		if got := call("list_templates", nil); !strings.Contains(got, "- app (from default") || !strings.Contains(got, "- child (from app") {
			t.Fatalf("list_templates: %s", got)
		}
		call("create_vm", map[string]any{"name": "mbox", "template": "child"})
		if got := call("exec", map[string]any{"vm": "mbox", "command": "curl -sS --max-time 10 http://127.0.0.1:8000/index.html; cat /tmp/child"}); !strings.Contains(got, "<h1>from a template</h1>") || !strings.Contains(got, "child") {
			t.Fatalf("exec in a VM made by create_vm from a template: %s", got)
		}
	})

	t.Run("cancelled and killed builds", func(t *testing.T) {
		cmd := s.CLICmd("", "template", "build", "slow", appDir, "-f", df("slow"), "--memory", "512")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitStarted := func(sc *bufio.Scanner) {
			t.Helper()
			for sc.Scan() {
				if sc.Text() == "  started" { // the step's own output (its heading names it too)
					if vms := buildVMs(t, s); len(vms) != 1 {
						t.Fatalf("a build under way has VMs %v, want one", vms)
					}
					return
				}
			}
			t.Fatal("the slow build's output ended before its step started")
		}
		waitStarted(bufio.NewScanner(stderr))
		cmd.Process.Signal(syscall.SIGINT)
		go io.Copy(io.Discard, stderr)
		cmd.Wait()
		waitUntil(t, "the cancelled build's VM deleted", 2*time.Minute, func() (bool, string) {
			vms := buildVMs(t, s)
			return len(vms) == 0, strings.Join(vms, " ")
		})
		if _, err := s.Client.GetTemplate(ctx, "slow"); !client.IsNotFound(err) {
			t.Fatalf("a cancelled build left a template: %v", err)
		}

		// A build past its time limit fails, naming it, and leaves nothing.
		_, errOut, code := s.CLI("", "template", "build", "slow", appDir, "-f", df("slow"), "--memory", "512", "--timeout", "60s")
		if code == 0 || !strings.Contains(errOut, "time limit (1m0s) ran out") {
			t.Fatalf("a build past its time limit: %d %q", code, errOut)
		}
		waitUntil(t, "the timed-out build's VM deleted", 2*time.Minute, func() (bool, string) {
			vms := buildVMs(t, s)
			return len(vms) == 0, strings.Join(vms, " ")
		})

		// The daemon killed mid-build: the next one removes the build's VM.
		cmd = s.CLICmd("", "template", "build", "slow", appDir, "-f", df("slow"), "--memory", "512")
		stderr, _ = cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitStarted(bufio.NewScanner(stderr))
		s.Kill9()
		go io.Copy(io.Discard, stderr)
		cmd.Wait()
		s.Restart()
		waitUntil(t, "the killed build's VM deleted by the next daemon", 2*time.Minute, func() (bool, string) {
			vms := buildVMs(t, s)
			return len(vms) == 0, strings.Join(vms, " ")
		})
		if _, err := s.Client.GetTemplate(ctx, "slow"); !client.IsNotFound(err) {
			t.Fatalf("a killed build left a template: %v", err)
		}
		if r := s.Exec(ctx, "tbox", "curl -sS --max-time 10 http://127.0.0.1:8000/index.html"); r.ExitCode != 0 {
			t.Fatalf("a VM made from a template after a daemon restart: %+v", r)
		}
	})

	t.Run("removal", func(t *testing.T) {
		tpl, _ := s.Client.GetTemplate(ctx, "app")
		if err := s.Client.DeleteSnapshot(ctx, tpl.Snapshot); err == nil || !strings.Contains(err.Error(), "template app") {
			t.Fatalf("deleting a template's snapshot: %v", err)
		}
		for _, n := range []string{"child", "app", "spec-web"} {
			if _, errOut, code := s.CLI("", "template", "rm", n); code != 0 {
				t.Fatalf("template rm %s: %s", n, errOut)
			}
		}
		if out, errOut, code := s.CLI("", "template", "prune"); code != 0 {
			t.Fatalf("prune: %q %q", out, errOut)
		}
		snaps, err := s.Client.ListSnapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(snaps) != 0 {
			t.Fatalf("snapshots left after every template went and a prune: %d (first %s)", len(snaps), snaps[0].Name)
		}
		if r := s.Exec(ctx, "tbox", "curl -sS --max-time 10 http://127.0.0.1:8000/index.html"); r.ExitCode != 0 {
			t.Fatalf("a VM made from a removed template: %+v", r)
		}
	})
}
