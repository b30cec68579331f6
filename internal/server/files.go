package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
)

// The files API is served by the guest agent; the server checks the caller,
// applies its user restriction and relays the request and the answer as
// streams. Paths name files inside the VM only: the host never opens them.
func (s *Server) fileRoutes(mux patternMux) {
	relay := func(guestPath string) http.HandlerFunc {
		return s.scoped(api.PermFiles, func(w http.ResponseWriter, r *http.Request) { s.relayFiles(w, r, guestPath) })
	}
	mux.HandleFunc("GET /v1/vms/{id}/files", relay(guest.PathFiles))
	mux.HandleFunc("PUT /v1/vms/{id}/files", relay(guest.PathFiles))
	mux.HandleFunc("DELETE /v1/vms/{id}/files", relay(guest.PathFiles))
	mux.HandleFunc("GET /v1/vms/{id}/files/stat", relay(guest.PathFilesStat))
	mux.HandleFunc("GET /v1/vms/{id}/files/list", relay(guest.PathFilesList))
	mux.HandleFunc("GET /v1/vms/{id}/files/tar", relay(guest.PathFilesTar))
	mux.HandleFunc("PUT /v1/vms/{id}/files/tar", relay(guest.PathFilesTar))
	mux.HandleFunc("POST /v1/vms/{id}/files/mkdir", relay(guest.PathFilesMkdir))
	mux.HandleFunc("POST /v1/vms/{id}/files/rename", relay(guest.PathFilesMove))
}

// checkGuestPath validates a path given for a file inside the VM.
func checkGuestPath(name, p string) error {
	switch {
	case p == "":
		return errors.New(name + " is required")
	case strings.ContainsRune(p, 0):
		return errors.New(name + " contains a NUL byte")
	case len(p) > 4096:
		return errors.New(name + " is longer than 4096 bytes")
	}
	return nil
}

var fileHeaders = []string{"Content-Type", "Content-Length", "Content-Range", "Accept-Ranges", "Last-Modified",
	guest.HeaderFileMode, guest.HeaderFileMtime, guest.HeaderFileSize, guest.HeaderFileType}

func (s *Server) relayFiles(w http.ResponseWriter, r *http.Request, guestPath string) {
	q := r.URL.Query()
	var body io.Reader = r.Body
	if r.Method == http.MethodPost { // mkdir, rename: JSON bodies carry the user and paths
		var req struct {
			api.RenameRequest
			Path string `json:"path,omitempty"`
			Mode uint32 `json:"mode,omitempty"`
		}
		if !decodeJSON(w, r, &req) {
			return
		}
		var ok bool
		if req.User, ok = actAs(w, r, req.User); !ok {
			return
		}
		var out any
		if guestPath == guest.PathFilesMkdir {
			if err := checkGuestPath("path", req.Path); err != nil {
				writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
				return
			}
			out = api.MkdirRequest{Path: req.Path, User: req.User, Mode: req.Mode}
		} else {
			for _, c := range [][2]string{{"from", req.From}, {"to", req.To}} {
				if err := checkGuestPath(c[0], c[1]); err != nil {
					writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
					return
				}
			}
			out = api.RenameRequest{From: req.From, To: req.To, User: req.User, Overwrite: req.Overwrite}
		}
		b, _ := json.Marshal(out)
		body = bytes.NewReader(b)
	} else {
		if err := checkGuestPath("path", q.Get("path")); err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error()+" (the query parameter path names a file inside the VM)")
			return
		}
		user, ok := actAs(w, r, q.Get("user"))
		if !ok {
			return
		}
		if user == "" {
			q.Del("user")
		} else {
			q.Set("user", user)
		}
		if r.Method == http.MethodGet || r.Method == http.MethodDelete {
			body = nil
		}
	}
	_, gc, err := s.svc.Guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	greq, err := http.NewRequestWithContext(r.Context(), r.Method, "http://agentvm"+guestPath+"?"+q.Encode(), body)
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	if body != nil && r.Method == http.MethodPut {
		greq.ContentLength = r.ContentLength
	}
	if rg := r.Header.Get("Range"); rg != "" {
		greq.Header.Set("Range", rg)
	}
	resp, err := gc.HTTPClient().Do(greq)
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "guest agent: "+err.Error())
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		relayGuestError(w, resp)
		return
	}
	for _, h := range fileHeaders {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	buf := make([]byte, 1<<20)
	io.CopyBuffer(flushWriter{w}, resp.Body, buf)
}

// relayGuestError turns a guest agent error into the API's error envelope,
// keeping its status and message.
func relayGuestError(w http.ResponseWriter, resp *http.Response) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	ae := &guest.APIError{Status: resp.StatusCode, Message: strings.TrimSpace(string(b))}
	var env guest.ErrorEnvelope
	if json.Unmarshal(b, &env) == nil && env.Error != nil {
		ae.Code, ae.Message = env.Error.Code, env.Error.Message
	}
	if ae.Message == "" {
		ae.Message = "guest agent answered " + strconv.Itoa(resp.StatusCode)
	}
	writeGuestErr(w, ae)
}

// flushWriter flushes after every write so streamed downloads do not stall
// in the server's buffer.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}
