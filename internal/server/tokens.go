package server

import (
	"errors"
	"net/http"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/store"
)

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) {
	var req api.CreateTokenRequest
	if !decodeJSON(w, r, &req) {
		return
	}
	switch {
	case req.VM == "" && !req.E2B && !req.Admin:
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "vm is required: a token opens exactly one VM (only an admin token, admin: true, or an E2B admin key, e2b: true, has none)")
		return
	case req.Admin && (req.VM != "" || req.E2B):
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "admin: an admin token names no vm and is not an E2B key (an E2B admin key is e2b: true without a vm)")
		return
	case req.VM == "" && principal(r).TokenID != "":
		// Its revoke would not end what it made: a leaked admin token
		// must not outlive its revoke through tokens of its own.
		writeError(w, http.StatusForbidden, api.CodeForbidden, "admin tokens and E2B admin keys are made with the node's own admin token (admin.token), not with a stored admin credential")
		return
	}
	vmID := ""
	if req.VM != "" {
		v, err := s.svc.Get(r.Context(), req.VM)
		if err != nil {
			writeErr(w, err)
			return
		}
		vmID = v.ID
	}
	t, err := s.tokens.Create(r.Context(), vmID, req)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) {
	vmID := ""
	if q := r.URL.Query().Get("vm"); q != "" {
		v, err := s.svc.Get(r.Context(), q)
		if err != nil {
			writeErr(w, err)
			return
		}
		vmID = v.ID
	}
	ts, err := s.tokens.List(r.Context(), vmID)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, api.ListTokensResponse{Tokens: ts})
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) {
	if err := s.tokens.Revoke(r.Context(), r.PathValue("id")); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			writeError(w, http.StatusNotFound, api.CodeNotFound, "no token "+r.PathValue("id"))
			return
		}
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) sshInfo(w http.ResponseWriter, r *http.Request) {
	if s.ssh == nil {
		writeJSON(w, 200, api.SSHInfo{})
		return
	}
	writeJSON(w, 200, api.SSHInfo{Enabled: true, Listen: s.ssh.Addr(),
		HostKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.ssh.HostKey())))})
}
