package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/coder/websocket"
)

func (s *Server) termRoutes(mux patternMux) {
	t := func(h http.HandlerFunc) http.HandlerFunc { return s.scoped(api.PermTerm, h) }
	mux.HandleFunc("GET /v1/vms/{id}/terminals", t(s.listTerms))
	mux.HandleFunc("POST /v1/vms/{id}/terminals", t(s.createTerm))
	mux.HandleFunc("GET /v1/vms/{id}/terminals/{name}", t(s.getOrAttachTerm))
	mux.HandleFunc("DELETE /v1/vms/{id}/terminals/{name}", t(s.termOp(func(ctx context.Context, gc *guest.Client, name string, _ *http.Request) error {
		return gc.DeleteTerm(ctx, name)
	})))
	mux.HandleFunc("POST /v1/vms/{id}/terminals/{name}/resize", t(s.termOp(func(ctx context.Context, gc *guest.Client, name string, r *http.Request) error {
		var sz guest.TermSize
		if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 4096)).Decode(&sz); err != nil {
			return &guest.APIError{Status: 400, Code: guest.CodeInvalid, Message: "invalid JSON body: " + err.Error()}
		}
		return gc.ResizeTerm(ctx, name, sz)
	})))
	mux.HandleFunc("POST /v1/vms/{id}/terminals/{name}/signal", t(s.termOp(func(ctx context.Context, gc *guest.Client, name string, r *http.Request) error {
		var sig guest.TermSignal
		if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 4096)).Decode(&sig); err != nil {
			return &guest.APIError{Status: 400, Code: guest.CodeInvalid, Message: "invalid JSON body: " + err.Error()}
		}
		return gc.SignalTerm(ctx, name, sig.Signal)
	})))
}

// writeGuestErr writes an error from a guest client call: the agent's own
// 4xx answers keep their status and message.
func writeGuestErr(w http.ResponseWriter, err error) {
	var ae *guest.APIError
	if errors.As(err, &ae) && ae.Status >= 400 && ae.Status < 600 {
		code := ae.Code
		switch code {
		case guest.CodeInvalid, guest.CodeUnknownUser, "":
			code = api.CodeInvalid // the public API has one code for bad input
		}
		writeError(w, ae.Status, code, ae.Message)
		return
	}
	writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
}

func termToAPI(t guest.TermInfo) api.TermInfo {
	return api.TermInfo{Name: t.Name, PID: t.PID, User: t.User, Argv: t.Argv, Cols: t.Cols, Rows: t.Rows,
		Clients: t.Clients, CreatedAt: t.CreatedAt, Exited: t.Exited, ExitCode: t.ExitCode, Signal: t.Signal}
}

// visibleTerm reports whether the caller may use a terminal: a token
// limited to one user sees only that user's terminals.
func visibleTerm(r *http.Request, t *guest.TermInfo) bool {
	p := principal(r)
	return p.Admin || p.User == "" || p.User == t.User
}

func (s *Server) listTerms(w http.ResponseWriter, r *http.Request) {
	_, gc, err := s.svc.Guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	ts, err := gc.ListTerms(r.Context())
	if err != nil {
		writeGuestErr(w, err)
		return
	}
	out := api.TermList{Terminals: []api.TermInfo{}}
	for i := range ts {
		if visibleTerm(r, &ts[i]) && !ts[i].Ephemeral {
			out.Terminals = append(out.Terminals, termToAPI(ts[i]))
		}
	}
	writeJSON(w, 200, out)
}

func (s *Server) createTerm(w http.ResponseWriter, r *http.Request) {
	var req api.TermCreate
	if !decodeJSON(w, r, &req) {
		return
	}
	var ok bool
	if req.User, ok = actAs(w, r, req.User); !ok {
		return
	}
	_, gc, err := s.svc.Guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	t, err := gc.CreateTerm(r.Context(), guest.TermCreate{Name: req.Name, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd,
		User: req.User, Cols: req.Cols, Rows: req.Rows})
	if err != nil {
		writeGuestErr(w, err)
		return
	}
	if v, err := s.svc.Get(r.Context(), r.PathValue("id")); err == nil {
		s.svc.Event(v.ID, "terminal", actor(r), "opened terminal %s (user %s, %s)", t.Name, t.User, strings.Join(t.Argv, " "))
	}
	writeJSON(w, http.StatusCreated, termToAPI(*t))
}

// termFor returns the guest session and the terminal, checking the caller may use it.
func (s *Server) termFor(w http.ResponseWriter, r *http.Request) (*guest.Client, *guest.TermInfo, bool) {
	_, gc, err := s.svc.Guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return nil, nil, false
	}
	t, err := gc.GetTerm(r.Context(), r.PathValue("name"))
	if err != nil {
		writeGuestErr(w, err)
		return nil, nil, false
	}
	if !visibleTerm(r, t) {
		writeError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf("terminal %q belongs to user %q; this token may only act as %q", t.Name, t.User, principal(r).User))
		return nil, nil, false
	}
	return gc, t, true
}

func (s *Server) termOp(op func(context.Context, *guest.Client, string, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		gc, t, ok := s.termFor(w, r)
		if !ok {
			return
		}
		if err := op(r.Context(), gc, t.Name, r); err != nil {
			writeGuestErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) getOrAttachTerm(w http.ResponseWriter, r *http.Request) {
	gc, t, ok := s.termFor(w, r)
	if !ok {
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		writeJSON(w, 200, termToAPI(*t))
		return
	}
	q := r.URL.Query()
	var at guest.TermAttach
	at.Cols, _ = strconv.Atoi(q.Get("cols"))
	at.Rows, _ = strconv.Atoi(q.Get("rows"))
	at.NoScrollback = q.Get("scrollback") == "0" || q.Get("scrollback") == "false"
	ctx, cancel := context.WithCancel(context.Background()) // outlives the handler's context after the upgrade
	defer cancel()
	st, err := gc.AttachTerm(ctx, t.Name, at)
	if err != nil {
		writeGuestErr(w, err)
		return
	}
	defer st.Close()
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return // Accept wrote the error
	}
	defer ws.CloseNow()
	ws.SetReadLimit(4 << 20)
	vmID, who, start := r.PathValue("id"), actor(r), time.Now()
	if v, err := s.svc.Get(r.Context(), vmID); err == nil {
		vmID = v.ID
	}
	if cast := s.rec.Terminal(vmID, t.Name, t.User, who, at.Cols, at.Rows); cast != nil {
		st.Tap = cast
		defer cast.Close()
	}
	s.svc.Event(vmID, "terminal", who, "attached to terminal %s (user %s)", t.Name, t.User)
	bridgeTerm(ctx, ws, st)
	s.svc.Event(vmID, "terminal", who, "detached from terminal %s after %s", t.Name, time.Since(start).Round(time.Second))
}

// bridgeTerm relays a terminal stream to a WebSocket: binary messages are
// terminal bytes both ways, text messages JSON api.TermControl.
func bridgeTerm(ctx context.Context, ws *websocket.Conn, st *guest.TermStream) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer cancel()
		defer st.Close() // the client left: detach from the guest terminal (unblocks Next)
		for {
			typ, b, err := ws.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if _, err := st.Write(b); err != nil {
					return
				}
				continue
			}
			var c api.TermControl
			if json.Unmarshal(b, &c) != nil {
				continue
			}
			switch c.Type {
			case "resize":
				if c.Cols > 0 && c.Rows > 0 {
					st.Resize(c.Cols, c.Rows)
				}
			case "signal":
				if n, err := guest.ParseSignal(c.Signal); err == nil {
					st.Signal(n)
				}
			}
		}
	}()
	for {
		f, err := st.Next()
		if err != nil {
			ws.Close(websocket.StatusGoingAway, "terminal stream ended")
			return
		}
		switch f.Type {
		case api.FrameStdout:
			wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
			err = ws.Write(wctx, websocket.MessageBinary, f.Data)
			wcancel()
			if err != nil {
				return
			}
		case api.FrameExit:
			var es guest.ExitStatus
			json.Unmarshal(f.Data, &es)
			b, _ := json.Marshal(api.TermControl{Type: "exit", ExitCode: es.ExitCode, Signal: es.Signal})
			ws.Write(ctx, websocket.MessageText, b)
			ws.Close(websocket.StatusNormalClosure, "exited")
			return
		}
	}
}
