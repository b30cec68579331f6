package e2b

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/agentvm/agentvm/internal/guest"
)

// envd's plain HTTP file endpoints: GET /files downloads, POST /files
// uploads (multipart or a raw body), both optionally authorised by a
// signed URL instead of the access token.

// maxUploadParts bounds the files of one multipart upload.
const maxUploadParts = 1000

// gzipMin is the smallest download sent compressed when the client accepts
// gzip (smaller ones are not worth it, and an empty body must keep its
// Content-Length: 0 for the JS SDK).
const gzipMin = 1024

func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		enc, q, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(enc), "gzip") && strings.ReplaceAll(q, " ", "") != "q=0" {
			return true
		}
	}
	return false
}

// signature is the signature of a file URL: "v1_" and the unpadded base64
// of SHA-256 over "path:operation:user:token[:expiration]".
func signature(path, op, user, token string, exp int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp > 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// fileUser is the user of a file request: the username parameter, or the
// caller's.
func (c *envdCall) fileUser(r *http.Request, signed bool) string {
	if u := r.URL.Query().Get("username"); u != "" {
		if !validUser(u) {
			return "" // refused by the callers
		}
		return u
	}
	if signed {
		return DefaultUser
	}
	return c.user
}

// fileHTTPError answers a file request with the agent's error.
func fileHTTPError(w http.ResponseWriter, err error) {
	var ae *guest.APIError
	if !errors.As(err, &ae) {
		envdHTTPError(w, http.StatusBadGateway, "the sandbox's agent: "+err.Error())
		return
	}
	status := http.StatusInternalServerError
	switch ae.Code {
	case guest.CodeNotFound:
		status = http.StatusNotFound
	case guest.CodeInvalid, guest.CodeIsDirectory, guest.CodeNotDirectory, guest.CodeExists, guest.CodeNotEmpty:
		status = http.StatusBadRequest
	case guest.CodePermission:
		status = http.StatusForbidden
	case guest.CodeUnknownUser:
		status = http.StatusUnauthorized
	case guest.CodeNoSpace:
		status = http.StatusInsufficientStorage
	}
	envdHTTPError(w, status, ae.Message)
}

func (c *envdCall) download(w http.ResponseWriter, r *http.Request, signed bool) {
	p := r.URL.Query().Get("path")
	if p == "" {
		envdHTTPError(w, http.StatusBadRequest, "path is required")
		return
	}
	user := c.fileUser(r, signed)
	if user == "" {
		envdHTTPError(w, http.StatusBadRequest, "invalid username")
		return
	}
	body, fi, err := c.g.ReadFile(r.Context(), user, p, 0, -1)
	if err != nil {
		fileHTTPError(w, err)
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": fi.Name}))
	w.Header().Add("Vary", "Accept-Encoding")
	if fi.Size >= gzipMin && acceptsGzip(r) {
		w.Header().Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusOK)
		zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		io.Copy(zw, body)
		zw.Close()
		return
	}
	if fi.Size > 0 { // 0 may be a file of unknown size (/proc): streamed to its end
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	}
	w.WriteHeader(http.StatusOK)
	io.Copy(w, body)
}

type writeInfo struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (c *envdCall) upload(w http.ResponseWriter, r *http.Request, signed bool) {
	// X-Metadata-<key>: value headers become the files' metadata.
	var meta map[string]string
	for k, vs := range r.Header {
		if key, ok := strings.CutPrefix(strings.ToLower(k), "x-metadata-"); ok && key != "" {
			if meta == nil {
				meta = map[string]string{}
			}
			meta[key] = vs[0]
		}
	}
	user := c.fileUser(r, signed)
	if user == "" {
		envdHTTPError(w, http.StatusBadRequest, "invalid username")
		return
	}
	qpath := r.URL.Query().Get("path")
	body := io.Reader(r.Body)
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			envdHTTPError(w, http.StatusBadRequest, "bad gzip body: "+err.Error())
			return
		}
		body = zr
	default:
		envdHTTPError(w, http.StatusBadRequest, "unsupported Content-Encoding "+strconv.Quote(enc))
		return
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writeInfo
	write := func(p string, data io.Reader) bool {
		if err := c.ensureParents(r.Context(), user, p); err != nil {
			fileHTTPError(w, err)
			return false
		}
		fi, err := c.g.WriteFileInPlace(r.Context(), user, p, data, true, meta)
		if err != nil {
			fileHTTPError(w, err)
			return false
		}
		out = append(out, writeInfo{Name: fi.Name, Type: "file", Path: fi.Path, Metadata: fi.Metadata})
		return true
	}
	if mt != "multipart/form-data" {
		if qpath == "" {
			envdHTTPError(w, http.StatusBadRequest, "path is required")
			return
		}
		if !write(qpath, body) {
			return
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	mr := multipart.NewReader(body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			envdHTTPError(w, http.StatusBadRequest, "bad multipart body: "+err.Error())
			return
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		if len(out) >= maxUploadParts {
			envdHTTPError(w, http.StatusBadRequest, "at most "+strconv.Itoa(maxUploadParts)+" files per upload")
			return
		}
		// The file name is the whole path (Part.FileName would keep only
		// its last element).
		_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
		p := dp["filename"]
		if qpath != "" {
			p = qpath
		}
		if p == "" {
			envdHTTPError(w, http.StatusBadRequest, "a file part has no file name and the request no path")
			return
		}
		if !write(p, part) {
			return
		}
	}
	if len(out) == 0 {
		envdHTTPError(w, http.StatusBadRequest, "no file in the upload (multipart field \"file\")")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// ensureParents creates the missing parent directories of p owned by user,
// as envd does (it creates them as root and hands them over): a user may
// then write where it could not create the directories itself. Envd's
// callers may act as root anyway, so this grants nothing new.
func (c *envdCall) ensureParents(ctx context.Context, user, p string) error {
	if user == "root" || user == "0" || !path.IsAbs(p) {
		return nil // root creates them itself; relative paths are under the user's home
	}
	dir := path.Dir(path.Clean(p))
	if _, err := c.g.Stat(ctx, "root", dir); err == nil || !isGuestCode(err, guest.CodeNotFound) {
		return nil
	}
	// The directories are arguments, never part of the script. The user
	// must exist; no existing directory of the chain may be a symlink (root
	// would create inside wherever it points); chown -h never follows one
	// swapped in after the mkdir.
	script := `u="$1"; shift; /usr/bin/id -u -- "$u" >/dev/null || exit 2
for d in "$@"; do
	if [ -L "$d" ]; then echo "$d is a symbolic link" >&2; exit 3; fi
	[ -e "$d" ] && continue
	/bin/mkdir -- "$d" && /bin/chown -h -- "$u:" "$d" || exit 1
done`
	argv := []string{"/bin/sh", "-c", script, "sh", user}
	var chain []string
	for d := dir; d != "/" && d != "."; d = path.Dir(d) {
		chain = append([]string{d}, chain...)
	}
	argv = append(argv, chain...)
	var stderr strings.Builder
	st, err := c.g.Run(ctx, guest.ExecRequest{Argv: argv}, nil, io.Discard, &limitWriter{w: &stderr, n: 4096})
	if err != nil {
		return err
	}
	switch st.ExitCode {
	case 0:
	case 2:
		return &guest.APIError{Status: http.StatusBadRequest, Code: guest.CodeUnknownUser, Message: "unknown user " + user}
	default:
		return &guest.APIError{Status: http.StatusForbidden, Code: guest.CodePermission, Message: "create the parents of " + p + ": " + strings.TrimSpace(stderr.String())}
	}
	return nil
}
