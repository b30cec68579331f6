package server

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/vm"
)

// tcpVM connects the caller to a TCP port inside the VM, dialed through the VM's
// virtual network (no port is opened on the host), or, when nothing listens on
// the guest's address, from inside the guest to its loopback (as previews do:
// the browser image's DevTools and VNC ports listen on loopback only). The
// request must carry "Upgrade: agentvm-tcp"; after 101 the connection is a raw
// byte stream.
func (s *Server) tcpVM(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "port must be a number between 1 and 65535")
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), api.TCPUpgrade) {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "this endpoint needs Upgrade: "+api.TCPUpgrade)
		return
	}
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	// The guest's loopback is reached from the agent, as root: only for a
	// token that may act as any user there (auth.Principal.ReachesLoopback),
	// or one limited to the user the code interpreter runs code as, for
	// that port (the same rule as /code).
	p := principal(r)
	codeInterp := port == image.CodeInterpreterPort && v.Image == image.CodeInterpreter
	if codeInterp && p.User != "" && p.User != codeUser {
		writeError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf(
			"this token is limited to user %q; the code interpreter on port %d runs code as %q", p.User, port, codeUser))
		return
	}
	dial := s.svc.DialGuest
	if p.ReachesLoopback(v.ID) || codeInterp {
		dial = s.svc.DialPort
	}
	gc, err := dial(r.Context(), v.ID, port)
	if errors.Is(err, vm.ErrNoListener) && !p.ReachesLoopback(v.ID) {
		writeError(w, http.StatusBadGateway, api.CodeUnavailable, fmt.Sprintf(
			"nothing listens on port %d on the address of %s; this token is limited to user %q, so it does not reach servers bound only to the guest's loopback (the agent dials them as root)", port, v.Name, p.User))
		return
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	defer gc.Close()
	conn, br, ok := switchProtocols(w, api.TCPUpgrade)
	if !ok {
		return
	}
	defer conn.Close()
	spliceTCP(conn, br, gc, auth.Revoked(r.Context()))
}

// spliceTCP copies both ways between a client's hijacked connection (read
// through br) and a connection into the VM until both directions end. The
// request's context is no signal here: it ends when the client half-closes
// its side, which must only half-close the VM side. A revoke (see
// auth.TrackHTTP) closes the client side, which ends the copy from the
// client; revoked closes the VM side too, even after a half-close.
func spliceTCP(conn net.Conn, br io.Reader, gc net.Conn, revoked <-chan struct{}) {
	finished := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := io.Copy(gc, br); err != nil {
			gc.Close()
			return
		}
		if cw, ok := gc.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		select {
		case <-revoked:
			gc.Close()
		case <-finished:
		}
	}()
	io.Copy(conn, gc)
	close(finished)
	conn.Close()
	gc.Close()
	wg.Wait()
}
