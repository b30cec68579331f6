package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/agentvm/agentvm/api"
)

// Events returns a VM's events after seq (0: from the start).
func (c *Client) Events(ctx context.Context, id string, after int64) ([]api.Event, error) {
	var out api.ListEventsResponse
	return out.Events, c.do(ctx, "GET", vmPath(id, "/events")+"?after="+strconv.FormatInt(after, 10), nil, &out)
}

// FollowEvents calls fn for each event after seq as it happens, until ctx
// ends or fn returns an error.
func (c *Client) FollowEvents(ctx context.Context, id string, after int64, fn func(api.Event) error) error {
	resp, err := c.stream(ctx, "GET", vmPath(id, "/events")+"?follow=1&after="+strconv.FormatInt(after, 10), nil, 0)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e api.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("bad event: %w", err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}

// SetPolicy changes a VM's idle timeout, delete-after and restart policy.
func (c *Client) SetPolicy(ctx context.Context, id string, req api.PolicyRequest) (*api.VM, error) {
	var v api.VM
	return &v, c.do(ctx, "POST", vmPath(id, "/policy"), req, &v)
}
