// Package mcp is agentvm's MCP server: tools that give a model durable
// Linux VMs (create, exec, files, fork, snapshot, suspend, previews,
// services, terminals), each a call of agentvm's own API through pkg/client
// with the caller's token, served over stdio (`agentvm mcp`) and over
// streamable HTTP at /mcp on the API listener.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/agentvm/agentvm/pkg/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Scope says which tools a caller gets: the admin gets all; a token of one
// VM gets only the tools that work on an existing VM, for that VM.
type Scope struct {
	VM string // "" for the admin
}

// New makes an MCP server whose tools call agentvm through c.
func New(c *client.Client, scope Scope, version string) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "agentvm", Title: "agentvm: durable Linux VMs", Version: version}, &sdk.ServerOptions{
		Instructions: instructions(scope),
	})
	t := &tools{c: c, scope: scope}
	t.register(s)
	return s
}

func instructions(scope Scope) string {
	s := "agentvm gives you real Linux computers (Debian 12 VMs) that keep running between calls: " +
		"files, processes, services and terminals stay until you delete the VM. " +
		"Run commands with exec, move files with read_file/write_file, and serve web apps with expose_port. "
	if scope.VM != "" {
		return s + "Your token opens one VM only: " + scope.VM + " (pass it as vm, or leave vm empty)."
	}
	return s + "Create a VM with create_vm first (about a second), fork_vm copies a running VM with its memory " +
		"and processes, snapshot_vm saves one to create others from, suspend_vm parks it on disk. Delete VMs you no longer need."
}

// tools holds what the tool handlers share.
type tools struct {
	c     *client.Client
	scope Scope
}

// vm resolves a tool's vm argument: required for the admin, defaulting to
// the token's VM otherwise.
func (t *tools) vm(v string) (string, error) {
	if v == "" {
		if t.scope.VM != "" {
			return t.scope.VM, nil
		}
		return "", errors.New("vm is required: the VM's name or id (list_vms shows them)")
	}
	return v, nil
}

// toolError makes an API error something a model can act on.
func toolError(what string, err error) error {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return fmt.Errorf("%s failed: %s (HTTP %d %s)", what, ae.Message, ae.Status, ae.Code)
	}
	return fmt.Errorf("%s failed: %v", what, err)
}

// text is a tool result of plain text.
func text(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}

// jsonText is a tool result showing v as indented JSON.
func jsonText(v any) *sdk.CallToolResult {
	b, _ := json.MarshalIndent(v, "", "  ")
	return text(string(b))
}

func boolp(b bool) *bool { return &b }

// add registers a tool; admin-only tools are left out of a VM's scope.
func add[In any](t *tools, s *sdk.Server, adminOnly bool, tool *sdk.Tool, h func(ctx context.Context, in In) (*sdk.CallToolResult, error)) {
	if adminOnly && t.scope.VM != "" {
		return
	}
	sdk.AddTool(s, tool, func(ctx context.Context, _ *sdk.CallToolRequest, in In) (*sdk.CallToolResult, any, error) {
		res, err := h(ctx, in)
		return res, nil, err
	})
}

// truncate cuts s to max bytes at a rune boundary.
func truncate(s string, max int) (string, bool) {
	if len(s) <= max {
		return s, false
	}
	cut := max
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return s[:cut], true
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// tail keeps the last max bytes of s, from a character's start.
func tail(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := len(s) - max
	for i < len(s) && !isRuneStart(s[i]) {
		i++
	}
	return s[i:]
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func join(parts ...string) string { return strings.Join(parts, "\n") }
