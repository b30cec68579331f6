package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
)

// runCode runs code and fails the test on a call error (not on an error in
// the code, which the caller checks).
func runCode(t *testing.T, c *client.Client, ctx context.Context, vm string, req api.RunCodeRequest) *client.Execution {
	t.Helper()
	ex, err := c.RunCode(ctx, vm, req, nil)
	if err != nil {
		t.Fatalf("run %q: %v", req.Code, err)
	}
	return ex
}

// wantText runs code and checks the text of its main result.
func wantText(t *testing.T, c *client.Client, ctx context.Context, vm string, req api.RunCodeRequest, want string) {
	t.Helper()
	ex := runCode(t, c, ctx, vm, req)
	if ex.Error != nil || ex.Text() != want {
		t.Fatalf("run %q: text %q, want %q (error %+v, stdout %q, stderr %q)", req.Code, ex.Text(), want, ex.Error, ex.Stdout, ex.Stderr)
	}
}

// resultTexts lists the text/plain of every result, main or display.
func resultTexts(ex *client.Execution) []string {
	var out []string
	for _, r := range ex.Results {
		var s string
		json.Unmarshal(r.Data["text/plain"], &s)
		out = append(out, s)
	}
	return out
}

func pngResult(t *testing.T, ex *client.Execution) []byte {
	t.Helper()
	for _, r := range ex.Results {
		var s string
		if json.Unmarshal(r.Data["image/png"], &s) == nil && s != "" {
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				t.Fatalf("image/png is not base64: %v", err)
			}
			img, err := png.Decode(bytes.NewReader(b))
			if err != nil || img.Bounds().Dx() < 50 || img.Bounds().Dy() < 50 {
				t.Fatalf("image/png does not decode to a chart: %v", err)
			}
			return b
		}
	}
	t.Fatalf("no image/png result in %+v", ex.Results)
	return nil
}

// TestCodeInterpreter drives the code-interpreter image through the native
// API, the Go client and the CLI: state across runs, rich results, errors,
// interrupts, contexts in three languages, and contexts surviving suspend,
// fork and snapshot.
func TestCodeInterpreter(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	c := s.Client

	// The first create builds the image and its template (a warm kernel).
	out, errOut, code := s.CLI("", "create", "--image", "code-interpreter", "--name", "ci", "--json")
	if code != 0 {
		t.Fatalf("create --image code-interpreter: %d %s %s\n%s", code, out, errOut, tail(s.Logs()))
	}
	var v api.VM
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Image != "code-interpreter" {
		t.Fatalf("created VM: %v %s", err, out)
	}

	t.Run("state", func(t *testing.T) {
		runCode(t, c, ctx, "ci", api.RunCodeRequest{Code: "x = 41\nimport math"})
		ex := runCode(t, c, ctx, "ci", api.RunCodeRequest{Code: "x + 1"})
		if ex.Text() != "42" || ex.ExecutionCount < 2 {
			t.Fatalf("x + 1: %q, execution %d", ex.Text(), ex.ExecutionCount)
		}
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Code: "round(math.pi, 2)"}, "3.14")
	})

	t.Run("streams", func(t *testing.T) {
		var order []string
		ex, err := c.RunCode(ctx, "ci", api.RunCodeRequest{Code: "import sys\nprint('out 1')\nprint('err 1', file=sys.stderr)\nprint('out 2')"},
			func(e api.CodeEvent) { order = append(order, e.Type) })
		if err != nil || ex.Stdout != "out 1\nout 2\n" || ex.Stderr != "err 1\n" {
			t.Fatalf("streams: %v %q %q", err, ex.Stdout, ex.Stderr)
		}
		if len(order) == 0 || order[len(order)-1] != api.CodeEnd {
			t.Fatalf("events: %v", order)
		}
	})

	t.Run("rich results", func(t *testing.T) {
		ex := runCode(t, c, ctx, "ci", api.RunCodeRequest{Code: "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('t')\nplt.show()"})
		pngResult(t, ex)
		ex = runCode(t, c, ctx, "ci", api.RunCodeRequest{Code: "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"})
		var html string
		for _, r := range ex.Results {
			if r.Main {
				json.Unmarshal(r.Data["text/html"], &html)
			}
		}
		if !strings.Contains(html, "<table") || !strings.Contains(ex.Text(), "a  b") {
			t.Fatalf("DataFrame: html %q text %q", html, ex.Text())
		}
	})

	t.Run("errors and interrupts", func(t *testing.T) {
		ex := runCode(t, c, ctx, "ci", api.RunCodeRequest{Code: "def f():\n    return 1 / 0\nf()"})
		if ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || !strings.Contains(ex.Error.Traceback, "return 1 / 0") {
			t.Fatalf("exception: %+v", ex.Error)
		}
		// survivor is set by an earlier run: the interrupted one may not have
		// reached its first line within its timeout on a loaded machine
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Code: "survivor = 7; survivor"}, "7")
		start := time.Now()
		ex = runCode(t, c, ctx, "ci", api.RunCodeRequest{Code: "import time\nsurvivor = 8\ntime.sleep(3600)", Timeout: api.Duration(5 * time.Second)})
		if ex.Error == nil || ex.Error.Name != "TimeoutError" {
			t.Fatalf("a run past its timeout did not end in a TimeoutError: %+v", ex.Error)
		}
		t.Logf("interrupted after %s: %s: %s", time.Since(start), ex.Error.Name, ex.Error.Value)
		// the kernel kept its state (8 when the run got that far)
		if got := runCode(t, c, ctx, "ci", api.RunCodeRequest{Code: "survivor"}).Text(); got != "7" && got != "8" {
			t.Fatalf("after the interrupt survivor is %q", got)
		}
	})

	t.Run("env", func(t *testing.T) {
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Code: "import os\nos.environ.get('RUN_ONLY')", Env: map[string]string{"RUN_ONLY": "yes"}}, "yes")
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Code: "os.environ.get('RUN_ONLY')"}, "") // None has no display
	})

	t.Run("javascript and bash", func(t *testing.T) {
		runCode(t, c, ctx, "ci", api.RunCodeRequest{Language: "javascript", Code: "const z = 5; console.log('from js')"})
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Language: "javascript", Code: "z * 2"}, "10")
		ex := runCode(t, c, ctx, "ci", api.RunCodeRequest{Language: "javascript", Code: "await new Promise(r => setTimeout(r, 10)); throw new TypeError('bad js')"})
		if ex.Error == nil || !strings.Contains(ex.Error.Name+ex.Error.Value, "bad js") {
			t.Fatalf("js error: %+v", ex.Error)
		}
		runCode(t, c, ctx, "ci", api.RunCodeRequest{Language: "bash", Code: "cd /tmp && export FOO=bar"})
		ex = runCode(t, c, ctx, "ci", api.RunCodeRequest{Language: "bash", Code: "pwd; echo $FOO"})
		if ex.Stdout != "/tmp\nbar\n" {
			t.Fatalf("bash state: %q %+v", ex.Stdout, ex.Error)
		}
		ex = runCode(t, c, ctx, "ci", api.RunCodeRequest{Language: "bash", Code: "false"})
		if ex.Error == nil {
			t.Fatal("a failing bash command gave no error")
		}
	})

	t.Run("r java typescript", func(t *testing.T) {
		// The default R context came with the template (--warm r): the
		// VM lists it before any R has run in it.
		list, err := c.ListCodeContexts(ctx, "ci")
		warm := false
		for _, l := range list {
			warm = warm || l.Language == "r"
		}
		if err != nil || !warm {
			t.Fatalf("no R context from the template: %v %+v", err, list)
		}
		// R answers with display results (IRkernel's), as in E2B.
		ex := runCode(t, c, ctx, "ci", api.RunCodeRequest{Language: "r", Code: "r_x <- 41\nr_x + 1"})
		if texts := resultTexts(ex); len(texts) != 1 || texts[0] != "[1] 42" {
			t.Fatalf("R value: %q %+v", texts, ex.Error)
		}
		ex = runCode(t, c, ctx, "ci", api.RunCodeRequest{Language: "r", Code: `Sys.getenv("R_RUN")`, Env: map[string]string{"R_RUN": "yes"}})
		if texts := resultTexts(ex); len(texts) != 1 || texts[0] != `[1] "yes"` {
			t.Fatalf("R env: %q", texts)
		}
		pngResult(t, runCode(t, c, ctx, "ci", api.RunCodeRequest{Language: "r", Code: "plot(1:10)"}))
		ex = runCode(t, c, ctx, "ci", api.RunCodeRequest{Language: "r", Code: "data.frame(a = 1:2)"})
		if len(ex.Results) != 1 || !strings.Contains(string(ex.Results[0].Data["text/html"]), "<table") {
			t.Fatalf("R data frame: %+v", ex.Results)
		}
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Language: "java", Code: "int j = 20;\nj * 2 + 2"}, "42")
		// The JVM maps the image's class-data archive (flavor.go): a JVM
		// whose flags differ from the archive's would silently not.
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Language: "java", Code: `java.nio.file.Files.readString(java.nio.file.Path.of("/proc/self/maps")).contains("kernel.jsa")`}, "true")
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Language: "java", Code: `System.getProperty("J_RUN")`, Env: map[string]string{"J_RUN": "yes"}}, "yes")
		ex = runCode(t, c, ctx, "ci", api.RunCodeRequest{Language: "java", Code: `Integer.parseInt("x")`})
		if ex.Error == nil || ex.Error.Name != "java.lang.NumberFormatException" {
			t.Fatalf("Java exception: %+v", ex.Error)
		}
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Language: "typescript", Code: "const n: number = 21;\nn * 2"}, "42")
	})

	t.Run("root contexts", func(t *testing.T) {
		if _, err := c.CreateCodeContext(ctx, "ci", api.CreateCodeContextRequest{Cwd: "/root"}); !isStatus(err, http.StatusBadRequest) ||
			!strings.Contains(err.Error(), "not accessible to user") {
			t.Fatalf("a default context in /root: %v", err)
		}
		cx, err := c.CreateCodeContext(ctx, "ci", api.CreateCodeContextRequest{Cwd: "/root", User: "root"})
		if err != nil || cx.User != "root" || cx.Cwd != "/root" {
			t.Fatalf("a root context: %v %+v", err, cx)
		}
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Context: cx.ID, Code: "import os\n(os.getuid(), os.getcwd())"}, "(0, '/root')")
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Code: "import os\nos.getuid()"}, "1001") // the default is user still
		c.DeleteCodeContext(ctx, "ci", cx.ID)
		if _, err := c.CreateCodeContext(ctx, "ci", api.CreateCodeContextRequest{User: "bob"}); !isStatus(err, http.StatusBadRequest) {
			t.Fatalf("a context of user bob: %v", err)
		}
		// A token limited to user "user" runs code, but not as root.
		lim, err := c.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{api.PermExec}, User: "user"})
		if err != nil {
			t.Fatal(err)
		}
		lc := &client.Client{BaseURL: s.URL, Token: lim.Secret, HTTP: http.DefaultClient}
		if _, err := lc.CreateCodeContext(ctx, v.ID, api.CreateCodeContextRequest{User: "root"}); !isStatus(err, http.StatusForbidden) {
			t.Fatalf("a user-limited token made a root context: %v", err)
		}
		rx, err := c.CreateCodeContext(ctx, "ci", api.CreateCodeContextRequest{User: "root"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lc.RunCode(ctx, v.ID, api.RunCodeRequest{Context: rx.ID, Code: "1"}, nil); !isStatus(err, http.StatusForbidden) {
			t.Fatalf("a user-limited token ran code in a root context: %v", err)
		}
		if err := lc.RestartCodeContext(ctx, v.ID, rx.ID); !isStatus(err, http.StatusForbidden) {
			t.Fatalf("a user-limited token restarted a root context: %v", err)
		}
		c.DeleteCodeContext(ctx, "ci", rx.ID)
		ux, err := lc.CreateCodeContext(ctx, v.ID, api.CreateCodeContextRequest{Language: "bash"})
		if err != nil || ux.User != "user" {
			t.Fatalf("a user-limited token's context: %v %+v", err, ux)
		}
		c.DeleteCodeContext(ctx, "ci", ux.ID)
		// The CLI, and the USER column of code-context ls.
		id, errOut, code := s.CLI("", "code-context", "create", "ci", "-l", "bash", "--user", "root")
		if code != 0 {
			t.Fatalf("code-context create --user root: %d %q", code, errOut)
		}
		id = strings.TrimSpace(id)
		out, errOut, code := s.CLI("", "run-code", "ci", "--context", id, "id -un")
		if code != 0 || out != "root\n" {
			t.Fatalf("run-code in a root context: %d %q %q", code, out, errOut)
		}
		out, _, _ = s.CLI("", "code-context", "ls", "ci")
		if !regexp.MustCompile(id + `\s+bash\s+root\s+/home/user`).MatchString(out) {
			t.Fatalf("code-context ls: %q", out)
		}
		s.CLI("", "code-context", "rm", "ci", id)
		out, errOut, code = s.CLI("", "run-code", "ci", "-l", "r", `cat(R.version.string)`)
		if code != 0 || !strings.HasPrefix(out, "R version") {
			t.Fatalf("run-code -l r: %d %q %q", code, out, errOut)
		}
	})

	t.Run("contexts", func(t *testing.T) {
		cx, err := c.CreateCodeContext(ctx, "ci", api.CreateCodeContextRequest{Language: "python", Cwd: "/tmp"})
		if err != nil || cx.ID == "" || cx.Language != "python" {
			t.Fatalf("create context: %v %+v", err, cx)
		}
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Context: cx.ID, Code: "import os\nos.getcwd()"}, "/tmp")
		// separate from the default context
		ex := runCode(t, c, ctx, "ci", api.RunCodeRequest{Context: cx.ID, Code: "x"})
		if ex.Error == nil || ex.Error.Name != "NameError" {
			t.Fatalf("a new context sees the default one's x: %+v", ex)
		}
		runCode(t, c, ctx, "ci", api.RunCodeRequest{Context: cx.ID, Code: "mine = 1"})
		list, err := c.ListCodeContexts(ctx, "ci")
		found := false
		for _, l := range list {
			found = found || l.ID == cx.ID && l.Cwd == "/tmp"
		}
		if err != nil || !found {
			t.Fatalf("list contexts: %v %+v", err, list)
		}
		if err := c.RestartCodeContext(ctx, "ci", cx.ID); err != nil {
			t.Fatal(err)
		}
		ex = runCode(t, c, ctx, "ci", api.RunCodeRequest{Context: cx.ID, Code: "mine"})
		if ex.Error == nil || ex.Error.Name != "NameError" {
			t.Fatalf("a restarted context kept its variables: %+v", ex)
		}
		if err := c.DeleteCodeContext(ctx, "ci", cx.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RunCode(ctx, "ci", api.RunCodeRequest{Context: cx.ID, Code: "1"}, nil); !isStatus(err, http.StatusNotFound) {
			t.Fatalf("run in a deleted context: %v", err)
		}
		if err := c.DeleteCodeContext(ctx, "ci", cx.ID); !isStatus(err, http.StatusNotFound) {
			t.Fatalf("delete a deleted context: %v", err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		_, err := c.RunCode(ctx, "ci", api.RunCodeRequest{Code: "1", Language: "python", Context: "abc"}, nil)
		if !isStatus(err, http.StatusBadRequest) {
			t.Fatalf("language and context: %v", err)
		}
		_, err = c.RunCode(ctx, "ci", api.RunCodeRequest{Code: "1", Language: "cobol"}, nil)
		if !isStatus(err, http.StatusBadRequest) {
			t.Fatalf("unknown language: %v", err)
		}
		status, body := rawRequest(t, s, "POST", "/v1/vms/ci/code", s.Token, `{"code": 1}`)
		if status != http.StatusBadRequest || !strings.Contains(body, "invalid JSON") {
			t.Fatalf("bad JSON: %d %s", status, body)
		}
		plain := s.CreateVM(ctx, api.CreateVMRequest{Name: "plain"})
		if _, err := c.RunCode(ctx, plain.ID, api.RunCodeRequest{Code: "1"}, nil); !isStatus(err, http.StatusConflict) ||
			!strings.Contains(err.Error(), "--image code-interpreter") {
			t.Fatalf("code in a default-image VM: %v", err)
		}
		c.DeleteVM(ctx, plain.ID)
		if _, err := c.CreateVM(ctx, api.CreateVMRequest{Image: "no-such-image"}); !isStatus(err, http.StatusBadRequest) {
			t.Fatalf("unknown image: %v", err)
		}
		if _, err := c.CreateVM(ctx, api.CreateVMRequest{Image: "code-interpreter", From: "anything"}); !isStatus(err, http.StatusBadRequest) {
			t.Fatalf("image and from: %v", err)
		}
		// A token of this VM without exec, or limited to another guest
		// user, cannot run code (the kernels run as "user", who may sudo).
		other, err := c.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{api.PermFiles}})
		if err != nil {
			t.Fatal(err)
		}
		oc := &client.Client{BaseURL: s.URL, Token: other.Secret, HTTP: http.DefaultClient}
		if _, err := oc.RunCode(ctx, "ci", api.RunCodeRequest{Code: "1"}, nil); !isStatus(err, http.StatusForbidden) {
			t.Fatalf("files-only token ran code: %v", err)
		}
		mine, err := c.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{api.PermExec}})
		if err != nil {
			t.Fatal(err)
		}
		mc := &client.Client{BaseURL: s.URL, Token: mine.Secret, HTTP: http.DefaultClient}
		wantText(t, mc, ctx, v.ID, api.RunCodeRequest{Code: "x"}, "41")
		limited, err := c.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{api.PermExec}, User: "agent"})
		if err != nil {
			t.Fatal(err)
		}
		lc := &client.Client{BaseURL: s.URL, Token: limited.Secret, HTTP: http.DefaultClient}
		if _, err := lc.RunCode(ctx, v.ID, api.RunCodeRequest{Code: "1"}, nil); !isStatus(err, http.StatusForbidden) {
			t.Fatalf("a token limited to user agent ran code: %v", err)
		}
		// Through the preview proxy (Host 49999-<vm>), the server, which
		// listens on the guest's loopback, is reached only by a token that
		// may run commands as any user: a preview-only token, even with
		// files, gets a 502 and no code run.
		h, err := c.Health(ctx)
		if err != nil {
			t.Fatal(err)
		}
		previewExec := func(secret string) (int, string) {
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+h.Proxy+"/execute", strings.NewReader(`{"code":"print(6 * 7)"}`))
			req.Host = fmt.Sprintf("%d-ci.%s", 49999, h.Domain)
			req.Header.Set("Authorization", "Bearer "+secret)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		for _, allow := range [][]string{{api.PermPreview}, {api.PermPreview, api.PermFiles}} {
			tok, err := c.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: allow})
			if err != nil {
				t.Fatal(err)
			}
			if code, body := previewExec(tok.Secret); code != http.StatusBadGateway || !strings.Contains(body, "exec permission") {
				t.Fatalf("a %v token through the preview proxy's /execute: %d %s", allow, code, body)
			}
		}
		pe, err := c.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{api.PermPreview, api.PermExec}})
		if err != nil {
			t.Fatal(err)
		}
		if code, body := previewExec(pe.Secret); code != 200 || !strings.Contains(body, `42\n`) {
			t.Fatalf("a preview+exec token through the preview proxy's /execute: %d %s", code, body)
		}
		// Inside the VM, the server answers root (the agent relays for the
		// host) and its own user, not other users.
		probe := "curl -s -m 20 -o /dev/null -w '%{http_code}' http://127.0.0.1:49999/health"
		if r := s.Exec(ctx, "ci", "runuser -u user -- "+probe); r.Stdout != "200" {
			t.Fatalf("user reaching the server: %+v", r)
		}
		if r := s.Exec(ctx, "ci", "runuser -u nobody -- "+probe); r.Stdout == "200" {
			t.Fatalf("user nobody reached the code interpreter: %+v", r)
		}
	})

	t.Run("cli", func(t *testing.T) {
		out, errOut, code := s.CLI("", "run-code", "ci", "print(6 * 7)")
		if code != 0 || out != "42\n" {
			t.Fatalf("run-code: %d %q %q", code, out, errOut)
		}
		dir := t.TempDir()
		out, errOut, code = s.CLI("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.show()\n", "run-code", "ci", "--out", dir, "-")
		if code != 0 || !strings.Contains(errOut, "saved image/png") {
			t.Fatalf("run-code --out: %d %q %q", code, out, errOut)
		}
		b, err := os.ReadFile(filepath.Join(dir, "result-1.png"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := png.Decode(bytes.NewReader(b)); err != nil {
			t.Fatalf("saved PNG: %v", err)
		}
		out, errOut, code = s.CLI("", "run-code", "ci", "-l", "bash", "echo from-bash")
		if code != 0 || out != "from-bash\n" {
			t.Fatalf("run-code -l bash: %d %q %q", code, out, errOut)
		}
		_, errOut, code = s.CLI("", "run-code", "ci", "raise ValueError('nope')")
		if code != 1 || !strings.Contains(errOut, "ValueError") {
			t.Fatalf("run-code raising: %d %q", code, errOut)
		}
		id, errOut, code := s.CLI("", "code-context", "create", "ci", "-l", "javascript")
		if code != 0 || strings.TrimSpace(id) == "" {
			t.Fatalf("code-context create: %d %q", code, errOut)
		}
		out, _, code = s.CLI("", "code-context", "ls", "ci")
		if code != 0 || !strings.Contains(out, strings.TrimSpace(id)) || !strings.Contains(out, "javascript") {
			t.Fatalf("code-context ls: %d %q", code, out)
		}
		if _, errOut, code = s.CLI("", "code-context", "rm", "ci", strings.TrimSpace(id)); code != 0 {
			t.Fatalf("code-context rm: %d %q", code, errOut)
		}
	})

	t.Run("suspend fork snapshot", func(t *testing.T) {
		runCode(t, c, ctx, "ci", api.RunCodeRequest{Code: "kept = 'before'"})
		if _, err := c.SuspendVM(ctx, "ci"); err != nil {
			t.Fatal(err)
		}
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Code: "kept"}, "before") // wakes the VM
		fr, err := c.Fork(ctx, "ci", 1)
		if err != nil || len(fr.Children) != 1 {
			t.Fatalf("fork: %v %+v", err, fr)
		}
		child := fr.Children[0].Name
		if fr.Children[0].Image != "code-interpreter" {
			t.Fatalf("fork child image: %q", fr.Children[0].Image)
		}
		wantText(t, c, ctx, child, api.RunCodeRequest{Code: "kept"}, "before")
		runCode(t, c, ctx, child, api.RunCodeRequest{Code: "kept = 'child'"})
		wantText(t, c, ctx, "ci", api.RunCodeRequest{Code: "kept"}, "before")
		wantText(t, c, ctx, child, api.RunCodeRequest{Code: "kept"}, "child")
		c.DeleteVM(ctx, child)
		if _, err := c.Snapshot(ctx, "ci", "ci-snap"); err != nil {
			t.Fatal(err)
		}
		nv, err := c.CreateVM(ctx, api.CreateVMRequest{Name: "ci-restored", From: "ci-snap"})
		if err != nil || nv.Image != "code-interpreter" {
			t.Fatalf("create from snapshot: %v %+v", err, nv)
		}
		wantText(t, c, ctx, "ci-restored", api.RunCodeRequest{Code: "kept"}, "before")
		c.DeleteVM(ctx, "ci-restored")
		c.DeleteSnapshot(ctx, "ci-snap")
	})
}
