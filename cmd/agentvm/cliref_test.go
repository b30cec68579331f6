package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

const cliReference = "../../docs/cli-reference.md"

// TestCLIReference: docs/cli-reference.md is what the command tree says.
// After changing a command or flag, regenerate it:
//
//	AGENTVM_UPDATE_DOCS=1 go test ./cmd/agentvm -run TestCLIReference
func TestCLIReference(t *testing.T) {
	update := os.Getenv("AGENTVM_UPDATE_DOCS") == "1"
	// Defaults that come from the environment are shown as on a machine
	// with none of it set, for root.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "AGENTVM_") || strings.HasPrefix(k, "XDG_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	t.Setenv("HOME", "/root")
	got := cliMarkdown(newRoot())
	if update {
		if err := os.WriteFile(cliReference, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(cliReference)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("docs/cli-reference.md is out of date with the commands: regenerate it with\n\tAGENTVM_UPDATE_DOCS=1 go test ./cmd/agentvm -run TestCLIReference")
	}
}

// cliMarkdown renders every command, in the tree's order, with its usage,
// description and flags.
func cliMarkdown(root *cobra.Command) []byte {
	var b bytes.Buffer
	b.WriteString("# CLI reference\n\nGenerated from the command tree by `AGENTVM_UPDATE_DOCS=1 go test ./cmd/agentvm -run TestCLIReference`; " +
		"the test fails when it is out of date. The tour is in [cli.md](cli.md).\n")
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		if c != root {
			fmt.Fprintf(&b, "\n## %s\n\n%s\n", c.CommandPath(), c.Short)
			if c.Long != "" && c.Long != c.Short {
				fmt.Fprintf(&b, "\n%s\n", strings.TrimSpace(c.Long))
			}
			fmt.Fprintf(&b, "\n```\n%s\n", c.UseLine())
			if fl := c.NonInheritedFlags(); fl.HasAvailableFlags() {
				fmt.Fprintf(&b, "\n%s", fl.FlagUsagesWrapped(100))
			}
			b.WriteString("```\n")
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return b.Bytes()
}
