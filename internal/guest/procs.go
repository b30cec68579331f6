package guest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// maxProcEventLine bounds one line of a managed process stream read from
// the guest (an output chunk is at most 32 KiB, 44 KiB in base64).
const maxProcEventLine = 1 << 20

// ndjson reads a guest's NDJSON stream one bounded line at a time. Its
// buffer starts small (streams are many, long lines rare) and a line may
// grow to maxProcEventLine.
type ndjson struct {
	body io.ReadCloser
	br   *bufio.Reader
	line []byte
}

func newNDJSON(body io.ReadCloser) *ndjson {
	return &ndjson{body: body, br: bufio.NewReaderSize(body, 16<<10)}
}

// next decodes the next line into v; io.EOF at a clean end.
func (s *ndjson) next(v any) error {
	s.line = s.line[:0]
	for {
		part, err := s.br.ReadSlice('\n')
		if len(s.line)+len(part) > maxProcEventLine {
			return fmt.Errorf("guest: stream line longer than %d bytes", maxProcEventLine)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			s.line = append(s.line, part...)
			continue
		}
		line := part
		if len(s.line) > 0 {
			s.line = append(s.line, part...)
			line = s.line
		}
		if err != nil {
			if len(bytes.TrimSpace(line)) == 0 {
				return io.EOF
			}
			return err
		}
		if err := json.Unmarshal(line, v); err != nil {
			return fmt.Errorf("guest: bad stream line: %w", err)
		}
		return nil
	}
}

// ProcStream is an attached managed process stream.
type ProcStream struct{ *ndjson }

// Next returns the next event; io.EOF when the stream ended without an end
// event (the stream was dropped, or the agent went away).
func (s *ProcStream) Next() (ProcEvent, error) {
	var ev ProcEvent
	err := s.next(&ev)
	return ev, err
}

// Close detaches; the process keeps running.
func (s *ProcStream) Close() error { return s.body.Close() }

func (c *Client) procStream(ctx context.Context, path string, in any) (*ProcStream, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("guest: POST %s: %w", path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeAPIError(resp)
	}
	return &ProcStream{newNDJSON(resp.Body)}, nil
}

// StartProc starts a managed process; the stream's first event is its start.
func (c *Client) StartProc(ctx context.Context, req ProcStart) (*ProcStream, error) {
	return c.procStream(ctx, PathProcs, req)
}

// ConnectProc attaches to a running managed process's output from now on.
func (c *Client) ConnectProc(ctx context.Context, sel ProcSelector) (*ProcStream, error) {
	return c.procStream(ctx, PathProcsConnect, sel)
}

// ListProcs lists the running managed processes.
func (c *Client) ListProcs(ctx context.Context) (*ProcList, error) {
	var l ProcList
	if err := c.do(ctx, http.MethodGet, PathProcs, nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// ProcInput writes to a managed process's stdin or pty.
func (c *Client) ProcInput(ctx context.Context, in ProcInput) error {
	return c.do(ctx, http.MethodPost, PathProcsInput, in, nil)
}

// ProcCloseStdin closes a managed process's stdin.
func (c *Client) ProcCloseStdin(ctx context.Context, sel ProcSelector) error {
	return c.do(ctx, http.MethodPost, PathProcsCloseStdin, sel, nil)
}

// ProcSignal signals a managed process's group.
func (c *Client) ProcSignal(ctx context.Context, req ProcSignal) error {
	return c.do(ctx, http.MethodPost, PathProcsSignal, req, nil)
}

// ProcResize resizes a managed process's pty.
func (c *Client) ProcResize(ctx context.Context, req ProcResize) error {
	return c.do(ctx, http.MethodPost, PathProcsResize, req, nil)
}
