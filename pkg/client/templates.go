package client

import (
	"bufio"
	"context"
	"encoding/base64"
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
	// RegistryUser and RegistryPassword log in to the registry of an OCI
	// base (FROM registry.example.com/team/app:tag); sent in a header, used
	// for that pull only.
	RegistryUser, RegistryPassword string
	// Tags are given to the build besides the name (NAME:TAG each); a
	// name of the form NAME:TAG given to BuildTemplate is one more.
	Tags []string
}

// BuildError is a build that failed: the server's account of it.
type BuildError struct{ api.BuildErr }

func (e *BuildError) Error() string { return e.Message }

// BuildTemplate builds (or rebuilds) the template name from a Dockerfile:
// contextTar is a tar of the build context. Each progress line goes to
// progress (may be nil). A failed step returns a *BuildError.
func (c *Client) BuildTemplate(ctx context.Context, name string, contextTar io.Reader, o BuildOptions, progress func(api.BuildEvent)) (*api.BuiltTemplate, error) {
	q := url.Values{}
	for _, t := range o.Tags {
		q.Add("tag", t)
	}
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
	if o.RegistryUser != "" {
		req.Header.Set(api.RegistryAuthHeader, base64.StdEncoding.EncodeToString([]byte(o.RegistryUser+":"+o.RegistryPassword)))
	}
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

// DeleteTemplate removes a template (NAME: its latest build; NAME:TAG: that
// tag only) and the cached steps only it used.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/templates/"+url.PathEscape(strings.TrimSpace(name)), nil, nil)
}

// TagTemplate gives the build ref (NAME or NAME:TAG) the tags: NAME:TAG
// then names it (a tag on another build moves; "latest" makes it NAME's
// latest build).
func (c *Client) TagTemplate(ctx context.Context, ref string, tags ...string) (*api.BuiltTemplate, error) {
	var t api.BuiltTemplate
	return &t, c.do(ctx, "POST", "/v1/templates/"+url.PathEscape(ref)+"/tags", api.TagTemplateRequest{Tags: tags}, &t)
}

// PruneTemplates removes the cached build steps no template uses.
func (c *Client) PruneTemplates(ctx context.Context) (int, error) {
	var out api.PruneTemplatesResponse
	return out.Removed, c.do(ctx, "POST", "/v1/templates/prune", nil, &out)
}
