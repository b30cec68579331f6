package server

import (
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
	if p := principal(r); port == image.CodeInterpreterPort && p.User != "" && p.User != codeUser {
		// The code interpreter runs code as its user: the same rule as /code.
		if v, err := s.svc.Get(r.Context(), r.PathValue("id")); err == nil && v.Image == image.CodeInterpreter {
			writeError(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf(
				"this token is limited to user %q; the code interpreter on port %d runs code as %q", p.User, port, codeUser))
			return
		}
	}
	gc, err := s.svc.DialPort(r.Context(), r.PathValue("id"), port)
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
