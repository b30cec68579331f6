package client

import (
	"context"
	"net/url"

	"github.com/agentvm/agentvm/api"
)

// CreateNetwork creates a private network.
func (c *Client) CreateNetwork(ctx context.Context, req api.CreateNetworkRequest) (*api.NetworkInfo, error) {
	var n api.NetworkInfo
	return &n, c.do(ctx, "POST", "/v1/networks", req, &n)
}

// ListNetworks lists the private networks.
func (c *Client) ListNetworks(ctx context.Context) ([]api.NetworkInfo, error) {
	var out api.ListNetworksResponse
	return out.Networks, c.do(ctx, "GET", "/v1/networks", nil, &out)
}

// DeleteNetwork deletes an empty private network.
func (c *Client) DeleteNetwork(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/networks/"+url.PathEscape(name), nil, nil)
}

// SetNetworkEgress sets a network's egress policy.
func (c *Client) SetNetworkEgress(ctx context.Context, name string, e api.Egress) (*api.NetworkInfo, error) {
	var n api.NetworkInfo
	return &n, c.do(ctx, "POST", "/v1/networks/"+url.PathEscape(name)+"/egress", e, &n)
}

// AttachNetwork puts a VM on a private network ("" detaches it).
func (c *Client) AttachNetwork(ctx context.Context, id, network string) (*api.VM, error) {
	var v api.VM
	return &v, c.do(ctx, "POST", vmPath(id, "/network"), api.AttachNetworkRequest{Network: network}, &v)
}

// SetEgress sets a VM's own egress policy; nil clears it (the network's applies).
func (c *Client) SetEgress(ctx context.Context, id string, e *api.Egress) (*api.VM, error) {
	var v api.VM
	if e == nil {
		return &v, c.do(ctx, "DELETE", vmPath(id, "/egress"), nil, &v)
	}
	return &v, c.do(ctx, "POST", vmPath(id, "/egress"), e, &v)
}
