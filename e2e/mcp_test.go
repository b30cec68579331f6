package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/e2e/testenv"
)

// mcpNPM is the official MCP TypeScript SDK, pinned; the test installs it
// into a temp dir.
const mcpNPM = "@modelcontextprotocol/sdk@1.32.2"

// TestMCP drives `agentvm mcp` (stdio) and <API>/mcp (streamable HTTP)
// with the official TypeScript MCP client.
func TestMCP(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("npm"); err != nil {
		t.Fatal("npm is needed to install the MCP client (scripts/setup.sh installs Node.js)")
	}
	s := testenv.Start(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	v := s.CreateVM(ctx, api.CreateVMRequest{Name: "mcp-scoped"})
	tok, err := s.Client.CreateToken(ctx, api.CreateTokenRequest{VM: v.ID})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name":"mcp-test","private":true,"type":"module"}`), 0o644)
	install(t, dir, "npm", "install", "--no-audit", "--no-fund", "--loglevel=error", mcpNPM)
	testenv.CopyFile(t, filepath.Join(testenv.RepoRoot(), "e2e", "mcp", "mcp.test.mjs"), filepath.Join(dir, "mcp.test.mjs"))
	e := &e2bEnv{s: s, env: append(os.Environ(),
		"AGENTVM_BIN="+filepath.Join(s.Bin, "agentvm"),
		"AGENTVM_URL="+s.URL,
		"AGENTVM_TOKEN="+s.Token,
		"AGENTVM_SCOPED_TOKEN="+tok.Secret,
		"AGENTVM_SCOPED_VM="+v.Name,
	)}
	e.run(t, dir, 20*time.Minute, "node", "--test", "--test-concurrency=1", "--test-reporter=spec", "mcp.test.mjs")
}
