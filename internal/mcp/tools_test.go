package mcp

import (
	"context"
	"encoding/base64"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// call calls a tool as a model's client would and returns the text of its
// result and whether the result is an error. A protocol error fails the test.
func call(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: %v", tool, args, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res.IsError
}

// ok calls a tool that must succeed and returns its text.
func ok(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any) string {
	t.Helper()
	out, isErr := call(t, cs, tool, args)
	if isErr {
		t.Fatalf("%s %v failed: %s", tool, args, out)
	}
	return out
}

// fails calls a tool that must fail with a message containing want.
func fails(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any, want string) {
	t.Helper()
	out, isErr := call(t, cs, tool, args)
	if !isErr || !strings.Contains(out, want) {
		t.Fatalf("%s %v = %q (error %v), want an error containing %q", tool, args, out, isErr, want)
	}
}

func toolNames(t *testing.T, cs *sdk.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	return names
}

var adminOnly = []string{"create_vm", "list_templates", "list_vms", "fork_vm", "snapshot_vm", "suspend_vm", "resume_vm", "delete_vm", "expose_port"}

// The admin gets every tool; a VM's token only those that work on an
// existing VM, and the instructions name its VM.
func TestToolsOfScope(t *testing.T) {
	f, base := newFakeAPI(t)
	f.tokens["avm_box"] = fakeToken{vm: "id0001", allow: []string{api.PermExec}}
	admin := toolNames(t, session(t, base, adminToken, Scope{}))
	vmTools := []string{"get_vm", "exec", "read_file", "write_file", "list_files", "diff_vm", "create_service", "service_logs",
		"terminal_send", "terminal_read", "run_code", "screenshot", "browser_navigate", "browser_click", "browser_type", "browser_evaluate"}
	if len(admin) != len(adminOnly)+len(vmTools) {
		t.Errorf("admin tools %v: want %d", admin, len(adminOnly)+len(vmTools))
	}
	for _, n := range append(slices.Clone(adminOnly), vmTools...) {
		if !slices.Contains(admin, n) {
			t.Errorf("the admin lacks %s", n)
		}
	}
	cs := session(t, base, "avm_box", Scope{VM: "id0001"})
	scoped := toolNames(t, cs)
	slices.Sort(scoped)
	slices.Sort(vmTools)
	if !slices.Equal(scoped, vmTools) {
		t.Errorf("a VM's token gets %v, want %v", scoped, vmTools)
	}
	if in := cs.InitializeResult().Instructions; !strings.Contains(in, "one VM only: id0001") {
		t.Errorf("instructions of a VM's token: %q", in)
	}
	// A tool left out is not there to call.
	if _, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "create_vm", Arguments: map[string]any{}}); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Errorf("create_vm with a VM's token: %v", err)
	}
}

func TestVMLifecycleTools(t *testing.T) {
	f, base := newFakeAPI(t)
	cs := session(t, base, adminToken, Scope{})
	if out := ok(t, cs, "list_vms", nil); out != "No VMs. Create one with create_vm." {
		t.Errorf("list_vms with none: %q", out)
	}
	out := ok(t, cs, "create_vm", map[string]any{"name": "box", "cpus": 2, "memory": "512M"})
	if want := "Created VM box (id id0001) from the default image: running, 2 vCPU, 512 MiB memory, address 10.0.0.2. Run commands in it with exec (vm: \"box\")."; out != want {
		t.Errorf("create_vm = %q, want %q", out, want)
	}
	if got := f.vms[0]; got.MemoryMiB != 512 || got.CPUs != 2 {
		t.Errorf("the API got %+v", got)
	}
	if out := ok(t, cs, "create_vm", map[string]any{"image": "code-interpreter"}); !strings.Contains(out, "Created VM vm-2 ") || !strings.HasSuffix(out, "with run_code.") {
		t.Errorf("create_vm of a code-interpreter: %q", out)
	}
	if out := ok(t, cs, "create_vm", map[string]any{"name": "web", "image": "browser"}); !strings.Contains(out, "browser_navigate") {
		t.Errorf("create_vm of a browser: %q", out)
	}
	fails(t, cs, "create_vm", map[string]any{"name": "x", "memory": "lots"}, `memory "lots"`)
	fails(t, cs, "create_vm", map[string]any{"name": "box"}, "create_vm failed: a VM named box exists (HTTP 409 conflict)")
	fails(t, cs, "create_vm", map[string]any{"cpus": "two"}, `validating "arguments"`)
	if len(f.vms) != 3 {
		t.Errorf("%d VMs after the failed creates, want 3", len(f.vms))
	}

	out = ok(t, cs, "list_vms", nil)
	for _, want := range []string{"3 VMs:\n", "- box (id id0001): running, 2 vCPU, 512 MiB\n", "- vm-2 (id id0002): running, 1 vCPU, 1024 MiB\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("list_vms = %q, want %q in it", out, want)
		}
	}
	if out := ok(t, cs, "get_vm", map[string]any{"vm": "box"}); !strings.Contains(out, `"name": "box"`) || !strings.Contains(out, `"id": "id0001"`) {
		t.Errorf("get_vm = %q", out)
	}
	fails(t, cs, "get_vm", nil, "vm is required")
	fails(t, cs, "get_vm", map[string]any{"vm": "nope"}, "get_vm failed: vm nope not found (HTTP 404 not_found)")

	if out := ok(t, cs, "suspend_vm", map[string]any{"vm": "box"}); out != "box is suspended." {
		t.Errorf("suspend_vm = %q", out)
	}
	if out := ok(t, cs, "resume_vm", map[string]any{"vm": "box"}); out != "box is running." {
		t.Errorf("resume_vm = %q", out)
	}
	fails(t, cs, "suspend_vm", map[string]any{"vm": "nope"}, "suspend_vm failed: vm nope not found")
	fails(t, cs, "resume_vm", nil, "vm is required")

	if out := ok(t, cs, "fork_vm", map[string]any{"vm": "box", "count": 2}); out != "Forked box into 2 running copies: box-1, box-2 (the original was paused 7 ms)." {
		t.Errorf("fork_vm = %q", out)
	}
	if out := ok(t, cs, "fork_vm", map[string]any{"vm": "box"}); !strings.Contains(out, "into 1 running copy: box-1 ") {
		t.Errorf("fork_vm with the default count = %q", out)
	}
	if out := ok(t, cs, "snapshot_vm", map[string]any{"vm": "box", "name": "base"}); !strings.HasPrefix(out, "Saved box as snapshot base (id sn01).") {
		t.Errorf("snapshot_vm = %q", out)
	}
	if out := ok(t, cs, "expose_port", map[string]any{"vm": "box", "port": 8000, "public": true}); out != "Port 8000 of box is at http://8000-box.localhost:7080/ . Anyone with the URL can open it." {
		t.Errorf("expose_port = %q", out)
	}
	if out := ok(t, cs, "expose_port", map[string]any{"vm": "box", "port": 3000}); !strings.Contains(out, "needs an agentvm token") {
		t.Errorf("expose_port of a private port = %q", out)
	}
	for _, port := range []int{0, 65536} {
		fails(t, cs, "expose_port", map[string]any{"vm": "box", "port": port}, "port must be between 1 and 65535")
	}

	if out := ok(t, cs, "delete_vm", map[string]any{"vm": "box"}); out != "Deleted box." {
		t.Errorf("delete_vm = %q", out)
	}
	fails(t, cs, "delete_vm", map[string]any{"vm": "box"}, "delete_vm failed: vm box not found (HTTP 404 not_found)")
	if out := ok(t, cs, "list_vms", nil); !strings.HasPrefix(out, "2 VMs:") || strings.Contains(out, "box") {
		t.Errorf("list_vms after the delete = %q", out)
	}
}

func TestExec(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}}
	cs := session(t, base, adminToken, Scope{})
	cases := []struct {
		name    string
		args    map[string]any
		res     api.ExecResult
		want    string
		isErr   bool
		timeout time.Duration // what the API must be sent
	}{
		{"stdout", map[string]any{"vm": "box", "command": "echo hi"}, api.ExecResult{Stdout: "hi\n"},
			"exit code: 0\n--- stdout ---\nhi\n", false, 300 * time.Second},
		{"both streams, no newline", map[string]any{"vm": "box", "command": "x", "timeout_seconds": 9}, api.ExecResult{Stdout: "out", Stderr: "err", ExitCode: 3},
			"exit code: 3\n--- stdout ---\nout\n--- stderr ---\nerr\n", true, 9 * time.Second},
		{"timed out", map[string]any{"vm": "box", "command": "sleep 99", "timeout_seconds": 5}, api.ExecResult{ExitCode: -1, TimedOut: true},
			"exit code: -1 (killed after the 5 s timeout)\n", true, 5 * time.Second},
		{"signal", map[string]any{"vm": "box", "command": "kill -9 $$"}, api.ExecResult{ExitCode: 137, Signal: "KILL"},
			"exit code: 137 (killed by KILL)\n", true, 300 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.exec = func(api.ExecRequest) api.ExecResult { return c.res }
			out, isErr := call(t, cs, "exec", c.args)
			if out != c.want || isErr != c.isErr {
				t.Errorf("exec = %q (error %v), want %q (error %v)", out, isErr, c.want, c.isErr)
			}
			req := f.execs[len(f.execs)-1]
			if req.Shell != c.args["command"] || time.Duration(req.Timeout) != c.timeout || len(req.Cmd) != 0 {
				t.Errorf("the API was sent %+v", req)
			}
		})
	}
	f.exec = nil
	ok(t, cs, "exec", map[string]any{"vm": "box", "command": "pwd", "cwd": "/srv", "user": "agent", "env": map[string]any{"A": "1"}})
	if req := f.execs[len(f.execs)-1]; req.Cwd != "/srv" || req.User != "agent" || req.Env["A"] != "1" {
		t.Errorf("cwd, user and env: the API was sent %+v", req)
	}
	sent := len(f.execs)
	for _, c := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"vm": "box", "command": "  "}, "command is required"},
		{map[string]any{"vm": "box"}, `missing properties: ["command"]`},
		{map[string]any{"command": "ls"}, "vm is required"},
		{map[string]any{"vm": "box", "command": "ls", "timeout_seconds": -1}, "timeout_seconds must be between 1 and 86400, got -1"},
		{map[string]any{"vm": "box", "command": "ls", "timeout_seconds": 86401}, "got 86401"},
		{map[string]any{"vm": "box", "command": 42}, `validating "arguments"`},
	} {
		fails(t, cs, "exec", c.args, c.want)
	}
	if len(f.execs) != sent {
		t.Errorf("bad arguments reached the API: %+v", f.execs[sent:])
	}
	fails(t, cs, "exec", map[string]any{"vm": "nope", "command": "ls"}, "exec failed: vm nope not found (HTTP 404 not_found)")
}

// Output past 16 KiB is cut at a character, and the whole of it saved in the
// VM (mode 0600, under the user's own directory) for read_file to page.
func TestExecLongOutput(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}}
	cs := session(t, base, adminToken, Scope{})
	long := strings.Repeat("a", maxShown-1) + "é" + strings.Repeat("z", 100) // é straddles the cut
	f.exec = func(api.ExecRequest) api.ExecResult {
		return api.ExecResult{Stdout: long, Stderr: "short\n", StdoutTruncated: true}
	}
	out := ok(t, cs, "exec", map[string]any{"vm": "box", "command": "yes", "user": "agent"})
	m := regexp.MustCompile(`\[\.\.\. stdout truncated: showing (\d+) of (\d+) bytes\. The whole stdout \(the server kept only the first 16 MiB of it\) is in (/tmp/agentvm-mcp-agent/exec-\d{8}-\d{6}-[0-9a-f]{8}\.stdout) in the VM: read the rest with read_file \(path "([^"]+)", offset (\d+)\)\.\]\n`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no truncation marker in %q", out[len(out)-400:])
	}
	if m[1] != "16383" || m[2] != "16485" || m[4] != m[3] || m[5] != "16383" {
		t.Errorf("marker %q: want 16383 of 16485 bytes, offset 16383", m[0])
	}
	if !strings.HasPrefix(out, "exit code: 0\n--- stdout ---\n"+strings.Repeat("a", maxShown-1)+"\n[...") || !strings.HasSuffix(out, "--- stderr ---\nshort\n") {
		t.Errorf("shown output: %q...%q", out[:40], out[len(out)-80:])
	}
	saved := f.files["id0001:"+m[3]]
	if string(saved.data) != long || saved.mode != 0o600 || saved.user != "agent" {
		t.Errorf("saved %d bytes, mode %o, as %q", len(saved.data), saved.mode, saved.user)
	}
	if rest := ok(t, cs, "read_file", map[string]any{"vm": "box", "path": m[3], "offset": 16383}); rest != "é"+strings.Repeat("z", 100) {
		t.Errorf("read_file of the rest = %q", rest)
	}

	// A token that may exec but not write files cannot save the output:
	// the marker then says to ask for less.
	f.tokens["avm_exec"] = fakeToken{vm: "id0001", allow: []string{api.PermExec}}
	before := len(f.files)
	out = ok(t, session(t, base, "avm_exec", Scope{VM: "id0001"}), "exec", map[string]any{"command": "yes"})
	if !strings.Contains(out, "[... stdout truncated: showing 16383 of 16485 bytes; run the command again with less output, e.g. piped to head or tail.]") {
		t.Errorf("marker without a saved file: %q", out[len(out)-200:])
	}
	if len(f.files) != before {
		t.Errorf("a file was saved without the files permission")
	}
}

func TestFileTools(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}}
	cs := session(t, base, adminToken, Scope{})
	if out := ok(t, cs, "write_file", map[string]any{"vm": "box", "path": "/root/a.txt", "content": "hello\n"}); out != "Wrote 6 bytes to /root/a.txt (mode 0644)." {
		t.Errorf("write_file = %q", out)
	}
	if out := ok(t, cs, "read_file", map[string]any{"vm": "box", "path": "/root/a.txt"}); out != "hello\n" {
		t.Errorf("read_file = %q", out)
	}
	if out := ok(t, cs, "write_file", map[string]any{"vm": "box", "path": "/root/bin/run.sh", "content": "#!/bin/sh\n", "mode": "755"}); out != "Wrote 10 bytes to /root/bin/run.sh (mode 0755)." {
		t.Errorf("write_file of a script = %q", out)
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe, 'x'}
	b64 := base64.StdEncoding.EncodeToString(bin)
	ok(t, cs, "write_file", map[string]any{"vm": "box", "path": "/root/blob", "content": b64, "base64": true})
	if got := f.files["id0001:/root/blob"].data; string(got) != string(bin) {
		t.Errorf("base64 content stored as %q", got)
	}
	if out := ok(t, cs, "read_file", map[string]any{"vm": "box", "path": "/root/blob"}); out != "[binary content, base64]\n"+b64 {
		t.Errorf("read_file of binary = %q", out)
	}
	out := ok(t, cs, "list_files", map[string]any{"vm": "box", "path": "/root"})
	for _, want := range []string{"/root: 2 entries\n", "file     0644          6 2026-01-02 03:04 a.txt\n", "file     0644          6 2026-01-02 03:04 blob\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("list_files = %q, want %q in it", out, want)
		}
	}

	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"write_file", map[string]any{"vm": "box", "path": "", "content": "x"}, "path is required"},
		{"write_file", map[string]any{"vm": "box", "path": "/x", "content": "%%%", "base64": true}, "content is not valid base64"},
		{"write_file", map[string]any{"vm": "box", "path": "/x", "content": "x", "mode": "9"}, `mode "9": use octal permission bits`},
		{"write_file", map[string]any{"vm": "box", "path": "/x", "content": "x", "mode": "0"}, `mode "0"`},
		{"write_file", map[string]any{"vm": "box", "path": "/x", "content": "x", "mode": "17777"}, `mode "17777"`},
		{"write_file", map[string]any{"path": "/x", "content": "x"}, "vm is required"},
		{"write_file", map[string]any{"vm": "nope", "path": "/x", "content": "x"}, "write_file failed: vm nope not found (HTTP 404 not_found)"},
		{"read_file", map[string]any{"vm": "box", "path": ""}, "path is required"},
		{"read_file", map[string]any{"vm": "box", "path": "/root/a.txt", "offset": -1}, "offset must be >= 0 and length between 1 and 65536"},
		{"read_file", map[string]any{"vm": "box", "path": "/root/a.txt", "length": maxRead + 1}, "length between 1 and 65536"},
		{"read_file", map[string]any{"vm": "box", "path": "/root/a.txt", "length": -5}, "length between"},
		{"read_file", map[string]any{"vm": "box", "path": "/root/missing"}, "read_file failed: /root/missing: no such file (HTTP 404 not_found)"},
		{"read_file", map[string]any{"vm": "box", "path": "/root/a.txt", "offset": "ten"}, `validating "arguments"`},
		{"list_files", map[string]any{"vm": "box", "path": ""}, "path is required"},
		{"list_files", map[string]any{"vm": "nope", "path": "/"}, "list_files failed: vm nope not found"},
	} {
		fails(t, cs, c.tool, c.args, c.want)
	}
	if _, ok := f.files["id0001:/x"]; ok {
		t.Error("a refused write_file wrote /x")
	}
}

// read_file pages a large text file on whole characters: each page says
// where the next begins, and the pages put together are the file.
func TestReadFilePages(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}}
	cs := session(t, base, adminToken, Scope{})
	content := strings.Repeat("€", 50000) // 150000 bytes, 3 to a character
	f.files["id0001:/root/big.txt"] = fakeFile{data: []byte(content), mode: 0o644}
	next := regexp.MustCompile(`\n\[\.\.\. (\d+) more bytes: call read_file with offset (\d+) to continue \(file size 150000\)\.\]$`)
	var got strings.Builder
	offsets := []string{}
	for off := 0; off >= 0; {
		out := ok(t, cs, "read_file", map[string]any{"vm": "box", "path": "/root/big.txt", "offset": off})
		m := next.FindStringSubmatch(out)
		page := next.ReplaceAllString(out, "")
		if len(page) > maxRead || strings.HasPrefix(page, "[binary") {
			t.Fatalf("page at %d: %d bytes, %q...", off, len(page), page[:20])
		}
		got.WriteString(page)
		off = -1
		if m != nil {
			off, _ = strconv.Atoi(m[2])
			offsets = append(offsets, m[2])
		}
	}
	if got.String() != content {
		t.Fatalf("the pages make %d bytes, not the file's %d", got.Len(), len(content))
	}
	// 65536 ends inside a character: each page stops before it.
	if !slices.Equal(offsets, []string{"65535", "131070"}) {
		t.Errorf("pages began at %v, want [65535 131070]", offsets)
	}
	if out := ok(t, cs, "read_file", map[string]any{"vm": "box", "path": "/root/big.txt", "offset": 3, "length": 5}); out != "€\n[... 149994 more bytes: call read_file with offset 6 to continue (file size 150000).]" {
		t.Errorf("a short page = %q", out)
	}
}

// Known bugs of read_file's paging of text, each checked for the right
// answer and skipped while the bug is there.
func TestReadFileInsideCharacter(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}}
	cs := session(t, base, adminToken, Scope{})
	f.files["id0001:/root/t.txt"] = fakeFile{data: []byte("a€b€c"), mode: 0o644}
	t.Run("offset inside a character", func(t *testing.T) {
		// tools.go says pages begin on whole characters.
		out := ok(t, cs, "read_file", map[string]any{"vm": "box", "path": "/root/t.txt", "offset": 2})
		if out != "b€c" { // (it was base64: the text check ran before the page's leading continuation bytes were dropped)
			t.Errorf("read_file at offset 2 = %q, want %q", out, "b€c")
		}
	})
	t.Run("length shorter than a character", func(t *testing.T) {
		out := ok(t, cs, "read_file", map[string]any{"vm": "box", "path": "/root/t.txt", "offset": 1, "length": 2})
		if strings.Contains(out, "offset 1 to continue") || strings.HasPrefix(out, "\n[...") { // (it was trimmed to nothing, with a note to continue at the same offset)
			t.Errorf("read_file of 2 bytes at the start of a 3-byte character = %q: no content", out)
		}
	})
}

// A VM's token works on its VM without naming it, and the API's refusals
// (another VM, a permission the token lacks) reach the model.
func TestScopedToken(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}, {ID: "id0002", Name: "other", State: api.StateRunning}}
	f.tokens["avm_box"] = fakeToken{vm: "id0001", allow: []string{api.PermExec, api.PermTerm}}
	cs := session(t, base, "avm_box", Scope{VM: "id0001"})
	f.exec = func(api.ExecRequest) api.ExecResult { return api.ExecResult{Stdout: "ok\n"} }
	if out := ok(t, cs, "exec", map[string]any{"command": "true"}); out != "exit code: 0\n--- stdout ---\nok\n" {
		t.Errorf("exec with the token's VM = %q", out)
	}
	if out := ok(t, cs, "get_vm", nil); !strings.Contains(out, `"id": "id0001"`) {
		t.Errorf("get_vm of the token's VM = %q", out)
	}
	fails(t, cs, "exec", map[string]any{"vm": "other", "command": "true"}, "exec failed: this token is for another VM (HTTP 403 forbidden)")
	fails(t, cs, "read_file", map[string]any{"path": "/etc/hostname"}, `read_file failed: this token does not allow "files" (it allows exec,term) (HTTP 403 forbidden)`)
	fails(t, cs, "write_file", map[string]any{"path": "/x", "content": "x"}, `this token does not allow "files"`)
	if len(f.execs) != 1 || len(f.files) != 0 {
		t.Errorf("refused calls ran: %d execs, %d files", len(f.execs), len(f.files))
	}
	fails(t, session(t, base, "avm_revoked", Scope{VM: "id0001"}), "exec", map[string]any{"command": "true"}, "exec failed: missing or unknown token (HTTP 401 unauthorized)")
}

// diff_vm lists what changed as A/M/D lines, with the unified diffs when
// patch is set, and a token without files gets the API's refusal.
func TestDiffTool(t *testing.T) {
	f, base := newFakeAPI(t)
	f.vms = []api.VM{{ID: "id0001", Name: "box", State: api.StateRunning}}
	cs := session(t, base, adminToken, Scope{})
	want := "box since create (the template it was made from): 2 added, 1 changed, 1 removed\nA /opt/app/\nA /opt/app/run.sh\nM /etc/hosts (content)\nD /etc/motd\n"
	if out := ok(t, cs, "diff_vm", map[string]any{"vm": "box"}); out != want {
		t.Errorf("diff_vm = %q, want %q", out, want)
	}
	if out := ok(t, cs, "diff_vm", map[string]any{"vm": "box", "patch": true, "since": "snap1"}); !strings.Contains(out, "since snap1") || !strings.Contains(out, "M /etc/hosts (content)\n--- a/etc/hosts\n+++ b/etc/hosts\n@@ -1 +1 @@\n-old\n+new\n") {
		t.Errorf("diff_vm with patch = %q", out)
	}
	f.tokens["avt_exec"] = fakeToken{vm: "id0001", allow: []string{"exec"}}
	scoped := session(t, base, "avt_exec", Scope{VM: "box"})
	fails(t, scoped, "diff_vm", map[string]any{}, "diff_vm failed")
}
