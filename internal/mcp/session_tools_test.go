package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// terminal_send makes the terminal on first use and types into it;
// terminal_read shows what it printed since, escape sequences removed, and
// detaches when it returns.
func TestTerminals(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}}
	f.tokens["avm_box"] = fakeToken{vm: "id0001", allow: []string{api.PermTerm}}
	cs := session(t, base, "avm_box", Scope{VM: "id0001"})

	if out := ok(t, cs, "terminal_send", map[string]any{"input": "ls\n"}); out != "Sent 3 bytes to terminal main. Read the screen with terminal_read." {
		t.Errorf("terminal_send = %q", out)
	}
	if _, made := f.terms["id0001:main"]; !made || len(f.terms) != 1 {
		t.Fatalf("terminals after the first send: %v", f.terms)
	}
	// The input reaches the terminal even though the tool detached at once.
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.mu.Lock()
		out := string(f.terms["id0001:main"].out)
		f.mu.Unlock()
		if strings.HasSuffix(out, "echo: ls\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal got %q", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A second send reuses the terminal (a second create would be a conflict).
	ok(t, cs, "terminal_send", map[string]any{"input": "pwd\n", "terminal": "main"})
	out := ok(t, cs, "terminal_read", map[string]any{"wait_ms": 200})
	if want := "root@box:~# echo: ls\necho: pwd\n"; out != want {
		t.Errorf("terminal_read = %q, want %q", out, want)
	}
	f.mu.Lock()
	attached := len(f.terms["id0001:main"].subs)
	f.mu.Unlock()
	for end := time.Now().Add(5 * time.Second); attached != 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
		f.mu.Lock()
		attached = len(f.terms["id0001:main"].subs)
		f.mu.Unlock()
	}
	if attached != 0 {
		t.Errorf("%d clients still attached after terminal_read returned", attached)
	}

	ok(t, cs, "terminal_send", map[string]any{"input": "top\n", "terminal": "second"})
	if out := ok(t, cs, "terminal_read", map[string]any{"terminal": "second", "wait_ms": 100}); !strings.Contains(out, "echo: top") || strings.Contains(out, "echo: ls") {
		t.Errorf("terminal_read of the second terminal = %q", out)
	}
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"terminal_send", map[string]any{"input": ""}, "input is required"},
		{"terminal_send", map[string]any{"vm": "other", "input": "x"}, "terminal_send failed: this token is for another VM (HTTP 403 forbidden)"},
		{"terminal_read", map[string]any{"terminal": "nope"}, "terminal_read failed: terminal nope not found (HTTP 404 not_found)"},
		{"terminal_read", map[string]any{"wait_ms": 10001}, "wait_ms must be between 1 and 10000"},
		{"terminal_read", map[string]any{"wait_ms": -1}, "wait_ms must be between 1 and 10000"},
	} {
		fails(t, cs, c.tool, c.args, c.want)
	}
	if len(f.terms) != 2 {
		t.Errorf("%d terminals after the refused calls, want 2", len(f.terms))
	}
}

// A terminal without the term permission is refused before anything is made.
func TestTerminalNeedsPermission(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}}
	f.tokens["avm_files"] = fakeToken{vm: "id0001", allow: []string{api.PermFiles}}
	cs := session(t, base, "avm_files", Scope{VM: "id0001"})
	fails(t, cs, "terminal_send", map[string]any{"input": "ls\n"}, `terminal_send failed: this token does not allow "term" (it allows files) (HTTP 403 forbidden)`)
	if len(f.terms) != 0 {
		t.Errorf("terminals made: %v", f.terms)
	}
}

func TestServices(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}}
	cs := session(t, base, adminToken, Scope{})
	out := ok(t, cs, "create_service", map[string]any{"vm": "box", "name": "web", "command": "python3 -m http.server", "env": map[string]any{"PORT": "8000"}})
	if out != `Service web is active in box. Its output: service_logs (name "web").` {
		t.Errorf("create_service = %q", out)
	}
	if s := f.services[0]; s.Shell != "python3 -m http.server" || s.Restart != "always" || s.Env["PORT"] != "8000" || len(s.Argv) != 0 {
		t.Errorf("the API was sent %+v", s)
	}
	if out := ok(t, cs, "service_logs", map[string]any{"vm": "box", "name": "web"}); out != "(no output yet)" {
		t.Errorf("service_logs of a quiet service = %q", out)
	}
	f.logs = "Serving HTTP on 0.0.0.0 port 8000\n"
	if out := ok(t, cs, "service_logs", map[string]any{"vm": "box", "name": "web", "lines": 5}); out != f.logs {
		t.Errorf("service_logs = %q", out)
	}
	f.logs = "old\n" + strings.Repeat("x", 4*maxShown) + "\nnewest\n"
	if out := ok(t, cs, "service_logs", map[string]any{"vm": "box", "name": "web"}); !strings.HasPrefix(out, "[... older lines cut: ask for fewer lines]\n") || !strings.HasSuffix(out, "x\nnewest\n") || strings.Contains(out, "old\n") {
		t.Errorf("service_logs of long logs: %d bytes, %q...", len(out), out[:60])
	}
	fails(t, cs, "create_service", map[string]any{"vm": "box", "name": "web", "command": " "}, "name and command are required")
	fails(t, cs, "service_logs", map[string]any{"vm": "box", "name": "web", "lines": 10001}, "lines must be between 1 and 10000")
	fails(t, cs, "service_logs", map[string]any{"vm": "nope", "name": "web"}, "service_logs failed: vm nope not found")
	if len(f.services) != 1 {
		t.Errorf("%d services created, want 1", len(f.services))
	}
}

func TestRunCode(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}}
	cs := session(t, base, adminToken, Scope{})
	png := []byte("\x89PNG chart")
	raw := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	f.code = []api.CodeEvent{
		{Type: api.CodeStdout, Text: "hi"},
		{Type: api.CodeResult, Data: map[string]json.RawMessage{"image/png": raw(base64.StdEncoding.EncodeToString(png)), "text/plain": raw("<Figure>")}},
		{Type: api.CodeResult, Main: true, Data: map[string]json.RawMessage{"text/plain": raw("42")}},
		{Type: api.CodeResult, Data: map[string]json.RawMessage{"application/json": json.RawMessage(`{"a":1}`)}},
		{Type: api.CodeCount, ExecutionCount: 3},
		{Type: api.CodeEnd},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_code", Arguments: map[string]any{"vm": "box", "code": "print('hi')", "language": "python"}})
	if err != nil || res.IsError || len(res.Content) != 2 {
		t.Fatalf("run_code: %v, %+v", err, res)
	}
	want := "--- stdout ---\nhi\n--- result: image/png image (attached) ---\n--- result (text/plain) ---\n<Figure>\n" +
		"--- value (text/plain) ---\n42\n--- result (application/json) ---\n{\"a\":1}\n[execution 3]\n"
	if got := res.Content[0].(*sdk.TextContent).Text; got != want {
		t.Errorf("run_code text = %q, want %q", got, want)
	}
	if img, _ := res.Content[1].(*sdk.ImageContent); img == nil || string(img.Data) != string(png) || img.MIMEType != "image/png" {
		t.Errorf("run_code image = %+v", res.Content[1])
	}
	if r := f.codeReqs[0]; r.Code != "print('hi')" || r.Language != "python" || time.Duration(r.Timeout) != 300*time.Second {
		t.Errorf("the API was sent %+v", r)
	}

	// An exception is a tool error showing the traceback without colours.
	f.code = []api.CodeEvent{
		{Type: api.CodeError, Name: "NameError", Value: "name 'x' is not defined", Traceback: "\x1b[0;31mNameError\x1b[0m: name 'x' is not defined"},
		{Type: api.CodeCount, ExecutionCount: 4},
		{Type: api.CodeEnd},
	}
	out, isErr := call(t, cs, "run_code", map[string]any{"vm": "box", "code": "x", "timeout_seconds": 7})
	if want := "--- error: NameError: name 'x' is not defined ---\nNameError: name 'x' is not defined\n[execution 4]\n"; out != want || !isErr {
		t.Errorf("run_code raising = %q (error %v), want %q", out, isErr, want)
	}
	if time.Duration(f.codeReqs[1].Timeout) != 7*time.Second {
		t.Errorf("timeout sent: %v", f.codeReqs[1].Timeout)
	}
	f.code = []api.CodeEvent{{Type: api.CodeCount, ExecutionCount: 5}, {Type: api.CodeEnd}}
	if out := ok(t, cs, "run_code", map[string]any{"vm": "box", "code": "pass"}); out != "(no output)\n[execution 5]\n" {
		t.Errorf("run_code with no output = %q", out)
	}
	f.code = []api.CodeEvent{{Type: api.CodeEnd, Error: "the kernel died"}}
	fails(t, cs, "run_code", map[string]any{"vm": "box", "code": "1"}, "run_code failed: run code: the kernel died")
	f.code = []api.CodeEvent{{Type: api.CodeStdout, Text: "cut"}}
	fails(t, cs, "run_code", map[string]any{"vm": "box", "code": "1"}, "the stream ended before the run did")
	sent := len(f.codeReqs)
	fails(t, cs, "run_code", map[string]any{"vm": "box", "code": "1", "language": "python", "context": "c1"}, "give language or context, not both")
	fails(t, cs, "run_code", map[string]any{"vm": "box", "code": "1", "timeout_seconds": -3}, "timeout_seconds must be between 1 and 86400, got -3")
	fails(t, cs, "run_code", map[string]any{"code": "1"}, "vm is required")
	if len(f.codeReqs) != sent {
		t.Errorf("refused runs reached the API")
	}
}

func TestBrowserTools(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "web", State: api.StateRunning}}
	cs := session(t, base, adminToken, Scope{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "screenshot", Arguments: map[string]any{"vm": "web", "scale": 0.5}})
	if err != nil || res.IsError || len(res.Content) != 1 {
		t.Fatalf("screenshot: %v %+v", err, res)
	}
	if img, _ := res.Content[0].(*sdk.ImageContent); img == nil || string(img.Data) != fakePNG || img.MIMEType != "image/png" {
		t.Errorf("screenshot = %+v", res.Content[0])
	}
	fails(t, cs, "screenshot", map[string]any{"vm": "web", "scale": 1.5}, "scale must be between 0 and 1, got 1.5")
	fails(t, cs, "screenshot", map[string]any{"vm": "nope"}, "screenshot failed: vm nope not found (HTTP 404 not_found)")
	// This API has no TCP tunnel, as a VM without Chromium has nothing on
	// port 9222: the browser tools say so instead of hanging.
	fails(t, cs, "browser_navigate", map[string]any{"vm": "web", "url": "http://localhost:8000/"}, "the browser of web does not answer (is it a VM of the browser image?)")
	fails(t, cs, "browser_evaluate", map[string]any{"vm": "web", "expression": "1"}, "the browser of web does not answer")
	fails(t, cs, "browser_click", map[string]any{"selector": "a"}, "vm is required")
}
