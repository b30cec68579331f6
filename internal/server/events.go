package server

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

// actor names the caller of r in events.
func actor(r *http.Request) string { return principal(r).Actor() }

func eventToAPI(e *store.Event) api.Event {
	return api.Event{Seq: e.Seq, VM: e.VMID, Time: e.Time, Type: e.Type, Actor: e.Actor, Message: e.Message, Data: e.Data}
}

// eventAfter reads an event sequence number (after=, Last-Event-ID); ""
// is 0, the start.
func eventAfter(text string) (int64, error) {
	if text == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("after must be an event sequence number")
	}
	return n, nil
}

// eventLimit reads a list of events' limit= (default 1000).
func eventLimit(q url.Values) (int, error) {
	if q.Get("limit") == "" {
		return 1000, nil
	}
	n, err := strconv.Atoi(q.Get("limit"))
	if err != nil || n < 1 || n > 10000 {
		return 0, errors.New("limit must be between 1 and 10000")
	}
	return n, nil
}

// listEvents serves GET /v1/vms/{id}/events[?after=SEQ][&limit=N][&follow=1]:
// a JSON list, or with follow an NDJSON stream that stays open.
// eventFilter says which events the caller may read. A token restricted to
// one guest user does not see what the admin or other tokens did (their
// command lines run as other users, root's above all, and may carry
// secrets): only its own events and the daemon's (lifecycle, policies).
func eventFilter(r *http.Request) func(*store.Event) bool {
	if restrictedUser(r) == "" {
		return func(*store.Event) bool { return true }
	}
	self := actor(r)
	return func(e *store.Event) bool {
		return e.Actor == self || e.Actor != "admin" && !strings.HasPrefix(e.Actor, "admin:") && !strings.HasPrefix(e.Actor, "token:")
	}
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) {
	// Events are kept by VM id, and outlive the VM: the path may name a
	// VM that exists, or be the id of one that is gone.
	id := r.PathValue("id")
	if v, err := s.svc.Get(r.Context(), id); err == nil {
		id = v.ID
	}
	q := r.URL.Query()
	after, err := eventAfter(q.Get("after"))
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	limit, err := eventLimit(q)
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	if f := q.Get("follow"); f == "1" || f == "true" {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(200)
		rc := http.NewResponseController(w)
		rc.Flush()
		enc := json.NewEncoder(w)
		visible := eventFilter(r)
		s.svc.FollowEvents(r.Context(), id, after, func(e *store.Event) error {
			if !visible(e) {
				return nil
			}
			if err := enc.Encode(eventToAPI(e)); err != nil {
				return err
			}
			return rc.Flush()
		})
		return
	}
	es, err := s.svc.Events(r.Context(), id, after, limit)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.ListEventsResponse{Events: []api.Event{}}
	visible := eventFilter(r)
	for _, e := range es {
		if visible(e) {
			out.Events = append(out.Events, eventToAPI(e))
		}
	}
	writeJSON(w, 200, out)
}

func (s *Server) setPolicy(w http.ResponseWriter, r *http.Request) {
	var req api.PolicyRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	var idle, del *time.Duration
	if req.IdleTimeout != nil {
		d := time.Duration(*req.IdleTimeout)
		idle = &d
	}
	if req.DeleteAfter != nil {
		d := time.Duration(*req.DeleteAfter)
		del = &d
	}
	v, err := s.svc.SetPolicy(r.Context(), r.PathValue("id"), idle, del, req.Restart)
	if err != nil {
		writeErr(w, err)
		return
	}
	var parts []string
	if idle != nil {
		parts = append(parts, "idle timeout "+idle.String())
	}
	if del != nil {
		parts = append(parts, "delete after "+del.String())
	}
	if req.Restart != nil {
		parts = append(parts, "restart "+*req.Restart)
	}
	s.svc.Event(v.ID, "policy", actor(r), "policy set: %s", strings.Join(parts, ", "))
	writeJSON(w, 200, s.toAPI(v))
}
