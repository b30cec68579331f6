package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// The compatibility benchmark: the published e2b npm package (installed
// into the run's temp dir) and the MCP exec tool against agentvm's own Go
// client, on the same server in the same run: create-to-first-command, and
// the round trip of a command that does nothing.

const e2bPackage = "e2b@2.51.0"

// e2bScript measures with the SDK and prints one JSON line.
const e2bScript = `import { Sandbox } from 'e2b'
const creates = Number(process.argv[2]), runs = Number(process.argv[3])
const out = { create_ms: [], run_ms: [] }
for (let i = 0; i < creates; i++) {
  const t0 = performance.now()
  const s = await Sandbox.create({ timeoutMs: 600_000 })
  await s.commands.run('true')
  out.create_ms.push(performance.now() - t0)
  await s.kill()
}
const s = await Sandbox.create({ timeoutMs: 600_000 })
for (let i = 0; i < 3; i++) await s.commands.run('true')
for (let i = 0; i < runs; i++) {
  const t0 = performance.now()
  await s.commands.run('true')
  out.run_ms.push(performance.now() - t0)
}
out.sandbox = s.sandboxId // the Go client measures on this same VM next
console.log(JSON.stringify(out))
`

// E2BReport is the result of -e2b.
type E2BReport struct {
	CreateSDK      Stats   `json:"create_to_first_command_e2b_sdk"`
	CreateAgentVM  Stats   `json:"create_to_first_command_agentvm_client"`
	CreateRatio    float64 `json:"create_ratio"`
	RunSDK         Stats   `json:"run_true_e2b_sdk"`
	ExecAgentVM    Stats   `json:"exec_true_agentvm_client"`
	LoginAgentVM   Stats   `json:"exec_bash_login_true_agentvm_client"`
	RunRatio       float64 `json:"run_ratio"`
	MCPExec        Stats   `json:"exec_true_mcp_streamable_http"`
	MCPRatio       float64 `json:"mcp_ratio"`
	SDKVersion     string  `json:"sdk"`
	NodeVersion    string  `json:"node"`
	WarmPoolPerRun int     `json:"warm_pool"`
}

func (b *bench) runE2B(ctx context.Context) error {
	r := &E2BReport{SDKVersion: e2bPackage}
	b.r.E2B = r
	nv, _ := exec.Command("node", "--version").Output()
	r.NodeVersion = strings.TrimSpace(string(nv))
	dir, err := b.installE2B(ctx)
	if err != nil {
		return fmt.Errorf("e2b: %w", err)
	}
	key, err := b.c.CreateToken(ctx, api.CreateTokenRequest{E2B: true})
	if err != nil {
		return err
	}
	h, err := b.c.Health(ctx)
	if err != nil || h.Proxy == "" {
		return fmt.Errorf("e2b: the server has no preview proxy: %v", err)
	}
	_, port, _ := strings.Cut(h.Proxy, ":")

	// agentvm's own client first: create, first exec, delete.
	var create, execs, login []float64
	for i := 0; i < b.o.creates; i++ {
		t0 := time.Now()
		v, err := b.c.CreateVM(ctx, api.CreateVMRequest{})
		if err != nil {
			return err
		}
		b.track(v.ID, v.PID)
		if _, err := b.c.Exec(ctx, v.ID, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return err
		}
		create = append(create, millis(time.Since(t0)))
		if err := b.remove(v.ID); err != nil {
			return err
		}
	}
	r.CreateAgentVM = summarize(create)

	logf("e2b SDK: %d creates, %d commands.run('true')", b.o.creates, b.o.execs)
	cmd := exec.CommandContext(ctx, "node", "bench.mjs", fmt.Sprint(b.o.creates), fmt.Sprint(b.o.execs))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_KEY="+key.Secret, "E2B_API_URL="+b.srv.url,
		"E2B_SANDBOX_URL=http://"+h.Proxy, "E2B_DOMAIN="+h.Domain+":"+port)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("e2b bench script: %v", err)
	}
	var res struct {
		Create  []float64 `json:"create_ms"`
		Run     []float64 `json:"run_ms"`
		Sandbox string    `json:"sandbox"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return fmt.Errorf("e2b bench script output %q: %v", out, err)
	}
	r.CreateSDK, r.RunSDK = summarize(res.Create), summarize(res.Run)
	// The Go client's round trips on the sandbox the SDK just used: the
	// same VM in the same state.
	v, err := b.c.GetVM(ctx, res.Sandbox)
	if err != nil {
		return err
	}
	b.track(v.ID, v.PID)
	for i := 0; i < 3+b.o.execs; i++ {
		t0 := time.Now()
		if _, err := b.c.Exec(ctx, v.ID, api.ExecRequest{Shell: "true"}); err != nil {
			return err
		}
		t1 := time.Now()
		// What the SDK runs for commands.run('true'): a login shell.
		if _, err := b.c.Exec(ctx, v.ID, api.ExecRequest{Cmd: []string{"/bin/bash", "-l", "-c", "true"}, User: "user"}); err != nil {
			return err
		}
		if i >= 3 {
			execs = append(execs, millis(t1.Sub(t0)))
			login = append(login, millis(time.Since(t1)))
		}
	}
	r.ExecAgentVM, r.LoginAgentVM = summarize(execs), summarize(login)
	if err := b.mcpExec(ctx, r, v.ID); err != nil { // then removes the VM
		return err
	}
	if r.CreateAgentVM.P50 > 0 {
		r.CreateRatio = r.CreateSDK.P50 / r.CreateAgentVM.P50
	}
	if r.ExecAgentVM.P50 > 0 {
		r.RunRatio = r.RunSDK.P50 / r.ExecAgentVM.P50
	}
	return nil
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// PrintE2B writes the -e2b report.
func (r *Report) PrintE2B(w io.Writer) {
	e := r.E2B
	if e == nil {
		return
	}
	fmt.Fprintf(w, "E2B SDK (%s, node %s) vs agentvm's Go client, same server, same run\n", e.SDKVersion, e.NodeVersion)
	statsLine(w, "create+first command (e2b SDK)", e.CreateSDK)
	statsLine(w, "create+first exec (agentvm)", e.CreateAgentVM)
	ratioLine(w, "ratio p50 (target <= 1.2)", e.CreateRatio)
	statsLine(w, "commands.run('true') (e2b SDK)", e.RunSDK)
	statsLine(w, "exec true (agentvm)", e.ExecAgentVM)
	ratioLine(w, "ratio p50 (target <= 1.5)", e.RunRatio)
	statsLine(w, "MCP exec tool 'true' (HTTP)", e.MCPExec)
	ratioLine(w, "MCP vs Go client exec, p50 (target <= 2)", e.MCPRatio)
	statsLine(w, "exec bash -l -c true as user", e.LoginAgentVM)
	if e.LoginAgentVM.P50 > 0 {
		ratioLine(w, "SDK vs the same login shell through exec", e.RunSDK.P50/e.LoginAgentVM.P50)
	}
}

// bearerTransport adds the token to every request.
type bearerTransport struct{ token string }

func (t bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpExec times the MCP exec tool over streamable HTTP (the official Go
// SDK's client) on the same VM.
func (b *bench) mcpExec(ctx context.Context, r *E2BReport, vmID string) error {
	defer b.remove(vmID)
	c := sdk.NewClient(&sdk.Implementation{Name: "agentvm-bench", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: b.srv.url + "/mcp",
		HTTPClient: &http.Client{Transport: bearerTransport{b.srv.token}}}, nil)
	if err != nil {
		return fmt.Errorf("mcp connect: %w", err)
	}
	defer cs.Close()
	var d []float64
	for i := 0; i < 3+b.o.execs; i++ {
		t0 := time.Now()
		res, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "exec", Arguments: map[string]any{"vm": vmID, "command": "true"}})
		if err != nil {
			return fmt.Errorf("mcp exec: %w", err)
		}
		if res.IsError {
			return fmt.Errorf("mcp exec: tool error %v", res.Content)
		}
		if i >= 3 {
			d = append(d, millis(time.Since(t0)))
		}
	}
	r.MCPExec = summarize(d)
	if r.ExecAgentVM.P50 > 0 {
		r.MCPRatio = r.MCPExec.P50 / r.ExecAgentVM.P50
	}
	return nil
}
