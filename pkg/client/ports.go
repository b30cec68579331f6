package client

import (
	"context"
	"net/url"
	"strconv"

	"github.com/agentvm/agentvm/api"
)

// Expose exposes a VM port: an HTTP preview URL, or a host TCP port.
func (c *Client) Expose(ctx context.Context, id string, req api.ExposeRequest) (*api.Port, error) {
	var p api.Port
	return &p, c.do(ctx, "POST", vmPath(id, "/ports"), req, &p)
}

// ListPorts lists a VM's exposed ports.
func (c *Client) ListPorts(ctx context.Context, id string) ([]api.Port, error) {
	var out api.ListPortsResponse
	return out.Ports, c.do(ctx, "GET", vmPath(id, "/ports"), nil, &out)
}

// Unexpose removes an exposure (kind "http" or "tcp").
func (c *Client) Unexpose(ctx context.Context, id string, port int, kind string) error {
	return c.do(ctx, "DELETE", vmPath(id, "/ports/"+strconv.Itoa(port))+"?kind="+url.QueryEscape(kind), nil, nil)
}

// AddDomain maps a custom host name to a VM port.
func (c *Client) AddDomain(ctx context.Context, d api.Domain) (*api.Domain, error) {
	var out api.Domain
	return &out, c.do(ctx, "POST", "/v1/domains", d, &out)
}

// ListDomains lists the custom domains.
func (c *Client) ListDomains(ctx context.Context) ([]api.Domain, error) {
	var out api.ListDomainsResponse
	return out.Domains, c.do(ctx, "GET", "/v1/domains", nil, &out)
}

// DeleteDomain removes a custom domain.
func (c *Client) DeleteDomain(ctx context.Context, domain string) error {
	return c.do(ctx, "DELETE", "/v1/domains/"+url.PathEscape(domain), nil, nil)
}
