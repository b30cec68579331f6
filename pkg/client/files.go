package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/agentvm/agentvm/api"
)

func vmPath(id, rest string) string { return "/v1/vms/" + url.PathEscape(id) + rest }

// FileOptions are the common options of file calls.
type FileOptions struct {
	User string // guest user the operation runs as (default root, or the token's user)
}

func fileQuery(path string, o FileOptions, kv ...string) string {
	q := url.Values{"path": {path}}
	if o.User != "" {
		q.Set("user", o.User)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	return "?" + q.Encode()
}

// Stat describes a file inside the VM.
func (c *Client) Stat(ctx context.Context, id, path string, o FileOptions) (*api.FileInfo, error) {
	var fi api.FileInfo
	return &fi, c.do(ctx, "GET", vmPath(id, "/files/stat")+fileQuery(path, o), nil, &fi)
}

// ListDir lists a directory inside the VM.
func (c *Client) ListDir(ctx context.Context, id, path string, o FileOptions) (*api.FileList, error) {
	var fl api.FileList
	return &fl, c.do(ctx, "GET", vmPath(id, "/files/list")+fileQuery(path, o), nil, &fl)
}

// Mkdir creates a directory and its missing parents.
func (c *Client) Mkdir(ctx context.Context, id string, req api.MkdirRequest) (*api.FileInfo, error) {
	var fi api.FileInfo
	return &fi, c.do(ctx, "POST", vmPath(id, "/files/mkdir"), req, &fi)
}

// Rename moves a file or directory inside the VM.
func (c *Client) Rename(ctx context.Context, id string, req api.RenameRequest) (*api.FileInfo, error) {
	var fi api.FileInfo
	return &fi, c.do(ctx, "POST", vmPath(id, "/files/rename"), req, &fi)
}

// Remove deletes a file, or a directory (recursive for a non-empty one).
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool, o FileOptions) error {
	r := ""
	if recursive {
		r = "1"
	}
	return c.do(ctx, "DELETE", vmPath(id, "/files")+fileQuery(path, o, "recursive", r), nil, nil)
}

// stream sends a request with a raw body and returns the response on 2xx.
func (c *Client) stream(ctx context.Context, method, p string, body io.Reader, size int64) (*http.Response, error) {
	req, err := c.newRequest(ctx, method, p, nil)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Body = io.NopCloser(body)
		req.ContentLength = size
		if size < 0 {
			req.ContentLength = -1
		}
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach agentvm at %s: %w", c.BaseURL, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// ReadFile streams a file (or a range of it: length < 0 reads to the end).
// The returned FileInfo carries the file's mode, mtime and whole size.
func (c *Client) ReadFile(ctx context.Context, id, path string, offset, length int64, o FileOptions) (io.ReadCloser, *api.FileInfo, error) {
	var off, ln string
	if offset > 0 {
		off = strconv.FormatInt(offset, 10)
	}
	if length >= 0 {
		ln = strconv.FormatInt(length, 10)
	}
	resp, err := c.stream(ctx, "GET", vmPath(id, "/files")+fileQuery(path, o, "offset", off, "length", ln), nil, 0)
	if err != nil {
		return nil, nil, err
	}
	fi := fileInfoFromHeaders(path, resp.Header)
	return resp.Body, fi, nil
}

func fileInfoFromHeaders(path string, h http.Header) *api.FileInfo {
	fi := &api.FileInfo{Path: path, Type: h.Get("X-File-Type")}
	if fi.Type == "" {
		fi.Type = "file"
	}
	if m, err := strconv.ParseUint(h.Get("X-File-Mode"), 8, 32); err == nil {
		fi.Mode = uint32(m)
	}
	fi.Size, _ = strconv.ParseInt(h.Get("X-File-Size"), 10, 64)
	fi.ModTime, _ = parseTime(h.Get("X-File-Mtime"))
	return fi
}

// WriteOptions are the options of WriteFile.
type WriteOptions struct {
	FileOptions
	Mode   uint32 // 0: keep the existing file's mode, else 0644
	MkDirs bool   // create missing parent directories
}

// WriteFile replaces a file atomically with the content of r (size -1 if
// unknown): readers in the VM see the old or the new file, never a part.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, size int64, o WriteOptions) (*api.FileInfo, error) {
	var mode, mk string
	if o.Mode != 0 {
		mode = fmt.Sprintf("%04o", o.Mode)
	}
	if o.MkDirs {
		mk = "1"
	}
	resp, err := c.stream(ctx, "PUT", vmPath(id, "/files")+fileQuery(path, o.FileOptions, "mode", mode, "mkdirs", mk), r, size)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi api.FileInfo
	return &fi, decodeJSONBody(resp, &fi)
}

// ReadTar streams a tar archive of a file or directory tree inside the VM
// (entry names relative to path). The FileInfo describes path itself.
func (c *Client) ReadTar(ctx context.Context, id, path string, o FileOptions) (io.ReadCloser, *api.FileInfo, error) {
	resp, err := c.stream(ctx, "GET", vmPath(id, "/files/tar")+fileQuery(path, o), nil, 0)
	if err != nil {
		return nil, nil, err
	}
	return resp.Body, fileInfoFromHeaders(path, resp.Header), nil
}

// WriteTar extracts a tar archive into the directory path (created if missing).
func (c *Client) WriteTar(ctx context.Context, id, path string, r io.Reader, o FileOptions) (*api.TarResult, error) {
	resp, err := c.stream(ctx, "PUT", vmPath(id, "/files/tar")+fileQuery(path, o), r, -1)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var tr api.TarResult
	return &tr, decodeJSONBody(resp, &tr)
}
