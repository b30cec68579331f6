// Package client is the Go SDK for the agentvm REST API; the agentvm CLI uses it.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
)

// Client talks to one agentvm server.
type Client struct {
	BaseURL string
	Token   string
	HTTP    *http.Client
}

// New returns a client for baseURL (e.g. http://127.0.0.1:7070) using token.
func New(baseURL, token string) *Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Token: token, HTTP: &http.Client{Transport: tr}}
}

// FromEnv builds a client from AGENTVM_URL (default http://127.0.0.1:7070) and
// AGENTVM_TOKEN, falling back to the admin token in the data dir
// ($AGENTVM_DATA_DIR or ~/.local/share/agentvm).
func FromEnv() *Client {
	u := os.Getenv("AGENTVM_URL")
	if u == "" {
		u = "http://127.0.0.1:7070"
	}
	tok := os.Getenv("AGENTVM_TOKEN")
	if tok == "" {
		dir := os.Getenv("AGENTVM_DATA_DIR")
		if dir == "" {
			home, _ := os.UserHomeDir()
			dir = filepath.Join(home, ".local", "share", "agentvm")
		}
		if b, err := os.ReadFile(filepath.Join(dir, "admin.token")); err == nil {
			tok = strings.TrimSpace(string(b))
		}
	}
	return New(u, tok)
}

// APIError is a non-2xx answer from the server.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("%s (HTTP %d %s)", e.Message, e.Status, e.Code) }

// IsNotFound reports whether err is a 404 from the server.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

func (c *Client) newRequest(ctx context.Context, method, path string, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	return req, nil
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	req, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach agentvm at %s (is `agentvm serve` running?): %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return decodeError(resp)
	}
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e api.Error
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		return &APIError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
	}
	return &APIError{Status: resp.StatusCode, Code: "http", Message: strings.TrimSpace(string(b))}
}

// Health checks the server (no auth needed).
func (c *Client) Health(ctx context.Context) (*api.Health, error) {
	var h api.Health
	return &h, c.do(ctx, "GET", "/v1/health", nil, &h)
}

// ListNodes lists the nodes of the cluster the server is a node of.
func (c *Client) ListNodes(ctx context.Context) ([]api.Node, error) {
	var out api.ListNodesResponse
	return out.Nodes, c.do(ctx, "GET", "/v1/nodes", nil, &out)
}

// RemoveNode removes a node whose lease has run out.
func (c *Client) RemoveNode(ctx context.Context, node string) error {
	return c.do(ctx, "DELETE", "/v1/nodes/"+url.PathEscape(node), nil, nil)
}

// DrainNode moves the VMs of node to other nodes (suspend, store, wake
// there) and keeps new VMs off it until it restarts.
func (c *Client) DrainNode(ctx context.Context, node string) (*api.DrainResponse, error) {
	var out api.DrainResponse
	return &out, c.do(ctx, "POST", "/v1/nodes/"+url.PathEscape(node)+"/drain", nil, &out)
}

// CreateVM creates a VM and returns it running.
func (c *Client) CreateVM(ctx context.Context, req api.CreateVMRequest) (*api.VM, error) {
	var v api.VM
	return &v, c.do(ctx, "POST", "/v1/vms", req, &v)
}

// ListVMs lists VMs, optionally filtered by labels ("k=v" or "k").
func (c *Client) ListVMs(ctx context.Context, labels ...string) ([]api.VM, error) {
	q := url.Values{}
	for _, l := range labels {
		q.Add("label", l)
	}
	p := "/v1/vms"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var out api.ListVMsResponse
	return out.VMs, c.do(ctx, "GET", p, nil, &out)
}

// GetVM returns one VM by id or name.
func (c *Client) GetVM(ctx context.Context, id string) (*api.VM, error) {
	var v api.VM
	return &v, c.do(ctx, "GET", "/v1/vms/"+url.PathEscape(id), nil, &v)
}

// DeleteVM deletes a VM.
func (c *Client) DeleteVM(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/vms/"+url.PathEscape(id), nil, nil)
}

// StartVM boots a stopped VM.
func (c *Client) StartVM(ctx context.Context, id string) (*api.VM, error) {
	var v api.VM
	return &v, c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(id)+"/start", nil, &v)
}

// StopVM shuts a VM down, keeping its disk.
func (c *Client) StopVM(ctx context.Context, id string) (*api.VM, error) {
	var v api.VM
	return &v, c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(id)+"/stop", nil, &v)
}

// Logs returns the VM's log: serial console and QEMU output.
func (c *Client) Logs(ctx context.Context, id string) (string, error) {
	req, err := c.newRequest(ctx, "GET", "/v1/vms/"+url.PathEscape(id)+"/logs", nil)
	if err != nil {
		return "", err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return "", decodeError(resp)
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// Exec runs a command and returns its buffered output and exit code.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest) (*api.ExecResult, error) {
	var r api.ExecResult
	return &r, c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(id)+"/exec", req, &r)
}

// ExecEvents runs a command and calls fn for each event of the NDJSON stream
// (stdout, stderr, error, exit) as it arrives.
func (c *Client) ExecEvents(ctx context.Context, id string, req api.ExecRequest, fn func(api.ExecEvent)) error {
	hreq, err := c.newRequest(ctx, "POST", "/v1/vms/"+url.PathEscape(id)+"/exec", req)
	if err != nil {
		return err
	}
	hreq.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.HTTP.Do(hreq)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return decodeError(resp)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev api.ExecEvent
		if err := dec.Decode(&ev); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		fn(ev)
	}
}

func (c *Client) vmOp(ctx context.Context, id, op string, body any) (*api.VM, error) {
	var v api.VM
	return &v, c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(id)+"/"+op, body, &v)
}

// PauseVM freezes a VM's vCPUs (memory stays in RAM).
func (c *Client) PauseVM(ctx context.Context, id string) (*api.VM, error) {
	return c.vmOp(ctx, id, "pause", nil)
}

// ResumeVM continues a paused VM.
func (c *Client) ResumeVM(ctx context.Context, id string) (*api.VM, error) {
	return c.vmOp(ctx, id, "resume", nil)
}

// SuspendVM saves a VM's memory to disk and frees its RAM; any request wakes it.
func (c *Client) SuspendVM(ctx context.Context, id string) (*api.VM, error) {
	return c.vmOp(ctx, id, "suspend", nil)
}

// ResizeVM grows a VM's disk online, or sets CPUs and memory for the next start.
func (c *Client) ResizeVM(ctx context.Context, id string, req api.ResizeRequest) (*api.VM, error) {
	return c.vmOp(ctx, id, "resize", req)
}

// WakeVM returns a VM after waking it if it was paused or suspended.
func (c *Client) WakeVM(ctx context.Context, id string) (*api.VM, error) {
	var v api.VM
	return &v, c.do(ctx, "GET", "/v1/vms/"+url.PathEscape(id)+"?wake=1", nil, &v)
}

// Snapshot captures a running or paused VM's memory, processes and disk.
func (c *Client) Snapshot(ctx context.Context, id, name string) (*api.Snapshot, error) {
	var s api.Snapshot
	return &s, c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(id)+"/snapshot", api.SnapshotRequest{Name: name}, &s)
}

// ListSnapshots lists snapshots.
func (c *Client) ListSnapshots(ctx context.Context) ([]api.Snapshot, error) {
	var out api.ListSnapshotsResponse
	return out.Snapshots, c.do(ctx, "GET", "/v1/snapshots", nil, &out)
}

// GetSnapshot returns a snapshot by id or name.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*api.Snapshot, error) {
	var s api.Snapshot
	return &s, c.do(ctx, "GET", "/v1/snapshots/"+url.PathEscape(id), nil, &s)
}

// DeleteSnapshot deletes a snapshot.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/snapshots/"+url.PathEscape(id), nil, nil)
}

// Fork copies a running VM into count new running VMs; the parent keeps running.
func (c *Client) Fork(ctx context.Context, id string, count int) (*api.ForkResponse, error) {
	var out api.ForkResponse
	return &out, c.do(ctx, "POST", "/v1/vms/"+url.PathEscape(id)+"/fork", api.ForkRequest{Count: count}, &out)
}

// CA returns the PEM certificate of the server's local CA (serve --tls
// auto), which clients trust for its HTTPS previews.
func (c *Client) CA(ctx context.Context) ([]byte, error) {
	req, err := c.newRequest(ctx, "GET", "/v1/tls/ca", nil)
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
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}
