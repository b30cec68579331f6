package server

import (
	"net"
	"net/http"

	"github.com/agentvm/agentvm/internal/mcp"
	"github.com/agentvm/agentvm/pkg/client"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpHandler serves MCP's streamable HTTP transport at /mcp (behind the
// auth middleware). Each session's tools call this server's own API with
// the caller's token, so they can do exactly what the token can: a VM's
// token gets the tools of that VM only. The tools keep no state between
// calls, so the transport runs stateless.
func (s *Server) mcpHandler() http.Handler {
	return sdk.NewStreamableHTTPHandler(func(r *http.Request) *sdk.Server {
		p := principal(r)
		scope := mcp.Scope{}
		if !p.Admin {
			scope.VM = p.VMID
		}
		return mcp.New(client.New(s.selfURL(), bearer(r)), scope, Version)
	}, &sdk.StreamableHTTPOptions{
		// Every request is its own session with the token it carries: no
		// session outlives its token, and none can be taken over by id.
		Stateless: true,
	})
}

// selfURL is the API's own address, as the MCP tools dial it.
func (s *Server) selfURL() string {
	host, port, _ := net.SplitHostPort(s.Addr())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if ip != nil && ip.To4() == nil {
			host = "::1"
		} else {
			host = "127.0.0.1"
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}
