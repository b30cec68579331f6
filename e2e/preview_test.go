package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
	"github.com/coder/websocket"
)

// startWebServer builds e2e/testdata/websrv, copies it into the VM and runs
// it on :8000 in the background.
func startWebServer(t *testing.T, s *testenv.Server, vm string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "websrv")
	cmd := exec.Command("go", "build", "-o", bin, "./e2e/testdata/websrv")
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build websrv: %v\n%s", err, out)
	}
	f, _ := os.Open(bin)
	defer f.Close()
	fi, _ := f.Stat()
	ctx := context.Background()
	if _, err := s.Client.WriteFile(ctx, vm, "/usr/local/bin/websrv", f, fi.Size(), client.WriteOptions{Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	r := s.Exec(ctx, vm, "nohup /usr/local/bin/websrv :8000 >/tmp/websrv.log 2>&1 & for i in $(seq 200); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; cat /tmp/websrv.log; exit 1")
	if r.ExitCode != 0 {
		t.Fatalf("websrv did not start: %+v", r)
	}
}

type previewEnv struct {
	t      *testing.T
	s      *testenv.Server
	proxy  string // host:port of the preview proxy
	domain string
}

func (p *previewEnv) host(port int, vm string) string {
	return fmt.Sprintf("%d-%s.%s", port, vm, p.domain)
}

// get sends a request to the proxy with the given Host header.
func (p *previewEnv) do(method, host, path string, body io.Reader, hdr map[string]string) (*http.Response, string) {
	p.t.Helper()
	req, _ := http.NewRequest(method, "http://"+p.proxy+path, body)
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	c := &http.Client{Timeout: 60 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		p.t.Fatalf("%s %s%s: %v", method, host, path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func TestPreviewURLs(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	h, err := s.Client.Health(ctx)
	if err != nil || h.Proxy == "" {
		t.Fatalf("health: %v %+v", err, h)
	}
	p := &previewEnv{t: t, s: s, proxy: h.Proxy, domain: h.Domain}
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "web1"})
	startWebServer(t, s, v.ID)
	host := p.host(8000, "web1")
	admin := map[string]string{"Authorization": "Bearer " + s.Token}

	t.Run("private by default, tokens open it", func(t *testing.T) {
		resp, body := p.do("GET", host, "/", nil, nil)
		if resp.StatusCode != 401 || !strings.Contains(body, "private") {
			t.Fatalf("no token: %d %q", resp.StatusCode, body)
		}
		resp, body = p.do("GET", host, "/x", nil, admin)
		if resp.StatusCode != 200 || body != "hello from HTTP/1.1 /x\n" {
			t.Fatalf("admin: %d %q", resp.StatusCode, body)
		}
		prev, _ := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{"preview"}})
		noPrev, _ := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID, Allow: []string{"exec"}})
		resp, _ = p.do("GET", host, "/", nil, map[string]string{"Authorization": "Bearer " + noPrev.Secret})
		if resp.StatusCode != 403 {
			t.Fatalf("token without preview: %d", resp.StatusCode)
		}
		// the query parameter becomes a cookie, then the URL is clean
		resp, _ = p.do("GET", host, "/page?a=1&agentvm_token="+prev.Secret, nil, nil)
		if resp.StatusCode != 302 || resp.Header.Get("Location") != "/page?a=1" || len(resp.Cookies()) != 1 {
			t.Fatalf("token parameter: %d %v", resp.StatusCode, resp.Header)
		}
		ck := resp.Cookies()[0]
		resp, body = p.do("GET", host, "/headers", nil, map[string]string{"Cookie": ck.Name + "=" + ck.Value + "; app=1"})
		var hd map[string]string
		json.Unmarshal([]byte(body), &hd)
		if resp.StatusCode != 200 || hd["cookie"] != "app=1" || hd["authorization"] != "" {
			t.Fatalf("cookie: %d %q (the app must not see agentvm's token)", resp.StatusCode, body)
		}
		// another VM's URL with this cookie/token is refused
		other := s.CreateVM(ctx, api.CreateVMRequest{Name: "web2"})
		resp, _ = p.do("GET", p.host(8000, "web2"), "/", nil, map[string]string{"Authorization": "Bearer " + prev.Secret})
		if resp.StatusCode != 403 {
			t.Fatalf("token of web1 on web2: %d", resp.StatusCode)
		}
		if _, err := s.Client.StopVM(ctx, other.ID); err != nil {
			t.Fatal(err)
		}
		resp, body = p.do("GET", p.host(8000, "web2"), "/", nil, admin)
		if resp.StatusCode != 503 || !strings.Contains(body, "stopped") {
			t.Fatalf("stopped VM: %d %q", resp.StatusCode, body)
		}
	})

	t.Run("public, headers, errors", func(t *testing.T) {
		out, errOut, code := s.CLI("", "expose", "web1", "8000", "--public")
		if code != 0 || !strings.Contains(out, "http://8000-web1."+p.domain+":") {
			t.Fatalf("expose: %d %q %q", code, out, errOut)
		}
		resp, body := p.do("GET", host, "/headers", nil, nil)
		var hd map[string]string
		json.Unmarshal([]byte(body), &hd)
		if resp.StatusCode != 200 || hd["host"] != host || hd["xfh"] != host || hd["xfp"] != "http" || hd["xff"] != "127.0.0.1" {
			t.Fatalf("headers: %d %q", resp.StatusCode, body)
		}
		start := time.Now()
		resp, body = p.do("GET", p.host(9, "web1"), "/", nil, admin)
		if resp.StatusCode != 502 || !strings.Contains(body, "nothing is listening on port 9") || time.Since(start) > 20*time.Second {
			t.Fatalf("nothing listening: %d %q after %v", resp.StatusCode, body, time.Since(start))
		}
		resp, _ = p.do("GET", "8000-nosuchvm."+p.domain, "/", nil, admin)
		if resp.StatusCode != 404 {
			t.Fatalf("unknown VM: %d", resp.StatusCode)
		}
		vmOut, _, _ := s.CLI("", "inspect", "web1")
		if !strings.Contains(vmOut, `"url": "http://8000-web1.`) {
			t.Fatalf("inspect does not show the port: %s", vmOut)
		}
	})

	t.Run("streaming upload, SSE, WebSocket, h2c", func(t *testing.T) {
		data := bytes.Repeat([]byte("0123456789abcdef"), 2<<20) // 32 MiB
		sum := sha256.Sum256(data)
		resp, body := p.do("POST", host, "/upload", bytes.NewReader(data), nil)
		if resp.StatusCode != 200 || body != fmt.Sprintf("%d %s\n", len(data), hex.EncodeToString(sum[:])) {
			t.Fatalf("upload: %d %q", resp.StatusCode, body)
		}

		// The server sends the rest of the stream only once the test has
		// received the first event and asked for the rest: a proxy that
		// held the stream back would time it out.
		req, _ := http.NewRequest("GET", "http://"+p.proxy+"/events?id=sse1", nil)
		req.Host = host
		sresp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer sresp.Body.Close()
		first := make(chan string, 1)
		all := make(chan string, 1)
		go func() {
			var got strings.Builder
			buf := make([]byte, 4096)
			sent := false
			for {
				n, err := sresp.Body.Read(buf)
				got.Write(buf[:n])
				if !sent && strings.Contains(got.String(), "data: event-1\n\n") {
					first <- got.String()
					sent = true
				}
				if err != nil {
					break
				}
			}
			all <- got.String()
		}()
		select {
		case <-first:
		case <-time.After(90 * time.Second):
			t.Fatal("the first event did not arrive before the stream went on")
		}
		if resp, body := p.do("GET", host, "/events/go?id=sse1", nil, nil); resp.StatusCode != 200 {
			t.Fatalf("release: %d %q", resp.StatusCode, body)
		}
		var got string
		select {
		case got = <-all:
		case <-time.After(3 * time.Minute):
			t.Fatal("the SSE stream did not end")
		}
		if strings.Count(got, "data: event-") != 5 || strings.Contains(got, "timeout") {
			t.Fatalf("SSE: %q", got)
		}

		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		defer wcancel()
		ws, _, err := websocket.Dial(wctx, "ws://"+p.proxy+"/ws", &websocket.DialOptions{Host: host})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			msg := fmt.Sprintf("ping-%d", i)
			ws.Write(wctx, websocket.MessageText, []byte(msg))
			_, b, err := ws.Read(wctx)
			if err != nil || string(b) != "echo:"+msg {
				t.Fatalf("websocket: %q %v", b, err)
			}
		}
		ws.Close(websocket.StatusNormalClosure, "")

		prot := new(http.Protocols)
		prot.SetUnencryptedHTTP2(true)
		h2 := &http.Client{Transport: &http.Transport{Protocols: prot}, Timeout: time.Minute}
		req, _ = http.NewRequest("GET", "http://"+p.proxy+"/h2", nil)
		req.Host = host
		hresp, err := h2.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(hresp.Body)
		hresp.Body.Close()
		if hresp.ProtoMajor != 2 || !strings.HasPrefix(string(b), "hello from") {
			t.Fatalf("h2c: %s %q", hresp.Proto, b)
		}
	})

	t.Run("wakes a suspended VM", func(t *testing.T) {
		if _, err := s.Client.SuspendVM(ctx, v.ID); err != nil {
			t.Fatal(err)
		}
		resp, body := p.do("GET", host, "/after-wake", nil, nil)
		if resp.StatusCode != 200 || body != "hello from HTTP/1.1 /after-wake\n" {
			t.Fatalf("after suspend: %d %q", resp.StatusCode, body)
		}
	})

	t.Run("custom domain and TCP exposure", func(t *testing.T) {
		if _, err := s.Client.AddDomain(ctx, api.Domain{Domain: "app.example.test", VM: "web1", Port: 8000}); err != nil {
			t.Fatal(err)
		}
		resp, body := p.do("GET", "app.example.test", "/d", nil, nil)
		if resp.StatusCode != 200 || body != "hello from HTTP/1.1 /d\n" {
			t.Fatalf("custom domain: %d %q", resp.StatusCode, body)
		}
		out, errOut, code := s.CLI("", "expose", "web1", "8000", "--tcp")
		addr := strings.TrimSpace(out)
		if code != 0 || !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Fatalf("expose --tcp: %d %q %q", code, out, errOut)
		}
		resp2, err := http.Get("http://" + addr + "/tcp")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp2.Body)
		resp2.Body.Close()
		if string(b) != "hello from HTTP/1.1 /tcp\n" {
			t.Fatalf("through the TCP exposure: %q", b)
		}
		ps, _ := s.Client.ListPorts(ctx, v.ID)
		if len(ps) != 2 {
			t.Fatalf("ports: %+v", ps)
		}
		if _, _, code := s.CLI("", "unexpose", "web1", "8000", "--tcp"); code != 0 {
			t.Fatal("unexpose failed")
		}
		if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
			c.Close()
			t.Fatal("the TCP exposure still listens after unexpose")
		}
		_, errOut, code = s.CLI("", "expose", "web1", "70000")
		if code == 0 || !strings.Contains(errOut, "between 1 and 65535") {
			t.Fatalf("bad port: %d %q", code, errOut)
		}
	})
}
