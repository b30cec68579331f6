package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/store"
)

// A token restricted to one guest user (--user sandbox) runs everything as
// that user, and the same holds for what it may see and touch: services,
// processes and jobs of other users (root's above all) do not exist for it.
// Without this, a sandbox token could read root jobs' logs, stop root
// services and signal any process, since the agent acts as root. Hidden
// ones answer 404 exactly like missing ones, so the token cannot even learn
// what else runs.

// ownedKind is what a path names: a service, a job or a process.
type ownedKind int

const (
	ownedService ownedKind = iota
	ownedJob
	ownedProcess
)

// guestOf returns the agent session of a VM. Tests set s.guestFn to reach an
// in-process fake agent; the daemon asks the VM service.
func (s *Server) guestOf(ctx context.Context, ref string) (*store.VM, *guest.Client, error) {
	if s.guestFn != nil {
		return s.guestFn(ctx, ref)
	}
	return s.svc.Guest(ctx, ref)
}

// restrictedUser is the guest user the caller is limited to ("" = none).
func restrictedUser(r *http.Request) string {
	if p := principal(r); !p.Admin {
		return p.User
	}
	return ""
}

// sameUser compares guest user names; the agent reports root's as "root",
// but an empty name also means root (the default user of every endpoint).
func sameUser(a, b string) bool {
	if a == "" {
		a = "root"
	}
	if b == "" {
		b = "root"
	}
	return a == b
}

// restrictedGuest serves an unrestricted caller with h at once (ok false);
// for a user-restricted one it returns that user and the VM's agent session,
// or answers the error itself (ok false).
func (s *Server) restrictedGuest(w http.ResponseWriter, r *http.Request, h http.HandlerFunc) (string, *guest.Client, bool) {
	user := restrictedUser(r)
	if user == "" {
		h(w, r)
		return "", nil, false
	}
	_, gc, err := s.guestOf(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return "", nil, false
	}
	return user, gc, true
}

// owned guards a handler of one service, job or process (named by {name},
// {job} or {pid}): a user-restricted caller reaches it only if it runs as
// that user.
func (s *Server) owned(kind ownedKind, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		user, gc, ok := s.restrictedGuest(w, r, h)
		if !ok {
			return
		}
		var err error
		var owner, notFound string
		switch kind {
		case ownedService:
			name := r.PathValue("name")
			notFound = "no service " + strconv.Quote(name)
			var info *api.ServiceInfo
			if info, err = gc.GetService(r.Context(), name); err == nil {
				owner = info.User
			}
		case ownedJob:
			id := r.PathValue("job")
			notFound = "no job " + strconv.Quote(id)
			var info *api.JobInfo
			if info, err = gc.GetJob(r.Context(), id); err == nil {
				owner = info.User
			}
		case ownedProcess:
			pid, perr := strconv.Atoi(r.PathValue("pid"))
			if perr != nil || pid <= 0 {
				h(w, r) // the agent explains what a pid is
				return
			}
			notFound = "no process " + strconv.Itoa(pid)
			owner, err = processOwner(r.Context(), gc, pid)
		}
		var ae *guest.APIError
		switch {
		case errors.As(err, &ae) && ae.Status == http.StatusNotFound, err == nil && !sameUser(owner, user):
			writeError(w, http.StatusNotFound, api.CodeNotFound, notFound)
			return
		case err != nil:
			writeGuestErr(w, err)
			return
		}
		// A process could exit and its pid be reused by another user's
		// between this check and the signal; pids are not reused that fast
		// in practice, and the agent has no signal-if-owner call.
		h(w, r)
	}
}

// processOwner is the user a process runs as; a 404 APIError when there is
// no such process.
func processOwner(ctx context.Context, gc *guest.Client, pid int) (string, error) {
	ps, err := gc.ListProcesses(ctx)
	if err != nil {
		return "", err
	}
	for _, p := range ps {
		if p.PID == pid {
			return p.User, nil
		}
	}
	return "", &guest.APIError{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: fmt.Sprintf("no process %d", pid)}
}

// ownedList serves a list of services, jobs or processes: relayed as is for
// unrestricted callers, and for a user-restricted one fetched, filtered to
// that user's and written in the agent's own shape.
func (s *Server) ownedList(kind ownedKind, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		user, gc, ok := s.restrictedGuest(w, r, h)
		if !ok {
			return
		}
		var err error
		var out any
		switch kind {
		case ownedService:
			var all []api.ServiceInfo
			if all, err = gc.ListServices(r.Context()); err == nil {
				out = api.ServiceList{Services: keepOwned(all, user, func(v api.ServiceInfo) string { return v.User })}
			}
		case ownedJob:
			var all []api.JobInfo
			if all, err = gc.ListJobs(r.Context()); err == nil {
				out = api.JobList{Jobs: keepOwned(all, user, func(v api.JobInfo) string { return v.User })}
			}
		case ownedProcess:
			var all []api.ProcessInfo
			if all, err = gc.ListProcesses(r.Context()); err == nil {
				out = api.ProcessList{Processes: keepOwned(all, user, func(v api.ProcessInfo) string { return v.User })}
			}
		}
		if err != nil {
			writeGuestErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	}
}

// keepOwned returns the items that run as user (never nil: lists encode as []).
func keepOwned[T any](all []T, user string, owner func(T) string) []T {
	out := make([]T, 0, len(all))
	for _, v := range all {
		if sameUser(owner(v), user) {
			out = append(out, v)
		}
	}
	return out
}
