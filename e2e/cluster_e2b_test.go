package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
	"github.com/agentvm/agentvm/pkg/client"
)

// clusterE2B drives an E2B sandbox that node b runs through node a: its
// control plane (info, pause, connect, kill) on node a's API, and envd
// (file upload and download, with the sandbox's access token) through node
// a's preview proxy.
func clusterE2B(t *testing.T, ctx context.Context, a, b *testenv.Server) {
	t.Helper()
	key, errOut, code := a.CLI("", "token", "create", "--e2b")
	if key = strings.TrimSpace(key); code != 0 || !strings.HasPrefix(key, "e2b_") {
		t.Fatalf("token create --e2b: %q %q %d", key, errOut, code)
	}
	e2bCall := func(s *testenv.Server, method, path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, s.URL+path, strings.NewReader(body))
		req.Header.Set("X-API-KEY", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Timeout: 5 * time.Minute}).Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out map[string]any
		json.Unmarshal(raw, &out)
		return resp.StatusCode, out
	}
	code, sb := e2bCall(b, "POST", "/sandboxes", `{"templateID":"base","timeout":600}`)
	id, _ := sb["sandboxID"].(string)
	token, _ := sb["envdAccessToken"].(string)
	if code != 201 || id == "" || token == "" {
		t.Fatalf("create a sandbox on node b: %d %v", code, sb)
	}
	if v, err := b.Client.GetVM(ctx, id); err != nil || v.Node != "node-b" {
		t.Fatalf("the sandbox's VM: %+v %v", v, err)
	}
	if code, info := e2bCall(a, "GET", "/sandboxes/"+id, ""); code != 200 || info["sandboxID"] != id {
		t.Fatalf("sandbox info through node a: %d %v", code, info)
	}

	h, err := a.Client.Health(ctx)
	if err != nil || h.Proxy == "" {
		t.Fatalf("health of node a: %+v %v", h, err)
	}
	pv := &previewEnv{t: t, s: a, proxy: h.Proxy, domain: h.Domain}
	envd := pv.host(49983, id)
	if resp, body := pv.do("POST", envd, "/files?path=/home/user/e2b.txt", strings.NewReader("written through node a"), map[string]string{"X-Access-Token": token}); resp.StatusCode != 200 {
		t.Fatalf("envd upload through node a: %d %q", resp.StatusCode, body)
	}
	if r := b.Exec(ctx, id, "cat /home/user/e2b.txt"); r.Stdout != "written through node a" {
		t.Fatalf("the file envd wrote through node a, on node b: %+v", r)
	}
	if resp, body := pv.do("GET", envd, "/files?path=/home/user/e2b.txt", nil, map[string]string{"X-Access-Token": token}); resp.StatusCode != 200 || body != "written through node a" {
		t.Fatalf("envd download through node a: %d %q", resp.StatusCode, body)
	}
	if resp, body := pv.do("GET", envd, "/files?path=/home/user/e2b.txt", nil, map[string]string{"X-Access-Token": "wrong"}); resp.StatusCode != 401 {
		t.Fatalf("envd with a wrong access token through node a: %d %q", resp.StatusCode, body)
	}

	if code, out := e2bCall(a, "POST", "/sandboxes/"+id+"/pause", ""); code != 204 {
		t.Fatalf("pause through node a: %d %v", code, out)
	}
	if v, err := b.Client.GetVM(ctx, id); err != nil || v.State == api.StateRunning || v.Node != "node-b" {
		t.Fatalf("the sandbox after its pause through node a: %+v %v", v, err)
	}
	if code, out := e2bCall(a, "POST", "/sandboxes/"+id+"/connect", `{"timeout":600}`); code != 200 && code != 201 {
		t.Fatalf("connect (resume) through node a: %d %v", code, out)
	}
	if r := b.Exec(ctx, id, "cat /home/user/e2b.txt"); r.Stdout != "written through node a" {
		t.Fatalf("the sandbox after its resume through node a: %+v", r)
	}
	if code, out := e2bCall(a, "DELETE", "/sandboxes/"+id, ""); code != 204 {
		t.Fatalf("kill through node a: %d %v", code, out)
	}
	var ae *client.APIError
	if _, err := b.Client.GetVM(ctx, id); !errors.As(err, &ae) || ae.Status != 404 {
		t.Fatalf("the sandbox after its kill through node a: %v", err)
	}
}
