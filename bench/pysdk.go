package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
)

// The Python SDK benchmark: the exec round trip of `true` through the SDK
// in sdk/python (installed in a virtualenv made in the run, with its
// pinned constraints) on the sync and the async client, and a tool call of
// the OpenAI Agents SDK's exec_command through agentvm's sandbox provider
// (against the async client's exec of true, and of the login-shell command
// line the tool runs), against the Go client on the same VM in the same run. The paths take
// turns in batches, so drifting host conditions hit them alike.

const pyBatches = 5

// pyScript stays up for the whole run, so its code is as warm as the Go
// client's: each line on stdin is a round-trip count, answered by one JSON
// line of the three paths' times. argv: VM id.
const pyScript = `import asyncio, json, sys, time
from agents.sandbox import Manifest
from agents.sandbox.capabilities.tools.shell_tool import ExecCommandTool
from agents.sandbox.snapshot import NoopSnapshot
from agentvm import AgentVM, AsyncAgentVM
from agentvm.openai_agents import AgentVMSandboxClient, AgentVMSandboxSessionState

vm_id = sys.argv[1]
loop = asyncio.new_event_loop()
sync_vm = AgentVM().vm(vm_id)
av = AsyncAgentVM()
async_vm = av.vm(vm_id)

async def open_tool():
    client = AgentVMSandboxClient(av)
    state = AgentVMSandboxSessionState(session_id="00000000-0000-0000-0000-000000000001", manifest=Manifest(), snapshot=NoopSnapshot(id="bench"), vm_id=vm_id)
    session = await client.resume(state)
    await session.start()
    return ExecCommandTool(session=session)

tool = loop.run_until_complete(open_tool())

def sync_exec():
    assert sync_vm.exec(["true"]).exit_code == 0

async def async_exec():
    assert (await async_vm.exec(["true"])).exit_code == 0

async def login_exec():
    # the command line the exec_command tool runs by default (a login shell)
    assert (await async_vm.exec(["sh", "-lc", "true"])).exit_code == 0

async def tool_call():
    out = await tool._invoke(None, json.dumps({"cmd": "true"}))
    assert "exited with code 0" in out, out

async def timed(f):
    t0 = time.perf_counter(); await f(); return (time.perf_counter() - t0) * 1000

for _ in range(3):
    sync_exec(); loop.run_until_complete(async_exec()); loop.run_until_complete(login_exec()); loop.run_until_complete(tool_call())
paths = [("async_ms", async_exec), ("login_ms", login_exec), ("tool_ms", tool_call)]
for line in sys.stdin:
    out = {"sync_ms": [], "async_ms": [], "login_ms": [], "tool_ms": []}
    for i in range(int(line)):
        t0 = time.perf_counter(); sync_exec(); out["sync_ms"].append((time.perf_counter() - t0) * 1000)
        for key, f in paths[i % 3:] + paths[:i % 3]:
            out[key].append(loop.run_until_complete(timed(f)))
    print(json.dumps(out), flush=True)
`

// PySDKReport is the result of -pysdk.
type PySDKReport struct {
	ExecSync   Stats   `json:"exec_true_py_sync"`
	ExecAsync  Stats   `json:"exec_true_py_async"`
	ExecGo     Stats   `json:"exec_true_go_client"`
	SyncRatio  float64 `json:"sync_ratio"`
	AsyncRatio float64 `json:"async_ratio"`
	Login      Stats   `json:"exec_sh_lc_true_py_async"`
	Tool       Stats   `json:"agents_tool_call_true"`
	ToolRatio  float64 `json:"tool_to_async_ratio"`
	ToolLogin  float64 `json:"tool_to_same_command_ratio"`
	Batches    int     `json:"batches"`
	Python     string  `json:"python"`
}

func (b *bench) runPySDK(ctx context.Context) error {
	r := &PySDKReport{Batches: pyBatches}
	b.r.PySDK = r
	pv, err := exec.Command("python3", "--version").Output()
	if err != nil {
		return fmt.Errorf("pysdk: python3 is needed: %v", err)
	}
	r.Python = strings.TrimSpace(string(pv))
	root, err := repoRoot()
	if err != nil {
		return err
	}
	sdk := filepath.Join(root, "sdk", "python")
	venv := filepath.Join(b.tmp, "pyvenv")
	py := filepath.Join(venv, "bin", "python")
	logf("installing the Python SDK into a virtualenv (pinned constraints; not measured)")
	for _, args := range [][]string{
		{"python3", "-m", "venv", venv},
		{py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", filepath.Join(sdk, "constraints.txt"), sdk + "[agents]"},
	} {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	script := filepath.Join(b.tmp, "pybench.py")
	if err := os.WriteFile(script, []byte(pyScript), 0o644); err != nil {
		return err
	}

	id, err := b.create(ctx)
	if err != nil {
		return fmt.Errorf("create the VM: %w", err)
	}
	defer b.remove(id)
	req := api.ExecRequest{Cmd: []string{"true"}}
	goExec := func() error {
		res, err := b.c.Exec(ctx, id, req)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", res.ExitCode)
		}
		return err
	}
	for i := 0; i < 3; i++ {
		if err := goExec(); err != nil {
			return fmt.Errorf("Go client.Exec (warm-up): %w", err)
		}
	}
	per := max(1, b.o.execs/pyBatches)
	var execGo, execSync, execAsync, login, tool []float64
	goBatch := func() error {
		for i := 0; i < per; i++ {
			t0 := time.Now()
			if err := goExec(); err != nil {
				return err
			}
			execGo = append(execGo, millis(time.Since(t0)))
		}
		return nil
	}
	pyProc, err := b.startScript(ctx, "python bench script", b.tmp, py, script, id)
	if err != nil {
		return err
	}
	defer pyProc.close()
	pyBatch := func() error {
		var res struct {
			Sync  []float64 `json:"sync_ms"`
			Async []float64 `json:"async_ms"`
			Login []float64 `json:"login_ms"`
			Tool  []float64 `json:"tool_ms"`
		}
		if err := pyProc.batch(per, &res); err != nil {
			return err
		}
		execSync, execAsync, tool = append(execSync, res.Sync...), append(execAsync, res.Async...), append(tool, res.Tool...)
		login = append(login, res.Login...)
		return nil
	}
	logf("exec true: %d batches of %d round trips per path, Python and Go taking turns", pyBatches, per)
	if err := alternate(pyBatches, goBatch, pyBatch); err != nil {
		return err
	}
	r.ExecGo, r.ExecSync, r.ExecAsync, r.Tool = summarize(execGo), summarize(execSync), summarize(execAsync), summarize(tool)
	r.SyncRatio, r.AsyncRatio = ratio(r.ExecSync.P50, r.ExecGo.P50), ratio(r.ExecAsync.P50, r.ExecGo.P50)
	r.Login = summarize(login)
	r.ToolRatio, r.ToolLogin = ratio(r.Tool.P50, r.ExecAsync.P50), ratio(r.Tool.P50, r.Login.P50)
	return nil
}

// PrintPySDK writes the -pysdk report.
func (r *Report) PrintPySDK(w io.Writer) {
	e := r.PySDK
	if e == nil {
		return
	}
	fmt.Fprintf(w, "Python SDK (sdk/python, %s) vs the Go client, same VM, same run, %d alternating batches\n", e.Python, e.Batches)
	statsLine(w, "Py AgentVM vm.exec(['true'])", e.ExecSync)
	statsLine(w, "Py AsyncAgentVM await vm.exec(['true'])", e.ExecAsync)
	statsLine(w, "Go client.Exec", e.ExecGo)
	ratioLine(w, "Py sync / Go p50 (target <= 1.3)", e.SyncRatio)
	ratioLine(w, "Py async / Go p50 (target <= 1.3)", e.AsyncRatio)
	statsLine(w, "Agents SDK exec_command 'true' (provider)", e.Tool)
	statsLine(w, "Py async exec ['sh', '-lc', 'true']", e.Login)
	ratioLine(w, "tool call / Py async exec of true p50 (target <= 1.2)", e.ToolRatio)
	ratioLine(w, "tool call / Py async exec of its command line (sh -lc true) p50", e.ToolLogin)
	fmt.Fprintln(w, "  (the tool runs its command in a login shell, sh -lc; Debian's /etc/profile forks id(1), which the exec of true does not pay)")
}
