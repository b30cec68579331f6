package e2b

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	osuser "os/user"
	"path/filepath"
	"strings"
	"testing"
)

// envdClient calls envd of one sandbox through the preview proxy, as E2B's
// SDKs do: E2b-Sandbox-Id and E2b-Sandbox-Port name the sandbox (or a
// <port>-<id>.<domain> Host does), X-Access-Token carries its envd token and
// Basic authorization the user.
type envdClient struct {
	e     *fakeE2B
	id    string // the sandbox
	token string // "" sends none
	user  string // "" sends no Authorization (envd's default user)
	host  string // when set, route by this Host instead of the headers
}

func (c envdClient) do(t *testing.T, method, path, ct string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(c.e.ctx, method, "http://"+c.e.env+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if c.host != "" {
		req.Host = c.host
	} else {
		req.Header.Set("E2b-Sandbox-Id", c.id)
		req.Header.Set("E2b-Sandbox-Port", "49983")
	}
	if c.token != "" {
		req.Header.Set("X-Access-Token", c.token)
	}
	if c.user != "" {
		req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.user+":")))
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	req.Header.Set("Connect-Protocol-Version", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// unary makes a Connect unary call with the JSON codec; out, when not nil,
// receives a 200's message.
func (c envdClient) unary(t *testing.T, rpc string, in, out any) (int, []byte) {
	t.Helper()
	body, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	code, _, b := c.do(t, "POST", rpc, "application/json", body)
	if code == http.StatusOK && out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: %v in %s", rpc, err, b)
		}
	}
	return code, b
}

// stream makes a Connect server-stream call: its messages and its end
// message.
func (c envdClient) stream(t *testing.T, rpc string, in any) ([]string, string) {
	t.Helper()
	msg, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	code, _, b := c.do(t, "POST", rpc, "application/connect+json", envelope(0, string(msg)))
	if code != http.StatusOK {
		t.Fatalf("%s: %d %s", rpc, code, b)
	}
	return readEnvelopes(t, b)
}

// run starts cmd with sh -c through process.Process/Start and returns what
// the stream carried: the pid of its start event, stdout and stderr, the
// end event and the stream's end message.
func (c envdClient) run(t *testing.T, cmd string, envs map[string]string) (pid uint32, stdout, stderr string, end *endEvent, last string) {
	t.Helper()
	msgs, last := c.stream(t, "/process.Process/Start", startRequest{Process: &processConfig{Cmd: "/bin/sh", Args: []string{"-c", cmd}, Envs: envs}})
	var out, errb strings.Builder
	for _, m := range msgs {
		var ev processEventResponse
		if err := json.Unmarshal([]byte(m), &ev); err != nil {
			t.Fatalf("event %s: %v", m, err)
		}
		switch e := ev.Event; {
		case e.Start != nil:
			pid = e.Start.PID
		case e.Data != nil:
			out.Write(e.Data.Stdout)
			errb.Write(e.Data.Stderr)
		case e.End != nil:
			end = e.End
		}
	}
	return pid, out.String(), errb.String(), end, last
}

// envd over its Connect protocol and its HTTP file routes, on a fake
// machine running the real guest agent: a process's output and exit code
// streamed, the filesystem RPCs, uploads and downloads, and the access
// token required.
func TestEnvdOnFakeVM(t *testing.T) {
	e := newFakeE2B(t)
	sb := e.create(t, `{"envVars":{"SANDBOX_VAR":"from-create"}}`)
	root := envdClient{e: e, id: sb.SandboxID, token: sb.EnvdAccessToken, user: "root"}

	// The token is required, and a wrong one refused, before any guest call.
	for name, c := range map[string]envdClient{
		"no token":    {e: e, id: sb.SandboxID, user: "root"},
		"wrong token": {e: e, id: sb.SandboxID, token: "k1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", user: "root"},
		"another sandbox's token": func() envdClient {
			other := e.create(t, `{}`)
			return envdClient{e: e, id: sb.SandboxID, token: other.EnvdAccessToken, user: "root"}
		}(),
	} {
		code, _, b := c.do(t, "GET", "/health", "", nil)
		if code != http.StatusUnauthorized {
			t.Errorf("health with %s: %d %s, want 401", name, code, b)
		}
		if code, b := c.unary(t, "/filesystem.Filesystem/Stat", pathRequest{Path: "/"}, nil); code != http.StatusUnauthorized {
			t.Errorf("stat with %s: %d %s, want 401", name, code, b)
		}
	}
	if code, _, b := root.do(t, "GET", "/health", "", nil); code != http.StatusNoContent {
		t.Fatalf("health: %d %s", code, b)
	}
	// The same sandbox by its preview host.
	byHost := root
	byHost.host = "49983-" + sb.SandboxID + "." + e.s.cfg.Domain
	if code, _, b := byHost.do(t, "GET", "/health", "", nil); code != http.StatusNoContent {
		t.Fatalf("health by host %s: %d %s", byHost.host, code, b)
	}
	gone := root
	gone.id = "inosuchsandbox000000"
	if code, _, b := gone.do(t, "GET", "/health", "", nil); code != http.StatusBadGateway || !strings.Contains(string(b), "The sandbox was not found") {
		t.Fatalf("envd of a missing sandbox: %d %s", code, b)
	}

	// A process: its output streamed in order, its exit code at the end, the
	// sandbox's and the call's environment set.
	pid, stdout, stderr, end, last := root.run(t, `echo "$SANDBOX_VAR"; echo "$CALL_VAR"; echo oops >&2; id -un; exit 3`, map[string]string{"CALL_VAR": "from-call"})
	if pid == 0 || stdout != "from-create\nfrom-call\nroot\n" || stderr != "oops\n" || end == nil || end.ExitCode != 3 || !end.Exited || last != "{}" {
		t.Fatalf("start: pid %d, stdout %q, stderr %q, end %+v, last %s", pid, stdout, stderr, end, last)
	}
	if _, stdout, _, end, _ := root.run(t, "printf ok", nil); stdout != "ok" || end == nil || end.ExitCode != 0 || end.Error != "" {
		t.Fatalf("a process that succeeds: %q %+v", stdout, end)
	}
	if _, last := root.stream(t, "/process.Process/Start", startRequest{Process: &processConfig{}}); !strings.Contains(last, `"code":"invalid_argument"`) {
		t.Fatalf("start without a command: %s", last)
	}
	// envd's default user is the image's "user"; this host has none, so
	// the agent refuses it, and the stream ends with that error.
	noUser := root
	noUser.user = ""
	if _, err := osuser.Lookup("user"); err == nil {
		t.Log("this host has a user named user: not checking envd's default user")
	} else if _, last := noUser.stream(t, "/process.Process/Start", startRequest{Process: &processConfig{Cmd: "true"}}); !strings.Contains(last, `"code":"unauthenticated"`) {
		t.Fatalf("start as a user the guest lacks: %s", last)
	}
	if code, b := root.unary(t, "/process.Process/NoSuchCall", empty{}, nil); code != http.StatusNotImplemented {
		t.Fatalf("an unknown RPC: %d %s", code, b)
	}

	// The filesystem RPCs. The fake guest's files are this host's.
	dir := t.TempDir()
	var ent entryResponse
	if code, b := root.unary(t, "/filesystem.Filesystem/MakeDir", pathRequest{Path: dir + "/a/b"}, &ent); code != 200 ||
		ent.Entry == nil || ent.Entry.Name != "b" || ent.Entry.Type != fileTypeDirectory || ent.Entry.Path != dir+"/a/b" {
		t.Fatalf("make dir: %d %s", code, b)
	}
	if code, b := root.unary(t, "/filesystem.Filesystem/MakeDir", pathRequest{Path: dir + "/a/b"}, nil); code != http.StatusConflict || !strings.Contains(string(b), "already_exists") {
		t.Fatalf("make an existing dir: %d %s", code, b)
	}
	if err := os.WriteFile(filepath.Join(dir, "a", "f.txt"), []byte("12345"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "a", "f.txt"), 0o640); err != nil { // whatever the umask
		t.Fatal(err)
	}
	var ls listDirResponse
	if code, b := root.unary(t, "/filesystem.Filesystem/ListDir", listDirRequest{Path: dir + "/a", Depth: 1}, &ls); code != 200 || len(ls.Entries) != 2 {
		t.Fatalf("list dir: %d %s", code, b)
	}
	got := map[string]*entryInfo{}
	for _, en := range ls.Entries {
		got[en.Name] = en
	}
	if f := got["f.txt"]; f == nil || f.Type != fileTypeFile || f.Size != "5" || f.Permissions != "-rw-r-----" || f.Owner != "root" {
		t.Fatalf("listed file: %+v", f)
	}
	if d := got["b"]; d == nil || d.Type != fileTypeDirectory {
		t.Fatalf("listed dir: %+v", d)
	}
	if code, b := root.unary(t, "/filesystem.Filesystem/ListDir", listDirRequest{Path: dir, Depth: 2}, &ls); code != 200 || len(ls.Entries) != 3 {
		t.Fatalf("list dir, depth 2: %d %s", code, b)
	}
	if code, b := root.unary(t, "/filesystem.Filesystem/Stat", pathRequest{Path: dir + "/a/f.txt"}, &ent); code != 200 || ent.Entry.Size != "5" || ent.Entry.Path != dir+"/a/f.txt" {
		t.Fatalf("stat: %d %s", code, b)
	}
	if code, b := root.unary(t, "/filesystem.Filesystem/Move", moveRequest{Source: dir + "/a/f.txt", Destination: dir + "/a/b/g.txt"}, &ent); code != 200 || ent.Entry.Name != "g.txt" {
		t.Fatalf("move: %d %s", code, b)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "a", "b", "g.txt")); err != nil || string(b) != "12345" {
		t.Fatalf("the moved file: %q %v", b, err)
	}
	if code, b := root.unary(t, "/filesystem.Filesystem/Stat", pathRequest{Path: dir + "/a/f.txt"}, nil); code != http.StatusNotFound || !strings.Contains(string(b), `"code":"not_found"`) {
		t.Fatalf("stat of the moved file's old path: %d %s", code, b)
	}
	if code, b := root.unary(t, "/filesystem.Filesystem/Remove", pathRequest{Path: dir + "/a"}, nil); code != 200 {
		t.Fatalf("remove: %d %s", code, b)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); !os.IsNotExist(err) {
		t.Fatalf("the removed tree: %v", err)
	}
	for rpc, in := range map[string]any{
		"/filesystem.Filesystem/Stat": pathRequest{}, "/filesystem.Filesystem/ListDir": listDirRequest{},
		"/filesystem.Filesystem/MakeDir": pathRequest{}, "/filesystem.Filesystem/Remove": pathRequest{},
		"/filesystem.Filesystem/Move": moveRequest{Source: dir},
	} {
		if code, b := root.unary(t, rpc, in, nil); code != http.StatusBadRequest || !strings.Contains(string(b), "invalid_argument") {
			t.Errorf("%s without a path: %d %s", rpc, code, b)
		}
	}

	// Uploads: a raw body to ?path=, and a multipart form whose file name
	// is the path, parents created; downloads read them back.
	code, _, b := root.do(t, "POST", "/files?path="+dir+"/up/raw.txt", "application/octet-stream", []byte("raw body"))
	var wi []writeInfo
	if err := json.Unmarshal(b, &wi); err != nil || code != 200 || len(wi) != 1 || wi[0].Path != dir+"/up/raw.txt" || wi[0].Type != "file" {
		t.Fatalf("raw upload: %d %s", code, b)
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	for name, content := range map[string]string{dir + "/up/m1.txt": "first", dir + "/up/deep/m2.txt": "second"} {
		fw, err := mw.CreateFormFile("file", name)
		if err != nil {
			t.Fatal(err)
		}
		fw.Write([]byte(content))
	}
	mw.Close()
	code, _, b = root.do(t, "POST", "/files", mw.FormDataContentType(), form.Bytes())
	if err := json.Unmarshal(b, &wi); err != nil || code != 200 || len(wi) != 2 {
		t.Fatalf("multipart upload: %d %s", code, b)
	}
	for p, want := range map[string]string{dir + "/up/raw.txt": "raw body", dir + "/up/m1.txt": "first", dir + "/up/deep/m2.txt": "second"} {
		if got, err := os.ReadFile(p); err != nil || string(got) != want {
			t.Errorf("uploaded %s: %q %v", p, got, err)
		}
		code, hdr, b := root.do(t, "GET", "/files?path="+p, "", nil)
		if code != 200 || string(b) != want || hdr.Get("Content-Type") != "application/octet-stream" {
			t.Errorf("download %s: %d %q %v", p, code, b, hdr)
		}
	}
	if code, _, b := root.do(t, "GET", "/files?path="+dir+"/up/nothing", "", nil); code != http.StatusNotFound {
		t.Fatalf("download of a missing file: %d %s", code, b)
	}
	if code, _, b := root.do(t, "GET", "/files", "", nil); code != http.StatusBadRequest || !strings.Contains(string(b), "path is required") {
		t.Fatalf("download without a path: %d %s", code, b)
	}
	if code, _, b := root.do(t, "POST", "/files", "application/octet-stream", []byte("x")); code != http.StatusBadRequest {
		t.Fatalf("raw upload without a path: %d %s", code, b)
	}
	noToken := root
	noToken.token = ""
	if code, _, b := noToken.do(t, "GET", "/files?path="+dir+"/up/raw.txt", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("download without a token: %d %s", code, b)
	}

	// A paused sandbox's envd does not answer until connect resumes it.
	if code, b := e.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/pause", e.key, ""); code != http.StatusNoContent {
		t.Fatalf("pause: %d %s", code, b)
	}
	if code, _, b := root.do(t, "GET", "/health", "", nil); code != http.StatusBadGateway || !strings.Contains(string(b), "not found") {
		t.Fatalf("envd of a paused sandbox: %d %s", code, b)
	}
	if code, b := e.call(t, "POST", "/sandboxes/"+sb.SandboxID+"/connect", e.key, `{}`); code != http.StatusCreated {
		t.Fatalf("connect: %d %s", code, b)
	}
	if _, stdout, _, end, _ := root.run(t, "cat "+dir+"/up/raw.txt", nil); stdout != "raw body" || end == nil || end.ExitCode != 0 {
		t.Fatalf("a process after the resume: %q %+v", stdout, end)
	}
}
