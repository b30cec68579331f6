package guest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"time"

	"github.com/agentvm/agentvm/api"
)

func fileQuery(user, p string) url.Values {
	q := url.Values{}
	q.Set("path", p)
	if user != "" {
		q.Set("user", user)
	}
	return q
}

// fileRequest sends a request to a file endpoint and returns the response
// of a 2xx answer; other answers are returned as *APIError.
func (c *Client) fileRequest(ctx context.Context, method, endpoint string, q url.Values, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, baseURL+endpoint+"?"+q.Encode(), body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		ct := "application/octet-stream"
		if endpoint == PathFilesTar {
			ct = "application/x-tar"
		}
		req.Header.Set("Content-Type", ct)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("guest: %s %s: %w", method, endpoint, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeAPIError(resp)
	}
	return resp, nil
}

func decodeInto(resp *http.Response, endpoint string, out any) error {
	defer resp.Body.Close()
	return decodeReply(resp.Body, endpoint, out)
}

// Stat returns the api.FileInfo of path (lstat) as user ("" = root).
func (c *Client) Stat(ctx context.Context, user, p string) (*api.FileInfo, error) {
	var fi api.FileInfo
	if err := c.do(ctx, http.MethodGet, PathFilesStat+"?"+fileQuery(user, p).Encode(), nil, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// List returns the entries of directory path, sorted by name.
func (c *Client) List(ctx context.Context, user, p string) (*api.FileList, error) {
	var l api.FileList
	if err := c.do(ctx, http.MethodGet, PathFilesList+"?"+fileQuery(user, p).Encode(), nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// ReadFile streams length bytes of path from offset (length < 0: to the
// end). The api.FileInfo carries the mode, mtime and full size from the
// response headers. The caller closes the reader.
func (c *Client) ReadFile(ctx context.Context, user, p string, offset, length int64) (io.ReadCloser, *api.FileInfo, error) {
	q := fileQuery(user, p)
	if offset > 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	if length >= 0 {
		q.Set("length", strconv.FormatInt(length, 10))
	}
	resp, err := c.fileRequest(ctx, http.MethodGet, PathFiles, q, nil)
	if err != nil {
		return nil, nil, err
	}
	fi := &api.FileInfo{Name: path.Base(p), Path: p, Type: FileTypeFile}
	fillHeaderInfo(fi, resp.Header)
	if n, err := strconv.ParseInt(resp.Header.Get(HeaderFileSize), 10, 64); err == nil {
		fi.Size = n
	}
	return resp.Body, fi, nil
}

func fillHeaderInfo(fi *api.FileInfo, h http.Header) {
	if m, err := strconv.ParseUint(h.Get(HeaderFileMode), 8, 32); err == nil {
		fi.Mode = uint32(m)
	}
	if t, err := time.Parse(time.RFC3339Nano, h.Get(HeaderFileMtime)); err == nil {
		fi.ModTime = t
	}
}

// WriteFile atomically replaces path with the contents of r (written to a
// temporary file, synced, renamed). mode 0 keeps the mode of the file it
// replaces (0644 for a new file); mkdirs creates missing parents.
func (c *Client) WriteFile(ctx context.Context, user, p string, r io.Reader, mode uint32, mkdirs bool) (*api.FileInfo, error) {
	return c.writeFile(ctx, user, p, r, mode, mkdirs, false, nil)
}

// WriteFileInPlace truncates and rewrites path (created when missing, owned
// by user) the way E2B's envd does, so that watchers see the same events;
// it is not atomic.
// meta is kept as the file's metadata (see api.FileInfo.Metadata).
func (c *Client) WriteFileInPlace(ctx context.Context, user, p string, r io.Reader, mkdirs bool, meta map[string]string) (*api.FileInfo, error) {
	return c.writeFile(ctx, user, p, r, 0, mkdirs, true, meta)
}

func (c *Client) writeFile(ctx context.Context, user, p string, r io.Reader, mode uint32, mkdirs, inplace bool, meta map[string]string) (*api.FileInfo, error) {
	q := fileQuery(user, p)
	if inplace {
		q.Set("inplace", "1")
	}
	for k, v := range meta {
		q.Add("meta", k+"="+v)
	}
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode))
	}
	if mkdirs {
		q.Set("mkdirs", "1")
	}
	if r == nil {
		r = http.NoBody
	}
	resp, err := c.fileRequest(ctx, http.MethodPut, PathFiles, q, r)
	if err != nil {
		return nil, err
	}
	var fi api.FileInfo
	if err := decodeInto(resp, PathFiles, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Remove deletes a file, symlink or empty directory; recursive also
// removes non-empty directories.
func (c *Client) Remove(ctx context.Context, user, p string, recursive bool) error {
	q := fileQuery(user, p)
	if recursive {
		q.Set("recursive", "1")
	}
	return c.do(ctx, http.MethodDelete, PathFiles+"?"+q.Encode(), nil, nil)
}

// Mkdir creates a directory and its missing parents.
func (c *Client) Mkdir(ctx context.Context, req api.MkdirRequest) (*api.FileInfo, error) {
	var fi api.FileInfo
	if err := c.do(ctx, http.MethodPost, PathFilesMkdir, req, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// Rename renames a file or directory and returns the api.FileInfo of the new
// path.
func (c *Client) Rename(ctx context.Context, req api.RenameRequest) (*api.FileInfo, error) {
	var fi api.FileInfo
	if err := c.do(ctx, http.MethodPost, PathFilesMove, req, &fi); err != nil {
		return nil, err
	}
	return &fi, nil
}

// ReadTar streams a tar archive of path: a directory's contents (names
// relative to it) or a single file. The caller closes the reader; an
// archive cut short by a guest-side failure ends with an unexpected EOF.
func (c *Client) ReadTar(ctx context.Context, user, p string) (io.ReadCloser, error) {
	resp, err := c.fileRequest(ctx, http.MethodGet, PathFilesTar, fileQuery(user, p), nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteTar extracts the tar stream r into directory path (created when
// missing).
func (c *Client) WriteTar(ctx context.Context, user, p string, r io.Reader) (*api.TarResult, error) {
	resp, err := c.fileRequest(ctx, http.MethodPut, PathFilesTar, fileQuery(user, p), r)
	if err != nil {
		return nil, err
	}
	var res api.TarResult
	if err := decodeInto(resp, PathFilesTar, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
