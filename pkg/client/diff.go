package client

import (
	"context"
	"net/url"
	"strconv"

	"github.com/agentvm/agentvm/api"
)

// DiffOptions are the options of Diff.
type DiffOptions struct {
	Since            string   // "create" (default) or a snapshot's name or id
	Ignore           []string // patterns added to the default caches
	NoDefaultIgnores bool     // compare the caches too
	Diffs            bool     // unified diffs of text files
	MaxEntries       int
}

// Diff tells what changed on a VM's disk, read from its disk layers.
func (c *Client) Diff(ctx context.Context, id string, o DiffOptions) (*api.DiffResponse, error) {
	q := url.Values{}
	if o.Since != "" {
		q.Set("since", o.Since)
	}
	for _, p := range o.Ignore {
		q.Add("ignore", p)
	}
	if o.NoDefaultIgnores {
		q.Set("default_ignores", "false")
	}
	if o.Diffs {
		q.Set("diffs", "1")
	}
	if o.MaxEntries > 0 {
		q.Set("max_entries", strconv.Itoa(o.MaxEntries))
	}
	var out api.DiffResponse
	return &out, c.do(ctx, "GET", vmPath(id, "/diff?"+q.Encode()), nil, &out)
}
