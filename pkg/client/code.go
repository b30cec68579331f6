package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/agentvm/agentvm/api"
)

// Execution is the outcome of a RunCode: everything its events said.
type Execution struct {
	Stdout         string
	Stderr         string
	Results        []api.CodeEvent // type "result"
	Error          *api.CodeEvent  // type "error", if the code raised
	ExecutionCount int
}

// Text is the main result's text/plain representation ("" if none).
func (e *Execution) Text() string {
	for _, r := range e.Results {
		if r.Main {
			var s string
			json.Unmarshal(r.Data["text/plain"], &s)
			return s
		}
	}
	return ""
}

// RunCode runs code in a code-interpreter VM. onEvent (optional) sees every
// event as it arrives; the returned Execution collects them (all of the
// output: use RunCodeEvents to keep only what you need). An error in the code
// is Execution.Error, not err; err is for the call itself (and a run that
// ended abnormally).
func (c *Client) RunCode(ctx context.Context, id string, req api.RunCodeRequest, onEvent func(api.CodeEvent)) (*Execution, error) {
	ex := &Execution{}
	var stdout, stderr strings.Builder
	err := c.RunCodeEvents(ctx, id, req, func(e api.CodeEvent) {
		if onEvent != nil {
			onEvent(e)
		}
		switch e.Type {
		case api.CodeStdout:
			stdout.WriteString(e.Text)
		case api.CodeStderr:
			stderr.WriteString(e.Text)
		case api.CodeResult:
			ex.Results = append(ex.Results, e)
		case api.CodeError:
			ex.Error = &e
		case api.CodeCount:
			ex.ExecutionCount = e.ExecutionCount
		}
	})
	ex.Stdout, ex.Stderr = stdout.String(), stderr.String()
	return ex, err
}

// RunCodeEvents runs code and hands each event to onEvent as it arrives,
// keeping nothing. It returns when the run ends; a run that ends abnormally
// (the end event carries an error, or the stream breaks) is an error.
func (c *Client) RunCodeEvents(ctx context.Context, id string, req api.RunCodeRequest, onEvent func(api.CodeEvent)) error {
	hreq, err := c.newRequest(ctx, "POST", vmPath(id, "/code"), req)
	if err != nil {
		return err
	}
	resp, err := c.HTTP.Do(hreq)
	if err != nil {
		return fmt.Errorf("cannot reach agentvm at %s: %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return decodeError(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 80<<20)
	for sc.Scan() {
		var e api.CodeEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("run code: bad event from the server: %w", err)
		}
		onEvent(e)
		if e.Type == api.CodeEnd {
			if e.Error != "" {
				return fmt.Errorf("run code: %s", e.Error)
			}
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("run code: %w", err)
	}
	return fmt.Errorf("run code: the stream ended before the run did")
}

// ListCodeContexts lists the VM's code contexts.
func (c *Client) ListCodeContexts(ctx context.Context, id string) ([]api.CodeContext, error) {
	var out api.CodeContextList
	return out.Contexts, c.do(ctx, "GET", vmPath(id, "/code/contexts"), nil, &out)
}

// CreateCodeContext starts a new kernel (language python, javascript or bash).
func (c *Client) CreateCodeContext(ctx context.Context, id string, req api.CreateCodeContextRequest) (*api.CodeContext, error) {
	var out api.CodeContext
	return &out, c.do(ctx, "POST", vmPath(id, "/code/contexts"), req, &out)
}

// DeleteCodeContext stops a context's kernel.
func (c *Client) DeleteCodeContext(ctx context.Context, id, contextID string) error {
	return c.do(ctx, "DELETE", vmPath(id, "/code/contexts/"+url.PathEscape(contextID)), nil, nil)
}

// RestartCodeContext restarts a context's kernel (its state is lost, its id kept).
func (c *Client) RestartCodeContext(ctx context.Context, id, contextID string) error {
	return c.do(ctx, "POST", vmPath(id, "/code/contexts/"+url.PathEscape(contextID)+"/restart"), nil, nil)
}
