package client

import (
	"context"
	"io"
	"net/url"
	"strconv"
	"time"

	"github.com/agentvm/agentvm/api"
)

// CreateService creates (and by default starts and enables) a systemd service in the VM.
func (c *Client) CreateService(ctx context.Context, id string, req api.ServiceCreate) (*api.ServiceInfo, error) {
	var s api.ServiceInfo
	return &s, c.do(ctx, "POST", vmPath(id, "/services"), req, &s)
}

// ListServices lists the VM's services with their state.
func (c *Client) ListServices(ctx context.Context, id string) ([]api.ServiceInfo, error) {
	var out api.ServiceList
	return out.Services, c.do(ctx, "GET", vmPath(id, "/services"), nil, &out)
}

// GetService describes one service.
func (c *Client) GetService(ctx context.Context, id, name string) (*api.ServiceInfo, error) {
	var s api.ServiceInfo
	return &s, c.do(ctx, "GET", vmPath(id, "/services/"+url.PathEscape(name)), nil, &s)
}

// ServiceAction runs start, stop or restart.
func (c *Client) ServiceAction(ctx context.Context, id, name, action string) (*api.ServiceInfo, error) {
	var s api.ServiceInfo
	return &s, c.do(ctx, "POST", vmPath(id, "/services/"+url.PathEscape(name)+"/"+action), nil, &s)
}

// DeleteService stops and removes a service.
func (c *Client) DeleteService(ctx context.Context, id, name string) error {
	return c.do(ctx, "DELETE", vmPath(id, "/services/"+url.PathEscape(name)), nil, nil)
}

// ServiceLogs returns the service's journal: the last lines, then (follow)
// new lines as they come until ctx ends or the reader is closed.
func (c *Client) ServiceLogs(ctx context.Context, id, name string, lines int, follow bool) (io.ReadCloser, error) {
	q := url.Values{}
	if lines > 0 {
		q.Set("lines", strconv.Itoa(lines))
	}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := c.stream(ctx, "GET", vmPath(id, "/services/"+url.PathEscape(name)+"/logs")+"?"+q.Encode(), nil, 0)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ListProcesses lists the processes in the VM.
func (c *Client) ListProcesses(ctx context.Context, id string) ([]api.ProcessInfo, error) {
	var out api.ProcessList
	return out.Processes, c.do(ctx, "GET", vmPath(id, "/processes"), nil, &out)
}

// SignalProcess sends a signal ("TERM", "KILL", "9"...) to a process in the VM.
func (c *Client) SignalProcess(ctx context.Context, id string, pid int, sig string) error {
	return c.do(ctx, "POST", vmPath(id, "/processes/"+strconv.Itoa(pid)+"/signal"), api.SignalRequest{Signal: sig}, nil)
}

// StartJob starts a detached exec; its output is kept in the VM.
func (c *Client) StartJob(ctx context.Context, id string, req api.ExecRequest) (*api.JobInfo, error) {
	var j api.JobInfo
	return &j, c.do(ctx, "POST", vmPath(id, "/jobs"), req, &j)
}

// ListJobs lists the VM's detached execs.
func (c *Client) ListJobs(ctx context.Context, id string) ([]api.JobInfo, error) {
	var out api.JobList
	return out.Jobs, c.do(ctx, "GET", vmPath(id, "/jobs"), nil, &out)
}

// GetJob describes a job.
func (c *Client) GetJob(ctx context.Context, id, job string) (*api.JobInfo, error) {
	var j api.JobInfo
	return &j, c.do(ctx, "GET", vmPath(id, "/jobs/"+url.PathEscape(job)), nil, &j)
}

// JobLogs reads a job's output (stream stdout, stderr or both; follow keeps
// reading until the job exits).
func (c *Client) JobLogs(ctx context.Context, id, job, stream string, offset int64, follow bool) (io.ReadCloser, error) {
	q := url.Values{}
	if stream != "" {
		q.Set("stream", stream)
	}
	if offset > 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := c.stream(ctx, "GET", vmPath(id, "/jobs/"+url.PathEscape(job)+"/logs")+"?"+q.Encode(), nil, 0)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WaitJob waits until a job exits (timeout 0: as long as ctx allows).
func (c *Client) WaitJob(ctx context.Context, id, job string, timeout time.Duration) (*api.JobInfo, error) {
	p := vmPath(id, "/jobs/"+url.PathEscape(job)+"/wait")
	if timeout > 0 {
		p += "?timeout_ms=" + strconv.FormatInt(timeout.Milliseconds(), 10)
	}
	var j api.JobInfo
	return &j, c.do(ctx, "POST", p, nil, &j)
}

// SignalJob signals every process of a job.
func (c *Client) SignalJob(ctx context.Context, id, job, sig string) error {
	return c.do(ctx, "POST", vmPath(id, "/jobs/"+url.PathEscape(job)+"/signal"), api.SignalRequest{Signal: sig}, nil)
}

// DeleteJob kills a job if it runs and removes it with its output.
func (c *Client) DeleteJob(ctx context.Context, id, job string) error {
	return c.do(ctx, "DELETE", vmPath(id, "/jobs/"+url.PathEscape(job)), nil, nil)
}
