package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/budget"
	"github.com/agentvm/agentvm/internal/display"
	"github.com/agentvm/agentvm/internal/guest"
	"github.com/agentvm/agentvm/internal/image"
	"github.com/agentvm/agentvm/internal/vm"
	"github.com/coder/websocket"
)

// The display of a browser VM (internal/image/browser.go): screenshots read
// the X server's framebuffer file through the agent; the live view is the
// display's VNC port (loopback in the guest, reached through the agent)
// carried over a WebSocket. Both need the display permission.

func (s *Server) displayRoutes(mux patternMux) {
	d := func(h http.HandlerFunc) http.HandlerFunc { return s.scoped(api.PermDisplay, h) }
	mux.HandleFunc("GET /v1/vms/{id}/screenshot", d(s.screenshotVM))
	mux.HandleFunc("GET /v1/vms/{id}/vnc", d(s.vncVM))
}

// maxFramebuffer bounds the framebuffer file read from the guest (a 4096 x
// 4096 screen of 32-bit pixels plus its header).
const maxFramebuffer = display.MaxSide*display.MaxSide*4 + 1<<20

func noDisplay(name string) string {
	return fmt.Sprintf("VM %s has no display: VMs made with --image %s have one", name, image.Browser)
}

func (s *Server) screenshotVM(w http.ResponseWriter, r *http.Request) {
	scale := 1.0
	if q := r.URL.Query().Get("scale"); q != "" {
		f, err := strconv.ParseFloat(q, 64)
		if err != nil || !(f > 0 && f <= 1) {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, fmt.Sprintf("scale must be a number in (0, 1], got %q", q))
			return
		}
		scale = f
	}
	v, gc, err := s.guestOf(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	rc, _, err := gc.ReadFile(r.Context(), "root", image.BrowserFramebuffer, 0, -1)
	if err != nil {
		var ae *guest.APIError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			writeError(w, http.StatusConflict, api.CodeConflict, noDisplay(v.Name))
			return
		}
		writeGuestErr(w, err)
		return
	}
	defer rc.Close()
	// The decoded screen, its scaled copy and the PNG encoder's rows are
	// taken from the daemon's memory budget before they are allocated.
	var release func()
	defer func() {
		if release != nil {
			release()
		}
	}()
	img, err := display.DecodeXWDReserving(io.LimitReader(rc, maxFramebuffer), func(width, height int) error {
		px := int64(width) * int64(height) * 4
		var err error
		release, err = s.mem.Take(px+int64(float64(px)*scale*scale)+1<<20, "a screenshot")
		return err
	})
	if errors.Is(err, budget.ErrExhausted) {
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, err.Error())
		return
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, api.CodeUnavailable, fmt.Sprintf("the display of %s: %v", v.Name, err))
		return
	}
	// Straight into the response: a PNG of a noisy screen is as large as
	// the screen, and holding it would double what the budget counts.
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Cache-Control", "no-store")
	if err := display.EncodePNG(w, display.Scale(img, scale)); err != nil {
		s.log.Info("screenshot: writing the PNG", "vm", v.ID, "err", err)
	}
}

// vncVM carries the display's RFB (VNC) stream over a WebSocket, one binary
// message per chunk each way (what noVNC speaks).
func (s *Server) vncVM(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, "this endpoint is a WebSocket carrying the display's VNC (RFB) stream (noVNC speaks it)")
		return
	}
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	if v.Image != image.Browser {
		// Port 5900 of another image is whatever the VM runs there, not
		// the display the permission names.
		writeError(w, http.StatusConflict, api.CodeConflict, noDisplay(v.Name))
		return
	}
	conn, err := s.svc.DialPort(r.Context(), v.ID, image.BrowserVNCPort)
	if err != nil {
		if errors.Is(err, vm.ErrNoListener) {
			writeError(w, http.StatusConflict, api.CodeConflict, noDisplay(v.Name))
			return
		}
		writeErr(w, err)
		return
	}
	defer conn.Close()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"binary"}})
	if err != nil {
		return // Accept wrote the error
	}
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 20)
	// The request's context ends with the token (revoke, expiry) or the VM.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	nc := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	who, start := actor(r), time.Now()
	// The display permission shows the screen; typing, clicking and
	// pasting into it (a browser can open file:///etc/agentvm/env) need a
	// token that may run commands as any user.
	input := principal(r).ReachesLoopback(v.ID)
	mode := "view only"
	if input {
		mode = "with input"
	}
	s.svc.Event(v.ID, "display", who, "opened the live view (%s)", mode)
	done := make(chan struct{})
	go func() {
		io.Copy(nc, conn) // the VNC server's side, until it closes
		cancel()
		close(done)
	}()
	if input {
		io.Copy(conn, nc) // the viewer's side, until it leaves
	} else if err := display.ViewOnly(conn, nc); err != nil {
		s.log.Info("live view: the viewer's stream ended", "vm", v.ID, "err", err)
	}
	conn.Close()
	<-done
	ws.Close(websocket.StatusNormalClosure, "")
	s.svc.Event(v.ID, "display", who, "closed the live view after %s", time.Since(start).Round(time.Second))
}
