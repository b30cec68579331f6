package browser

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
)

// The published DevTools clients, pinned; the test installs them into a
// temp dir (puppeteer-core 24 is the last line for Node 18-20).
const (
	puppeteerNPM  = "puppeteer-core@24.43.1"
	playwrightNPM = "playwright-core@1.65.1"
)

// The test app, served inside the VM on port 8000: a DOM to read, CJK and
// emoji, a form field to half-fill, a counter that runs in the page and a
// download.
const browserApp = `<!doctype html>
<meta charset="utf-8"><title>agentvm browser test</title>
<style>body { font: 20px sans-serif; margin: 0 } #band { height: 160px; background: linear-gradient(90deg, #e22, #2c2, #22e) }</style>
<div id="band"></div>
<h1 id="hello">Hello from inside the VM</h1>
<p id="cjk">你好，世界 こんにちは 🙂</p>
<form onsubmit="return false"><label>Name <input id="name" autocomplete="off" size="40"></label></form>
<p>Count: <span id="count">0</span></p>
<p><a id="download" href="/report.txt" download>report</a></p>
<script>let n = 0; setInterval(() => { document.querySelector('#count').textContent = ++n }, 100)</script>
`

// browserRun is one TestBrowser: a server, the node packages and scripts,
// and where artifacts and measurements go.
type browserRun struct {
	t     *testing.T
	s     *testenv.Server
	ctx   context.Context
	node  string // dir with node_modules and e2e/browser's scripts
	art   string
	proxy string // the preview proxy's host:port
	meas  map[string]any
}

// TestBrowser drives the browser image: Puppeteer and Playwright over CDP
// through a preview URL and `agentvm connect`, screenshots, the live view in
// the console, a fork of a VM with an open page, suspend/wake with the
// browser alive, a QA app with PostgreSQL, the MCP browser tools, and the
// profile across stop/start. Screenshots, logs and timings are artifacts
// ($AGENTVM_ARTIFACTS/browser).
func TestBrowser(t *testing.T) {
	if _, err := exec.LookPath("npm"); err != nil {
		t.Fatal("npm is needed to install puppeteer-core (scripts/setup.sh installs Node.js)")
	}
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	b := &browserRun{t: t, s: s, ctx: ctx, art: browserArtifacts(t), meas: map[string]any{}}
	defer b.saveMeasurements()
	h, err := s.Client.Health(ctx)
	if err != nil || h.Proxy == "" {
		t.Fatalf("health: %v %+v", err, h)
	}
	b.proxy = h.Proxy

	installed := make(chan struct{})
	go func() { // while the image builds
		defer close(installed)
		b.node = t.TempDir()
		os.WriteFile(filepath.Join(b.node, "package.json"), []byte(`{"name":"browser-test","private":true,"type":"module"}`), 0o644)
		cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--loglevel=error", puppeteerNPM, playwrightNPM)
		cmd.Dir = b.node
		if out, err := cmd.CombinedOutput(); err != nil {
			b.node = ""
			t.Errorf("npm install: %v\n%s", err, out)
			return
		}
		for _, f := range []string{"cdp.mjs", "localhost.mjs"} {
			testenv.CopyFile(t, filepath.Join(testenv.RepoRoot(), "e2e", "browser", f), filepath.Join(b.node, f))
		}
	}()

	// The first create builds the image and its template (Chromium started
	// and answering before the template is saved).
	start := time.Now()
	out, errOut, code := s.CLI("", "create", "--image", "browser", "--name", "b1", "--json")
	if code != 0 {
		t.Fatalf("create --image browser: %d %s %s\n%s", code, out, errOut, testenv.Tail(s.Logs(), 2000))
	}
	b.measure("first_create_with_image_and_template_s", time.Since(start).Seconds())
	var v api.VM
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Image != "browser" {
		t.Fatalf("created VM: %v %s", err, out)
	}
	<-installed
	if b.node == "" {
		t.FailNow()
	}
	testStart := time.Now()
	defer func() { b.measure("test_after_first_create_s", time.Since(testStart).Seconds()) }()
	b.serveApp("b1")

	t.Run("drive over CDP", func(t *testing.T) { b.driveOverCDP(t) })
	t.Run("screenshot", func(t *testing.T) { b.screenshots(t) })
	t.Run("fork with an open page", func(t *testing.T) { b.forkOpenPage(t) })
	t.Run("suspend and wake", func(t *testing.T) { b.suspendWake(t) })
	t.Run("live view in the console", func(t *testing.T) { b.liveView(t) })
	// An idle Chromium under emulation keeps a fifth of a core busy (measured:
	// 22% for a blank tab), and the suite beside this test runs on the same
	// two cores: b1 sleeps suspended while the QA VM works (the next
	// subtest's DevTools request through the preview URL wakes it), and the
	// QA VM goes when its subtests are done.
	if _, err := s.Client.SuspendVM(ctx, "b1"); err != nil {
		t.Errorf("suspend b1 while the QA VM works: %v", err) // the subtests below do not need it
	}
	t.Run("QA app with PostgreSQL", func(t *testing.T) { b.qaScenario(t) })
	t.Run("MCP tools", func(t *testing.T) { b.mcpTools(t) })
	if err := s.Client.DeleteVM(ctx, "qa"); err != nil && !client.IsNotFound(err) { // (none if its create failed)
		t.Errorf("delete the QA VM: %v", err)
	}
	t.Run("stop and start keep the profile", func(t *testing.T) { b.stopStart(t) })
}

func browserArtifacts(t *testing.T) string {
	var dir string
	var err error
	if base := os.Getenv("AGENTVM_ARTIFACTS"); base != "" {
		dir = filepath.Join(base, "browser")
		err = os.MkdirAll(dir, 0o755)
	} else {
		dir, err = os.MkdirTemp("", "agentvm-browser-artifacts-")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("browser artifacts (screenshots, logs, measurements): %s", dir)
	return dir
}

func (b *browserRun) measure(key string, v any) {
	if f, ok := v.(float64); ok {
		v = float64(int64(f*100+0.5)) / 100
	}
	b.meas[key] = v
	b.t.Logf("measure: %s = %v", key, v)
}

func (b *browserRun) saveMeasurements() {
	j, _ := json.MarshalIndent(b.meas, "", "  ")
	os.WriteFile(filepath.Join(b.art, "measurements.json"), j, 0o644)
}

func (b *browserRun) save(name string, data []byte) {
	if err := os.WriteFile(filepath.Join(b.art, name), data, 0o644); err != nil {
		b.t.Logf("artifact %s: %v", name, err)
	}
}

// eventually retries fn until it succeeds or d passes (guests run under
// emulation: every wait is on a condition, with room to spare).
func (b *browserRun) eventually(t *testing.T, what string, d time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || b.ctx.Err() != nil {
			t.Fatalf("%s: still failing after %s: %v", what, d, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (b *browserRun) write(t *testing.T, vm, path, content string) {
	t.Helper()
	if _, err := b.s.Client.WriteFile(b.ctx, vm, path, strings.NewReader(content), int64(len(content)), client.WriteOptions{MkDirs: true}); err != nil {
		t.Fatalf("write %s:%s: %v", vm, path, err)
	}
}

// serveApp serves the test app on port 8000 of vm, as a service (it comes
// back after a stop and start).
func (b *browserRun) serveApp(vm string) {
	t := b.t
	b.write(t, vm, "/srv/app/index.html", browserApp)
	b.write(t, vm, "/srv/app/report.txt", "a report the browser downloads\n")
	if _, err := b.s.Client.CreateService(b.ctx, vm, api.ServiceCreate{Name: "web", Argv: []string{"python3", "-m", "http.server", "8000", "--directory", "/srv/app"}, Restart: "always"}); err != nil {
		t.Fatalf("web service: %v", err)
	}
	b.eventually(t, "the app answers in the VM", 2*time.Minute, func() error {
		if r := b.s.Exec(b.ctx, vm, "curl -sf http://localhost:8000/ | grep -q hello"); r.ExitCode != 0 {
			return fmt.Errorf("curl: %+v", r)
		}
		return nil
	})
}

// cdpURL is the preview URL of a VM's DevTools port.
func (b *browserRun) cdpURL(vm string) string {
	_, port, _ := net.SplitHostPort(b.proxy)
	return fmt.Sprintf("http://9222-%s.localhost:%s", vm, port)
}

// pageState is what cdp.mjs prints of the app's tab.
type pageState struct {
	URL       string   `json:"url"`
	Title     string   `json:"title"`
	Hello     string   `json:"hello"`
	CJK       string   `json:"cjk"`
	Name      string   `json:"name"`
	Count     int      `json:"count"`
	Cookie    string   `json:"cookie"`
	Local     string   `json:"local"`
	WS        string   `json:"ws"`
	Version   string   `json:"version"`
	Tabs      int      `json:"tabs"`
	Found     bool     `json:"found"`
	Items     []string `json:"items"`
	HTML      string   `json:"html"`
	ConnectMs float64  `json:"connectMs"`
	StepMs    float64  `json:"stepMs"`
}

// cdp runs one step of e2e/browser/cdp.mjs against endpoint (with token for
// a preview URL) and returns what it printed.
func (b *browserRun) cdp(t *testing.T, endpoint, token, app, step string, args ...string) pageState {
	t.Helper()
	st, err := b.cdpErr(endpoint, token, app, step, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cdp %s via %s: %.1fs (connect %.0f ms)", step, endpoint, st.StepMs/1000, st.ConnectMs)
	return st
}

func (b *browserRun) cdpErr(endpoint, token, app, step string, args ...string) (pageState, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 12*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", append([]string{"cdp.mjs", step}, args...)...)
	cmd.Dir = b.node
	cmd.Env = append(os.Environ(), "CDP_URL="+endpoint, "CDP_TOKEN="+token, "APP_URL="+app)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var st pageState
	if err != nil || json.Unmarshal([]byte(lines[len(lines)-1]), &st) != nil {
		return st, fmt.Errorf("node cdp.mjs %s %v (%s): %v\nstdout: %s\nstderr: %s", step, args, endpoint, err, stdout.String(), testenv.Tail(stderr.String(), 4000))
	}
	return st, nil
}

const appURL = "http://localhost:8000/"

func (b *browserRun) driveOverCDP(t *testing.T) {
	c := b.s.Client
	previewOnly, err := c.CreateToken(b.ctx, api.CreateTokenRequest{VM: "b1", Allow: []string{api.PermPreview}})
	if err != nil {
		t.Fatal(err)
	}
	execOnly, err := c.CreateToken(b.ctx, api.CreateTokenRequest{VM: "b1", Allow: []string{api.PermExec}})
	if err != nil {
		t.Fatal(err)
	}
	preview, err := c.CreateToken(b.ctx, api.CreateTokenRequest{VM: "b1", Allow: []string{api.PermPreview, api.PermExec}})
	if err != nil {
		t.Fatal(err)
	}
	// The DevTools port is private: no token, or one without preview, is
	// refused; and it listens on the guest's loopback, which only a token
	// that may also run commands reaches (DevTools runs code as the user).
	for _, tc := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {execOnly.Secret, http.StatusForbidden}, {previewOnly.Secret, http.StatusBadGateway}, {preview.Secret, http.StatusOK}} {
		req, _ := http.NewRequestWithContext(b.ctx, "GET", "http://"+b.proxy+"/json/version", nil)
		req.Host = strings.TrimPrefix(b.cdpURL("b1"), "http://")
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Fatalf("/json/version with token %.8q: %d %s, want %d", tc.token, resp.StatusCode, body, tc.want)
		}
		if tc.want == 200 && !strings.Contains(string(body), `"webSocketDebuggerUrl": "ws://`+req.Host+`/devtools/browser/`) {
			t.Fatalf("/json/version does not name the preview host: %s", body)
		}
	}

	// Puppeteer through the preview URL: open the app in a tab and read its DOM.
	st := b.cdp(t, b.cdpURL("b1"), preview.Secret, appURL, "open")
	if st.Hello != "Hello from inside the VM" || st.CJK != "你好，世界 こんにちは 🙂" || !strings.HasPrefix(st.WS, "ws://9222-b1.localhost:") {
		t.Fatalf("page through the preview: %+v", st)
	}
	b.measure("puppeteer_connect_preview_ms", st.ConnectMs)
	b.measure("puppeteer_open_app_tab_ms", st.StepMs)

	// Playwright's connectOverCDP through the same URL.
	pw := b.cdp(t, b.cdpURL("b1"), preview.Secret, appURL, "playwright")
	if pw.Hello != "Hello from inside the VM" {
		t.Fatalf("playwright: %+v", pw)
	}
	b.measure("playwright_connect_preview_ms", pw.ConnectMs)

	// `agentvm connect b1 9222 --listen`: Puppeteer's plain browserURL.
	local := b.forward(t, "b1", 9222)
	st = b.cdp(t, local, "", appURL, "type", "half-filled")
	if st.Name != "half-filled" || st.Hello == "" {
		t.Fatalf("typed through agentvm connect: %+v", st)
	}
	b.measure("puppeteer_connect_forward_ms", st.ConnectMs)
}

// forward runs `agentvm connect VM PORT --listen 127.0.0.1:N` for the rest
// of the test and returns http://127.0.0.1:N.
func (b *browserRun) forward(t *testing.T, vm string, port int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := b.s.CLICmd("", "connect", vm, fmt.Sprint(port), "--listen", addr)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.Contains(line, "forwarding "+addr) {
		t.Fatalf("agentvm connect --listen: %q %v", line, err)
	}
	go io.Copy(io.Discard, stderr)
	return "http://" + addr
}

// shot takes a screenshot through the API and checks it shows something.
func (b *browserRun) shot(t *testing.T, vm, name string, scale float64) image.Image {
	t.Helper()
	p, err := b.s.Client.Screenshot(b.ctx, vm, scale)
	if err != nil {
		t.Fatalf("screenshot %s: %v", vm, err)
	}
	img, err := png.Decode(bytes.NewReader(p))
	if err != nil {
		t.Fatalf("screenshot %s is not a PNG: %v", vm, err)
	}
	if name != "" {
		b.save(name, p)
	}
	return img
}

// colours counts the distinct colours of an image and how many pixels are
// strongly red (the app's band).
func colours(img image.Image) (distinct, red int) {
	seen := map[[3]uint32]bool{}
	bd := img.Bounds()
	for y := bd.Min.Y; y < bd.Max.Y; y++ {
		for x := bd.Min.X; x < bd.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			seen[[3]uint32{r >> 8, g >> 8, bl >> 8}] = true
			if r>>8 > 180 && g>>8 < 90 && bl>>8 < 90 {
				red++
			}
		}
	}
	return len(seen), red
}

func (b *browserRun) screenshots(t *testing.T) {
	// The app's tab is in front: its red band is on the display.
	b.eventually(t, "the app on the display", time.Minute, func() error {
		img := b.shot(t, "b1", "b1-app.png", 0)
		distinct, red := colours(img)
		if img.Bounds().Dx() != 1280 || img.Bounds().Dy() != 800 || distinct < 50 || red < 5000 {
			return fmt.Errorf("%v, %d colours, %d red pixels", img.Bounds(), distinct, red)
		}
		return nil
	})
	if img := b.shot(t, "b1", "b1-half.png", 0.5); img.Bounds().Dx() != 640 || img.Bounds().Dy() != 400 {
		t.Fatalf("scale 0.5: %v", img.Bounds())
	}
	var ms []float64
	for range 5 {
		start := time.Now()
		b.shot(t, "b1", "", 0)
		ms = append(ms, float64(time.Since(start).Microseconds())/1000)
	}
	sort.Float64s(ms)
	b.measure("screenshot_round_trip_p50_ms", ms[2])
	// The CLI.
	file := filepath.Join(b.art, "b1-cli.png")
	if out, errOut, code := b.s.CLI("", "screenshot", "b1", "-o", file); code != 0 {
		t.Fatalf("agentvm screenshot: %d %s %s", code, out, errOut)
	}
	if f, err := os.Open(file); err != nil {
		t.Fatal(err)
	} else if _, err := png.Decode(f); err != nil {
		t.Fatalf("agentvm screenshot wrote no PNG: %v", err)
	}
	// Scoped tokens need the display permission.
	for _, tc := range []struct {
		allow []string
		ok    bool
	}{{[]string{api.PermPreview, api.PermExec}, false}, {[]string{api.PermDisplay}, true}} {
		tok, err := b.s.Client.CreateToken(b.ctx, api.CreateTokenRequest{VM: "b1", Allow: tc.allow})
		if err != nil {
			t.Fatal(err)
		}
		_, err = client.New(b.s.URL, tok.Secret).Screenshot(b.ctx, "b1", 0.25)
		if (err == nil) != tc.ok {
			t.Fatalf("screenshot with a token allowing %v: %v", tc.allow, err)
		}
	}
	// Bad scale.
	if _, err := b.s.Client.Screenshot(b.ctx, "b1", 2); err == nil || !strings.Contains(err.Error(), "scale") {
		t.Fatalf("scale 2: %v", err)
	}
}

func (b *browserRun) forkOpenPage(t *testing.T) {
	c := b.s.Client
	before := b.cdp(t, b.cdpURL("b1"), b.s.Token, appURL, "state")
	if before.Name != "half-filled" || before.Count <= 0 {
		t.Fatalf("parent before the fork: %+v", before)
	}
	start := time.Now()
	fr, err := c.Fork(b.ctx, "b1", 2)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	b.measure("fork_parent_pause_ms", float64(fr.ParentPauseMs))
	kids := []string{fr.Children[0].Name, fr.Children[1].Name}
	defer func() {
		for _, k := range kids {
			c.DeleteVM(context.Background(), k)
		}
	}()
	// Both children answer CDP, with the page as the parent had it.
	type res struct {
		st  pageState
		err error
	}
	done := make(chan res, 2)
	for _, k := range kids {
		go func() {
			st, err := b.cdpErr(b.cdpURL(k), b.s.Token, appURL, "state")
			done <- res{st, err}
		}()
	}
	for range kids {
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.st.Name != "half-filled" || r.st.Count < before.Count || r.st.Hello == "" {
			t.Fatalf("a child's page does not continue from the parent's: before %+v, child %+v", before, r.st)
		}
	}
	b.measure("fork_to_both_children_answering_cdp_s", time.Since(start).Seconds())
	// They diverge: each child types its own text; the parent keeps its own.
	a := b.cdp(t, b.cdpURL(kids[0]), b.s.Token, appURL, "type", "-A")
	z := b.cdp(t, b.cdpURL(kids[1]), b.s.Token, appURL, "type", "-B")
	p := b.cdp(t, b.cdpURL("b1"), b.s.Token, appURL, "state")
	if a.Name != "half-filled-A" || z.Name != "half-filled-B" || p.Name != "half-filled" {
		t.Fatalf("after typing: child A %q, child B %q, parent %q", a.Name, z.Name, p.Name)
	}
	a2 := b.cdp(t, b.cdpURL(kids[0]), b.s.Token, appURL, "state")
	if a2.Count <= a.Count || a2.Name != "half-filled-A" {
		t.Fatalf("child A's page is not running on: %+v then %+v", a, a2)
	}
	b.shot(t, kids[0], "fork-child-A.png", 0)
	b.shot(t, kids[1], "fork-child-B.png", 0)
}

func (b *browserRun) suspendWake(t *testing.T) {
	c := b.s.Client
	before := b.cdp(t, b.cdpURL("b1"), b.s.Token, appURL, "state")
	if _, err := c.SuspendVM(b.ctx, "b1"); err != nil {
		t.Fatalf("suspend: %v", err)
	}
	if v, err := c.GetVM(b.ctx, "b1"); err != nil || v.State != api.StateSuspended {
		t.Fatalf("after suspend: %v %+v", err, v)
	}
	// A DevTools connection wakes it; the page is where it was, and runs on.
	start := time.Now()
	after := b.cdp(t, b.cdpURL("b1"), b.s.Token, appURL, "state")
	b.measure("wake_to_cdp_page_state_s", time.Since(start).Seconds())
	if after.Name != before.Name || after.Count < before.Count {
		t.Fatalf("after wake: before %+v, after %+v", before, after)
	}
	again := b.cdp(t, b.cdpURL("b1"), b.s.Token, appURL, "state")
	if again.Count <= after.Count {
		t.Fatalf("the page is not running after the wake: %d then %d", after.Count, again.Count)
	}
	b.shot(t, "b1", "after-wake.png", 0)
}

func (b *browserRun) stopStart(t *testing.T) {
	c := b.s.Client
	st := b.cdp(t, b.cdpURL("b1"), b.s.Token, appURL, "persist")
	if !strings.Contains(st.Cookie, "agentvm=kept") || st.Local != "kept" {
		t.Fatalf("persist: %+v", st)
	}
	b.eventually(t, "the download on disk", time.Minute, func() error {
		if r := b.s.Exec(b.ctx, "b1", "cat /home/user/Downloads/report.txt"); r.ExitCode != 0 {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
	start := time.Now()
	if _, err := c.StopVM(b.ctx, "b1"); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := c.StartVM(b.ctx, "b1"); err != nil {
		t.Fatalf("start: %v", err)
	}
	b.eventually(t, "CDP after a start", 5*time.Minute, func() error {
		req, _ := http.NewRequestWithContext(b.ctx, "GET", "http://"+b.proxy+"/json/version", nil)
		req.Host = strings.TrimPrefix(b.cdpURL("b1"), "http://")
		req.Header.Set("Authorization", "Bearer "+b.s.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		return nil
	})
	b.measure("stop_start_to_cdp_s", time.Since(start).Seconds())
	b.eventually(t, "the app after a start", 2*time.Minute, func() error {
		if r := b.s.Exec(b.ctx, "b1", "curl -sf http://localhost:8000/ >/dev/null"); r.ExitCode != 0 {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
	after := b.cdp(t, b.cdpURL("b1"), b.s.Token, appURL, "open")
	t.Logf("after stop/start: tab restored by the session: %v, %d tabs", after.Found, after.Tabs)
	if !strings.Contains(after.Cookie, "agentvm=kept") || after.Local != "kept" {
		t.Fatalf("the profile was not kept across stop/start: cookie %q, local storage %q", after.Cookie, after.Local)
	}
	if r := b.s.Exec(b.ctx, "b1", "cat /home/user/Downloads/report.txt"); r.ExitCode != 0 || !strings.Contains(r.Stdout, "a report") {
		t.Fatalf("the download was not kept: %+v", r)
	}
	b.shot(t, "b1", "after-stop-start.png", 0)
}
