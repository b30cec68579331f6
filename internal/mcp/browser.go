package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/agentvm/agentvm/internal/cdp"
	"github.com/agentvm/agentvm/pkg/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Browser tools: a browser VM's display as an image, and its Chromium driven
// through the DevTools protocol (the API's TCP tunnel to port 9222), so a
// model works a browser with no library of its own.

type screenshotIn struct {
	VM    string  `json:"vm,omitempty" jsonschema:"the VM's name or id (made with create_vm image browser)"`
	Scale float64 `json:"scale,omitempty" jsonschema:"shrink the image by this factor, between 0 and 1 (default 1: 1280x800)"`
}

type navigateIn struct {
	VM             string `json:"vm,omitempty" jsonschema:"the VM's name or id (made with create_vm image browser)"`
	URL            string `json:"url" jsonschema:"the address to open, e.g. http://localhost:8000/ for a server in the VM, or https://example.com"`
	NewTab         bool   `json:"new_tab,omitempty" jsonschema:"open it in a new tab instead of the current one"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"wait at most this long for the page to load (default 60)"`
}

type clickIn struct {
	VM       string  `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Selector string  `json:"selector,omitempty" jsonschema:"CSS selector of the element to click (its centre is clicked); or give x and y"`
	X        float64 `json:"x,omitempty" jsonschema:"x in CSS pixels of the page (as on a screenshot's page area), with y, when there is no selector"`
	Y        float64 `json:"y,omitempty" jsonschema:"y in CSS pixels of the page"`
}

type typeIn struct {
	VM       string `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Text     string `json:"text" jsonschema:"the text to type"`
	Selector string `json:"selector,omitempty" jsonschema:"CSS selector of the field to type into (it is focused first); default: the focused element"`
	Clear    bool   `json:"clear,omitempty" jsonschema:"empty the field first"`
	Submit   bool   `json:"submit,omitempty" jsonschema:"press Enter afterwards (submits a form)"`
}

type evalIn struct {
	VM         string `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Expression string `json:"expression" jsonschema:"a JavaScript expression evaluated in the current tab (a promise is awaited); its value is returned as JSON"`
}

func (t *tools) registerBrowser(s *sdk.Server) {
	ro := &sdk.ToolAnnotations{ReadOnlyHint: true}
	act := &sdk.ToolAnnotations{DestructiveHint: boolp(true), OpenWorldHint: boolp(true)}
	add(t, s, false, &sdk.Tool{Name: "screenshot", Description: "Take a screenshot of a browser VM's display (create it with create_vm and image \"browser\"): what its Chromium shows, as a PNG image.", Annotations: ro}, t.screenshot)
	add(t, s, false, &sdk.Tool{Name: "browser_navigate", Description: "Open a URL in a browser VM's Chromium (the current tab, or a new one) and wait for it to load. Returns the page's title, address and visible text. Servers inside the VM are at http://localhost:PORT/.", Annotations: act}, t.navigate)
	add(t, s, false, &sdk.Tool{Name: "browser_click", Description: "Click an element of the current tab of a browser VM, by CSS selector (preferred) or by x,y page coordinates, as a real mouse click. Returns the page's title and address afterwards.", Annotations: act}, t.click)
	add(t, s, false, &sdk.Tool{Name: "browser_type", Description: "Type text into a field of the current tab of a browser VM (focused by CSS selector, or the focused element), optionally clearing it first and pressing Enter after.", Annotations: act}, t.typeText)
	add(t, s, false, &sdk.Tool{Name: "browser_evaluate", Description: "Evaluate a JavaScript expression in the current tab of a browser VM and return its value as JSON (read the DOM, e.g. document.querySelector('h1').textContent).", Annotations: act}, t.evaluate)
}

func (t *tools) screenshot(ctx context.Context, in screenshotIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	if in.Scale < 0 || in.Scale > 1 {
		return nil, fmt.Errorf("scale must be between 0 and 1, got %g", in.Scale)
	}
	png, err := t.c.Screenshot(ctx, id, in.Scale)
	if err != nil {
		return nil, toolError("screenshot", err)
	}
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.ImageContent{Data: png, MIMEType: "image/png"}}}, nil
}

// browser opens the DevTools protocol of a VM's Chromium through the API.
func (t *tools) browser(id string) *cdp.Browser {
	return cdp.New(func(ctx context.Context) (net.Conn, error) { return t.c.DialTCP(ctx, id, client.BrowserCDPPort) })
}

// page opens a session on the VM's current tab (the most recently used).
func (t *tools) page(ctx context.Context, vm string) (*cdp.Browser, *cdp.Conn, string, error) {
	id, err := t.vm(vm)
	if err != nil {
		return nil, nil, "", err
	}
	b := t.browser(id)
	pages, err := b.Pages(ctx)
	if err != nil {
		return nil, nil, "", fmt.Errorf("the browser of %s does not answer (is it a VM of the browser image?): %v", id, err)
	}
	var target *cdp.Target
	if len(pages) > 0 {
		target = &pages[0]
	} else if target, err = b.NewPage(ctx, "about:blank"); err != nil {
		return nil, nil, "", fmt.Errorf("open a tab: %v", err)
	}
	c, err := b.Page(ctx, target.ID)
	if err != nil {
		return nil, nil, "", err
	}
	return b, c, target.ID, nil
}

// pageSummary is what a model sees of a page after an action.
type pageSummary struct {
	URL   string `json:"url"`
	Title string `json:"title"`
	Text  string `json:"text"`
}

const summaryJS = `({url: location.href, title: document.title, text: document.body ? document.body.innerText : ''})`

// settle waits until the page has loaded (readyState complete) or d passes.
func settle(ctx context.Context, c *cdp.Conn, d time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		var st string
		if c.Evaluate(ctx, "document.readyState", &st) == nil && st == "complete" {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func summarize(ctx context.Context, c *cdp.Conn, withText bool) string {
	var s pageSummary
	if err := c.Evaluate(ctx, summaryJS, &s); err != nil {
		return "(the page could not be read: " + err.Error() + ")"
	}
	out := fmt.Sprintf("Page: %s\nTitle: %s", s.URL, s.Title)
	if withText {
		txt, cut := truncate(strings.TrimSpace(s.Text), 8<<10)
		out += "\n--- visible text ---\n" + txt
		if cut {
			out += "\n[... text truncated at 8 KiB; use browser_evaluate to read more]"
		}
	}
	return out
}

func (t *tools) navigate(ctx context.Context, in navigateIn) (*sdk.CallToolResult, error) {
	if in.URL == "" {
		return nil, fmt.Errorf("url is required")
	}
	timeout := time.Duration(in.TimeoutSeconds) * time.Second
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	b, c, tab, err := t.page(ctx, in.VM)
	if err != nil {
		return nil, err
	}
	if in.NewTab {
		c.Close()
		nt, err := b.NewPage(ctx, "about:blank")
		if err != nil {
			return nil, fmt.Errorf("open a tab: %v", err)
		}
		tab = nt.ID
		if c, err = b.Page(ctx, tab); err != nil {
			return nil, err
		}
	}
	defer c.Close()
	b.Activate(ctx, tab)
	var r struct {
		ErrorText string `json:"errorText"`
	}
	nctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.Call(nctx, "Page.navigate", map[string]any{"url": in.URL}, &r); err != nil {
		return nil, fmt.Errorf("navigate to %s: %v", in.URL, err)
	}
	if r.ErrorText != "" {
		return nil, fmt.Errorf("navigate to %s: %s", in.URL, r.ErrorText)
	}
	settle(ctx, c, timeout)
	return text(summarize(ctx, c, true)), nil
}

func (t *tools) click(ctx context.Context, in clickIn) (*sdk.CallToolResult, error) {
	_, c, _, err := t.page(ctx, in.VM)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	x, y, what := in.X, in.Y, fmt.Sprintf("(%g, %g)", in.X, in.Y)
	if in.Selector != "" {
		sel, _ := json.Marshal(in.Selector)
		var el struct {
			Found bool    `json:"found"`
			X     float64 `json:"x"`
			Y     float64 `json:"y"`
			Desc  string  `json:"desc"`
		}
		err := c.Evaluate(ctx, `(() => { const e = document.querySelector(`+string(sel)+`); if (!e) return {found: false};
			e.scrollIntoView({block: 'center', inline: 'center'}); const r = e.getBoundingClientRect();
			return {found: true, x: r.left + r.width / 2, y: r.top + r.height / 2,
				desc: e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' ' + (e.innerText || e.value || '').trim().slice(0, 60)}; })()`, &el)
		if err != nil {
			return nil, fmt.Errorf("find %s: %v", in.Selector, err)
		}
		if !el.Found {
			return nil, fmt.Errorf("no element matches %s on this page", in.Selector)
		}
		x, y, what = el.X, el.Y, strings.TrimSpace(el.Desc)
	} else if in.X == 0 && in.Y == 0 {
		return nil, fmt.Errorf("give a selector, or x and y")
	}
	for _, typ := range []string{"mouseMoved", "mousePressed", "mouseReleased"} {
		p := map[string]any{"type": typ, "x": x, "y": y, "button": "left", "clickCount": 1}
		if typ == "mouseMoved" {
			p = map[string]any{"type": typ, "x": x, "y": y}
		}
		if err := c.Call(ctx, "Input.dispatchMouseEvent", p, nil); err != nil {
			return nil, fmt.Errorf("click: %v", err)
		}
	}
	time.Sleep(300 * time.Millisecond) // let a navigation the click started begin
	settle(ctx, c, 30*time.Second)
	return text("Clicked " + what + ".\n" + summarize(ctx, c, false)), nil
}

func (t *tools) typeText(ctx context.Context, in typeIn) (*sdk.CallToolResult, error) {
	_, c, _, err := t.page(ctx, in.VM)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if in.Selector != "" {
		sel, _ := json.Marshal(in.Selector)
		var found bool
		if err := c.Evaluate(ctx, `(() => { const e = document.querySelector(`+string(sel)+`); if (!e) return false;
			e.scrollIntoView({block: 'center'}); e.focus(); return true; })()`, &found); err != nil {
			return nil, fmt.Errorf("focus %s: %v", in.Selector, err)
		}
		if !found {
			return nil, fmt.Errorf("no element matches %s on this page", in.Selector)
		}
	}
	if in.Clear {
		if err := c.Evaluate(ctx, `(() => { const e = document.activeElement; if (e && 'value' in e) { e.select && e.select(); } else if (e && e.isContentEditable) { document.execCommand('selectAll'); } return true; })()`, nil); err != nil {
			return nil, err
		}
		if err := c.Call(ctx, "Input.dispatchKeyEvent", map[string]any{"type": "keyDown", "key": "Delete", "code": "Delete", "windowsVirtualKeyCode": 46}, nil); err != nil {
			return nil, err
		}
		c.Call(ctx, "Input.dispatchKeyEvent", map[string]any{"type": "keyUp", "key": "Delete", "code": "Delete", "windowsVirtualKeyCode": 46}, nil)
	}
	if in.Text != "" {
		if err := c.Call(ctx, "Input.insertText", map[string]any{"text": in.Text}, nil); err != nil {
			return nil, fmt.Errorf("type: %v", err)
		}
	}
	if in.Submit {
		for _, typ := range []string{"keyDown", "keyUp"} {
			p := map[string]any{"type": typ, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13}
			if typ == "keyDown" {
				p["text"] = "\r"
			}
			if err := c.Call(ctx, "Input.dispatchKeyEvent", p, nil); err != nil {
				return nil, fmt.Errorf("press Enter: %v", err)
			}
		}
		time.Sleep(300 * time.Millisecond)
		settle(ctx, c, 30*time.Second)
	}
	return text(fmt.Sprintf("Typed %d characters%s.\n%s", len([]rune(in.Text)), map[bool]string{true: " and pressed Enter"}[in.Submit], summarize(ctx, c, false))), nil
}

func (t *tools) evaluate(ctx context.Context, in evalIn) (*sdk.CallToolResult, error) {
	if in.Expression == "" {
		return nil, fmt.Errorf("expression is required")
	}
	_, c, _, err := t.page(ctx, in.VM)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var v json.RawMessage
	if err := c.Evaluate(ctx, in.Expression, &v); err != nil {
		return nil, fmt.Errorf("evaluate: %v", err)
	}
	if len(v) == 0 {
		return text("undefined"), nil
	}
	// Chromium escapes non-ASCII characters; show them as they are.
	var val any
	if json.Unmarshal(v, &val) == nil {
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if enc.Encode(val) == nil {
			v = json.RawMessage(strings.TrimSpace(b.String()))
		}
	}
	shown, cut := truncate(string(v), maxShown)
	if cut {
		shown += fmt.Sprintf("\n[... truncated: showing %d of %d bytes]", len(shown), len(v))
	}
	return text(shown), nil
}
