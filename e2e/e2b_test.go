package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

// The published E2B SDKs, pinned. They are installed from the registries
// into temp dirs by this test; nothing of them is kept in the repository.
const (
	e2bNPM  = "e2b@2.51.0"
	e2bPyPI = "e2b==2.63.0"
	// E2B's code-interpreter SDKs (on top of the above).
	codeInterpNPM  = "@e2b/code-interpreter@2.8.0"
	codeInterpPyPI = "e2b-code-interpreter==2.11.5"
)

// e2bEnv is a server with an E2B admin key and the SDK environment.
type e2bEnv struct {
	s   *testenv.Server
	env []string
}

func startE2B(t *testing.T, serveArgs ...string) *e2bEnv {
	t.Helper()
	s := testenv.Start(t, "", serveArgs...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	h, err := s.Client.Health(ctx)
	if err != nil || h.Proxy == "" {
		t.Fatalf("health: %v %+v", err, h)
	}
	key, errOut, code := s.CLI("", "token", "create", "--e2b")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(key), "e2b_") || len(strings.TrimSpace(key)) != 44 {
		t.Fatalf("token create --e2b: %q %q %d", key, errOut, code)
	}
	// A key scoped to another VM (not a sandbox) must not see sandboxes.
	other := s.CreateVM(ctx, api.CreateVMRequest{Name: "not-a-sandbox"})
	scoped, err := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: other.ID, E2B: true})
	if err != nil || !strings.HasPrefix(scoped.Secret, "e2b_") {
		t.Fatalf("scoped e2b key: %v %+v", err, scoped)
	}
	_, port, _ := strings.Cut(h.Proxy, ":")
	scheme := "http"
	if h.ProxyTLS {
		scheme = "https"
	}
	env := append(os.Environ(),
		"E2B_API_KEY="+strings.TrimSpace(key),
		"E2B_API_URL="+s.URL,
		"E2B_SANDBOX_URL="+scheme+"://"+h.Proxy,
		"E2B_DOMAIN="+h.Domain+":"+port,
		"AGENTVM_PROXY="+h.Proxy,
		"AGENTVM_SCOPED_KEY="+scoped.Secret,
		"AGENTVM_URL="+s.URL, "AGENTVM_TOKEN="+s.Token, // what the VM really does, where E2B's answers round it
		"RUN="+strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")),
	)
	return &e2bEnv{s: s, env: env}
}

// run runs a command with the SDK environment, logging its output.
func (e *e2bEnv) run(t *testing.T, dir string, timeout time.Duration, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, e.env
	out, err := cmd.CombinedOutput()
	t.Logf("%s %s:\n%s", name, strings.Join(args, " "), out)
	if err != nil {
		// The end of the command's output again, after the server's: a report
		// that keeps only the end of a failure still shows what failed.
		t.Fatalf("%s: %v\nserver log:\n%s\nthe end of %s's output, again:\n%s", name, err, tail(e.s.Logs()), name, testenv.Tail(string(out), 6000))
	}
}

// install runs an installer (npm, pip) with a generous deadline.
func install(t *testing.T, dir string, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// npmE2B installs the e2b npm package into a temp dir, with the given test
// scripts from e2e/e2b next to it.
func npmE2B(t *testing.T, scripts ...string) string {
	return npmPackages(t, []string{e2bNPM}, scripts...)
}

// npmPackages installs npm packages into a temp dir, with the given test
// scripts from e2e/e2b next to them.
func npmPackages(t *testing.T, pkgs []string, scripts ...string) string {
	t.Helper()
	if _, err := exec.LookPath("npm"); err != nil {
		t.Fatal("npm is needed to install the e2b SDK (scripts/setup.sh installs Node.js)")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name":"e2b-compat-test","private":true,"type":"module"}`), 0o644)
	install(t, dir, "npm", append([]string{"install", "--no-audit", "--no-fund", "--loglevel=error"}, pkgs...)...)
	for _, f := range scripts {
		testenv.CopyFile(t, filepath.Join(testenv.RepoRoot(), "e2e", "e2b", f), filepath.Join(dir, f))
	}
	return dir
}

// TestE2BSDKNode drives agentvm with the published e2b npm package.
func TestE2BSDKNode(t *testing.T) {
	t.Parallel()
	e := startE2B(t)
	dir := npmE2B(t, "sdk.test.mjs")
	e.run(t, dir, 30*time.Minute, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "sdk.test.mjs")
}

// TestE2BSDKNodeTLS runs the SDK against `serve --tls auto`, trusting the
// CA that `agentvm ca` prints.
func TestE2BSDKNodeTLS(t *testing.T) {
	t.Parallel()
	// Two labels: clients refuse a wildcard certificate for *.localhost.
	e := startE2B(t, "--tls", "auto", "--domain", "agentvm.localhost")
	ca, errOut, code := e.s.CLI("", "ca")
	if code != 0 || !strings.Contains(ca, "BEGIN CERTIFICATE") {
		t.Fatalf("agentvm ca: %q %q %d", ca, errOut, code)
	}
	dir := npmE2B(t, "tls.test.mjs", "localhost-dns.mjs")
	caFile := filepath.Join(dir, "ca.pem")
	os.WriteFile(caFile, []byte(ca), 0o644)
	e.env = append(e.env, "NODE_EXTRA_CA_CERTS="+caFile)
	e.run(t, dir, 15*time.Minute, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "tls.test.mjs")
}

// TestE2BSDKPython drives agentvm with the published e2b PyPI package,
// sync and async clients, in a throwaway virtualenv.
func TestE2BSDKPython(t *testing.T) {
	t.Parallel()
	e := startE2B(t)
	dir := t.TempDir()
	install(t, dir, "python3", "-m", "venv", filepath.Join(dir, "venv"))
	install(t, dir, filepath.Join(dir, "venv", "bin", "pip"), "install", "--quiet", "--disable-pip-version-check", e2bPyPI)
	testenv.CopyFile(t, filepath.Join(testenv.RepoRoot(), "e2e", "e2b", "sdk_test.py"), filepath.Join(dir, "sdk_test.py"))
	e.run(t, dir, 30*time.Minute, filepath.Join(dir, "venv", "bin", "python"), "-m", "unittest", "-v", "sdk_test")
}

// warmCodeInterpreter makes sure the code-interpreter image and template of
// the SDKs' default shape (1 vCPU, 1 GiB) exist before the SDKs create
// sandboxes: their create calls time out after 60 s, and the first build
// takes minutes.
func warmCodeInterpreter(t *testing.T, e *e2bEnv) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	v, err := e.s.Client.CreateVM(ctx, api.CreateVMRequest{Image: "code-interpreter", Memory: 1 << 30})
	if err != nil {
		t.Fatalf("warm the code-interpreter template: %v", err)
	}
	e.s.Client.DeleteVM(ctx, v.ID)
}

// TestE2BCodeInterpreterNode drives the code-interpreter image with the
// published @e2b/code-interpreter npm package.
func TestE2BCodeInterpreterNode(t *testing.T) {
	t.Parallel()
	e := startE2B(t)
	warmCodeInterpreter(t, e)
	dir := npmPackages(t, []string{e2bNPM, codeInterpNPM}, "codeinterp.test.mjs")
	e.run(t, dir, 40*time.Minute, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "codeinterp.test.mjs")
}

// TestE2BCodeInterpreterPython drives it with the published
// e2b-code-interpreter PyPI package, sync and async.
func TestE2BCodeInterpreterPython(t *testing.T) {
	t.Parallel()
	e := startE2B(t)
	warmCodeInterpreter(t, e)
	dir := t.TempDir()
	install(t, dir, "python3", "-m", "venv", filepath.Join(dir, "venv"))
	install(t, dir, filepath.Join(dir, "venv", "bin", "pip"), "install", "--quiet", "--disable-pip-version-check", e2bPyPI, codeInterpPyPI)
	testenv.CopyFile(t, filepath.Join(testenv.RepoRoot(), "e2e", "e2b", "codeinterp_test.py"), filepath.Join(dir, "codeinterp_test.py"))
	e.run(t, dir, 40*time.Minute, filepath.Join(dir, "venv", "bin", "python"), "-m", "unittest", "-v", "codeinterp_test")
}

// TestE2BTemplates builds templates with E2B's Template SDK, the published
// npm and PyPI packages (sync and async), and makes sandboxes of them.
func TestE2BTemplates(t *testing.T) {
	t.Parallel()
	e := startE2B(t)
	t.Run("access", func(t *testing.T) { e2bTemplateAccess(t, e) })
	// fromImage's registry: Debian without systemd, behind a login.
	reg := startRegistry(t)
	pushImage(t, reg+"/team/debian:bookworm", debianImage(t))
	e.env = append(e.env, "AGENTVM_TEST_REGISTRY="+reg)
	dir := npmE2B(t, "template.test.mjs")
	e.run(t, dir, 30*time.Minute, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "template.test.mjs")
	py := t.TempDir()
	install(t, py, "python3", "-m", "venv", filepath.Join(py, "venv"))
	install(t, py, filepath.Join(py, "venv", "bin", "pip"), "install", "--quiet", "--disable-pip-version-check", e2bPyPI)
	testenv.CopyFile(t, filepath.Join(testenv.RepoRoot(), "e2e", "e2b", "template_test.py"), filepath.Join(py, "template_test.py"))
	e.run(t, py, 30*time.Minute, filepath.Join(py, "venv", "bin", "python"), "-m", "unittest", "-v", "template_test")
}

// e2bTemplateAccess tries the template build routes with a weaker key and
// with none, and the upload link with and without its signature.
func e2bTemplateAccess(t *testing.T, e *e2bEnv) {
	envOf := func(k string) string {
		for _, kv := range e.env {
			if v, ok := strings.CutPrefix(kv, k+"="); ok {
				return v
			}
		}
		return ""
	}
	call := func(method, url, key, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		if key != "" {
			req.Header.Set("X-API-KEY", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	admin, scoped := envOf("E2B_API_KEY"), envOf("AGENTVM_SCOPED_KEY")
	hash := strings.Repeat("0f", 32)
	for who, c := range map[string]struct {
		key  string
		want int
	}{"a sandbox's key": {scoped, 403}, "no key": {"", 401}} {
		if code, b := call("POST", e.s.URL+"/v3/templates", c.key, `{"name":"x"}`); code != c.want {
			t.Errorf("%s: request a build: %d %s, want %d", who, code, b, c.want)
		}
		if code, b := call("GET", e.s.URL+"/templates/x/files/"+hash, c.key, ""); code != c.want {
			t.Errorf("%s: upload link: %d %s, want %d", who, code, b, c.want)
		}
		for _, r := range [][3]string{{"POST", "/templates/tags", `{"target":"x","tags":["a"]}`}, {"DELETE", "/templates/tags", `{"name":"x","tags":["a"]}`}, {"GET", "/templates/x/tags", ""}} {
			if code, b := call(r[0], e.s.URL+r[1], c.key, r[2]); code != c.want {
				t.Errorf("%s: %s %s: %d %s, want %d", who, r[0], r[1], code, b, c.want)
			}
		}
	}
	code, b := call("GET", e.s.URL+"/templates/x/files/"+hash, admin, "")
	var link struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	if code != 201 || json.Unmarshal([]byte(b), &link) != nil || link.Present || link.URL == "" {
		t.Fatalf("upload link: %d %s", code, b)
	}
	for what, u := range map[string]string{
		"no signature":       e.s.URL + "/e2b/template-files/" + hash,
		"a forged signature": strings.Replace(link.URL, "sig=", "sig=00", 1),
		"another hash":       strings.Replace(link.URL, hash, strings.Repeat("1e", 32), 1),
	} {
		if code, b := call("PUT", u, "", "x"); code != 403 {
			t.Errorf("upload with %s: %d %s, want 403", what, code, b)
		}
	}
	if code, b := call("PUT", link.URL, "", "not checked here: a tar is read when a build uses it"); code != 200 {
		t.Fatalf("upload through the signed link: %d %s", code, b)
	}
	if code, b := call("GET", e.s.URL+"/templates/x/files/"+hash, admin, ""); code != 201 || !strings.Contains(b, `"present":true`) {
		t.Fatalf("after the upload: %d %s", code, b)
	}
}
