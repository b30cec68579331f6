package e2e

import (
	"bytes"
	"context"
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

// TestTokenScopes is the scope matrix: a token opens exactly its VM, only
// with the permissions it holds, and only as its user.
func TestTokenScopes(t *testing.T) {
	t.Parallel()
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	a := s.CreateVM(ctx, api.CreateVMRequest{Name: "scope-a"})
	b := s.CreateVM(ctx, api.CreateVMRequest{Name: "scope-b"})
	adm := s.Client
	mk := func(req api.CreateTokenRequest) *client.Client {
		t.Helper()
		tok, err := adm.CreateToken(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return client.New(s.URL, tok.Secret)
	}
	execOnly := mk(api.CreateTokenRequest{VM: a.Name, Allow: []string{"exec"}})
	filesOnly := mk(api.CreateTokenRequest{VM: a.ID, Allow: []string{"files"}})
	agentAll := mk(api.CreateTokenRequest{VM: a.ID, User: "agent"})
	if _, err := adm.CreateTerminal(ctx, a.ID, api.TermCreate{Name: "rootterm"}); err != nil {
		t.Fatal(err)
	}

	type call struct {
		name string
		fn   func(c *client.Client) error
	}
	execAs := func(vm, user string) func(c *client.Client) error {
		return func(c *client.Client) error {
			r, err := c.Exec(ctx, vm, api.ExecRequest{Shell: "whoami", User: user})
			if err == nil && r.ExitCode != 0 {
				t.Fatalf("exec failed: %+v", r)
			}
			return err
		}
	}
	calls := []call{
		{"get A", func(c *client.Client) error { _, err := c.GetVM(ctx, a.ID); return err }},
		{"get B", func(c *client.Client) error { _, err := c.GetVM(ctx, b.ID); return err }},
		{"list", func(c *client.Client) error { _, err := c.ListVMs(ctx); return err }},
		{"create", func(c *client.Client) error {
			_, err := c.CreateVM(ctx, api.CreateVMRequest{Memory: 512 << 20})
			return err
		}},
		{"delete A", func(c *client.Client) error { return c.DeleteVM(ctx, "scope-a-does-not-exist") }},
		{"exec A", execAs(a.ID, "")},
		{"exec A as root", execAs(a.ID, "root")},
		{"exec A by name", execAs("scope-a", "")},
		{"exec B", execAs(b.ID, "")},
		{"files A", func(c *client.Client) error {
			_, err := c.Stat(ctx, a.ID, "/etc/hostname", client.FileOptions{})
			return err
		}},
		{"files A as root", func(c *client.Client) error {
			_, err := c.Stat(ctx, a.ID, "/etc/hostname", client.FileOptions{User: "root"})
			return err
		}},
		{"files B", func(c *client.Client) error {
			_, err := c.Stat(ctx, b.ID, "/etc/hostname", client.FileOptions{})
			return err
		}},
		{"terminals A", func(c *client.Client) error { _, err := c.ListTerminals(ctx, a.ID); return err }},
		{"root terminal", func(c *client.Client) error { _, err := c.GetTerminal(ctx, a.ID, "rootterm"); return err }},
		{"tokens", func(c *client.Client) error { _, err := c.ListTokens(ctx, ""); return err }},
		{"snapshot", func(c *client.Client) error { _, err := c.Snapshot(ctx, a.ID, ""); return err }},
		{"stop", func(c *client.Client) error { _, err := c.StopVM(ctx, a.ID); return err }},
	}
	// want[token][call] = expected HTTP status (0 = success)
	want := map[string]map[string]int{
		"exec": {"get A": 0, "get B": 403, "list": 403, "create": 403, "delete A": 403, "exec A": 0, "exec A as root": 0,
			"exec A by name": 0, "exec B": 403, "files A": 403, "files A as root": 403, "files B": 403, "terminals A": 403,
			"root terminal": 403, "tokens": 403, "snapshot": 403, "stop": 403},
		"files": {"get A": 0, "get B": 403, "list": 403, "create": 403, "delete A": 403, "exec A": 403, "exec A as root": 403,
			"exec A by name": 403, "exec B": 403, "files A": 0, "files A as root": 0, "files B": 403, "terminals A": 403,
			"root terminal": 403, "tokens": 403, "snapshot": 403, "stop": 403},
		"agent": {"get A": 0, "get B": 403, "list": 403, "create": 403, "delete A": 403, "exec A": 0, "exec A as root": 403,
			"exec A by name": 0, "exec B": 403, "files A": 0, "files A as root": 403, "files B": 403, "terminals A": 0,
			"root terminal": 403, "tokens": 403, "snapshot": 403, "stop": 403},
	}
	for tname, c := range map[string]*client.Client{"exec": execOnly, "files": filesOnly, "agent": agentAll} {
		for _, cl := range calls {
			err := cl.fn(c)
			exp := want[tname][cl.name]
			if exp == 0 && err != nil {
				t.Errorf("token %s: %s: %v", tname, cl.name, err)
			}
			if exp != 0 {
				if ae, ok := err.(*client.APIError); !ok || ae.Status != exp {
					t.Errorf("token %s: %s: want %d, got %v", tname, cl.name, exp, err)
				}
			}
		}
	}
	// the agent token's exec runs as agent
	if r, err := agentAll.Exec(ctx, a.ID, api.ExecRequest{Shell: "whoami"}); err != nil || r.Stdout != "agent\n" {
		t.Fatalf("agent token exec: %v %+v", err, r)
	}
	// the agent token sees only agent terminals
	if ts, err := agentAll.ListTerminals(ctx, a.ID); err != nil || len(ts) != 0 {
		t.Fatalf("agent token lists others' terminals: %v %+v", err, ts)
	}
	if _, err := agentAll.CreateTerminal(ctx, a.ID, api.TermCreate{Name: "mine"}); err != nil {
		t.Fatal(err)
	}
	if ts, _ := agentAll.ListTerminals(ctx, a.ID); len(ts) != 1 || ts[0].User != "agent" {
		t.Fatalf("agent terminals: %+v", ts)
	}

	t.Run("unauthenticated, expired, revoked", func(t *testing.T) {
		for _, c := range []*client.Client{client.New(s.URL, ""), client.New(s.URL, "avt_nope"), client.New(s.URL, s.Token+"x")} {
			_, err := c.GetVM(ctx, a.ID)
			wantStatus(t, err, 401, api.CodeUnauthorized)
		}
		short, err := adm.CreateToken(ctx, api.CreateTokenRequest{VM: a.ID, TTL: "1s"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		_, err = client.New(s.URL, short.Secret).GetVM(ctx, a.ID)
		wantStatus(t, err, 401, "")
		tok, _ := adm.CreateToken(ctx, api.CreateTokenRequest{VM: a.ID})
		if err := adm.RevokeToken(ctx, tok.ID); err != nil {
			t.Fatal(err)
		}
		_, err = client.New(s.URL, tok.Secret).GetVM(ctx, a.ID)
		wantStatus(t, err, 401, "")
		_, err = adm.CreateToken(ctx, api.CreateTokenRequest{VM: a.ID, Allow: []string{"everything"}})
		wantStatus(t, err, 400, api.CodeInvalid)
		_, err = adm.CreateToken(ctx, api.CreateTokenRequest{VM: "nosuchvm"})
		wantStatus(t, err, 404, "")
		_, err = adm.CreateToken(ctx, api.CreateTokenRequest{VM: a.ID, TTL: "forever"})
		wantStatus(t, err, 400, api.CodeInvalid)
	})

	t.Run("CLI", func(t *testing.T) {
		out, errOut, code := s.CLI("", "token", "create", "scope-a", "--allow", "exec", "--ttl", "10m", "--user", "agent")
		if code != 0 || !strings.HasPrefix(out, "avt_") {
			t.Fatalf("token create: %d %q %q", code, out, errOut)
		}
		secret := strings.TrimSpace(out)
		run := func(args ...string) (string, string, int) {
			cmd := exec.Command(filepath.Join(s.Bin, "agentvm"), args...)
			cmd.Env = append(os.Environ(), "AGENTVM_URL="+s.URL, "AGENTVM_TOKEN="+secret, "AGENTVM_DATA_DIR=/nonexistent")
			var o, e bytes.Buffer
			cmd.Stdout, cmd.Stderr = &o, &e
			err := cmd.Run()
			c := 0
			if ee, ok := err.(*exec.ExitError); ok {
				c = ee.ExitCode()
			}
			return o.String(), e.String(), c
		}
		if out, errOut, code := run("exec", "scope-a", "--", "whoami"); code != 0 || out != "agent\n" {
			t.Fatalf("scoped exec: %d %q %q", code, out, errOut)
		}
		if _, errOut, code := run("ls"); code == 0 || !strings.Contains(errOut, "admin token") {
			t.Fatalf("scoped ls: %d %q", code, errOut)
		}
		out, _, _ = s.CLI("", "token", "ls", "--vm", "scope-a")
		if !strings.Contains(out, "exec") || !strings.Contains(out, "agent") || strings.Contains(out, secret) {
			t.Fatalf("token ls: %q", out)
		}
	})

	t.Run("tokens die with their VM", func(t *testing.T) {
		if err := adm.DeleteVM(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		ts, err := adm.ListTokens(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range ts {
			if tk.VMID == a.ID {
				t.Fatalf("token of a deleted VM: %+v", tk)
			}
		}
	})
}
