package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/agentvm/agentvm/api"
	"github.com/coder/websocket"
)

// ListTerminals lists a VM's terminal sessions.
func (c *Client) ListTerminals(ctx context.Context, id string) ([]api.TermInfo, error) {
	var out api.TermList
	return out.Terminals, c.do(ctx, "GET", vmPath(id, "/terminals"), nil, &out)
}

// CreateTerminal starts a terminal session (the user's login shell unless Argv is set).
func (c *Client) CreateTerminal(ctx context.Context, id string, req api.TermCreate) (*api.TermInfo, error) {
	var t api.TermInfo
	return &t, c.do(ctx, "POST", vmPath(id, "/terminals"), req, &t)
}

// GetTerminal describes one terminal session.
func (c *Client) GetTerminal(ctx context.Context, id, name string) (*api.TermInfo, error) {
	var t api.TermInfo
	return &t, c.do(ctx, "GET", vmPath(id, "/terminals/"+url.PathEscape(name)), nil, &t)
}

// KillTerminal ends a terminal session and its processes.
func (c *Client) KillTerminal(ctx context.Context, id, name string) error {
	return c.do(ctx, "DELETE", vmPath(id, "/terminals/"+url.PathEscape(name)), nil, nil)
}

// ResizeTerminal sets a terminal's size.
func (c *Client) ResizeTerminal(ctx context.Context, id, name string, cols, rows int) error {
	return c.do(ctx, "POST", vmPath(id, "/terminals/"+url.PathEscape(name)+"/resize"), map[string]int{"cols": cols, "rows": rows}, nil)
}

// SignalTerminal sends a signal ("INT", "TERM", "9"...) to the terminal's foreground process group.
func (c *Client) SignalTerminal(ctx context.Context, id, name, sig string) error {
	return c.do(ctx, "POST", vmPath(id, "/terminals/"+url.PathEscape(name)+"/signal"), map[string]string{"signal": sig}, nil)
}

// Terminal is an attached terminal session (a WebSocket). Read returns the
// terminal's output (the scrollback first); io.EOF after the program exited
// (see Exit) or the session was detached.
type Terminal struct {
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	rmu    sync.Mutex
	pend   []byte
	mu     sync.Mutex
	exit   *api.TermControl
}

// AttachOptions are the options of AttachTerminal.
type AttachOptions struct {
	Cols, Rows   int  // resize on attach when both are set
	NoScrollback bool // skip the replay of earlier output
}

// AttachTerminal attaches to a terminal session over a WebSocket.
func (c *Client) AttachTerminal(ctx context.Context, id, name string, o AttachOptions) (*Terminal, error) {
	u, err := url.Parse(c.BaseURL + vmPath(id, "/terminals/"+url.PathEscape(name)))
	if err != nil {
		return nil, err
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	q := url.Values{}
	if o.Cols > 0 && o.Rows > 0 {
		q.Set("cols", strconv.Itoa(o.Cols))
		q.Set("rows", strconv.Itoa(o.Rows))
	}
	if o.NoScrollback {
		q.Set("scrollback", "0")
	}
	u.RawQuery = q.Encode()
	h := http.Header{}
	if c.Token != "" {
		h.Set("Authorization", "Bearer "+c.Token)
	}
	ws, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPClient: c.HTTP, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			return nil, decodeError(resp)
		}
		return nil, fmt.Errorf("attach terminal %s: %w", name, err)
	}
	ws.SetReadLimit(16 << 20)
	tctx, cancel := context.WithCancel(context.Background())
	return &Terminal{ws: ws, ctx: tctx, cancel: cancel}, nil
}

// Read reads terminal output.
func (t *Terminal) Read(p []byte) (int, error) {
	t.rmu.Lock()
	defer t.rmu.Unlock()
	for len(t.pend) == 0 {
		typ, b, err := t.ws.Read(t.ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) || errors.Is(err, context.Canceled) {
				return 0, io.EOF
			}
			return 0, err
		}
		if typ == websocket.MessageBinary {
			t.pend = b
			continue
		}
		var c api.TermControl
		if json.Unmarshal(b, &c) == nil && c.Type == "exit" {
			t.mu.Lock()
			t.exit = &c
			t.mu.Unlock()
		}
	}
	n := copy(p, t.pend)
	t.pend = t.pend[n:]
	return n, nil
}

// Write sends input to the terminal.
func (t *Terminal) Write(p []byte) (int, error) {
	if err := t.ws.Write(t.ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (t *Terminal) control(c api.TermControl) error {
	b, _ := json.Marshal(c)
	return t.ws.Write(t.ctx, websocket.MessageText, b)
}

// Resize sets the terminal size.
func (t *Terminal) Resize(cols, rows int) error {
	return t.control(api.TermControl{Type: "resize", Cols: cols, Rows: rows})
}

// Signal sends a signal ("INT", "TERM", ...) to the foreground process group.
func (t *Terminal) Signal(sig string) error {
	return t.control(api.TermControl{Type: "signal", Signal: sig})
}

// Exit returns the program's exit once Read has returned io.EOF after it
// exited; nil while it runs (or when only this client detached).
func (t *Terminal) Exit() *api.TermControl {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.exit
}

// Close detaches; the session keeps running in the VM.
func (t *Terminal) Close() error {
	err := t.ws.Close(websocket.StatusNormalClosure, "detach")
	t.cancel()
	return err
}
