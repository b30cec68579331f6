package guest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentvm/agentvm/api"
)

func servicePath(name string) string { return PathServices + "/" + url.PathEscape(name) }

func jobPath(id string) string { return PathJobs + "/" + url.PathEscape(id) }

// ListServices returns the services, sorted by name.
func (c *Client) ListServices(ctx context.Context) ([]api.ServiceInfo, error) {
	var list api.ServiceList
	if err := c.do(ctx, http.MethodGet, PathServices, nil, &list); err != nil {
		return nil, err
	}
	return list.Services, nil
}

// CreateService writes, enables (unless NoBoot) and starts (unless NoStart)
// a service. An existing name gives an *APIError with Status 409 and Code
// "exists".
func (c *Client) CreateService(ctx context.Context, req api.ServiceCreate) (*api.ServiceInfo, error) {
	var info api.ServiceInfo
	if err := c.do(ctx, http.MethodPost, PathServices, req, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// GetService describes a service; an unknown name gives an *APIError with
// Status 404 and Code "not_found".
func (c *Client) GetService(ctx context.Context, name string) (*api.ServiceInfo, error) {
	var info api.ServiceInfo
	if err := c.do(ctx, http.MethodGet, servicePath(name), nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// ServiceAction runs "start", "stop" or "restart" and returns the service
// afterwards.
func (c *Client) ServiceAction(ctx context.Context, name, action string) (*api.ServiceInfo, error) {
	var info api.ServiceInfo
	if err := c.do(ctx, http.MethodPost, servicePath(name)+"/"+url.PathEscape(action), nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// DeleteService stops, disables and removes a service.
func (c *Client) DeleteService(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, servicePath(name), nil, nil)
}

// ServiceLogs returns the last lines of the service's journal (lines <= 0:
// the guest's default, 200). With follow the stream stays open with new
// lines until ctx ends or the reader is closed.
func (c *Client) ServiceLogs(ctx context.Context, name string, lines int, follow bool) (io.ReadCloser, error) {
	q := url.Values{}
	if lines > 0 {
		q.Set("lines", strconv.Itoa(lines))
	}
	if follow {
		q.Set("follow", "1")
	}
	return c.getStream(ctx, servicePath(name)+"/logs", q)
}

// ListProcesses returns the guest's processes, sorted by pid.
func (c *Client) ListProcesses(ctx context.Context) ([]api.ProcessInfo, error) {
	var list api.ProcessList
	if err := c.do(ctx, http.MethodGet, PathProcesses, nil, &list); err != nil {
		return nil, err
	}
	return list.Processes, nil
}

// SignalProcess sends a signal ("TERM", "SIGKILL", "9", ...) to a process.
// A missing process gives Status 404; pid 1 and the agent itself 400.
func (c *Client) SignalProcess(ctx context.Context, pid int, sig string) error {
	return c.do(ctx, http.MethodPost, PathProcesses+"/"+strconv.Itoa(pid)+"/signal", TermSignal{Signal: sig}, nil)
}

// StartJob starts a detached command (Stdin must be false; TimeoutMS
// bounds its run time).
func (c *Client) StartJob(ctx context.Context, req ExecRequest) (*api.JobInfo, error) {
	var info api.JobInfo
	if err := c.do(ctx, http.MethodPost, PathJobs, req, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// ListJobs returns the jobs, oldest first.
func (c *Client) ListJobs(ctx context.Context) ([]api.JobInfo, error) {
	var list api.JobList
	if err := c.do(ctx, http.MethodGet, PathJobs, nil, &list); err != nil {
		return nil, err
	}
	return list.Jobs, nil
}

// GetJob describes a job; an unknown id gives Status 404.
func (c *Client) GetJob(ctx context.Context, id string) (*api.JobInfo, error) {
	var info api.JobInfo
	if err := c.do(ctx, http.MethodGet, jobPath(id), nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// JobLogs reads a job's output from offset: stream is "stdout" (default),
// "stderr" or "both" (stdout then stderr, offset into the concatenation;
// not with follow). With follow the stream stays open until the job has
// exited and its output was sent, or until ctx ends or the reader is closed.
func (c *Client) JobLogs(ctx context.Context, id, stream string, offset int64, follow bool) (io.ReadCloser, error) {
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
	return c.getStream(ctx, jobPath(id)+"/logs", q)
}

// WaitJob waits until the job has exited, or for timeout (0: until ctx
// ends), and returns it (Exited is false after a timeout).
func (c *Client) WaitJob(ctx context.Context, id string, timeout time.Duration) (*api.JobInfo, error) {
	p := jobPath(id) + "/wait"
	if timeout > 0 {
		ms := (timeout + time.Millisecond - 1) / time.Millisecond
		p += "?timeout_ms=" + strconv.FormatInt(int64(ms), 10)
	}
	var info api.JobInfo
	if err := c.do(ctx, http.MethodPost, p, nil, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// SignalJob sends a signal to every process of a running job (a no-op
// once it has exited).
func (c *Client) SignalJob(ctx context.Context, id, sig string) error {
	return c.do(ctx, http.MethodPost, jobPath(id)+"/signal", TermSignal{Signal: sig}, nil)
}

// DeleteJob kills the job if it runs and removes it with its output.
func (c *Client) DeleteJob(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, jobPath(id), nil, nil)
}

// getStream GETs path and returns the body for the caller to read; ctx
// covers the whole read.
func (c *Client) getStream(ctx context.Context, path string, q url.Values) (io.ReadCloser, error) {
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("guest: GET %s: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeAPIError(resp)
	}
	return resp.Body, nil
}
