package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
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
)

func isStatus(err error, status int) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.Status == status
}

func rawRequest(t *testing.T, s *testenv.Server, method, path, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, s.URL+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	t.Run("auth", func(t *testing.T) {
		if code, body := rawRequest(t, s, "GET", "/v1/health", "", ""); code != 200 || !strings.Contains(body, `"ok"`) {
			t.Fatalf("health: %d %s", code, body)
		}
		for _, tok := range []string{"", "wrong"} {
			code, body := rawRequest(t, s, "GET", "/v1/vms", tok, "")
			if code != 401 || !strings.Contains(body, `"unauthorized"`) {
				t.Fatalf("token %q: %d %s", tok, code, body)
			}
		}
		st, err := os.Stat(filepath.Join(s.DataDir, "admin.token"))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("admin.token mode: %v %v", st.Mode(), err)
		}
	})
	cases := []struct {
		name, body string
		status     int
		msg        string
	}{
		{"bad memory", `{"memory":"12X"}`, 400, "invalid size"},
		{"zero memory", `{"memory":0.01}`, 400, "memory must be at least"},
		{"bad disk", `{"disk":"-5G"}`, 400, "invalid size"},
		{"disk smaller than image", `{"disk":"1G"}`, 400, "disk must be at least"},
		{"bad name", `{"name":"Bad_Name!"}`, 400, "invalid name"},
		{"too many cpus", `{"cpus":1000}`, 400, "cpus must be between"},
		{"unknown field", `{"nmae":"x"}`, 400, "unknown field"},
		{"not json", `{`, 400, "invalid JSON"},
		{"bad env", `{"env":{"1BAD":"x"}}`, 400, "invalid environment variable"},
		{"too much memory", `{"memory":"4T"}`, 507, "memory requested"},
		{"too much disk", `{"disk":"900T"}`, 507, "disk needs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := rawRequest(t, s, "POST", "/v1/vms", s.Token, c.body)
			if code != c.status || !strings.Contains(body, c.msg) || !strings.Contains(body, `"error"`) {
				t.Fatalf("%s: got %d %s, want %d with %q", c.body, code, body, c.status, c.msg)
			}
		})
	}
	t.Run("refusals are counted", func(t *testing.T) {
		code, body := rawRequest(t, s, "GET", "/metrics", s.Token, "")
		for _, want := range []string{"agentvm_admission_refusals_total{resource=\"memory\"} 1\n", "agentvm_admission_refusals_total{resource=\"disk\"} 1\n"} {
			if code != 200 || !strings.Contains(body, want) {
				t.Fatalf("metrics: %d, no %q in\n%s", code, want, body)
			}
		}
		if !strings.Contains(s.Logs(), "refused: the host is short of memory") {
			t.Fatal("no log line for the refused create")
		}
	})
	t.Run("cli sizes", func(t *testing.T) {
		_, errOut, code := s.CLI("", "create", "--memory", "lots")
		if code == 0 || !strings.Contains(errOut, "--memory: invalid size") {
			t.Fatalf("cli --memory lots: %d %q", code, errOut)
		}
	})
	t.Run("unknown VM", func(t *testing.T) {
		_, err := s.Client.GetVM(ctx, "nope")
		if !isStatus(err, 404) {
			t.Fatalf("get: %v", err)
		}
		_, errOut, code := s.CLI("", "inspect", "nope")
		if code == 0 || !strings.Contains(errOut, `no VM named or with id "nope"`) {
			t.Fatalf("cli inspect: %d %q", code, errOut)
		}
		for _, p := range []string{"/v1/vms/nope/exec", "/v1/vms/nope/stop", "/v1/vms/nope/start"} {
			if code, body := rawRequest(t, s, "POST", p, s.Token, `{"cmd":["true"]}`); code != 404 {
				t.Fatalf("%s: %d %s", p, code, body)
			}
		}
		if code, _ := rawRequest(t, s, "DELETE", "/v1/vms/nope", s.Token, ""); code != 404 {
			t.Fatalf("delete unknown: %d", code)
		}
	})
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "valid"})
	t.Run("bad exec requests", func(t *testing.T) {
		for body, msg := range map[string]string{
			`{}`:                                 "missing command",
			`{"cmd":["true"],"shell":"true"}`:    "not both",
			`{"cmd":["true"],"cwd":"relative"}`:  "absolute path",
			`{"cmd":["true"],"user":"no such"}`:  "invalid user",
			`{"cmd":["true"],"user":"ghost"}`:    "ghost",
			`{"cmd":["true"],"cwd":"/nonexist"}`: "nonexist",
			`{"cmd":["true"],"timeout":"-1s"}`:   "invalid duration",
		} {
			code, resp := rawRequest(t, s, "POST", "/v1/vms/valid/exec", s.Token, body)
			if code != 400 || !strings.Contains(resp, msg) {
				t.Errorf("%s: %d %s (want 400 %q)", body, code, resp, msg)
			}
		}
	})
	t.Run("bad lifecycle requests", func(t *testing.T) {
		for _, c := range []struct{ path, body, msg string }{
			{"/v1/vms/valid/fork", `{"count":0}`, "count must be between 1 and 32"},
			{"/v1/vms/valid/fork", `{"count":100}`, "count must be between 1 and 32"},
			{"/v1/vms/valid/resize", `{}`, "nothing to resize"},
			{"/v1/vms/valid/resize", `{"disk":"1G"}`, "shrinking the disk is not supported"},
			{"/v1/vms/valid/resize", `{"memory":"64M"}`, "memory must be at least"},
			{"/v1/vms/valid/snapshot", `{"name":"Bad Name"}`, "invalid snapshot name"},
			{"/v1/vms/valid/snapshot", `{"name":"snap-0123456789ab"}`, "reserved for snapshot ids"},
		} {
			code, resp := rawRequest(t, s, "POST", c.path, s.Token, c.body)
			if code != 400 || !strings.Contains(resp, c.msg) {
				t.Errorf("%s %s: %d %s (want 400 %q)", c.path, c.body, code, resp, c.msg)
			}
		}
		if code, _ := rawRequest(t, s, "GET", "/v1/snapshots/nope", s.Token, ""); code != 404 {
			t.Errorf("unknown snapshot: %d", code)
		}
		if code, _ := rawRequest(t, s, "POST", "/v1/vms/valid/resume", s.Token, ""); code != 200 {
			t.Errorf("resume of a running VM is a no-op, got %d", code)
		}
	})
	t.Run("ctrl-c reaches the remote command", func(t *testing.T) {
		cmd := exec.Command(filepath.Join(s.Bin, "agentvm"), "exec", "valid", "--", "sh", "-c", `trap "echo interrupted; exit 7" INT; echo ready; sleep 60 & wait`)
		cmd.Env = append(os.Environ(), "AGENTVM_URL="+s.URL, "AGENTVM_DATA_DIR="+s.DataDir, "AGENTVM_TOKEN=")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stuck := time.AfterFunc(3*time.Minute, func() { cmd.Process.Kill() }) // a stalled CLI fails, not hangs
		defer stuck.Stop()
		// Ctrl-C once the remote shell has its trap (it says so)
		br := bufio.NewReader(stdout)
		if line, err := br.ReadString('\n'); err != nil || line != "ready\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("before Ctrl-C: %q %v", line, err)
		}
		cmd.Process.Signal(os.Interrupt)
		rest, _ := io.ReadAll(br)
		err = cmd.Wait()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 || !strings.Contains(string(rest), "interrupted") {
			t.Fatalf("exec after Ctrl-C: %v %q", err, rest)
		}
	})
	t.Run("duplicate name", func(t *testing.T) {
		_, err := s.Client.CreateVM(ctx, api.CreateVMRequest{Name: "valid", Memory: 512 << 20})
		if !isStatus(err, 409) || !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("duplicate: %v", err)
		}
	})
	t.Run("failed create leaves nothing behind", func(t *testing.T) {
		// A second server whose template snapshot is corrupt: the restore fails
		// after QEMU, overlay, sockets and row were made; all must be gone.
		tplDir := t.TempDir()
		src := filepath.Join(os.Getenv("HOME"), ".cache", "agentvm", "templates", v.Template)
		dst := filepath.Join(tplDir, v.Template)
		if out, err := exec.Command("cp", "-a", "--reflink=auto", src, dst).CombinedOutput(); err != nil {
			t.Skipf("cannot copy template (%v: %s)", err, out)
		}
		os.Chmod(filepath.Join(dst, "state"), 0o644)
		if err := os.WriteFile(filepath.Join(dst, "state"), []byte("not a migration stream"), 0o444); err != nil {
			t.Fatal(err)
		}
		bad := testenv.Start(t, "", "--template-dir", tplDir)
		_, err := bad.Client.CreateVM(ctx, api.CreateVMRequest{Name: "doomed", Memory: 512 << 20})
		if err == nil || isStatus(err, 201) {
			t.Fatal("create from a corrupt template succeeded")
		}
		if vms, _ := bad.Client.ListVMs(ctx); len(vms) != 0 {
			t.Fatalf("rows left: %+v", vms)
		}
		if ents, _ := os.ReadDir(filepath.Join(bad.DataDir, "vms")); len(ents) != 0 {
			t.Fatalf("VM dirs left: %v", ents)
		}
		for _, p := range testenv.AllQEMUProcesses() {
			if strings.Contains(p, "doomed") || strings.Contains(p, bad.DataDir) {
				t.Fatalf("QEMU left running: %s", p)
			}
		}
		if n := testenv.RunDirEntries(bad.DataDir); n != 0 {
			t.Fatalf("%d socket dirs left", n)
		}
	})
}
