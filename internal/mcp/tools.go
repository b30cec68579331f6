package mcp

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

const (
	// maxShown is how much of each output stream a tool result shows; the
	// rest is saved in the VM for read_file.
	maxShown = 16 << 10
	// maxRead is the default and largest length of one read_file.
	maxRead = 64 << 10
)

type vmArg struct {
	VM string `json:"vm,omitempty" jsonschema:"the VM's name or id"`
}

type createIn struct {
	Name         string `json:"name,omitempty" jsonschema:"a name (lowercase letters, digits and '-'); generated when empty"`
	FromSnapshot string `json:"from_snapshot,omitempty" jsonschema:"restore this snapshot (name or id) instead of a fresh Debian image: its memory, processes and files come back"`
	CPUs         int    `json:"cpus,omitempty" jsonschema:"vCPUs (default 1)"`
	Memory       string `json:"memory,omitempty" jsonschema:"memory, e.g. 512M or 2G (default 1G)"`
	Image        string `json:"image,omitempty" jsonschema:"default (Debian with Python, Node.js, git), code-interpreter (also Jupyter kernels with numpy, pandas and matplotlib, for run_code), or browser (Chromium running on a display, for screenshot and the browser_ tools)"`
	Template     string `json:"template,omitempty" jsonschema:"a template built from a Dockerfile (see list_templates), NAME or NAME:TAG: the VM starts with its environment installed and its start command already running"`
}

type execIn struct {
	VM             string            `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Command        string            `json:"command" jsonschema:"a shell command line, run with /bin/sh -c (pipes, &&, redirections work)"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default 300)"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory (default the user's home)"`
	User           string            `json:"user,omitempty" jsonschema:"run as this user: root (default) or agent"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
}

type readIn struct {
	VM     string `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Path   string `json:"path" jsonschema:"absolute path, or relative to root's home"`
	Offset int64  `json:"offset,omitempty" jsonschema:"byte offset to start at (for paging through large files)"`
	Length int64  `json:"length,omitempty" jsonschema:"bytes to read (default and at most 65536)"`
}

type writeIn struct {
	VM      string `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Path    string `json:"path" jsonschema:"absolute path; missing parent directories are created"`
	Content string `json:"content" jsonschema:"the whole new content of the file (text)"`
	Base64  bool   `json:"base64,omitempty" jsonschema:"content is base64 (for binary files)"`
	Mode    string `json:"mode,omitempty" jsonschema:"permission bits in octal, e.g. 755 for a script (default 644)"`
}

type diffIn struct {
	VM     string   `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Since  string   `json:"since,omitempty" jsonschema:"compare with the VM as created (default) or with this snapshot's name"`
	Patch  bool     `json:"patch,omitempty" jsonschema:"include unified diffs of changed text files"`
	Ignore []string `json:"ignore,omitempty" jsonschema:"more paths or patterns to leave out (caches such as apt lists and __pycache__ are left out already)"`
}

type listIn struct {
	VM   string `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Path string `json:"path" jsonschema:"a directory"`
}

type forkIn struct {
	VM    string `json:"vm,omitempty" jsonschema:"the VM to copy"`
	Count int    `json:"count,omitempty" jsonschema:"how many copies (default 1, at most 32)"`
}

type snapshotIn struct {
	VM   string `json:"vm,omitempty" jsonschema:"the VM to save"`
	Name string `json:"name,omitempty" jsonschema:"the snapshot's name (generated when empty)"`
}

type exposeIn struct {
	VM     string `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Port   int    `json:"port" jsonschema:"the TCP port a web server listens on inside the VM"`
	Public bool   `json:"public,omitempty" jsonschema:"anyone with the URL may open it; otherwise it needs an agentvm token"`
}

type serviceIn struct {
	VM      string            `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Name    string            `json:"name" jsonschema:"service name (letters, digits, '-', '_')"`
	Command string            `json:"command" jsonschema:"shell command line of a long-running program (a server, a worker)"`
	User    string            `json:"user,omitempty" jsonschema:"run as this user (default root)"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"working directory"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"environment variables"`
}

type serviceLogsIn struct {
	VM    string `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Name  string `json:"name" jsonschema:"service name"`
	Lines int    `json:"lines,omitempty" jsonschema:"how many of the newest lines (default 100)"`
}

type termSendIn struct {
	VM       string `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Terminal string `json:"terminal,omitempty" jsonschema:"terminal name (default main); created with a login shell on first use"`
	Input    string `json:"input" jsonschema:"text to type; end a command with \\n; control keys as characters, e.g. \\u0003 for Ctrl-C"`
}

type termReadIn struct {
	VM       string `json:"vm,omitempty" jsonschema:"the VM's name or id"`
	Terminal string `json:"terminal,omitempty" jsonschema:"terminal name (default main)"`
	WaitMs   int    `json:"wait_ms,omitempty" jsonschema:"wait until the output has been quiet this long (default 500, at most 10000)"`
}

func (t *tools) register(s *sdk.Server) {
	ro := &sdk.ToolAnnotations{ReadOnlyHint: true}
	add(t, s, true, &sdk.Tool{Name: "create_vm", Description: "Create a new Linux VM (Debian 12 with python3, git, curl, Node.js; users root and agent with sudo) and return its name. It keeps running, with its files and processes, until you delete it. With from_snapshot it is a copy of a saved VM.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(false)}}, t.create)
	add(t, s, true, &sdk.Tool{Name: "list_templates", Description: "List the templates built from Dockerfiles (agentvm template build): name, base, start command and exposed ports. create_vm with template makes a VM from one, its service already running.", Annotations: ro}, t.listTemplates)
	add(t, s, true, &sdk.Tool{Name: "list_vms", Description: "List the VMs: name, id, state (running, paused, suspended, stopped), CPUs, memory.", Annotations: ro}, t.list)
	add(t, s, false, &sdk.Tool{Name: "get_vm", Description: "Show one VM: state, resources, address, exposed ports.", Annotations: ro}, t.get)
	add(t, s, false, &sdk.Tool{Name: "exec", Description: "Run a shell command in a VM and return its exit code, stdout and stderr. A paused or suspended VM is woken first. Long output is cut at 16 KiB per stream with a marker; the full output is then saved in the VM and the marker says how to page through it with read_file. For programs that need a terminal or keep running, use terminal_send or create_service.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(true), OpenWorldHint: boolp(true)}}, t.exec)
	add(t, s, false, &sdk.Tool{Name: "read_file", Description: "Read a file in a VM (up to 64 KiB per call; use offset to page). Binary content comes back as base64.", Annotations: ro}, t.read)
	add(t, s, false, &sdk.Tool{Name: "write_file", Description: "Create or replace a file in a VM with the given content (atomically; parent directories are created).",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(true), IdempotentHint: true}}, t.write)
	add(t, s, false, &sdk.Tool{Name: "list_files", Description: "List a directory in a VM: name, type, size, mode, modification time.", Annotations: ro}, t.listFiles)
	add(t, s, false, &sdk.Tool{Name: "diff_vm", Description: "What changed on a VM's disk since it was created (or since a snapshot): files added (A), changed (M) and removed (D), read from its disk from outside, with unified diffs of text files when patch is set. Use it to review what a session did to a machine.", Annotations: ro}, t.diff)
	add(t, s, true, &sdk.Tool{Name: "fork_vm", Description: "Copy a running VM, memory and running processes included, into new running VMs (to try alternatives in parallel). The original keeps running. Returns the copies' names.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(false)}}, t.fork)
	add(t, s, true, &sdk.Tool{Name: "snapshot_vm", Description: "Save a VM (memory, processes, disk) as a named snapshot; create_vm with from_snapshot makes new VMs from it. The VM keeps running.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(false)}}, t.snapshot)
	add(t, s, true, &sdk.Tool{Name: "suspend_vm", Description: "Park a VM on disk: it stops using memory and CPU; resume_vm (or any exec) brings it back exactly as it was.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(false), IdempotentHint: true}}, t.suspend)
	add(t, s, true, &sdk.Tool{Name: "resume_vm", Description: "Wake a paused or suspended VM.", Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(false), IdempotentHint: true}}, t.resume)
	add(t, s, true, &sdk.Tool{Name: "delete_vm", Description: "Delete a VM for good: its disk, memory and processes are gone.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(true), IdempotentHint: true}}, t.delete)
	add(t, s, true, &sdk.Tool{Name: "expose_port", Description: "Make a web server in a VM reachable from outside and return its preview URL (start the server first, listening on 0.0.0.0 or 127.0.0.1).",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(false), IdempotentHint: true}}, t.expose)
	add(t, s, false, &sdk.Tool{Name: "create_service", Description: "Run a long-running program (a server, a worker) in a VM as a supervised service: it is restarted when it fails and keeps running across suspend and resume. Read its output with service_logs.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(false)}}, t.createService)
	add(t, s, false, &sdk.Tool{Name: "service_logs", Description: "Show the newest lines a service wrote.", Annotations: ro}, t.serviceLogs)
	add(t, s, false, &sdk.Tool{Name: "terminal_send", Description: "Type into an interactive terminal in a VM (a login shell, created on first use; it keeps running between calls). Use for interactive programs (python REPL, top, editors). Read the screen with terminal_read.",
		Annotations: &sdk.ToolAnnotations{DestructiveHint: boolp(true), OpenWorldHint: boolp(true)}}, t.termSend)
	t.registerCode(s)
	t.registerBrowser(s)
	add(t, s, false, &sdk.Tool{Name: "terminal_read", Description: "Read what a terminal shows: its recent output (up to 16 KiB), after waiting until it has been quiet for wait_ms.", Annotations: ro}, t.termRead)
}

func (t *tools) create(ctx context.Context, in createIn) (*sdk.CallToolResult, error) {
	req := api.CreateVMRequest{Name: in.Name, From: in.FromSnapshot, CPUs: in.CPUs, Image: in.Image, Template: in.Template}
	if in.Memory != "" {
		m, err := api.ParseSize(in.Memory)
		if err != nil {
			return nil, fmt.Errorf("memory %q: %v (use e.g. 512M or 2G)", in.Memory, err)
		}
		req.Memory = m
	}
	v, err := t.c.CreateVM(ctx, req)
	if err != nil {
		return nil, toolError("create_vm", err)
	}
	hint := ""
	if v.Image == "code-interpreter" {
		hint = " Run Python, JavaScript or bash in its live kernels with run_code."
	}
	if v.Image == "browser" {
		hint = " Its Chromium is running: drive it with browser_navigate, browser_click, browser_type and browser_evaluate, and look at it with screenshot."
	}
	return text(fmt.Sprintf("Created VM %s (id %s) from the %s image: %s, %d vCPU, %d MiB memory, address %s. Run commands in it with exec (vm: %q).%s",
		v.Name, v.ID, v.Image, v.State, v.CPUs, v.MemoryMiB, v.IP, v.Name, hint)), nil
}

func (t *tools) list(ctx context.Context, _ struct{}) (*sdk.CallToolResult, error) {
	vms, err := t.c.ListVMs(ctx)
	if err != nil {
		return nil, toolError("list_vms", err)
	}
	if len(vms) == 0 {
		return text("No VMs. Create one with create_vm."), nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s:\n", len(vms), plural(len(vms), "VM", "VMs"))
	for _, v := range vms {
		fmt.Fprintf(&b, "- %s (id %s): %s, %d vCPU, %d MiB\n", v.Name, v.ID, v.State, v.CPUs, v.MemoryMiB)
	}
	return text(b.String()), nil
}

func (t *tools) listTemplates(ctx context.Context, _ struct{}) (*sdk.CallToolResult, error) {
	ts, err := t.c.ListTemplates(ctx)
	if err != nil {
		return nil, toolError("list_templates", err)
	}
	if len(ts) == 0 {
		return text("No templates. An admin builds them with: agentvm template build NAME -f Dockerfile DIR"), nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s:\n", len(ts), plural(len(ts), "template", "templates"))
	for _, tp := range ts {
		fmt.Fprintf(&b, "- %s (from %s, %d vCPU, %d MiB)", tp.Name, tp.Base, tp.CPUs, tp.MemoryMiB)
		if len(tp.Start) > 0 {
			fmt.Fprintf(&b, ", runs %q", strings.Join(tp.Start, " "))
		}
		if len(tp.Expose) > 0 {
			fmt.Fprintf(&b, ", ports %v", tp.Expose)
		}
		b.WriteString("\n")
	}
	return text(b.String()), nil
}

func (t *tools) get(ctx context.Context, in vmArg) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	v, err := t.c.GetVM(ctx, id)
	if err != nil {
		return nil, toolError("get_vm", err)
	}
	return jsonText(v), nil
}

func (t *tools) exec(ctx context.Context, in execIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(in.Command) == "" {
		return nil, fmt.Errorf("command is required: a shell command line such as \"ls -la /\"")
	}
	timeout := in.TimeoutSeconds
	if timeout == 0 {
		timeout = 300
	}
	if timeout < 0 || timeout > 24*3600 {
		return nil, fmt.Errorf("timeout_seconds must be between 1 and 86400, got %d", in.TimeoutSeconds)
	}
	res, err := t.c.Exec(ctx, id, api.ExecRequest{Shell: in.Command, Cwd: in.Cwd, User: in.User, Env: in.Env, Timeout: api.Duration(time.Duration(timeout) * time.Second)})
	if err != nil {
		return nil, toolError("exec", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "exit code: %d", res.ExitCode)
	if res.TimedOut {
		fmt.Fprintf(&b, " (killed after the %d s timeout)", timeout)
	} else if res.Signal != "" {
		fmt.Fprintf(&b, " (killed by %s)", res.Signal)
	}
	b.WriteString("\n")
	stamp := newStamp()
	for _, o := range []struct{ name, data string }{{"stdout", res.Stdout}, {"stderr", res.Stderr}} {
		if o.data == "" {
			continue
		}
		shown, cut := truncate(o.data, maxShown)
		fmt.Fprintf(&b, "--- %s ---\n%s", o.name, shown)
		if !strings.HasSuffix(shown, "\n") {
			b.WriteString("\n")
		}
		if cut {
			// Saved for the caller only: its own directory, mode 0600.
			who := in.User
			if who == "" {
				who = "root"
			}
			path := "/tmp/agentvm-mcp-" + who + "/exec-" + stamp + "." + o.name
			capped := ""
			if (o.name == "stdout" && res.StdoutTruncated) || (o.name == "stderr" && res.StderrTruncated) {
				capped = " (the server kept only the first 16 MiB of it)"
			}
			if _, err := t.c.WriteFile(ctx, id, path, strings.NewReader(o.data), int64(len(o.data)), client.WriteOptions{Mode: 0o600, MkDirs: true, FileOptions: client.FileOptions{User: in.User}}); err == nil {
				fmt.Fprintf(&b, "[... %s truncated: showing %d of %d bytes. The whole %s%s is in %s in the VM: read the rest with read_file (path %q, offset %d).]\n",
					o.name, len(shown), len(o.data), o.name, capped, path, path, len(shown))
			} else {
				fmt.Fprintf(&b, "[... %s truncated: showing %d of %d bytes; run the command again with less output, e.g. piped to head or tail.]\n", o.name, len(shown), len(o.data))
			}
		}
	}
	r := text(b.String())
	r.IsError = res.ExitCode != 0
	return r, nil
}

// trimRunes drops an incomplete character at the end of b.
func trimRunes(b []byte) []byte {
	for i := 1; i <= 3 && i <= len(b); i++ {
		if isRuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}

func newStamp() string {
	b := make([]byte, 4)
	rand.Read(b)
	return time.Now().UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b)
}

func (t *tools) read(ctx context.Context, in readIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	if in.Path == "" {
		return nil, fmt.Errorf("path is required")
	}
	if in.Offset < 0 || in.Length < 0 || in.Length > maxRead {
		return nil, fmt.Errorf("offset must be >= 0 and length between 1 and %d", maxRead)
	}
	length := in.Length
	if length == 0 {
		length = maxRead
	}
	rc, fi, err := t.c.ReadFile(ctx, id, in.Path, in.Offset, length, client.FileOptions{})
	if err != nil {
		return nil, toolError("read_file", err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, length))
	if err != nil {
		return nil, toolError("read_file", err)
	}
	start := in.Offset
	// Text: pages begin and end on whole characters, so each reads as
	// text (a page boundary inside a character would make it binary). A
	// page that begins inside one skips to the next before the check.
	lead, skip := data, 0
	if in.Offset > 0 {
		for skip < 3 && len(lead) > 0 && !isRuneStart(lead[0]) {
			lead, skip = lead[1:], skip+1
		}
	}
	if utf8.Valid(trimRunes(lead)) {
		page := lead
		if fi != nil && fi.Size > start+int64(skip)+int64(len(page)) {
			page = trimRunes(page)
		}
		// A page shorter than one character stays as it was (shown as
		// binary), so the next offset moves on.
		if len(page) > 0 || len(data) == 0 {
			data, start = page, start+int64(skip)
		}
	}
	end := start + int64(len(data))
	var b strings.Builder
	if utf8.Valid(data) {
		b.Write(data)
	} else {
		fmt.Fprintf(&b, "[binary content, base64]\n%s", base64.StdEncoding.EncodeToString(data))
	}
	if fi != nil && fi.Size > end {
		fmt.Fprintf(&b, "\n[... %d more bytes: call read_file with offset %d to continue (file size %d).]", fi.Size-end, end, fi.Size)
	}
	return text(b.String()), nil
}

func (t *tools) write(ctx context.Context, in writeIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	if in.Path == "" {
		return nil, fmt.Errorf("path is required")
	}
	data := []byte(in.Content)
	if in.Base64 {
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, fmt.Errorf("content is not valid base64: %v", err)
		}
	}
	var mode uint32
	if in.Mode != "" {
		m, err := strconv.ParseUint(in.Mode, 8, 32)
		if err != nil || m == 0 || m > 0o7777 {
			return nil, fmt.Errorf("mode %q: use octal permission bits such as 644 or 755", in.Mode)
		}
		mode = uint32(m)
	}
	fi, err := t.c.WriteFile(ctx, id, in.Path, strings.NewReader(string(data)), int64(len(data)), client.WriteOptions{Mode: mode, MkDirs: true})
	if err != nil {
		return nil, toolError("write_file", err)
	}
	return text(fmt.Sprintf("Wrote %d bytes to %s (mode %04o).", fi.Size, fi.Path, fi.Mode)), nil
}

func (t *tools) listFiles(ctx context.Context, in listIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	if in.Path == "" {
		return nil, fmt.Errorf("path is required")
	}
	l, err := t.c.ListDir(ctx, id, in.Path, client.FileOptions{})
	if err != nil {
		return nil, toolError("list_files", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d %s\n", l.Path, len(l.Entries), plural(len(l.Entries), "entry", "entries"))
	for _, e := range l.Entries {
		name := e.Name
		if e.Type == "dir" {
			name += "/"
		}
		if e.LinkTarget != "" {
			name += " -> " + e.LinkTarget
		}
		fmt.Fprintf(&b, "%-8s %04o %10d %s %s\n", e.Type, e.Mode, e.Size, e.ModTime.UTC().Format("2006-01-02 15:04"), name)
	}
	return text(b.String()), nil
}

// maxDiffText bounds diff_vm's answer.
const maxDiffText = 64 << 10

func (t *tools) diff(ctx context.Context, in diffIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	d, err := t.c.Diff(ctx, id, client.DiffOptions{Since: in.Since, Diffs: in.Patch, Ignore: in.Ignore})
	if err != nil {
		return nil, toolError("diff_vm", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s since %s (%s): %d added, %d changed, %d removed\n", d.VM, d.Since, d.Base, len(d.Added), len(d.Changed), len(d.Removed))
	for _, l := range []struct {
		mark string
		es   []api.DiffEntry
	}{{"A", d.Added}, {"M", d.Changed}, {"D", d.Removed}} {
		for _, e := range l.es {
			if b.Len() > maxDiffText {
				b.WriteString("[cut: the diff is longer than 64 KiB; ask with ignore patterns or without patch]\n")
				return text(b.String()), nil
			}
			line := l.mark + " " + e.Path
			if e.Kind == "dir" {
				line += "/"
			}
			if len(e.What) > 0 {
				line += " (" + strings.Join(e.What, ", ") + ")"
			}
			if e.Binary {
				line += fmt.Sprintf(" binary, %d bytes", e.Size)
			}
			b.WriteString(line + "\n")
			if e.Diff != "" {
				b.WriteString(e.Diff)
			}
		}
	}
	if d.Truncated {
		b.WriteString("[more entries differ than listed]\n")
	}
	return text(b.String()), nil
}

func (t *tools) fork(ctx context.Context, in forkIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	n := in.Count
	if n == 0 {
		n = 1
	}
	res, err := t.c.Fork(ctx, id, n)
	if err != nil {
		return nil, toolError("fork_vm", err)
	}
	names := make([]string, len(res.Children))
	for i, c := range res.Children {
		names[i] = c.Name
	}
	return text(fmt.Sprintf("Forked %s into %d running %s: %s (the original was paused %d ms).", id, len(names), plural(len(names), "copy", "copies"), strings.Join(names, ", "), res.ParentPauseMs)), nil
}

func (t *tools) snapshot(ctx context.Context, in snapshotIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	sn, err := t.c.Snapshot(ctx, id, in.Name)
	if err != nil {
		return nil, toolError("snapshot_vm", err)
	}
	return text(fmt.Sprintf("Saved %s as snapshot %s (id %s). create_vm with from_snapshot %q makes copies of it.", id, sn.Name, sn.ID, sn.Name)), nil
}

func (t *tools) suspend(ctx context.Context, in vmArg) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	v, err := t.c.SuspendVM(ctx, id)
	if err != nil {
		return nil, toolError("suspend_vm", err)
	}
	return text(fmt.Sprintf("%s is %s.", v.Name, v.State)), nil
}

func (t *tools) resume(ctx context.Context, in vmArg) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	v, err := t.c.WakeVM(ctx, id)
	if err != nil {
		return nil, toolError("resume_vm", err)
	}
	return text(fmt.Sprintf("%s is %s.", v.Name, v.State)), nil
}

func (t *tools) delete(ctx context.Context, in vmArg) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	if err := t.c.DeleteVM(ctx, id); err != nil {
		return nil, toolError("delete_vm", err)
	}
	return text("Deleted " + id + "."), nil
}

func (t *tools) expose(ctx context.Context, in exposeIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	if in.Port < 1 || in.Port > 65535 {
		return nil, fmt.Errorf("port must be between 1 and 65535, got %d", in.Port)
	}
	p, err := t.c.Expose(ctx, id, api.ExposeRequest{Port: in.Port, Public: in.Public})
	if err != nil {
		return nil, toolError("expose_port", err)
	}
	note := "It needs an agentvm token (Authorization: Bearer, or ?agentvm_token= once)."
	if p.Public {
		note = "Anyone with the URL can open it."
	}
	return text(fmt.Sprintf("Port %d of %s is at %s . %s", in.Port, id, p.URL, note)), nil
}

func (t *tools) createService(ctx context.Context, in serviceIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	if in.Name == "" || strings.TrimSpace(in.Command) == "" {
		return nil, fmt.Errorf("name and command are required")
	}
	si, err := t.c.CreateService(ctx, id, api.ServiceCreate{Name: in.Name, Shell: in.Command, User: in.User, Cwd: in.Cwd, Env: in.Env, Restart: "always"})
	if err != nil {
		return nil, toolError("create_service", err)
	}
	return text(fmt.Sprintf("Service %s is %s in %s. Its output: service_logs (name %q).", si.Name, si.ActiveState, id, si.Name)), nil
}

func (t *tools) serviceLogs(ctx context.Context, in serviceLogsIn) (*sdk.CallToolResult, error) {
	id, err := t.vm(in.VM)
	if err != nil {
		return nil, err
	}
	lines := in.Lines
	if lines == 0 {
		lines = 100
	}
	if lines < 0 || lines > 10000 {
		return nil, fmt.Errorf("lines must be between 1 and 10000")
	}
	rc, err := t.c.ServiceLogs(ctx, id, in.Name, lines, false)
	if err != nil {
		return nil, toolError("service_logs", err)
	}
	defer rc.Close()
	data, _ := io.ReadAll(io.LimitReader(rc, 16<<20))
	out := string(data)
	if len(out) > 4*maxShown { // keep the newest
		out = "[... older lines cut: ask for fewer lines]\n" + tail(out, 4*maxShown)
	}
	if out == "" {
		out = "(no output yet)"
	}
	return text(out), nil
}
