package mcp

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/coder/websocket"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// fakeAPI is agentvm's HTTP API as the MCP tools reach it through
// pkg/client: VMs, files kept in memory, terminals whose program echoes what
// is typed, and scripted answers for exec and run_code.
//
// The tests cannot use the real API over the fake hypervisor: mcp cannot
// import internal/server (server imports mcp), and server.New, the only way
// to build one from outside that package, needs QEMU. So this keeps the
// API's wire contract (routes, bodies, X-File-* headers, api.Error, 403 for
// a token of another VM or without the permission) and nothing more.
type fakeAPI struct {
	mu     sync.Mutex
	vms    []api.VM
	files  map[string]fakeFile  // vm id + ":" + path
	terms  map[string]*fakeTerm // vm id + ":" + name
	tokens map[string]fakeToken
	// exec answers POST /exec (default: exit 0, no output); execs records
	// the requests.
	exec  func(api.ExecRequest) api.ExecResult
	execs []api.ExecRequest
	// code is the NDJSON stream POST /code answers with.
	code     []api.CodeEvent
	codeReqs []api.RunCodeRequest
	// services records POST /services; logs is every service's journal.
	services []api.ServiceCreate
	logs     string
}

type fakeFile struct {
	data []byte
	mode uint32
	user string
}

type fakeToken struct {
	vm    string   // "" for the admin
	allow []string // the permissions of a VM's token
}

const (
	adminToken = "avm_admin"
	fakePNG    = "\x89PNG\r\n\x1a\nfake"
)

// fakeTerm is a terminal session: its output so far, and the attached
// clients waiting for more.
type fakeTerm struct {
	out  []byte
	subs []chan []byte
}

func newFakeAPI(t *testing.T) (*fakeAPI, string) {
	t.Helper()
	f := &fakeAPI{files: map[string]fakeFile{}, terms: map[string]*fakeTerm{},
		tokens: map[string]fakeToken{adminToken: {}}}
	hs := httptest.NewServer(f.routes())
	t.Cleanup(hs.Close)
	return f, hs.URL
}

// session connects an MCP client to a server whose tools call the fake API
// with token, over the SDK's in-memory transport.
func session(t *testing.T, base, token string, scope Scope) *sdk.ClientSession {
	t.Helper()
	ctx := context.Background()
	srv := New(client.New(base, token), scope, "test")
	st, ct := sdk.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test-client", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.Error{Error: api.ErrorBody{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (f *fakeAPI) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/vms", f.admin(f.createVM))
	mux.HandleFunc("GET /v1/vms", f.admin(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		writeJSON(w, 200, api.ListVMsResponse{VMs: slices.Clone(f.vms)})
	}))
	mux.HandleFunc("GET /v1/vms/{id}", f.scoped("", func(w http.ResponseWriter, r *http.Request, v *api.VM) {
		if r.URL.Query().Get("wake") == "1" {
			v.State = api.StateRunning
		}
		writeJSON(w, 200, v)
	}))
	mux.HandleFunc("DELETE /v1/vms/{id}", f.admin(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		n := len(f.vms)
		f.vms = slices.DeleteFunc(f.vms, func(v api.VM) bool { return v.ID == r.PathValue("id") || v.Name == r.PathValue("id") })
		if len(f.vms) == n {
			writeErr(w, 404, api.CodeNotFound, "vm "+r.PathValue("id")+" not found")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("GET /v1/vms/{id}/diff", f.scoped(api.PermFiles, func(w http.ResponseWriter, r *http.Request, v *api.VM) {
		d := api.DiffResponse{VM: v.Name, Since: cmp.Or(r.URL.Query().Get("since"), "create"), Base: "the template it was made from",
			Added:   []api.DiffEntry{{Path: "/opt/app", Kind: "dir"}, {Path: "/opt/app/run.sh", Kind: "file", Size: 3}},
			Changed: []api.DiffEntry{{Path: "/etc/hosts", Kind: "file", What: []string{"content"}}},
			Removed: []api.DiffEntry{{Path: "/etc/motd", Kind: "file"}}}
		if r.URL.Query().Get("diffs") == "1" {
			d.Changed[0].Diff = "--- a/etc/hosts\n+++ b/etc/hosts\n@@ -1 +1 @@\n-old\n+new\n"
		}
		writeJSON(w, 200, d)
	}))
	mux.HandleFunc("POST /v1/vms/{id}/suspend", f.admin(f.vmOnly(func(w http.ResponseWriter, r *http.Request, v *api.VM) {
		v.State = api.StateSuspended
		writeJSON(w, 200, v)
	})))
	mux.HandleFunc("POST /v1/vms/{id}/fork", f.admin(f.vmOnly(func(w http.ResponseWriter, r *http.Request, v *api.VM) {
		var req api.ForkRequest
		json.NewDecoder(r.Body).Decode(&req)
		res := api.ForkResponse{Parent: *v, ParentPauseMs: 7}
		for i := range req.Count {
			res.Children = append(res.Children, api.VM{Name: fmt.Sprintf("%s-%d", v.Name, i+1)})
		}
		writeJSON(w, 200, res)
	})))
	mux.HandleFunc("POST /v1/vms/{id}/snapshot", f.admin(f.vmOnly(func(w http.ResponseWriter, r *http.Request, v *api.VM) {
		var req api.SnapshotRequest
		json.NewDecoder(r.Body).Decode(&req)
		writeJSON(w, 201, api.Snapshot{ID: "sn01", Name: cmp.Or(req.Name, "snap-1"), VMID: v.ID})
	})))
	mux.HandleFunc("POST /v1/vms/{id}/ports", f.admin(f.vmOnly(func(w http.ResponseWriter, r *http.Request, v *api.VM) {
		var req api.ExposeRequest
		json.NewDecoder(r.Body).Decode(&req)
		writeJSON(w, 201, api.Port{Port: req.Port, Kind: "http", Public: req.Public, URL: fmt.Sprintf("http://%d-%s.localhost:7080/", req.Port, v.Name)})
	})))
	mux.HandleFunc("POST /v1/vms/{id}/services", f.scoped(api.PermExec, func(w http.ResponseWriter, r *http.Request, _ *api.VM) {
		var req api.ServiceCreate
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.services = append(f.services, req)
		f.mu.Unlock()
		writeJSON(w, 201, api.ServiceInfo{Name: req.Name, ActiveState: "active"})
	}))
	mux.HandleFunc("GET /v1/vms/{id}/services/{name}/logs", f.scoped(api.PermExec, func(w http.ResponseWriter, r *http.Request, _ *api.VM) {
		f.mu.Lock()
		logs := f.logs
		f.mu.Unlock()
		io.WriteString(w, logs)
	}))
	mux.HandleFunc("GET /v1/vms/{id}/screenshot", f.scoped(api.PermDisplay, func(w http.ResponseWriter, r *http.Request, _ *api.VM) {
		io.WriteString(w, fakePNG)
	}))
	mux.HandleFunc("POST /v1/vms/{id}/exec", f.scoped(api.PermExec, f.execVM))
	mux.HandleFunc("GET /v1/vms/{id}/files", f.scoped(api.PermFiles, f.readFile))
	mux.HandleFunc("PUT /v1/vms/{id}/files", f.scoped(api.PermFiles, f.writeFile))
	mux.HandleFunc("GET /v1/vms/{id}/files/list", f.scoped(api.PermFiles, f.listDir))
	mux.HandleFunc("POST /v1/vms/{id}/terminals", f.scoped(api.PermTerm, f.createTerm))
	mux.HandleFunc("GET /v1/vms/{id}/terminals/{name}", f.scoped(api.PermTerm, f.term))
	mux.HandleFunc("POST /v1/vms/{id}/code", f.scoped(api.PermExec, f.runCode))
	return mux
}

// admin allows only the admin token.
func (f *fakeAPI) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, ok := f.token(w, r)
		if !ok {
			return
		}
		if tok.vm != "" {
			writeErr(w, 403, api.CodeForbidden, "this endpoint needs the admin token")
			return
		}
		h(w, r)
	}
}

func (f *fakeAPI) token(w http.ResponseWriter, r *http.Request) (fakeToken, bool) {
	f.mu.Lock()
	tok, ok := f.tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
	f.mu.Unlock()
	if !ok {
		writeErr(w, 401, api.CodeUnauthorized, "missing or unknown token")
	}
	return tok, ok
}

// vmOnly resolves the path's VM (by id or name) for an admin route.
func (f *fakeAPI) vmOnly(h func(http.ResponseWriter, *http.Request, *api.VM)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		v := f.find(r.PathValue("id"))
		f.mu.Unlock()
		if v == nil {
			writeErr(w, 404, api.CodeNotFound, "vm "+r.PathValue("id")+" not found")
			return
		}
		h(w, r, v)
	}
}

// scoped allows the admin and the VM's tokens that hold perm ("": any).
func (f *fakeAPI) scoped(perm string, h func(http.ResponseWriter, *http.Request, *api.VM)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, ok := f.token(w, r)
		if !ok {
			return
		}
		f.mu.Lock()
		v := f.find(r.PathValue("id"))
		f.mu.Unlock()
		switch {
		case tok.vm != "" && (v == nil || v.ID != tok.vm):
			writeErr(w, 403, api.CodeForbidden, "this token is for another VM")
		case v == nil:
			writeErr(w, 404, api.CodeNotFound, "vm "+r.PathValue("id")+" not found")
		case tok.vm != "" && perm != "" && !slices.Contains(tok.allow, perm):
			writeErr(w, 403, api.CodeForbidden, fmt.Sprintf("this token does not allow %q (it allows %s)", perm, strings.Join(tok.allow, ",")))
		default:
			h(w, r, v)
		}
	}
}

// find is the VM named or numbered ref; f.mu held.
func (f *fakeAPI) find(ref string) *api.VM {
	for i := range f.vms {
		if f.vms[i].ID == ref || f.vms[i].Name == ref {
			return &f.vms[i]
		}
	}
	return nil
}

func (f *fakeAPI) createVM(w http.ResponseWriter, r *http.Request) {
	var req api.CreateVMRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeErr(w, 400, api.CodeInvalid, err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if req.Name == "" {
		req.Name = fmt.Sprintf("vm-%d", len(f.vms)+1)
	}
	if f.find(req.Name) != nil {
		writeErr(w, 409, api.CodeConflict, "a VM named "+req.Name+" exists")
		return
	}
	v := api.VM{ID: fmt.Sprintf("id%04d", len(f.vms)+1), Name: req.Name, State: api.StateRunning,
		CPUs: max(req.CPUs, 1), MemoryMiB: int64(req.Memory) >> 20, Image: req.Image, IP: "10.0.0.2"}
	if v.MemoryMiB == 0 {
		v.MemoryMiB = 1024
	}
	if v.Image == "" {
		v.Image = "default"
	}
	f.vms = append(f.vms, v)
	writeJSON(w, 201, v)
}

func (f *fakeAPI) execVM(w http.ResponseWriter, r *http.Request, _ *api.VM) {
	var req api.ExecRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeErr(w, 400, api.CodeInvalid, err.Error())
		return
	}
	f.mu.Lock()
	f.execs = append(f.execs, req)
	run := f.exec
	f.mu.Unlock()
	res := api.ExecResult{}
	if run != nil {
		res = run(req)
	}
	writeJSON(w, 200, res)
}

// readFile serves a file or a range of it, as the guest agent does: the
// X-File-Size header is the whole size.
func (f *fakeAPI) readFile(w http.ResponseWriter, r *http.Request, v *api.VM) {
	q := r.URL.Query()
	f.mu.Lock()
	file, ok := f.files[v.ID+":"+q.Get("path")]
	f.mu.Unlock()
	if !ok {
		writeErr(w, 404, api.CodeNotFound, q.Get("path")+": no such file")
		return
	}
	off, _ := strconv.ParseInt(q.Get("offset"), 10, 64)
	n := int64(len(file.data)) - off
	if s := q.Get("length"); s != "" {
		l, _ := strconv.ParseInt(s, 10, 64)
		n = min(n, l)
	}
	w.Header().Set("X-File-Size", strconv.Itoa(len(file.data)))
	w.Header().Set("X-File-Mode", fmt.Sprintf("%04o", file.mode))
	if n <= 0 {
		return
	}
	w.Write(file.data[off : off+n])
}

func (f *fakeAPI) writeFile(w http.ResponseWriter, r *http.Request, v *api.VM) {
	q := r.URL.Query()
	p := q.Get("path")
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.Get("mkdirs") != "1" && path.Dir(p) != "/" {
		writeErr(w, 404, api.CodeNotFound, path.Dir(p)+": no such directory")
		return
	}
	mode := uint32(0o644)
	if s := q.Get("mode"); s != "" {
		m, _ := strconv.ParseUint(s, 8, 32)
		mode = uint32(m)
	}
	data, _ := io.ReadAll(r.Body)
	f.files[v.ID+":"+p] = fakeFile{data: data, mode: mode, user: q.Get("user")}
	writeJSON(w, 200, api.FileInfo{Name: path.Base(p), Path: p, Type: "file", Size: int64(len(data)), Mode: mode})
}

func (f *fakeAPI) listDir(w http.ResponseWriter, r *http.Request, v *api.VM) {
	dir := r.URL.Query().Get("path")
	l := api.FileList{Path: dir, Entries: []api.FileInfo{}}
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, file := range f.files {
		p := strings.TrimPrefix(k, v.ID+":")
		if p != k && path.Dir(p) == dir {
			l.Entries = append(l.Entries, api.FileInfo{Name: path.Base(p), Type: "file", Size: int64(len(file.data)),
				Mode: file.mode, ModTime: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)})
		}
	}
	slices.SortFunc(l.Entries, func(a, b api.FileInfo) int { return strings.Compare(a.Name, b.Name) })
	writeJSON(w, 200, l)
}

func (f *fakeAPI) createTerm(w http.ResponseWriter, r *http.Request, v *api.VM) {
	var req api.TermCreate
	json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.terms[v.ID+":"+req.Name]; ok {
		writeErr(w, 409, api.CodeConflict, "terminal "+req.Name+" exists")
		return
	}
	f.terms[v.ID+":"+req.Name] = &fakeTerm{out: []byte("\x1b[1;32mroot@box\x1b[0m:~# ")}
	writeJSON(w, 201, api.TermInfo{Name: req.Name, Cols: req.Cols, Rows: req.Rows})
}

// term describes a terminal, or attaches to it over a WebSocket: the
// scrollback unless scrollback=0, then what its program writes, which
// echoes each input as "echo: INPUT".
func (f *fakeAPI) term(w http.ResponseWriter, r *http.Request, v *api.VM) {
	key := v.ID + ":" + r.PathValue("name")
	f.mu.Lock()
	tm, ok := f.terms[key]
	f.mu.Unlock()
	if !ok {
		writeErr(w, 404, api.CodeNotFound, "terminal "+r.PathValue("name")+" not found")
		return
	}
	if r.Header.Get("Upgrade") == "" {
		writeJSON(w, 200, api.TermInfo{Name: r.PathValue("name")})
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer ws.CloseNow()
	ch := make(chan []byte, 64)
	f.mu.Lock()
	if r.URL.Query().Get("scrollback") != "0" {
		ch <- slices.Clone(tm.out)
	}
	tm.subs = append(tm.subs, ch)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		tm.subs = slices.DeleteFunc(tm.subs, func(c chan []byte) bool { return c == ch })
		f.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		defer cancel()
		for {
			_, b, err := ws.Read(ctx)
			if err != nil {
				return
			}
			out := []byte("echo: " + string(b))
			f.mu.Lock()
			tm.out = append(tm.out, out...)
			for _, c := range tm.subs {
				select {
				case c <- out:
				default:
				}
			}
			f.mu.Unlock()
		}
	}()
	for {
		select {
		case b := <-ch:
			if err := ws.Write(ctx, websocket.MessageBinary, b); err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

func (f *fakeAPI) runCode(w http.ResponseWriter, r *http.Request, _ *api.VM) {
	var req api.RunCodeRequest
	json.NewDecoder(r.Body).Decode(&req)
	f.mu.Lock()
	f.codeReqs = append(f.codeReqs, req)
	events := f.code
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for _, e := range events {
		enc.Encode(e)
	}
}
