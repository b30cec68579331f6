package browser

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/chromedp/chromedp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// The QA scenario's app: Python with psycopg2 on PostgreSQL, both Debian
// packages of the browser image, in the same VM as the browser.
const qaApp = `import html, http.server, sys, urllib.parse
import psycopg2

DSN = "dbname=qa user=qa password=qa host=127.0.0.1"

def items():
    with psycopg2.connect(DSN) as c, c.cursor() as cur:
        cur.execute("select name from items order by id")
        return [r[0] for r in cur.fetchall()]

class App(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        lis = "".join("<li>%s</li>" % html.escape(n) for n in items())
        body = ("<!doctype html><meta charset=utf-8><title>QA app</title><h1>Shopping list</h1>"
                "<ul id=items>%s</ul><form method=post action=/add><input id=item name=name>"
                "<button id=add>Add</button></form>"
                "<button id=toggle type=button onclick=\"document.body.dataset.toggled='yes'\">Toggle</button>" % lis).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        name = urllib.parse.parse_qs(self.rfile.read(n).decode()).get("name", [""])[0].strip()
        if name:
            with psycopg2.connect(DSN) as c, c.cursor() as cur:
                cur.execute("insert into items (name) values (%s)", (name,))
            print("added %r" % name, file=sys.stderr, flush=True)
        self.send_response(303)
        self.send_header("Location", "/")
        self.send_header("Content-Length", "0")
        self.end_headers()

http.server.ThreadingHTTPServer(("127.0.0.1", 8080), App).serve_forever()
`

const qaURL = "http://localhost:8080/"

// qaScenario: a second browser VM (a create is a restore of the warm
// browser) runs PostgreSQL and an app on it; the browser adds a row through
// the app's form; the row is in the database. Screenshots, the app's and
// PostgreSQL's logs and the page are kept as artifacts.
func (b *browserRun) qaScenario(t *testing.T) {
	c := b.s.Client
	start := time.Now()
	v, err := c.CreateVM(b.ctx, api.CreateVMRequest{Name: "qa", Image: "browser"})
	if err != nil {
		t.Fatalf("create qa: %v", err)
	}
	b.measure("create_browser_vm_restore_s", float64(v.CreateMs)/1000)
	b.eventually(t, "CDP in the new VM", 2*time.Minute, func() error {
		_, err := b.cdpVersion("qa")
		return err
	})
	b.measure("create_to_cdp_version_s", time.Since(start).Seconds())

	b.write(t, "qa", "/srv/qa/app.py", qaApp)
	setup := `set -e
systemctl start postgresql
sudo -u postgres psql -q -c "create role qa login password 'qa'" -c "create database qa owner qa"
PGPASSWORD=qa psql -q -h 127.0.0.1 -U qa -d qa -c "create table items (id serial primary key, name text not null)"`
	if r := b.s.Exec(b.ctx, "qa", setup); r.ExitCode != 0 {
		t.Fatalf("PostgreSQL setup: %+v", r)
	}
	if _, err := c.CreateService(b.ctx, "qa", api.ServiceCreate{Name: "qa-app", Argv: []string{"python3", "/srv/qa/app.py"}, Restart: "always"}); err != nil {
		t.Fatalf("app service: %v", err)
	}
	b.eventually(t, "the QA app answers", 2*time.Minute, func() error {
		if r := b.s.Exec(b.ctx, "qa", "curl -sf "+qaURL+" | grep -q Shopping"); r.ExitCode != 0 {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
	tok, err := c.CreateToken(b.ctx, api.CreateTokenRequest{VM: "qa", Allow: []string{api.PermPreview, api.PermExec, api.PermDisplay}})
	if err != nil {
		t.Fatal(err)
	}
	b.shot(t, "qa", "qa-before.png", 0)
	st := b.cdp(t, b.cdpURL("qa"), tok.Secret, qaURL, "qa", "bought by the browser")
	if !contains(st.Items, "bought by the browser") {
		t.Fatalf("the page does not list the new item: %v", st.Items)
	}
	b.save("qa-page.html", []byte(st.HTML))
	r := b.s.Exec(b.ctx, "qa", `PGPASSWORD=qa psql -h 127.0.0.1 -U qa -d qa -tAc "select name from items"`)
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "bought by the browser") {
		t.Fatalf("the row is not in the database: %+v", r)
	}
	b.shot(t, "qa", "qa-after.png", 0)
	b.saveLogs(t, "qa")
}

// saveLogs keeps the app's and PostgreSQL's logs.
func (b *browserRun) saveLogs(t *testing.T, vm string) {
	if rc, err := b.s.Client.ServiceLogs(b.ctx, vm, "qa-app", 1000, false); err == nil {
		out, _ := io.ReadAll(rc)
		rc.Close()
		b.save("qa-app.log", out)
	} else {
		t.Logf("app log: %v", err)
	}
	r := b.s.Exec(b.ctx, vm, "cat /var/log/postgresql/*.log; journalctl --no-pager -u 'postgresql*' -u agentvm-chromium | tail -n 300")
	b.save("qa-postgresql-and-chromium.log", []byte(r.Stdout+r.Stderr))
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// cdpVersion is the browser's /json/version through the preview proxy.
func (b *browserRun) cdpVersion(vm string) (string, error) {
	req, _ := http.NewRequestWithContext(b.ctx, "GET", "http://"+b.proxy+"/json/version", nil)
	req.Host = strings.TrimPrefix(b.cdpURL(vm), "http://")
	req.Header.Set("Authorization", "Bearer "+b.s.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
	}
	return string(body), nil
}

// mcpTools drives the QA VM's browser with `agentvm mcp`'s tools (stdio,
// with the official Go SDK's client): navigate, type and submit, click,
// evaluate, screenshot.
func (b *browserRun) mcpTools(t *testing.T) {
	cmd := b.s.CLICmd("", "mcp")
	cmd.Stdin = nil // the transport's pipe
	cmd.Env = append(cmd.Env, "AGENTVM_TOKEN="+b.s.Token)
	cl := sdk.NewClient(&sdk.Implementation{Name: "browser-test", Version: "1"}, nil)
	sess, err := cl.Connect(b.ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("agentvm mcp: %v", err)
	}
	defer sess.Close()
	call := func(name string, args map[string]any) *sdk.CallToolResult {
		t.Helper()
		start := time.Now()
		r, err := sess.CallTool(b.ctx, &sdk.CallToolParams{Name: name, Arguments: args})
		if err != nil || r.IsError {
			t.Fatalf("%s %v: %v %s", name, args, err, toolText(r))
		}
		t.Logf("mcp %s: %.1fs", name, time.Since(start).Seconds())
		return r
	}
	if got := toolText(call("browser_navigate", map[string]any{"vm": "qa", "url": qaURL})); !strings.Contains(got, "Shopping list") || !strings.Contains(got, "bought by the browser") {
		t.Fatalf("browser_navigate: %s", got)
	}
	call("browser_type", map[string]any{"vm": "qa", "selector": "#item", "text": "added by MCP", "submit": true})
	b.eventually(t, "the MCP item in the page", time.Minute, func() error {
		got := toolText(call("browser_evaluate", map[string]any{"vm": "qa", "expression": "[...document.querySelectorAll('#items li')].map(l => l.textContent)"}))
		if !strings.Contains(got, `"added by MCP"`) {
			return fmt.Errorf("items: %s", got)
		}
		return nil
	})
	call("browser_click", map[string]any{"vm": "qa", "selector": "#toggle"})
	if got := toolText(call("browser_evaluate", map[string]any{"vm": "qa", "expression": "document.body.dataset.toggled"})); got != `"yes"` {
		t.Fatalf("browser_click did not click: %s", got)
	}
	r := call("screenshot", map[string]any{"vm": "qa", "scale": 0.5})
	var shot []byte
	for _, c := range r.Content {
		if im, ok := c.(*sdk.ImageContent); ok && im.MIMEType == "image/png" {
			shot = im.Data
		}
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil || img.Bounds().Dx() != 640 {
		t.Fatalf("screenshot tool: %v %v", err, img)
	}
	b.save("qa-mcp-screenshot.png", shot)
	if r := b.s.Exec(b.ctx, "qa", `PGPASSWORD=qa psql -h 127.0.0.1 -U qa -d qa -tAc "select count(*) from items where name = 'added by MCP'"`); strings.TrimSpace(r.Stdout) != "1" {
		t.Fatalf("the MCP item is not in the database: %+v", r)
	}
	b.saveLogs(t, "qa")
}

func toolText(r *sdk.CallToolResult) string {
	if r == nil {
		return ""
	}
	var s []string
	for _, c := range r.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			s = append(s, tc.Text)
		}
	}
	return strings.Join(s, "\n")
}

// liveView opens the display on its own in the web console (#/display/b1)
// signed in with a token that may only use the display, checks that the
// noVNC canvas shows the screen and that keys typed into it do not reach
// the VM (the display permission is view-only), then with a token that may
// also run commands, whose keys do.
func (b *browserRun) liveView(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is needed for the console's live view test (scripts/setup.sh installs Debian's chromium)")
	}
	if resp, err := http.Get(b.s.URL + "/"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET / = %v %v: the console is not built into this binary (run scripts/setup.sh, or: cd web && npm ci && npm run build)", resp, err)
	}
	before := b.cdp(t, b.cdpURL("b1"), b.s.Token, appURL, "state")
	// The page's field has the focus in the VM's browser.
	b.cdp(t, b.cdpURL("b1"), b.s.Token, appURL, "type", "")
	for _, tc := range []struct {
		allow []string
		keys  string
		shot  string
	}{
		{[]string{api.PermDisplay}, " blocked", "console-live-view"},
		{[]string{api.PermDisplay, api.PermExec}, " via vnc", "console-live-view-typed"},
	} {
		tok, err := b.s.Client.CreateToken(b.ctx, api.CreateTokenRequest{VM: "b1", Allow: tc.allow})
		if err != nil {
			t.Fatal(err)
		}
		// Each view stays open to the end: the first one's keys are on
		// the wire long before the second view has connected.
		defer b.typeInLiveView(t, chromium, tok.Secret, tc.keys, tc.shot)()
	}
	// Only the second token's keys reached the page: the first view's were
	// dropped on the host.
	b.eventually(t, "the keys in the VM's page", time.Minute, func() error {
		st := b.cdp(t, b.cdpURL("b1"), b.s.Token, appURL, "state")
		if strings.Contains(st.Name, "blocked") {
			t.Fatalf("keys typed into a display-only live view reached the VM's page: field %q", st.Name)
		}
		if st.Name != before.Name+" via vnc" {
			return fmt.Errorf("field %q", st.Name)
		}
		return nil
	})
}

// typeInLiveView signs in to the console's live view of b1 with secret in a
// fresh browser, waits for the screen in the canvas and types keys into it.
// The returned func closes the browser.
func (b *browserRun) typeInLiveView(t *testing.T, chromium, secret, keys, shot string) func() {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Minute)
	actx, acancel := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1400, 1000),
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true))...)
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	closeAll := func() { bcancel(); acancel(); cancel() }
	run := func(what string, actions ...chromedp.Action) {
		t.Helper()
		if err := chromedp.Run(bctx, actions...); err != nil {
			var img []byte
			sctx, scancel := context.WithTimeout(bctx, 20*time.Second)
			if chromedp.Run(sctx, chromedp.FullScreenshot(&img, 90)) == nil {
				b.save("failed-"+shot+".png", img)
			}
			scancel()
			t.Fatalf("live view: %s: %v", what, err)
		}
	}
	poll := func(expr string, d time.Duration) chromedp.Action {
		return chromedp.Poll(expr, nil, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(d))
	}
	start := time.Now()
	run("open the display page", chromedp.Navigate(b.s.URL+"/#/display/b1"), chromedp.WaitVisible(`input[name="token"]`, chromedp.ByQuery))
	run("sign in with a display token", chromedp.KeyEvent(secret+"\r"))
	run("the live view connects", poll(`document.querySelector('[data-display-status]')?.textContent === 'Live: b1'`, 2*time.Minute))
	// noVNC draws the framebuffer into its canvas: wait until it shows the app.
	run("the screen in the canvas", poll(`(() => {
		const cv = document.querySelector('.display canvas'); if (!cv || cv.width !== 1280) return false;
		const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data; const seen = new Set(); let red = 0;
		for (let i = 0; i < d.length; i += 4 * 7) { seen.add(d[i] << 16 | d[i+1] << 8 | d[i+2]); if (d[i] > 180 && d[i+1] < 90 && d[i+2] < 90) red++; }
		return seen.size > 30 && red > 500; })()`, 2*time.Minute))
	b.measure("live_view_open_to_screen_s", time.Since(start).Seconds())
	run("focus the view", chromedp.Evaluate(`document.querySelector('.display canvas').focus()`, nil))
	run("type through VNC", chromedp.KeyEvent(keys))
	var img []byte
	run("screenshot", chromedp.FullScreenshot(&img, 100))
	b.save(shot+".png", img)
	return closeAll
}
