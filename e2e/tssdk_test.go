package e2e

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/e2e/testenv"
)

// TestTSSDK checks the TypeScript SDK (sdk/typescript) in a copy laid out
// as in the repository (sdk/typescript beside api/openapi.yaml): its
// pinned dev dependencies from package-lock.json, the drift check of the
// types generated from openapi.yaml, the build and the type check of the
// example, then its node tests against a real server.
func TestTSSDK(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("npm"); err != nil {
		t.Fatal("npm is needed to build the TypeScript SDK (scripts/setup.sh installs Node.js)")
	}
	s := testenv.Start(t, "")
	root := testenv.RepoRoot()
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "sdk", "typescript")
	copySDK(t, filepath.Join(root, "sdk", "typescript"), dir)
	if err := os.MkdirAll(filepath.Join(tmp, "api"), 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.CopyFile(t, filepath.Join(root, "api", "openapi.yaml"), filepath.Join(tmp, "api", "openapi.yaml"))

	install(t, dir, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	e := &e2bEnv{s: s, env: append(os.Environ(), "AGENTVM_URL="+s.URL, "AGENTVM_TOKEN="+s.Token)}
	e.run(t, dir, 2*time.Minute, "npm", "run", "check-gen")
	e.run(t, dir, 5*time.Minute, "npm", "run", "build")
	e.run(t, dir, 5*time.Minute, "npm", "run", "typecheck")

	tests, err := filepath.Glob(filepath.Join(dir, "test", "*.test.mjs"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no node tests in %s: %v", dir, err)
	}
	args := []string{"--test", "--test-concurrency=1", "--test-reporter=spec"}
	for _, f := range tests {
		args = append(args, filepath.Join("test", filepath.Base(f)))
	}
	start := time.Now()
	e.run(t, dir, 20*time.Minute, "node", args...)
	t.Logf("node tests took %s", time.Since(start).Round(time.Second))

	// The tests delete what they create; nothing of theirs may be left.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if vms, err := s.Client.ListVMs(ctx); err != nil || len(vms) != 0 {
		t.Errorf("VMs left after the node tests: %v %d", err, len(vms))
	}
	if snaps, err := s.Client.ListSnapshots(ctx); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots left after the node tests: %v %d", err, len(snaps))
	}
}

// copySDK copies the package's sources, leaving out what installs, builds
// and test runs make (node_modules, dist, Python caches and build output).
func copySDK(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		if d.IsDir() {
			switch base := d.Name(); {
			case rel == "node_modules", rel == "dist", rel == "build", base == "__pycache__", base == ".pytest_cache", strings.HasSuffix(base, ".egg-info"):
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(to, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o644)
	})
	if err != nil {
		t.Fatalf("copy %s: %v", from, err)
	}
}
