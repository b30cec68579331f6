package client

import (
	"context"
	"net/url"
	"strconv"

	"github.com/agentvm/agentvm/api"
)

func repoPath(name, sub string) string { return "/v1/repos/" + url.PathEscape(name) + sub }

// CreateRepo creates a hosted git repository.
func (c *Client) CreateRepo(ctx context.Context, req api.CreateRepoRequest) (*api.Repo, error) {
	var r api.Repo
	return &r, c.do(ctx, "POST", "/v1/repos", req, &r)
}

// ListRepos lists the hosted repositories.
func (c *Client) ListRepos(ctx context.Context) ([]api.Repo, error) {
	var out api.ListReposResponse
	return out.Repos, c.do(ctx, "GET", "/v1/repos", nil, &out)
}

// GetRepo describes a repository.
func (c *Client) GetRepo(ctx context.Context, name string) (*api.Repo, error) {
	var r api.Repo
	return &r, c.do(ctx, "GET", repoPath(name, ""), nil, &r)
}

// DeleteRepo deletes a repository and its tokens.
func (c *Client) DeleteRepo(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", repoPath(name, ""), nil, nil)
}

// CreateRepoToken issues a repository token (revoke it with RevokeToken).
func (c *Client) CreateRepoToken(ctx context.Context, name string, req api.CreateRepoTokenRequest) (*api.Token, error) {
	var t api.Token
	return &t, c.do(ctx, "POST", repoPath(name, "/tokens"), req, &t)
}

// AddRepoHook adds a webhook; the answer holds its secret.
func (c *Client) AddRepoHook(ctx context.Context, name string, req api.AddRepoHookRequest) (*api.RepoHook, error) {
	var h api.RepoHook
	return &h, c.do(ctx, "POST", repoPath(name, "/hooks"), req, &h)
}

// RemoveRepoHook removes a webhook.
func (c *Client) RemoveRepoHook(ctx context.Context, name, id string) error {
	return c.do(ctx, "DELETE", repoPath(name, "/hooks/"+url.PathEscape(id)), nil, nil)
}

// RepoEvents lists a repository's pushes and webhook deliveries after seq.
func (c *Client) RepoEvents(ctx context.Context, name string, after int64) ([]api.Event, error) {
	var out api.ListEventsResponse
	return out.Events, c.do(ctx, "GET", repoPath(name, "/events?after="+strconv.FormatInt(after, 10)), nil, &out)
}
