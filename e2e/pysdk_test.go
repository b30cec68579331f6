package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/e2e/testenv"
)

// TestPythonSDK checks the Python SDK (sdk/python) as a user installs it:
// in a copy laid out as in the repository (beside api/openapi.yaml), a
// throwaway virtualenv gets the build tools pinned in its constraints file,
// builds the wheel with the standard tools, installs the wheel with its
// extras (the OpenAI Agents SDK and its E2B extra included, all pinned),
// checks that the generated models match openapi.yaml, runs the pytest
// suite against a real server (VMs, exec, files, terminals, fork and
// snapshots, access, supervision, the code interpreter, the Agents SDK's
// Runner on agentvm and on agentvm's E2B API) and the quick start.
func TestPythonSDK(t *testing.T) {
	t.Parallel()
	e := startE2B(t)
	root := testenv.RepoRoot()
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "sdk", "python")
	copySDK(t, filepath.Join(root, "sdk", "python"), dir)
	if err := os.MkdirAll(filepath.Join(tmp, "api"), 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.CopyFile(t, filepath.Join(root, "api", "openapi.yaml"), filepath.Join(tmp, "api", "openapi.yaml"))

	venv := filepath.Join(tmp, "venv")
	py := filepath.Join(venv, "bin", "python")
	pip := []string{"-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", "constraints.txt"}
	install(t, dir, "python3", "-m", "venv", venv)
	install(t, dir, py, append(pip, "build", "hatchling")...)
	install(t, dir, py, "-m", "build", "--wheel", "--no-isolation", "--outdir", filepath.Join(tmp, "dist"))
	wheels, err := filepath.Glob(filepath.Join(tmp, "dist", "agentvm_sdk-*.whl"))
	if err != nil || len(wheels) != 1 {
		t.Fatalf("the wheel: %v %v", wheels, err)
	}
	install(t, dir, py, append(pip, wheels[0]+"[agents,dev]", "openai-agents[e2b]")...)
	// The models generated from openapi.yaml are up to date (the drift check).
	e.run(t, dir, 2*time.Minute, py, "scripts/gen.py", "--check")
	// The package under test is the installed wheel, not the copied sources.
	if err := os.RemoveAll(filepath.Join(dir, "src")); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	// Nothing may be skipped here (a missing extra or server variable would
	// otherwise pass silently): the suite's conftest fails a run with skips.
	e.env = append(e.env, "AGENTVM_SDK_NO_SKIP=1")
	e.run(t, dir, 25*time.Minute, py, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", "tests")
	t.Logf("pytest took %s", time.Since(start).Round(time.Second))
	e.run(t, dir, 5*time.Minute, py, "examples/quickstart.py")

	// The tests delete what they create; only startE2B's own VM may be left
	// (a deletion a test began as it ended gets a minute to finish).
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)
	var left []string
	for {
		vms, err := e.s.Client.ListVMs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		left = left[:0]
		for _, v := range vms {
			if v.Name != "not-a-sandbox" {
				left = append(left, v.Name+" ("+string(v.State)+")")
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if len(left) != 0 {
		t.Errorf("VMs left after the Python tests: %s", strings.Join(left, ", "))
	}
	if snaps, err := e.s.Client.ListSnapshots(ctx); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots left after the Python tests: %v %d", err, len(snaps))
	}
}
