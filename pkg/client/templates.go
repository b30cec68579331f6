package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
)

// BuildOptions are a template build's settings (all optional).
type BuildOptions struct {
	Dockerfile   string // its path in the context tar (default "Dockerfile")
	Spec         string // or a spec's (agentvm.toml, or JSON): its path in the context tar
	BuildArgs    map[string]string
	NoCache      bool
	CPUs         int
	Memory       string // e.g. "2G" (default 1024 MiB)
	Disk         string // e.g. "16G" (default 8 GiB)
	ReadyTimeout time.Duration
	Timeout      time.Duration // the whole build's limit (default 2h)
}

// BuildError is a build that failed: the server's account of it.
type BuildError struct{ api.BuildErr }

func (e *BuildError) Error() string { return e.Message }

// BuildTemplate builds (or rebuilds) the template name from a Dockerfile:
// contextTar is a tar of the build context. Each progress line goes to
// progress (may be nil). A failed step returns a *BuildError.
func (c *Client) BuildTemplate(ctx context.Context, name string, contextTar io.Reader, o BuildOptions, progress func(api.BuildEvent)) (*api.BuiltTemplate, error) {
	q := url.Values{}
	if o.Dockerfile != "" {
		q.Set("dockerfile", o.Dockerfile)
	}
	if o.Spec != "" {
		q.Set("spec", o.Spec)
	}
	for k, v := range o.BuildArgs {
		q.Add("build_arg", k+"="+v)
	}
	if o.NoCache {
		q.Set("no_cache", "true")
	}
	if o.CPUs != 0 {
		q.Set("cpus", strconv.Itoa(o.CPUs))
	}
	if o.Memory != "" {
		q.Set("memory", o.Memory)
	}
	if o.Disk != "" {
		q.Set("disk", o.Disk)
	}
	if o.ReadyTimeout != 0 {
		q.Set("ready_timeout", o.ReadyTimeout.String())
	}
	if o.Timeout != 0 {
		q.Set("timeout", o.Timeout.String())
	}
	req, err := c.newRequest(ctx, "POST", "/v1/templates/"+url.PathEscape(name)+"/build?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(contextTar)
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach agentvm at %s (is `agentvm serve` running?): %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return nil, decodeError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		var ev api.BuildEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("build stream: %w", err)
		}
		switch {
		case ev.Template != nil:
			return ev.Template, nil
		case ev.Error != nil:
			return nil, &BuildError{*ev.Error}
		case progress != nil:
			progress(ev)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("build stream: %w", err)
	}
	return nil, errors.New("the build's stream ended before its result (the server stopped?)")
}

// ListTemplates lists the templates built from Dockerfiles.
func (c *Client) ListTemplates(ctx context.Context) ([]api.BuiltTemplate, error) {
	var out api.ListTemplatesResponse
	return out.Templates, c.do(ctx, "GET", "/v1/templates", nil, &out)
}

// GetTemplate returns a template, with its Dockerfile and last build log.
func (c *Client) GetTemplate(ctx context.Context, name string) (*api.BuiltTemplate, error) {
	var t api.BuiltTemplate
	return &t, c.do(ctx, "GET", "/v1/templates/"+url.PathEscape(name), nil, &t)
}

// DeleteTemplate removes a template and the cached steps only it used.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/templates/"+url.PathEscape(strings.TrimSpace(name)), nil, nil)
}

// PruneTemplates removes the cached build steps no template uses.
func (c *Client) PruneTemplates(ctx context.Context) (int, error) {
	var out api.PruneTemplatesResponse
	return out.Removed, c.do(ctx, "POST", "/v1/templates/prune", nil, &out)
}
