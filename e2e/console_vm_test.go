package e2e

// The VM page's flows of TestConsole (console_test.go): the terminal (type,
// resize, detach and reattach, keystroke echo against `agentvm term`),
// files (upload, download, edit), a port and its preview, services,
// events, the serial log and the charts.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

func (c *consoleRun) openVM(v *api.VM, tab string) {
	c.run("open "+v.Name, chromedp.Navigate(fmt.Sprintf("%s/#/vms/%s/%s", c.s.URL, v.ID, tab)),
		chromedp.WaitVisible(fmt.Sprintf(`.tabpanel[data-tab=%q]`, tab), chromedp.ByQuery))
}

func (c *consoleRun) tab(name string) {
	c.click(fmt.Sprintf(`button[role="tab"][data-tab=%q]`, name))
	c.run("tab "+name, chromedp.WaitVisible(fmt.Sprintf(`.tabpanel[data-tab=%q]`, name), chromedp.ByQuery))
}

// typeTerm types into the focused terminal. Printable text goes in as
// text input (CDP Input.insertText: xterm.js reads it from its textarea's
// input event); chromedp's key events deliver a printable key twice to
// xterm.js (a keypress and a char event). Newlines are the Enter key.
func typeTerm(s string) chromedp.Action {
	var steps chromedp.Tasks
	for i, part := range strings.Split(s, "\n") {
		if i > 0 {
			steps = append(steps, chromedp.KeyEvent(kb.Enter))
		}
		if part != "" {
			steps = append(steps, input.InsertText(part))
		}
	}
	return steps
}

// termText is what xterm.js shows (the rendered rows).
const termText = `(document.querySelector('.term .xterm-rows')||{textContent:''}).textContent.replace(/\u00a0/g, ' ')`

func (c *consoleRun) attachSession(name string) {
	c.run("open session "+name,
		chromedp.SetValue(`input[name="session"]`, name, chromedp.ByQuery),
		chromedp.Click(`form[aria-label="Open a terminal session"] button[type="submit"]`, chromedp.ByQuery))
	c.waitJS("attached to "+name, fmt.Sprintf(`document.querySelector('[data-term-status]').textContent === %q`, "Attached to "+name), 2*time.Minute)
}

func (c *consoleRun) terminal(v *api.VM) {
	c.openVM(v, "terminal")
	c.attachSession("main")
	c.run("type a command", chromedp.Click(`.term`, chromedp.ByQuery), typeTerm("echo hello-$((6*7))\n"))
	c.waitJS("the command's output", termText+`.includes('hello-42')`, 2*time.Minute)
	c.a11y("terminal tab")
	c.screenshot("terminal")
	// The terminal follows the window: a narrower window, fewer columns.
	var cols int
	var err error
	c.run("shrink the window", chromedp.EmulateViewport(900, 800))
	deadline := time.Now().Add(time.Minute)
	for {
		var ts *api.TermInfo
		ts, err = c.s.Client.GetTerminal(c.ctx, v.ID, "main")
		if err == nil {
			cols = ts.Cols
		}
		if err == nil && cols > 0 && cols < 110 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || cols <= 0 {
		c.t.Fatalf("the session's size after the window shrank: %d columns, %v", cols, err)
	}
	if cols >= 110 {
		c.t.Errorf("the session kept %d columns after the window shrank", cols)
	}
	c.run("restore the window", chromedp.EmulateViewport(1400, 1000))
	// Detach, reattach: the scrollback comes back.
	c.click(`button:not([disabled])[type="button"]:is(.termbar button)`)
	c.waitJS("detached", `document.querySelector('[data-term-status]').textContent === 'Not attached'`, time.Minute)
	c.click(`button[data-session="main"]`)
	c.waitJS("reattached", `document.querySelector('[data-term-status]').textContent === 'Attached to main'`, 2*time.Minute)
	c.waitJS("the scrollback after reattaching", termText+`.includes('hello-42')`, time.Minute)
	c.screenshot("terminal-reattached")
	c.keystrokeEcho(v)
}

// keystrokeEcho measures one key to its echo on screen through xterm.js
// (CDP key event to the glyph in xterm's rows), and through `agentvm term`
// on a PTY (a byte to the PTY until it comes back), both into `cat`.
func (c *consoleRun) keystrokeEcho(v *api.VM) {
	for _, n := range []string{"echo-ui", "echo-cli"} {
		if _, err := c.s.Client.CreateTerminal(c.ctx, v.ID, api.TermCreate{Name: n, Argv: []string{"cat"}}); err != nil {
			c.t.Fatal(err)
		}
	}
	// Keep a handle on the page's next WebSocket, to also time when the echo
	// arrives from the network (before xterm.js parses and paints it).
	c.eval(`(() => {
		const O = window.WebSocket;
		const W = function (url, protocols) { const s = new O(url, protocols); window.__lastWS = s; return s; };
		W.prototype = O.prototype;
		for (const k of ['CONNECTING', 'OPEN', 'CLOSING', 'CLOSED']) W[k] = O[k];
		window.WebSocket = W;
		return true;
	})()`, new(bool))
	c.attachSession("echo-ui")
	c.run("focus", chromedp.Click(`.term`, chromedp.ByQuery))
	c.eval(`(() => {
		const rows = document.querySelector('.term .xterm-rows');
		const now = () => performance.timeOrigin + performance.now();
		window.__echo = null;
		new MutationObserver(() => {
			const p = window.__echo;
			if (p && !p.t && rows.textContent.includes(p.s)) { p.t = now(); if (p.done) p.done(p); }
		}).observe(rows, {subtree: true, childList: true, characterData: true});
		const dec = new TextDecoder();
		window.__lastWS.addEventListener('message', (m) => {
			const p = window.__echo;
			if (p && !p.ws && typeof m.data !== 'string' && dec.decode(m.data).includes(p.s.slice(-1))) p.ws = now();
		});
		window.__expect = (s) => { window.__echo = {s}; return true; };
		window.__waitEcho = () => new Promise((r, j) => {
			const p = window.__echo;
			if (p.t) { r(p); return; }
			p.done = r;
			setTimeout(() => j(new Error('no echo of ' + JSON.stringify(p.s) + ' on screen within 60 s')), 60000);
		});
		return true;
	})()`, new(bool))
	acc := "qz"
	c.run("prefix", typeTerm(acc))
	c.waitJS("prefix echoed", termText+`.includes('qz')`, time.Minute)
	var ui, net []float64
	for i := 0; i < 45; i++ {
		ch := string(rune('a' + i%25))
		acc += ch
		c.eval(fmt.Sprintf(`window.__expect(%q)`, acc), new(bool))
		t0 := float64(time.Now().UnixNano()) / 1e6
		c.run("key", typeTerm(ch))
		var got struct {
			T  float64 `json:"t"`
			WS float64 `json:"ws"`
		}
		c.eval(`window.__waitEcho()`, &got)
		if i >= 5 {
			ui = append(ui, got.T-t0)
			if got.WS > 0 {
				net = append(net, got.WS-t0)
			}
		}
	}
	sort.Float64s(ui)
	sort.Float64s(net)
	c.measure("keystroke_echo_xtermjs_ms_p50", round1(ui[len(ui)/2]))
	c.measure("keystroke_echo_xtermjs_ms_p90", round1(ui[len(ui)*9/10]))
	if len(net) > 0 {
		c.measure("keystroke_echo_websocket_in_page_ms_p50", round1(net[len(net)/2]))
	}
	c.screenshot("terminal-echo")

	cli, err := cliEcho(c.s, v.Name, "echo-cli", 45)
	if err != nil {
		c.t.Errorf("agentvm term echo: %v", err)
		return
	}
	sort.Float64s(cli)
	c.measure("keystroke_echo_cli_term_ms_p50", round1(cli[len(cli)/2]))
	c.measure("keystroke_echo_cli_term_ms_p90", round1(cli[len(cli)*9/10]))
}

// recordings plays back, in the recordings tab, the terminal session the
// terminal flow typed into (docs/recordings.md).
func (c *consoleRun) recordings(v *api.VM) {
	c.tab("recordings")
	c.waitJS("a recording of terminal main", `[...document.querySelectorAll('table[aria-label="Recordings"] tr')].some((r) => r.textContent.includes('terminal main'))`, time.Minute)
	c.eval(`(() => {
		const row = [...document.querySelectorAll('table[aria-label="Recordings"] tr')].find((r) => r.textContent.includes('terminal main'));
		row.querySelector('button[data-recording]').click();
		return true;
	})()`, new(bool))
	c.waitJS("the playback shows the command's output", `(() => {
		const rows = document.querySelector('.player [data-playback] .xterm-rows');
		return !!rows && rows.textContent.replace(/\u00a0/g, ' ').includes('hello-42');
	})()`, 2*time.Minute)
	c.a11y("recordings tab")
	c.screenshot("recordings")
}

// changes compares the VM's disk in the changes tab (docs/diff.md) after a
// file is written, and opens the file's diff.
func (c *consoleRun) changes(v *api.VM) {
	if r, err := c.s.Client.Exec(c.ctx, v.ID, api.ExecRequest{Shell: "echo from-console > /root/console-change.txt && sync"}); err != nil || r.ExitCode != 0 {
		c.t.Fatalf("write a file: %v %+v", err, r)
	}
	c.tab("changes")
	c.click(`form[aria-label="Compare the disk"] button[type="submit"]`)
	c.waitJS("the new file listed", `!!document.querySelector('[data-change="A /root/console-change.txt"]')`, 2*time.Minute)
	c.click(`[data-change="A /root/console-change.txt"] button`)
	c.waitJS("its diff shown", `(() => {
		const pre = document.querySelector('[data-change="A /root/console-change.txt"] pre');
		return !!pre && !pre.hidden && pre.textContent.includes('+from-console');
	})()`, time.Minute)
	c.a11y("changes tab")
	c.screenshot("changes")
}

func (c *consoleRun) files(v *api.VM) {
	c.tab("files")
	c.waitJS("the file list", `!!document.querySelector('table.files tbody tr')`, time.Minute)
	b := make([]byte, 96<<10)
	rand.Read(b)
	content := hex.EncodeToString(b) // 192 KiB of text
	local := filepath.Join(c.t.TempDir(), "upload.txt")
	os.WriteFile(local, []byte(content), 0o644)
	c.run("choose a file", chromedp.SetUploadFiles(`input[type="file"]`, []string{local}, chromedp.ByQuery))
	c.waitJS("the uploaded file listed", `!!document.querySelector('tr[data-file="upload.txt"]')`, 2*time.Minute)
	rc, _, err := c.s.Client.ReadFile(c.ctx, v.ID, "/root/upload.txt", 0, -1, client.FileOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != content {
		c.t.Fatalf("uploaded file: %d bytes, want %d", len(got), len(content))
	}
	c.screenshot("files")
	// Download it through the browser.
	dl := c.t.TempDir()
	done := make(chan string, 1)
	chromedp.ListenTarget(c.ctx, func(ev any) {
		if e, ok := ev.(*browser.EventDownloadProgress); ok && e.State == browser.DownloadProgressStateCompleted {
			select {
			case done <- e.GUID:
			default:
			}
		}
	})
	c.run("allow downloads", browser.SetDownloadBehavior(browser.SetDownloadBehaviorBehaviorAllowAndName).WithDownloadPath(dl).WithEventsEnabled(true))
	c.click(`a[aria-label="Download upload.txt"]`)
	select {
	case guid := <-done:
		got, err := os.ReadFile(filepath.Join(dl, guid))
		if err != nil || string(got) != content {
			c.t.Fatalf("downloaded file: %d bytes, %v", len(got), err)
		}
	case <-time.After(2 * time.Minute):
		c.t.Fatal("the download did not complete")
	}
	// Edit a small text file.
	c.click(`button[aria-label="Edit upload.txt"]`)
	c.run("edit", chromedp.WaitVisible(`.editor textarea`, chromedp.ByQuery),
		chromedp.SetValue(`.editor textarea`, "edited in the browser\n", chromedp.ByQuery),
		chromedp.Click(`.editor button[type="submit"]`, chromedp.ByQuery))
	deadline := time.Now().Add(time.Minute)
	for {
		r := c.s.Exec(c.ctx, v.ID, "cat /root/upload.txt")
		if r.Stdout == "edited in the browser\n" {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("edited file: %q", testenv.Tail(r.Stdout, 100))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *consoleRun) ports(v *api.VM) {
	c.s.Exec(c.ctx, v.ID, "cd /root && echo console-preview-ok > index.html && (nohup python3 -m http.server 8000 >/dev/null 2>&1 &)")
	c.tab("ports")
	c.run("expose 8000",
		chromedp.SetValue(`input[name="port"]`, "8000", chromedp.ByQuery),
		chromedp.Click(`input[name="public"]`, chromedp.ByQuery),
		chromedp.Click(`form[aria-label="Expose a port"] button[type="submit"]`, chromedp.ByQuery))
	c.waitJS("the preview link", `!!document.querySelector('a[data-preview="8000"]')`, time.Minute)
	c.screenshot("ports")
	var href string
	c.eval(`document.querySelector('a[data-preview="8000"]').href`, &href)
	// Open the preview as a user would: the link opens a new tab.
	tabCh := chromedp.WaitNewTarget(c.ctx, func(i *target.Info) bool { return strings.Contains(i.URL, "8000-") })
	c.click(`a[data-preview="8000"]`)
	var tid target.ID
	select {
	case tid = <-tabCh:
	case <-time.After(2 * time.Minute):
		c.t.Fatal("the preview link opened no tab")
	}
	pctx, cancel := chromedp.NewContext(c.ctx, chromedp.WithTargetID(tid))
	defer cancel()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var body string
		err := chromedp.Run(pctx, chromedp.Text("body", &body, chromedp.ByQuery))
		if err == nil && strings.Contains(body, "console-preview-ok") {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("preview %s never served the page: %v %q", href, err, body)
		}
		time.Sleep(500 * time.Millisecond)
		chromedp.Run(pctx, chromedp.Reload())
	}
	var buf []byte
	if chromedp.Run(pctx, chromedp.FullScreenshot(&buf, 100)) == nil {
		c.shot++
		os.WriteFile(filepath.Join(c.dir, fmt.Sprintf("%02d-preview.png", c.shot)), buf, 0o644)
	}
	chromedp.Run(pctx, page.Close())
}

func (c *consoleRun) otherTabs(v *api.VM) {
	if _, err := c.s.Client.CreateService(c.ctx, v.ID, api.ServiceCreate{Name: "ticker", Shell: "while true; do echo tick; sleep 2; done", Restart: "always"}); err != nil {
		c.t.Fatal(err)
	}
	c.tab("services")
	c.waitJS("the service listed", `!!document.querySelector('tr[data-service="ticker"]')`, time.Minute)
	c.click(`button[aria-label="Follow logs of ticker"]`)
	c.waitJS("followed service logs", `document.querySelector('pre.log').textContent.includes('tick')`, 2*time.Minute)
	c.screenshot("services")
	c.tab("events")
	c.waitJS("events listed", `document.querySelectorAll('table.events tbody tr').length > 3`, time.Minute)
	c.screenshot("events")
	c.tab("log")
	c.waitJS("the serial log", `document.querySelector('pre.log').textContent.length > 100`, time.Minute)
	c.screenshot("serial-log")
	c.tab("metrics")
	c.waitJS("CPU and memory charts", `document.querySelectorAll('svg.chart polyline').length === 2`, 3*time.Minute)
	c.a11y("metrics tab")
	c.screenshot("metrics")
}
