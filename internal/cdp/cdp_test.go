package cdp

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// fakeChromium answers /json/* and a protocol session the way Chromium
// does, checking the Host header as it does.
func fakeChromium(t *testing.T) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host != host {
			http.Error(w, "Host header is specified and is not an IP address or localhost.", 500)
			return
		}
		switch r.URL.Path {
		case "/json/version":
			fmt.Fprintf(w, `{"Browser":"Chrome/1","webSocketDebuggerUrl":"ws://%s/devtools/browser/B"}`, r.Host)
		case "/json/list":
			fmt.Fprint(w, `[{"id":"W","type":"service_worker","url":"https://x/sw.js"},{"id":"P1","type":"page","title":"one","url":"https://x/"},{"id":"D","type":"page","url":"devtools://devtools/x"}]`)
		case "/devtools/page/P1", "/devtools/browser/B":
			ws, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer ws.CloseNow()
			for {
				_, b, err := ws.Read(r.Context())
				if err != nil {
					return
				}
				var m struct {
					ID     int64          `json:"id"`
					Method string         `json:"method"`
					Params map[string]any `json:"params"`
				}
				json.Unmarshal(b, &m)
				// An event first: the client must skip it.
				ws.Write(r.Context(), websocket.MessageText, []byte(`{"method":"Page.loadEventFired","params":{}}`))
				var out string
				switch m.Method {
				case "Browser.getVersion":
					out = fmt.Sprintf(`{"id":%d,"result":{"product":"Chrome/1"}}`, m.ID)
				case "Runtime.evaluate":
					if m.Params["expression"] == "boom" {
						out = fmt.Sprintf(`{"id":%d,"result":{"result":{"type":"object"},"exceptionDetails":{"text":"Uncaught","exception":{"description":"Error: boom"}}}}`, m.ID)
					} else {
						out = fmt.Sprintf(`{"id":%d,"result":{"result":{"type":"number","value":42}}}`, m.ID)
					}
				default:
					out = fmt.Sprintf(`{"id":%d,"error":{"code":-32601,"message":"'%s' wasn't found"}}`, m.ID, m.Method)
				}
				ws.Write(r.Context(), websocket.MessageText, []byte(out))
			}
		default:
			http.NotFound(w, r)
		}
	}))
}

func TestClient(t *testing.T) {
	srv := fakeChromium(t)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	})
	pages, err := b.Pages(ctx)
	if err != nil || len(pages) != 1 || pages[0].ID != "P1" {
		t.Fatalf("pages: %v %+v", err, pages)
	}
	c, err := b.Page(ctx, "P1")
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := c.Evaluate(ctx, "6*7", &n); err != nil || n != 42 {
		t.Fatalf("evaluate: %v %d", err, n)
	}
	if err := c.Evaluate(ctx, "boom", nil); err == nil || err.Error() != "Error: boom" {
		t.Fatalf("exception: %v", err)
	}
	if err := c.Call(ctx, "Nope.nope", nil, nil); err == nil || !strings.Contains(err.Error(), "wasn't found") {
		t.Fatalf("protocol error: %v", err)
	}
	c.Close()
	if err := c.Call(ctx, "Runtime.evaluate", nil, nil); err == nil {
		t.Fatal("a call on a closed session succeeded")
	}
	bc, err := b.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	var v struct {
		Product string `json:"product"`
	}
	if err := bc.Call(ctx, "Browser.getVersion", nil, &v); err != nil || v.Product != "Chrome/1" {
		t.Fatalf("Browser.getVersion: %v %+v", err, v)
	}
}
