package e2e

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// consoleRun is one browser session against one daemon: its screenshots go
// to dir, its measurements to the test log and dir/measurements.json.
type consoleRun struct {
	t    *testing.T
	s    *testenv.Server
	ctx  context.Context
	dir  string
	shot int
	meas map[string]any
	// expectFailure lets waits pass a failed create's row (the test makes
	// one on purpose).
	expectFailure bool
}

// TestConsole drives the web console in Debian's headless Chromium against
// a real daemon and real VMs: sign-in (by keyboard), create, live list
// updates, a terminal (type, detach, reattach with scrollback), files
// (upload with the file picker, download), a port exposed and its preview
// opened, the other VM tabs, fork and delete from the UI, the host page
// with a scoped token created there, and that token's view (its VM only).
// Screenshots of each page are kept as artifacts; first paint, live-update
// latency and keystroke echo (xterm.js against `agentvm term`) are logged,
// never asserted (guests run under TCG here).
func TestConsole(t *testing.T) {
	t.Parallel()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is needed for the console's browser test (scripts/setup.sh installs Debian's chromium)")
	}
	s := testenv.Start(t, "")
	resp, err := http.Get(s.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET / = %d: the console is not built into this binary (run scripts/setup.sh, or: cd web && npm ci && npm run build)", resp.StatusCode)
	}
	dir := artifactsDir(t)

	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	actx, acancel := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1400, 1000),
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true))...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer bcancel()
	c := &consoleRun{t: t, s: s, ctx: bctx, dir: dir, meas: map[string]any{}}
	defer c.saveMeasurements()

	c.signIn(s.Token)
	vm := c.createVM("web1")
	c.liveUpdates(vm)
	c.terminal(vm)
	c.recordings(vm)
	c.changes(vm)
	c.files(vm)
	c.ports(vm)
	c.otherTabs(vm)
	child := c.fork(vm)
	secret := c.host(vm)
	c.deleteVM(child)
	c.keyboard(vm)
	c.scoped(vm, secret)
}

func artifactsDir(t *testing.T) string {
	base := os.Getenv("AGENTVM_ARTIFACTS")
	var dir string
	var err error
	if base != "" {
		dir = filepath.Join(base, "console")
		err = os.MkdirAll(dir, 0o755)
	} else {
		dir, err = os.MkdirTemp("", "agentvm-console-artifacts-")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("console artifacts (screenshots, measurements): %s", dir)
	return dir
}

// run runs browser actions, failing the test with what the page shows.
func (c *consoleRun) run(what string, actions ...chromedp.Action) {
	c.t.Helper()
	if err := chromedp.Run(c.ctx, actions...); err != nil {
		c.screenshot("failed-" + strings.ReplaceAll(what, " ", "-"))
		var body string
		tctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
		chromedp.Run(tctx, chromedp.Text("body", &body, chromedp.ByQuery))
		cancel()
		c.t.Fatalf("%s: %v\npage text:\n%s", what, err, testenv.Tail(body, 3000))
	}
}

// failedCreate is the text of a failed create's row in the VM list ("" when
// there is none): a terminal failure every wait stops at.
const failedCreate = `(document.querySelector('tr[data-state="failed"] td.error') || {}).textContent || ''`

// waitJS waits (polling) until the expression is true, for at most d, and
// fails at once when the console shows a failed create.
func (c *consoleRun) waitJS(what, expr string, d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for {
		var ok bool
		if err := chromedp.Run(c.ctx, chromedp.Evaluate(expr, &ok)); err == nil && ok {
			return
		}
		var failed string
		if err := chromedp.Run(c.ctx, chromedp.Evaluate(failedCreate, &failed)); err == nil && failed != "" && !c.expectFailure {
			c.screenshot("failed-create")
			c.t.Fatalf("%s: the console shows a failed create: %s\n%s", what, failed, tail(c.s.Logs()))
		}
		if time.Now().After(deadline) {
			c.run(what, chromedp.ActionFunc(func(context.Context) error {
				return fmt.Errorf("still false after %s: %s", d, expr)
			}))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *consoleRun) eval(expr string, out any) {
	c.t.Helper()
	c.run("evaluate "+testenv.Tail(expr, 80), chromedp.Evaluate(expr, out, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }))
}

func (c *consoleRun) screenshot(name string) {
	c.shot++
	var buf []byte
	tctx, cancel := context.WithTimeout(c.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Run(tctx, chromedp.FullScreenshot(&buf, 100)); err != nil {
		c.t.Logf("screenshot %s: %v", name, err)
		return
	}
	p := filepath.Join(c.dir, fmt.Sprintf("%02d-%s.png", c.shot, name))
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		c.t.Logf("screenshot %s: %v", name, err)
	}
}

func (c *consoleRun) measure(key string, v any) {
	c.meas[key] = v
	c.t.Logf("measure: %s = %v", key, v)
}

func (c *consoleRun) saveMeasurements() {
	b, _ := json.MarshalIndent(c.meas, "", "  ")
	os.WriteFile(filepath.Join(c.dir, "measurements.json"), b, 0o644)
}

// click clicks the element sel (a CSS selector) once it is visible.
func (c *consoleRun) click(sel string) {
	c.t.Helper()
	c.run("click "+sel, chromedp.WaitVisible(sel, chromedp.ByQuery), chromedp.Click(sel, chromedp.ByQuery))
}

// signIn signs in with the keyboard only: the token field has focus, the
// token is typed and Enter submits. It also measures the sign-in page's
// first paint and, after sign-in, a reload's first paint and VM list.
func (c *consoleRun) signIn(token string) {
	c.run("open the console", chromedp.Navigate(c.s.URL+"/"), chromedp.WaitVisible(`input[name="token"]`, chromedp.ByQuery))
	var fcp float64
	c.eval(`(performance.getEntriesByName('first-contentful-paint')[0]||{startTime:-1}).startTime`, &fcp)
	c.measure("signin_first_contentful_paint_ms", round1(fcp))
	c.a11y("sign-in page")
	c.screenshot("signin")
	var focused string
	c.eval(`document.activeElement.name`, &focused)
	if focused != "token" {
		c.t.Fatalf("the token field should have focus on the sign-in page, not %q", focused)
	}
	c.run("type the token", chromedp.KeyEvent(token), chromedp.KeyEvent(kb.Enter))
	c.run("VM list after sign-in", chromedp.WaitVisible(`table.vms`, chromedp.ByQuery))
	// The cookie is HttpOnly: the page cannot read it.
	var cookies string
	c.eval(`document.cookie`, &cookies)
	if strings.Contains(cookies, "agentvm_session") || strings.Contains(cookies, token) {
		c.t.Fatalf("the session cookie is visible to scripts: %q", cookies)
	}
	// A signed-in reload: first paint, and the list on screen.
	c.run("reload", chromedp.Reload(), chromedp.WaitVisible(`table.vms`, chromedp.ByQuery))
	var perf struct {
		FCP  float64 `json:"fcp"`
		List float64 `json:"list"`
	}
	c.eval(`({fcp: (performance.getEntriesByName('first-contentful-paint')[0]||{startTime:-1}).startTime,
		list: (performance.getEntriesByType('resource').find(e => e.name.endsWith('/v1/vms'))||{responseEnd:-1}).responseEnd})`, &perf)
	c.measure("console_first_contentful_paint_ms", round1(perf.FCP))
	c.measure("console_vm_list_loaded_ms", round1(perf.List))
}

func round1(f float64) float64 { return float64(int(f*10+0.5)) / 10 }

func (c *consoleRun) createVM(name string) *api.VM {
	c.click(`details.panel > summary`)
	c.run("fill the create form",
		chromedp.SetValue(`form.create input[name="name"]`, name, chromedp.ByQuery),
		chromedp.SetValue(`form.create input[name="memory"]`, "512M", chromedp.ByQuery),
		chromedp.SetValue(`form.create input[name="labels"]`, "suite=console", chromedp.ByQuery))
	c.screenshot("create-form")
	start := time.Now()
	c.click(`form.create button[type="submit"]`)
	c.waitJS("the new VM's row", fmt.Sprintf(`!!document.querySelector('tr[data-vm-name=%q][data-state="running"]')`, name), 5*time.Minute)
	c.measure("create_from_ui_s", time.Since(start).Round(10*time.Millisecond).Seconds())
	// A create that fails shows its row with the error, and can be dismissed.
	c.expectFailure = true
	var open bool
	c.eval(`document.querySelector('details.panel').open = true`, &open)
	c.run("fill the create form with a bad name", chromedp.SetValue(`form.create input[name="name"]`, "Bad Name!", chromedp.ByQuery))
	c.click(`form.create button[type="submit"]`)
	c.waitJS("the failed create's row", `(document.querySelector('tr[data-create-failed="Bad Name!"] td.error') || {}).textContent?.includes('name') === true`, time.Minute)
	c.screenshot("create-failed")
	c.click(`tr[data-create-failed="Bad Name!"] button:last-child`)
	c.waitJS("the failed row dismissed", `!document.querySelector('tr[data-state="failed"]')`, time.Minute)
	c.eval(`document.querySelector('details.panel').open = false`, &open)
	c.expectFailure = false
	v, err := c.s.Client.GetVM(c.ctx, name)
	if err != nil {
		c.t.Fatal(err)
	}
	if v.Labels["suite"] != "console" {
		c.t.Fatalf("labels from the form: %v", v.Labels)
	}
	c.screenshot("vm-list")
	return v
}

// liveUpdates measures how long an event takes to change the VM's row: the
// page records when the row shows the new state, the daemon stamps the
// event; both clocks are this machine's.
func (c *consoleRun) liveUpdates(v *api.VM) {
	c.eval(`(() => {
		window.__rowSeen = {};
		const tb = document.querySelector('table.vms tbody');
		new MutationObserver(() => {
			for (const tr of tb.querySelectorAll('tr[data-vm-id]')) {
				const k = tr.dataset.vmId + ':' + tr.dataset.state;
				if (!(k in window.__rowSeen)) window.__rowSeen[k] = performance.timeOrigin + performance.now();
			}
		}).observe(tb, {childList: true, subtree: true, attributes: true});
		return true;
	})()`, new(bool))
	var lat []float64
	for i := 0; i < 3; i++ {
		for _, op := range []string{"pause", "resume"} {
			state := map[string]string{"pause": "paused", "resume": "running"}[op]
			c.eval(fmt.Sprintf(`delete window.__rowSeen[%q]`, v.ID+":"+state), new(bool))
			var err error
			if op == "pause" {
				_, err = c.s.Client.PauseVM(c.ctx, v.ID)
			} else {
				_, err = c.s.Client.ResumeVM(c.ctx, v.ID)
			}
			if err != nil {
				c.t.Fatal(err)
			}
			key := v.ID + ":" + state
			c.waitJS("the row shows "+state, fmt.Sprintf(`%q in window.__rowSeen`, key), time.Minute)
			var seen float64
			c.eval(fmt.Sprintf(`window.__rowSeen[%q]`, key), &seen)
			evs, err := c.s.Client.Events(c.ctx, v.ID, 0)
			if err != nil {
				c.t.Fatal(err)
			}
			var at time.Time
			for _, e := range evs {
				if e.Data["op"] == op {
					at = e.Time
				}
			}
			lat = append(lat, seen-float64(at.UnixNano())/1e6)
		}
	}
	sort.Float64s(lat)
	c.measure("live_update_event_to_row_ms_p50", round1(lat[len(lat)/2]))
	c.measure("live_update_event_to_row_ms_all", roundAll(lat))
}

func roundAll(fs []float64) []float64 {
	out := make([]float64, len(fs))
	for i, f := range fs {
		out[i] = round1(f)
	}
	return out
}

func (c *consoleRun) fork(v *api.VM) string {
	c.run("VM list", chromedp.Navigate(c.s.URL+"/#/"), chromedp.WaitVisible(fmt.Sprintf(`tr[data-vm-id=%q]`, v.ID), chromedp.ByQuery))
	before := c.rowCount()
	c.click(fmt.Sprintf(`button[aria-label="Fork %s"]`, v.Name))
	c.run("fork dialog", chromedp.WaitVisible(`dialog input[name="count"]`, chromedp.ByQuery))
	c.screenshot("fork-dialog")
	c.click(`dialog button[type="submit"]`)
	c.waitJS("the fork's row", fmt.Sprintf(`document.querySelectorAll('tr[data-vm-id][data-state="running"]').length === %d`, before+1), 5*time.Minute)
	var child string
	c.eval(fmt.Sprintf(`[...document.querySelectorAll('tr[data-vm-id]')].map(r => r.dataset.vmName).find(n => n !== %q)`, v.Name), &child)
	c.screenshot("forked")
	return child
}

func (c *consoleRun) rowCount() int {
	var n int
	c.eval(`document.querySelectorAll('tr[data-vm-id]').length`, &n)
	return n
}

// host checks the host page and creates a scoped token for v there.
func (c *consoleRun) host(v *api.VM) string {
	// A built template, listed with its steps and build log.
	dir := c.t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM default\nRUN echo built for the console > /tmp/c\nCMD [\"sleep\", \"infinity\"]\n"), 0o644)
	if out, errOut, code := c.s.CLI("", "template", "build", "console-tpl", dir, "--memory", "512"); code != 0 {
		c.t.Fatalf("template build: %d %q %q", code, out, errOut)
	}
	c.run("host page", chromedp.Navigate(c.s.URL+"/#/host"), chromedp.WaitVisible(`dd[data-metric="running"]`, chromedp.ByQuery))
	c.waitJS("templates listed", `!!document.querySelector('table[aria-label="Templates"] tbody tr td.mono')`, time.Minute)
	c.waitJS("the built template listed", `!!document.querySelector('tr[data-template="console-tpl"]')`, time.Minute)
	c.run("its log", chromedp.Click(`button[aria-label="Steps and build log of template console-tpl"]`, chromedp.ByQuery))
	c.waitJS("the built template's steps and log", `(document.querySelector('pre[data-template-steps="console-tpl"]')?.textContent ?? '').includes('RUN echo built for the console') &&
		(document.querySelector('pre[data-template-log="console-tpl"]')?.textContent ?? '').includes('[3/3] start sleep infinity')`, time.Minute)
	var running string
	c.eval(`document.querySelector('dd[data-metric="running"]').textContent`, &running)
	if running != "2" {
		c.t.Errorf("host page: %s running, want 2", running)
	}
	c.run("pick the VM", chromedp.SetValue(`form[aria-label="Create a scoped token"] select[name="vm"]`, v.ID, chromedp.ByQuery),
		chromedp.Click(`form[aria-label="Create a scoped token"] button[type="submit"]`, chromedp.ByQuery))
	c.waitJS("the new token", `!!document.querySelector('code[data-token]')`, time.Minute)
	var secret string
	c.eval(`document.querySelector('code[data-token]').textContent`, &secret)
	if !strings.HasPrefix(secret, "avt_") {
		c.t.Fatalf("token from the host page: %q", secret)
	}
	c.a11y("host page")
	c.screenshot("host")
	return secret
}

// deleteVM deletes a VM from the list, confirming with the keyboard.
func (c *consoleRun) deleteVM(name string) {
	c.run("VM list", chromedp.Navigate(c.s.URL+"/#/"), chromedp.WaitVisible(fmt.Sprintf(`tr[data-vm-name=%q]`, name), chromedp.ByQuery))
	c.click(fmt.Sprintf(`button[aria-label="Delete %s"]`, name))
	c.run("confirm dialog", chromedp.WaitVisible(`dialog button.danger`, chromedp.ByQuery))
	var focused string
	c.eval(`document.activeElement.textContent`, &focused)
	if focused != "Delete" {
		c.t.Errorf("the confirm dialog should focus its Delete button, focus is on %q", focused)
	}
	c.screenshot("delete-confirm")
	c.run("confirm with Enter", chromedp.KeyEvent(kb.Enter))
	c.waitJS("the row gone", fmt.Sprintf(`!document.querySelector('tr[data-vm-name=%q]')`, name), 3*time.Minute)
	if _, err := c.s.Client.GetVM(c.ctx, name); !client.IsNotFound(err) {
		c.t.Fatalf("%s still exists after the UI deleted it: %v", name, err)
	}
}

// keyboard checks that the main actions are reachable with Tab, in order.
func (c *consoleRun) keyboard(v *api.VM) {
	c.run("VM list", chromedp.Navigate(c.s.URL+"/#/"), chromedp.WaitVisible(fmt.Sprintf(`tr[data-vm-id=%q]`, v.ID), chromedp.ByQuery))
	c.eval(`document.activeElement.blur(), true`, new(bool))
	var seen []string
	for i := 0; i < 40; i++ {
		c.run("tab", chromedp.KeyEvent(kb.Tab))
		var d string
		c.eval(`(e => e.getAttribute('aria-label') || e.textContent.trim())(document.activeElement)`, &d)
		seen = append(seen, d)
	}
	joined := strings.Join(seen, " | ")
	for _, want := range []string{"Skip to content", "Host", "Sign out", "Create a VM", v.Name, "Pause " + v.Name, "Fork " + v.Name, "Delete " + v.Name} {
		if !strings.Contains(joined, want) {
			c.t.Errorf("%q is not reachable with Tab; tab order: %s", want, joined)
		}
	}
	c.measure("tab_order_vm_list", seen[:min(len(seen), 16)])
}

// scoped signs in with a VM's token: the list has that VM only, there is
// no host page, and the API refuses the rest.
func (c *consoleRun) scoped(v *api.VM, secret string) {
	// The admin's session, as someone who copied the cookie would hold it.
	var old []*network.Cookie
	c.run("the session cookie", chromedp.ActionFunc(func(ctx context.Context) (err error) {
		old, err = network.GetCookies().WithURLs([]string{c.s.URL}).Do(ctx)
		return err
	}))
	var csrf string
	c.eval(`fetch('/console/session').then(r => r.json()).then(s => s.csrf_token)`, &csrf)
	c.click(`#who button`)
	c.run("signed out", chromedp.WaitVisible(`input[name="token"]`, chromedp.ByQuery))
	// Signing out ended the session on the daemon: the old cookie is
	// worthless.
	req, _ := http.NewRequestWithContext(c.ctx, "GET", c.s.URL+"/v1/vms", nil)
	for _, ck := range old {
		if ck.Name == "agentvm_session" {
			if strings.Contains(ck.Value, c.s.Token) || !ck.HTTPOnly || ck.SameSite != network.CookieSameSiteStrict {
				c.t.Errorf("session cookie %+v: want an HttpOnly, SameSite=Strict session id", ck)
			}
			req.AddCookie(&http.Cookie{Name: ck.Name, Value: ck.Value})
		}
	}
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.Header.Set("X-CSRF-Token", csrf)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		c.t.Errorf("the signed-out session's cookie: %v %v, want 401", resp, err)
	} else {
		resp.Body.Close()
	}
	c.run("sign in with the VM's token", chromedp.SendKeys(`input[name="token"]`, secret, chromedp.ByQuery), chromedp.KeyEvent(kb.Enter))
	c.waitJS("its VM only", fmt.Sprintf(`document.querySelectorAll('tr[data-vm-id]').length === 1 && !!document.querySelector('tr[data-vm-id=%q]')`, v.ID), time.Minute)
	var nav string
	c.eval(`document.getElementById('nav').textContent`, &nav)
	if strings.Contains(nav, "Host") {
		c.t.Errorf("a scoped session shows the host page: nav %q", nav)
	}
	// The API refuses the admin endpoints to this session (with its CSRF
	// token, as the page sends it), and any call without the token.
	var codes []int
	c.eval(`fetch('/console/session').then(r => r.json()).then(s => Promise.all(['/v1/vms', '/v1/host', '/v1/tokens', '/v1/vms/`+v.ID+`'].map(p =>
		fetch(p, {headers: {'X-CSRF-Token': s.csrf_token}}).then(r => r.status))))`, &codes)
	if fmt.Sprint(codes) != "[403 403 403 200]" {
		c.t.Errorf("a scoped session: /v1/vms, /v1/host, /v1/tokens, its VM = %v, want [403 403 403 200]", codes)
	}
	var noCSRF int
	c.eval(`fetch('/v1/vms/`+v.ID+`').then(r => r.status)`, &noCSRF)
	if noCSRF != 403 {
		c.t.Errorf("an API call of a browser session without the CSRF token: %d, want 403", noCSRF)
	}
	c.screenshot("scoped-list")
	c.click(fmt.Sprintf(`tr[data-vm-id=%q] a`, v.ID))
	c.run("its VM page", chromedp.WaitVisible(`.tabpanel[data-tab="terminal"]`, chromedp.ByQuery))
	c.attachSession("main")
	c.waitJS("the scrollback as the scoped token", termText+`.includes('hello-42')`, time.Minute)
	c.a11y("scoped VM page")
	c.screenshot("scoped-vm")
}

// a11y checks the basics: every form control has an accessible name, every
// button a name, the page a main landmark and a heading.
func (c *consoleRun) a11y(where string) {
	c.t.Helper()
	var bad []string
	c.eval(`(() => {
		const bad = [];
		const named = (e) => (e.labels && e.labels.length && [...e.labels].some(l => l.textContent.trim())) || e.getAttribute('aria-label') || e.getAttribute('aria-labelledby') || e.title;
		for (const e of document.querySelectorAll('input, select, textarea')) {
			if (e.type === 'hidden' || e.closest('.xterm')) continue;
			if (!named(e)) bad.push(e.outerHTML.slice(0, 120));
		}
		for (const b of document.querySelectorAll('button, a[href], summary')) {
			if (!(b.textContent.trim() || b.getAttribute('aria-label'))) bad.push(b.outerHTML.slice(0, 120));
		}
		if (!document.querySelector('main')) bad.push('no <main>');
		if (!document.querySelector('h1')) bad.push('no <h1>');
		if (!document.documentElement.lang) bad.push('no lang');
		return bad;
	})()`, &bad)
	if len(bad) > 0 {
		c.t.Errorf("accessibility (%s): unlabelled or unnamed elements:\n\t%s", where, strings.Join(bad, "\n\t"))
	}
}
