package client

import (
	"context"
	"fmt"
	"io"
	"net/url"

	"github.com/agentvm/agentvm/api"
)

// Recordings lists a VM's terminal and exec recordings.
func (c *Client) Recordings(ctx context.Context, id string) (*api.ListRecordingsResponse, error) {
	var out api.ListRecordingsResponse
	return &out, c.do(ctx, "GET", vmPath(id, "/recordings"), nil, &out)
}

// SetRecording turns a VM's recording on or off.
func (c *Client) SetRecording(ctx context.Context, id string, enabled bool) error {
	return c.do(ctx, "POST", vmPath(id, "/recordings/settings"), api.RecordingSettings{Enabled: enabled}, nil)
}

// Recording writes one recording (an asciicast v2 file, or an exec's JSON
// line) to w.
func (c *Client) Recording(ctx context.Context, id, rec string, w io.Writer) error {
	return c.download(ctx, vmPath(id, "/recordings/"+url.PathEscape(rec)), w)
}

// ExportRecordings writes a VM's recordings and events as a .tar.gz to w.
func (c *Client) ExportRecordings(ctx context.Context, id string, w io.Writer) error {
	return c.download(ctx, vmPath(id, "/recordings/export"), w)
}

func (c *Client) download(ctx context.Context, p string, w io.Writer) error {
	resp, err := c.stream(ctx, "GET", p, nil, -1)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("download: %w", err)
	}
	return nil
}
