package server

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/console"
	"github.com/agentvm/agentvm/internal/vm"
)

type principalKey struct{}

// principal is the authenticated caller of r (set by the auth middleware).
func principal(r *http.Request) *auth.Principal {
	if p, ok := r.Context().Value(principalKey{}).(*auth.Principal); ok {
		return p
	}
	return &auth.Principal{} // no permissions at all
}

// bearer extracts the token of a request: the Authorization header, or for
// WebSocket upgrades (browsers cannot set headers) the access_token query
// parameter.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return r.URL.Query().Get("access_token")
	}
	return ""
}

func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret, err := s.credential(w, r) // a bearer token, or a signed-in browser's session
		if err != nil {
			status, code := http.StatusForbidden, api.CodeForbidden
			if errors.Is(err, console.ErrNoSession) || errors.Is(err, errCookieMCP) {
				status, code = http.StatusUnauthorized, api.CodeUnauthorized
			}
			writeError(w, status, code, err.Error())
			return
		}
		p, err := s.tokens.Authenticate(r.Context(), secret)
		if err != nil {
			if errors.Is(err, auth.ErrUnauthenticated) {
				writeError(w, http.StatusUnauthorized, api.CodeUnauthorized, "missing, invalid or expired API token: send Authorization: Bearer <token> (the admin token is in <data dir>/admin.token)")
				return
			}
			writeErr(w, err)
			return
		}
		s.serveAs(w, r, p, next)
	})
}

// serveAs serves r as principal p: from here on the request is p's, on
// whichever node runs its VM (forwardToOwner).
func (s *Server) serveAs(w http.ResponseWriter, r *http.Request, p *auth.Principal, next http.Handler) {
	r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
	// Lifecycle operations record who asked (vm/ops.go).
	r = r.WithContext(vm.WithActor(r.Context(), actor(r)))
	// A scoped token's revoke or expiry ends its requests that are still
	// running (streams, upgraded connections), not just its next login.
	w, r, done, err := s.tokens.TrackHTTP(w, r, p)
	if err != nil {
		writeError(w, http.StatusTooManyRequests, api.CodeTooMany, err.Error())
		return
	}
	defer done()
	if s.forwardToOwner(w, r, p) {
		return
	}
	next.ServeHTTP(w, r)
}

// admin allows only the admin token.
func admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !principal(r).Admin {
			writeError(w, http.StatusForbidden, api.CodeForbidden, "this endpoint needs the admin token; scoped tokens open only their VM's exec, files, terminals, ssh and preview")
			return
		}
		h(w, r)
	}
}

// scoped allows the admin and tokens of the VM in the path that hold perm
// ("" = any token of that VM). The path's {id} may be a name; it is
// resolved first so a token cannot reach another VM through a name.
func (s *Server) scoped(perm string, h http.HandlerFunc) http.HandlerFunc {
	if perm == "" {
		return s.scopedAny(nil, h)
	}
	return s.scopedAny([]string{perm}, h)
}

// scopedAny is scoped for tokens that hold at least one of perms (none = any
// token of the VM).
func (s *Server) scopedAny(perms []string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := principal(r)
		if p.Admin {
			// Any use of a VM counts as activity for its idle policy; a
			// long request (an exec, a terminal, a download) for its whole length.
			if v, err := s.svc.Get(r.Context(), r.PathValue("id")); err == nil {
				defer s.svc.Hold(v.ID)()
			}
			h(w, r)
			return
		}
		v, err := s.svc.Get(r.Context(), r.PathValue("id"))
		if err != nil {
			if p.VMID != "" || p.Repo != "" {
				// do not reveal which other VMs exist
				writeError(w, http.StatusForbidden, api.CodeForbidden, "this token is for another VM")
				return
			}
			writeErr(w, err)
			return
		}
		var check error
		switch len(perms) {
		case 0:
			check = p.Can(v.ID, "")
		case 1:
			check = p.Can(v.ID, perms[0])
		default:
			check = p.CanAny(v.ID, perms...)
		}
		if err := check; err != nil {
			writeError(w, http.StatusForbidden, api.CodeForbidden, strings.TrimPrefix(err.Error(), auth.ErrForbidden.Error()+": "))
			return
		}
		r.SetPathValue("id", v.ID)
		defer s.svc.Hold(v.ID)()
		h(w, r)
	}
}

// actAs applies the caller's user restriction to a requested guest user and
// writes a 403 when it is refused.
func actAs(w http.ResponseWriter, r *http.Request, user string) (string, bool) {
	u, err := principal(r).ActAs(user)
	if err != nil {
		writeError(w, http.StatusForbidden, api.CodeForbidden, strings.TrimPrefix(err.Error(), auth.ErrForbidden.Error()+": "))
		return "", false
	}
	return u, true
}
