package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"

	"github.com/agentvm/agentvm/api"
)

func decodeJSONBody(resp *http.Response, v any) error { return json.NewDecoder(resp.Body).Decode(v) }

func parseTime(s string) (time.Time, error) { return time.Parse(time.RFC3339Nano, s) }

// CreateToken issues a scoped token; the secret is in Token.Secret.
func (c *Client) CreateToken(ctx context.Context, req api.CreateTokenRequest) (*api.Token, error) {
	var t api.Token
	return &t, c.do(ctx, "POST", "/v1/tokens", req, &t)
}

// ListTokens lists live tokens, of one VM when vm is set.
func (c *Client) ListTokens(ctx context.Context, vm string) ([]api.Token, error) {
	p := "/v1/tokens"
	if vm != "" {
		p += "?vm=" + url.QueryEscape(vm)
	}
	var out api.ListTokensResponse
	return out.Tokens, c.do(ctx, "GET", p, nil, &out)
}

// RevokeToken deletes a token.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/tokens/"+url.PathEscape(id), nil, nil)
}

// SSHInfo returns the SSH gateway's address and host key.
func (c *Client) SSHInfo(ctx context.Context) (*api.SSHInfo, error) {
	var s api.SSHInfo
	return &s, c.do(ctx, "GET", "/v1/ssh", nil, &s)
}
