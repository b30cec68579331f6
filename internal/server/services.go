package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
)

// Services, processes and jobs are served by the guest agent; the server
// checks the caller (they run commands: the exec permission), applies its
// user restriction (owners.go: a user-restricted token sees and acts on its
// user's only), records events and relays.
func (s *Server) serviceRoutes(mux patternMux) {
	x := func(h http.HandlerFunc) http.HandlerFunc { return s.scoped(api.PermExec, h) }
	svc := func(h http.HandlerFunc) http.HandlerFunc { return x(s.owned(ownedService, h)) }
	job := func(h http.HandlerFunc) http.HandlerFunc { return x(s.owned(ownedJob, h)) }
	mux.HandleFunc("GET /v1/vms/{id}/services", x(s.ownedList(ownedService, s.relayGuest(guest.PathServices, ""))))
	mux.HandleFunc("POST /v1/vms/{id}/services", x(s.createService))
	mux.HandleFunc("GET /v1/vms/{id}/services/{name}", svc(s.relayGuest(guest.PathServices+"/{name}", "")))
	mux.HandleFunc("DELETE /v1/vms/{id}/services/{name}", svc(s.relayGuest(guest.PathServices+"/{name}", "service {name} removed")))
	mux.HandleFunc("GET /v1/vms/{id}/services/{name}/logs", svc(s.relayGuest(guest.PathServices+"/{name}/logs", "")))
	for _, a := range []string{"start", "stop", "restart"} {
		mux.HandleFunc("POST /v1/vms/{id}/services/{name}/"+a, svc(s.relayGuest(guest.PathServices+"/{name}/"+a, "service {name}: "+a)))
	}
	mux.HandleFunc("GET /v1/vms/{id}/processes", x(s.ownedList(ownedProcess, s.relayGuest(guest.PathProcesses, ""))))
	mux.HandleFunc("POST /v1/vms/{id}/processes/{pid}/signal", x(s.owned(ownedProcess, s.relayGuest(guest.PathProcesses+"/{pid}/signal", "signal sent to pid {pid}"))))
	mux.HandleFunc("POST /v1/vms/{id}/jobs", x(s.startJob))
	mux.HandleFunc("GET /v1/vms/{id}/jobs", x(s.ownedList(ownedJob, s.relayGuest(guest.PathJobs, ""))))
	mux.HandleFunc("GET /v1/vms/{id}/jobs/{job}", job(s.relayGuest(guest.PathJobs+"/{job}", "")))
	mux.HandleFunc("GET /v1/vms/{id}/jobs/{job}/logs", job(s.relayGuest(guest.PathJobs+"/{job}/logs", "")))
	mux.HandleFunc("POST /v1/vms/{id}/jobs/{job}/wait", job(s.relayGuest(guest.PathJobs+"/{job}/wait", "")))
	mux.HandleFunc("POST /v1/vms/{id}/jobs/{job}/signal", job(s.relayGuest(guest.PathJobs+"/{job}/signal", "signal sent to job {job}")))
	mux.HandleFunc("DELETE /v1/vms/{id}/jobs/{job}", job(s.relayGuest(guest.PathJobs+"/{job}", "job {job} removed")))
}

// expand fills {name}, {pid} and {job} from the request's path values.
func expand(r *http.Request, pattern string, escape bool) string {
	for _, k := range []string{"name", "pid", "job"} {
		v := r.PathValue(k)
		if escape {
			v = url.PathEscape(v)
		}
		pattern = strings.ReplaceAll(pattern, "{"+k+"}", v)
	}
	return pattern
}

// relayGuest relays a request to the same endpoint of the guest agent,
// streaming the answer (logs follow). event, when set, is recorded on success.
func (s *Server) relayGuest(guestPath, event string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, gc, err := s.guestOf(r.Context(), r.PathValue("id"))
		if err != nil {
			writeErr(w, err)
			return
		}
		var body io.Reader
		if r.Method == http.MethodPost {
			b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
			if err != nil {
				writeError(w, http.StatusBadRequest, api.CodeInvalid, "request body: "+err.Error())
				return
			}
			body = bytes.NewReader(b)
		}
		u := "http://agentvm" + expand(r, guestPath, true)
		if r.URL.RawQuery != "" {
			u += "?" + r.URL.RawQuery
		}
		greq, err := http.NewRequestWithContext(r.Context(), r.Method, u, body)
		if err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
			return
		}
		if body != nil {
			greq.Header.Set("Content-Type", "application/json")
		}
		resp, err := gc.HTTPClient().Do(greq)
		if err != nil {
			if r.Context().Err() == nil {
				writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "guest agent: "+err.Error())
			}
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 400 {
			relayGuestError(w, resp)
			return
		}
		if event != "" {
			typ := "process"
			if strings.Contains(guestPath, "/services") {
				typ = "service"
			} else if strings.Contains(guestPath, "/jobs") {
				typ = "job"
			}
			s.svc.Event(v.ID, typ, actor(r), "%s", expand(r, event, false))
		}
		if ct := resp.Header.Get("Content-Type"); ct != "" {
			w.Header().Set("Content-Type", ct)
		}
		w.WriteHeader(resp.StatusCode)
		io.CopyBuffer(flushWriter{w}, resp.Body, make([]byte, 32<<10))
	}
}

func (s *Server) createService(w http.ResponseWriter, r *http.Request) {
	var req api.ServiceCreate
	if !decodeJSON(w, r, &req) {
		return
	}
	var ok bool
	if req.User, ok = actAs(w, r, req.User); !ok {
		return
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("invalid environment variable %q", k))
			return
		}
	}
	v, gc, err := s.guestOf(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	info, err := gc.CreateService(r.Context(), api.ServiceCreate{Name: req.Name, Argv: req.Argv, Shell: req.Shell, Env: req.Env,
		Cwd: req.Cwd, User: req.User, Restart: req.Restart, Type: req.Type, NoBoot: req.NoBoot, NoStart: req.NoStart})
	if err != nil {
		writeGuestErr(w, err)
		return
	}
	cmd := req.Shell
	if cmd == "" {
		cmd = strings.Join(req.Argv, " ")
	}
	s.svc.Event(v.ID, "service", actor(r), "service %s created (%s, restart %s): %s", info.Name, info.ActiveState, info.Restart, cmd)
	b, _ := json.Marshal(info)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(b)
}

func (s *Server) startJob(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	greq, err := validateExec(&req)
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	var ok bool
	if greq.User, ok = actAs(w, r, greq.User); !ok {
		return
	}
	v, gc, err := s.guestOf(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	j, err := gc.StartJob(r.Context(), greq)
	if err != nil {
		writeGuestErr(w, err)
		return
	}
	s.svc.EventData(v.ID, "job", actor(r), map[string]string{"job": j.ID, "cmd": describeCmd(&req)}, "job %s started: %s", j.ID, describeCmd(&req))
	writeJSON(w, http.StatusCreated, j)
}
