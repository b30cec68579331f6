// Package cdp is a small Chrome DevTools Protocol client over any dialer:
// enough to list a browser's pages, open one and send it commands. agentvm's
// MCP tools and benchmarks reach a browser VM's Chromium with it through the
// API's TCP tunnel (Puppeteer or Playwright do the same for programs).
package cdp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// Dialer opens a new connection to the browser's DevTools port.
type Dialer func(ctx context.Context) (net.Conn, error)

// host is the Host every request carries: Chromium answers only to an IP
// address or localhost.
const host = "127.0.0.1:9222"

// maxMessage bounds one protocol message (a full-page screenshot is a few MiB
// of base64).
const maxMessage = 64 << 20

// Browser is a Chromium reached through dial.
type Browser struct {
	hc *http.Client
}

// New returns a client of the browser behind dial.
func New(dial Dialer) *Browser {
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DisableKeepAlives: true,
	}
	return &Browser{hc: &http.Client{Transport: tr}}
}

// Target is a page (or worker, or extension) from /json/list.
type Target struct {
	ID    string `json:"id"`
	Type  string `json:"type"`
	Title string `json:"title"`
	URL   string `json:"url"`
}

func (b *Browser) getJSON(ctx context.Context, method, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+host+path, nil)
	if err != nil {
		return err
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		return fmt.Errorf("DevTools %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMessage))
	if err != nil {
		return fmt.Errorf("DevTools %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("DevTools %s: HTTP %d: %s", path, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("DevTools %s: %w", path, err)
	}
	return nil
}

// Version is /json/version: the browser's product and protocol versions.
func (b *Browser) Version(ctx context.Context) (map[string]string, error) {
	var v map[string]string
	return v, b.getJSON(ctx, "GET", "/json/version", &v)
}

// Pages lists the open tabs, the most recently used first.
func (b *Browser) Pages(ctx context.Context) ([]Target, error) {
	var all []Target
	if err := b.getJSON(ctx, "GET", "/json/list", &all); err != nil {
		return nil, err
	}
	var pages []Target
	for _, t := range all {
		if t.Type == "page" && !strings.HasPrefix(t.URL, "devtools://") {
			pages = append(pages, t)
		}
	}
	return pages, nil
}

// NewPage opens a tab at u.
func (b *Browser) NewPage(ctx context.Context, u string) (*Target, error) {
	var t Target
	return &t, b.getJSON(ctx, "PUT", "/json/new?"+url.QueryEscape(u), &t)
}

// Activate brings a tab to the front (so the display shows it).
func (b *Browser) Activate(ctx context.Context, id string) error {
	return b.getJSON(ctx, "GET", "/json/activate/"+url.PathEscape(id), nil)
}

// Conn opens a protocol session on the browser itself (Browser.*, Target.*).
func (b *Browser) Conn(ctx context.Context) (*Conn, error) {
	v, err := b.Version(ctx)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(v["webSocketDebuggerUrl"])
	if err != nil || !strings.HasPrefix(u.Path, "/devtools/browser/") {
		return nil, fmt.Errorf("DevTools: no browser WebSocket URL in /json/version: %q", v["webSocketDebuggerUrl"])
	}
	return b.dialWS(ctx, u.Path)
}

// Page opens a protocol session on a tab.
func (b *Browser) Page(ctx context.Context, id string) (*Conn, error) {
	return b.dialWS(ctx, "/devtools/page/"+url.PathEscape(id))
}

func (b *Browser) dialWS(ctx context.Context, path string) (*Conn, error) {
	ws, _, err := websocket.Dial(ctx, "ws://"+host+path, &websocket.DialOptions{HTTPClient: b.hc})
	if err != nil {
		return nil, fmt.Errorf("DevTools %s: %w", path, err)
	}
	ws.SetReadLimit(maxMessage)
	c := &Conn{ws: ws, pending: map[int64]chan reply{}, done: make(chan struct{})}
	go c.read()
	return c, nil
}

// Conn is one protocol session (a WebSocket to a page or the browser).
type Conn struct {
	ws *websocket.Conn

	mu      sync.Mutex
	next    int64
	pending map[int64]chan reply
	err     error
	done    chan struct{}
}

type reply struct {
	Result json.RawMessage `json:"result"`
	Error  *Error          `json:"error"`
}

// Error is an error answer of the protocol.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    string `json:"data,omitempty"`
}

func (e *Error) Error() string {
	if e.Data != "" {
		return fmt.Sprintf("%s (%s)", e.Message, e.Data)
	}
	return e.Message
}

// read dispatches answers to their callers; events are not used and dropped.
func (c *Conn) read() {
	var err error
	for {
		var b []byte
		if _, b, err = c.ws.Read(context.Background()); err != nil {
			break
		}
		var m struct {
			ID int64 `json:"id"`
			reply
		}
		if json.Unmarshal(b, &m) != nil || m.ID == 0 {
			continue
		}
		c.mu.Lock()
		ch := c.pending[m.ID]
		delete(c.pending, m.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- m.reply
		}
	}
	c.mu.Lock()
	c.err = fmt.Errorf("DevTools session closed: %w", err)
	c.mu.Unlock()
	close(c.done)
}

// Call sends a command and decodes its result into out (nil: ignore it).
func (c *Conn) Call(ctx context.Context, method string, params, out any) error {
	if params == nil {
		params = struct{}{}
	}
	ch := make(chan reply, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.next++
	id := c.next
	c.pending[id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}
	msg, err := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	if err != nil {
		forget()
		return err
	}
	if err := c.ws.Write(ctx, websocket.MessageText, msg); err != nil {
		forget()
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case r := <-ch:
		if r.Error != nil {
			return fmt.Errorf("%s: %w", method, r.Error)
		}
		if out != nil && len(r.Result) > 0 {
			return json.Unmarshal(r.Result, out)
		}
		return nil
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return fmt.Errorf("%s: %w", method, c.err)
	case <-ctx.Done():
		forget()
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// Close ends the session (the page stays open).
func (c *Conn) Close() error {
	err := c.ws.Close(websocket.StatusNormalClosure, "")
	<-c.done
	return err
}

// Evaluate runs a JavaScript expression in the page (awaiting a promise) and
// decodes its value, which must be JSON-serialisable, into out.
func (c *Conn) Evaluate(ctx context.Context, expr string, out any) error {
	var r struct {
		Result struct {
			Type        string          `json:"type"`
			Value       json.RawMessage `json:"value"`
			Description string          `json:"description"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := c.Call(ctx, "Runtime.evaluate", map[string]any{
		"expression": expr, "returnByValue": true, "awaitPromise": true, "userGesture": true,
	}, &r); err != nil {
		return err
	}
	if e := r.ExceptionDetails; e != nil {
		msg := e.Exception.Description
		if msg == "" {
			msg = e.Text
		}
		return errors.New(msg)
	}
	if out == nil || len(r.Result.Value) == 0 {
		return nil
	}
	return json.Unmarshal(r.Result.Value, out)
}
