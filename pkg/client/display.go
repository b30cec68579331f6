package client

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
)

// BrowserCDPPort is where a browser VM's Chromium serves the DevTools
// protocol (on the guest's loopback): DialTCP(ctx, vm, BrowserCDPPort)
// reaches it, and so does the preview URL of that port.
const BrowserCDPPort = 9222

// Screenshot returns a PNG of a browser VM's display. scale in (0, 1]
// shrinks it (0 means full size).
func (c *Client) Screenshot(ctx context.Context, id string, scale float64) ([]byte, error) {
	path := "/v1/vms/" + url.PathEscape(id) + "/screenshot"
	if scale > 0 && scale != 1 {
		path += "?scale=" + strconv.FormatFloat(scale, 'f', -1, 64)
	}
	req, err := c.newRequest(ctx, "GET", path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach agentvm at %s (is `agentvm serve` running?): %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return nil, decodeError(resp)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 256<<20))
}
