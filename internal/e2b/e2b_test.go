package e2b

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/guest"
)

func TestSignature(t *testing.T) {
	// Vectors computed with the published SDKs' own signing code.
	for _, c := range []struct {
		path, op, user, tok string
		exp                 int64
		want                string
	}{
		{"/home/user/a.txt", "read", "", "tok", 0, "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY"},
		{"/home/user/a.txt", "write", "root", "tok", 0, "v1_tJmkQHhVPX4HQJN798qOoaLdUnmEwsD4q0dAgTQksTY"},
		{"/home/user/a.txt", "read", "user", "tok", 1700000000, "v1_rjyaqcqTmWCotSjgdIM5sPngpduJ8ZZz/orD09SpFng"},
	} {
		if got := signature(c.path, c.op, c.user, c.tok, c.exp); got != c.want {
			t.Errorf("signature(%q, %q, %q, %q, %d) = %s, want %s", c.path, c.op, c.user, c.tok, c.exp, got, c.want)
		}
	}
}

func TestSandboxIDs(t *testing.T) {
	re := regexp.MustCompile(`^i[a-z0-9]{19}$`)
	seen := map[string]bool{}
	for range 1000 {
		id := newSandboxID()
		if !re.MatchString(id) || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
	s := New(Config{Key: []byte("k")})
	k := &auth.Principal{TokenID: "k1"}
	if a, b := s.envdToken("vm-1", k), s.envdToken("vm-2", k); a == b || a != s.envdToken("vm-1", k) || a == s.envdToken("vm-1", auth.Admin) || !strings.HasPrefix(a, "k1.") {
		t.Fatalf("envd tokens %q %q", a, b)
	}
}

func TestBasicUser(t *testing.T) {
	for h, want := range map[string]string{
		"": DefaultUser, "Basic " + base64.StdEncoding.EncodeToString([]byte("root:")): "root",
		"Basic " + base64.StdEncoding.EncodeToString([]byte(":")): DefaultUser,
	} {
		r := httptest.NewRequest("POST", "/", nil)
		if h != "" {
			r.Header.Set("Authorization", h)
		}
		if got, err := basicUser(r); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", h, got, err, want)
		}
	}
	for _, h := range []string{"Bearer x", "Basic !!!", "Basic " + base64.StdEncoding.EncodeToString([]byte("a/b:"))} {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("Authorization", h)
		if _, err := basicUser(r); err == nil {
			t.Errorf("%q accepted", h)
		}
	}
}

func TestMetadataFilter(t *testing.T) {
	// What the SDKs send: each key and value escaped, joined as a form,
	// and the whole escaped once more by the query string.
	got, err := metadataFilter("user=abc&app=prod%2520x") // after the query string is decoded
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["user"] != "abc" || got["app"] != "prod x" {
		t.Fatalf("%v", got)
	}
	if !matches(map[string]string{"user": "abc", "app": "prod x", "z": "1"}, got) || matches(map[string]string{"user": "abc"}, got) {
		t.Fatal("matches")
	}
}

func TestParseMetrics(t *testing.T) {
	m := parseMetrics("cpu  100 0 100 800 0 0 0 0 0 0\ncpu  150 0 150 900 0 0 0 0 0 0\nMemTotal:  1000 kB\nMemAvailable: 400 kB\nCached: 100 kB\n 5000 20000\n")
	if m.CPUUsedPct != 50 || m.MemTotal != 1000<<10 || m.MemUsed != 600<<10 || m.MemCache != 100<<10 || m.DiskUsed != 5000 || m.DiskTotal != 20000 {
		t.Fatalf("%+v", m)
	}
	if m := parseMetrics("garbage\ncpu x y\n\x00"); m.MemTotal != 0 || m.CPUUsedPct != 0 {
		t.Fatalf("garbage: %+v", m)
	}
}

func TestEntry(t *testing.T) {
	mt := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	e := entry(&api.FileInfo{Name: "d", Path: "/home/user/d", Type: guest.FileTypeDir, Size: 4096, Mode: 0o755, Owner: "user", Group: "user", ModTime: mt})
	b, _ := json.Marshal(e)
	want := `{"name":"d","type":"FILE_TYPE_DIRECTORY","path":"/home/user/d","size":"4096","mode":493,"permissions":"drwxr-xr-x","owner":"user","group":"user","modifiedTime":"2026-01-02T03:04:05.000000006Z"}`
	if string(b) != want {
		t.Fatalf("%s\nwant %s", b, want)
	}
	l := entry(&api.FileInfo{Name: "l", Type: guest.FileTypeSymlink, Mode: 0o777, LinkTarget: "/x", UID: 7, GID: 8})
	if l.Type != fileTypeSymlink || !l.IsSymlink || *l.SymlinkTarget != "/x" || l.Owner != "7" || l.Group != "8" || l.Permissions != "Lrwxrwxrwx" {
		t.Fatalf("%+v", l)
	}
}

func envelope(flag byte, msg string) []byte {
	b := make([]byte, 5+len(msg))
	b[0] = flag
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

// readEnvelopes splits a stream response.
func readEnvelopes(t *testing.T, body []byte) (msgs []string, end string) {
	t.Helper()
	r := &envelopeReader{br: bufio.NewReader(bytes.NewReader(body))}
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r.br, hdr[:]); err != nil {
			t.Fatalf("no end message in %q", body)
		}
		b := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		io.ReadFull(r.br, b)
		if hdr[0] == endStreamFlag {
			return msgs, string(b)
		}
		msgs = append(msgs, string(b))
	}
}

func TestConnectProtocol(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/u", func(w http.ResponseWriter, r *http.Request) {
		unary(w, r, func(ctx context.Context, req *pathRequest) (*entryResponse, error) {
			if req.Path == "" {
				return nil, rpcErr(codeInvalidArgument, "path is required")
			}
			return &entryResponse{Entry: &entryInfo{Name: req.Path}}, nil
		})
	})
	mux.HandleFunc("/s", func(w http.ResponseWriter, r *http.Request) {
		serverStream(w, r, func(ctx context.Context, req *pathRequest, st *stream) error {
			if req.Path == "sleep" {
				<-ctx.Done()
				return ctx.Err()
			}
			for _, p := range strings.Split(req.Path, ",") {
				st.Send(pathRequest{Path: p})
			}
			if req.Path == "fail" {
				return rpcErr(codeNotFound, "no such thing")
			}
			return nil
		})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func(path, ct string, body []byte, hdr map[string]string) (int, []byte) {
		req, _ := http.NewRequest("POST", srv.URL+path, bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, b := post("/u", "application/json", []byte(`{"path":"x","unknown":1}`), map[string]string{"Content-Encoding": "identity"}); code != 200 || !strings.Contains(string(b), `"name":"x"`) {
		t.Fatalf("unary: %d %s", code, b)
	}
	if code, b := post("/u", "application/json", []byte(`{}`), nil); code != 400 || !strings.Contains(string(b), `"code":"invalid_argument"`) {
		t.Fatalf("unary error: %d %s", code, b)
	}
	if code, _ := post("/u", "application/proto", nil, nil); code != 415 {
		t.Fatalf("binary codec: %d", code)
	}
	if code, _ := post("/u", "application/json", []byte(`{`), nil); code != 400 {
		t.Fatalf("bad JSON: %d", code)
	}
	code, b := post("/s", "application/connect+json", envelope(0, `{"path":"a,b"}`), nil)
	msgs, end := readEnvelopes(t, b)
	if code != 200 || len(msgs) != 2 || msgs[1] != `{"path":"b"}` || end != `{}` {
		t.Fatalf("stream: %d %q %q", code, msgs, end)
	}
	_, b = post("/s", "application/connect+json", envelope(0, `{"path":"fail"}`), nil)
	if _, end := readEnvelopes(t, b); !strings.Contains(end, `"code":"not_found"`) {
		t.Fatalf("stream error: %s", end)
	}
	_, b = post("/s", "application/connect+json", envelope(0, `{"path":"sleep"}`), map[string]string{"Connect-Timeout-Ms": "50"})
	if _, end := readEnvelopes(t, b); !strings.Contains(end, `"code":"deadline_exceeded"`) {
		t.Fatalf("deadline: %s", end)
	}
	// A gzip-compressed message (Connect-Content-Encoding: gzip, flag 1).
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write([]byte(`{"path":"z1,z2"}`))
	zw.Close()
	_, b = post("/s", "application/connect+json", envelope(1, zb.String()), map[string]string{"Connect-Content-Encoding": "gzip"})
	if msgs, end := readEnvelopes(t, b); len(msgs) != 2 || end != `{}` {
		t.Fatalf("compressed request: %q %q", msgs, end)
	}
	// Errors before the first message still come as a 200 stream.
	for _, bad := range [][]byte{envelope(1, `{}`), {0, 0xff, 0xff, 0xff, 0xff}, envelope(0, `{`)} {
		code, b := post("/s", "application/connect+json", bad, nil)
		if _, end := readEnvelopes(t, b); code != 200 || !strings.Contains(end, `"error"`) {
			t.Fatalf("bad request %q: %d %s", bad, code, end)
		}
	}
}
