package main

import (
	"os"

	"github.com/agentvm/agentvm/internal/mcp"
	"github.com/agentvm/agentvm/internal/server"
	"github.com/agentvm/agentvm/pkg/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"
)

func mcpCmd() *cobra.Command {
	var scope mcp.Scope
	c := &cobra.Command{
		Use:   "mcp",
		Short: "Serve agentvm's MCP tools over stdio (for Claude Code, Claude Desktop, Cursor and other MCP clients)",
		Long: `Serve agentvm's MCP tools over stdio, calling the daemon at AGENTVM_URL with
AGENTVM_TOKEN. With a token of one VM, pass --vm so that only that VM's tools
are offered. The same tools are served over streamable HTTP at <API>/mcp.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return mcp.New(client.FromEnv(), scope, server.Version).Run(cmd.Context(), &sdk.StdioTransport{})
		},
	}
	c.Flags().StringVar(&scope.VM, "vm", os.Getenv("AGENTVM_VM"), "offer only the tools of this VM (for a token scoped to it; env AGENTVM_VM)")
	return c
}
