package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/store"
)

// The DevTools protocol of a browser VM (Chromium's remote debugging port)
// through a preview URL. Chromium answers HTTP only to a Host header that is
// an IP address or localhost (a DNS-rebinding guard), and its /json answers
// name WebSocket URLs on the Host it was sent. So requests to that port get
// the Host Chromium expects, and the URLs in its /json answers are rewritten
// to the preview host the client used: Playwright's connectOverCDP and
// Puppeteer's connect then follow them back through the proxy.

// cdpHost is the Host header Chromium is sent.
const cdpHost = "127.0.0.1:9222"

// maxCDPJSON bounds a /json answer the proxy reads to rewrite (a list of a
// few hundred tabs is well under it).
const maxCDPJSON = 4 << 20

// isCDP reports whether a preview of this VM port is the browser image's
// DevTools port.
func isCDP(v *store.VM, port int) bool {
	return v.Image == image.Browser && port == image.BrowserCDPPort
}

// rewriteCDPAnswer rewrites the WebSocket URLs of a /json answer from
// Chromium for a client that reached it as scheme://host.
func rewriteCDPAnswer(resp *http.Response, host string, tls bool) error {
	if !strings.HasPrefix(resp.Request.URL.Path, "/json") || resp.StatusCode != http.StatusOK ||
		!strings.Contains(resp.Header.Get("Content-Type"), "json") {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxCDPJSON+1))
	resp.Body.Close()
	if err != nil {
		return err
	}
	if len(b) > maxCDPJSON {
		return fmt.Errorf("DevTools answer larger than %d bytes", maxCDPJSON)
	}
	out, err := rewriteCDPJSON(b, host, tls)
	if err != nil {
		out = b // not the JSON we know: pass it on untouched
	}
	resp.Body = io.NopCloser(bytes.NewReader(out))
	resp.ContentLength = int64(len(out))
	resp.Header.Set("Content-Length", strconv.Itoa(len(out)))
	return nil
}

// rewriteCDPJSON rewrites webSocketDebuggerUrl ("ws://127.0.0.1:9222/...")
// and devtoolsFrontendUrl ("...?ws=127.0.0.1:9222/...") in a /json answer
// (an object, or a list of them) to the client's host and scheme.
func rewriteCDPJSON(b []byte, host string, tls bool) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	ws, param := "ws://", "ws="
	if tls {
		ws, param = "wss://", "wss="
	}
	fix := func(m map[string]any) {
		if u, ok := m["webSocketDebuggerUrl"].(string); ok {
			if _, path, ok := cutWSURL(u); ok {
				m["webSocketDebuggerUrl"] = ws + host + path
			}
		}
		if u, ok := m["devtoolsFrontendUrl"].(string); ok {
			if i := strings.Index(u, "ws="); i >= 0 && (i == 0 || u[i-1] == '?' || u[i-1] == '&') {
				if _, path, ok := cutWSURL("ws://" + u[i+3:]); ok {
					m["devtoolsFrontendUrl"] = u[:i] + param + host + path
				}
			}
		}
	}
	switch d := doc.(type) {
	case map[string]any:
		fix(d)
	case []any:
		for _, e := range d {
			if m, ok := e.(map[string]any); ok {
				fix(m)
			}
		}
	default:
		return b, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "   ")
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// cutWSURL splits "ws://HOST/PATH" into HOST and "/PATH".
func cutWSURL(u string) (host, path string, ok bool) {
	rest, ok := strings.CutPrefix(u, "ws://")
	if !ok {
		if rest, ok = strings.CutPrefix(u, "wss://"); !ok {
			return "", "", false
		}
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return rest, "/", true
	}
	return rest[:i], rest[i:], true
}
