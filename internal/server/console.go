package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/console"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vmstats"
)

// The web console (internal/console) and the API it needs beyond the
// CLI's: one event stream for every VM, the host's capacity and templates,
// and each VM's recent CPU and memory.

// newConsole makes the console. Its sessions (and the random key of their
// CSRF tokens) live in memory: a daemon restart signs every browser out.
func newConsole(s *Server) *console.Console {
	return console.New(console.Config{Auth: s.tokens, Log: s.log})
}

// metricsInterval is how often each running VM's QEMU is sampled (see
// internal/vmstats): 360 samples per VM for the last hour.
const metricsInterval = 10 * time.Second

// consoleRoutes registers the console's page and session endpoints on the
// outer mux (no bearer token: a browser has its cookie) and its API routes
// on the authenticated one.
func (s *Server) consoleRoutes(outer, authed patternMux) {
	if s.console != nil {
		s.console.Routes(outer)
	}
	authed.HandleFunc("GET /v1/events", s.listAllEvents)
	authed.HandleFunc("GET /v1/host", admin(s.hostInfo))
	authed.HandleFunc("GET /v1/vms/{id}/metrics", s.scoped("", s.vmMetrics))
}

// errCookieMCP refuses the console's cookie on /mcp.
var errCookieMCP = errors.New("/mcp does not accept the web console's session cookie: MCP clients authenticate with Authorization: Bearer <token>")

// credential is the token of a request: its bearer token, or the token of a
// signed-in browser's session (its cookie must pass the console's origin
// and CSRF checks). Answers to a browser session are locked down
// (console.Sandbox): a file from a VM opened in a tab must not run as the
// console's origin. /mcp takes bearer tokens only.
func (s *Server) credential(w http.ResponseWriter, r *http.Request) (string, error) {
	if b := bearer(r); b != "" || s.console == nil {
		return b, nil
	}
	if r.URL.Path == "/mcp" || strings.HasPrefix(r.URL.Path, "/mcp/") {
		if ck, err := r.Cookie(auth.SessionCookie); err == nil && ck.Value != "" {
			return "", errCookieMCP
		}
		return "", nil
	}
	secret, err := s.console.Credential(r)
	if secret != "" {
		console.Sandbox(w)
	}
	return secret, err
}

// runUsage samples every running or paused VM's QEMU into s.usage every
// interval until ctx ends.
func (s *Server) runUsage(ctx context.Context) {
	s.usage.Run(ctx, func(ctx context.Context) []vmstats.Proc {
		vms, err := s.svc.List(ctx)
		if err != nil {
			return nil
		}
		var out []vmstats.Proc
		for _, v := range vms {
			if (v.State == store.StateRunning || v.State == store.StatePaused) && v.PID > 0 {
				out = append(out, vmstats.Proc{VMID: v.ID, PID: v.PID}) // the sampler reads its start time
			}
		}
		return out
	})
}

func (s *Server) vmMetrics(w http.ResponseWriter, r *http.Request) {
	v, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.VMMetrics{VM: v.ID, Samples: []api.MetricSample{}}
	if s.usage != nil {
		out.IntervalSec = int(s.usage.Interval() / time.Second)
		for _, sm := range s.usage.Samples(v.ID) {
			out.Samples = append(out.Samples, api.MetricSample{Time: sm.Time, CPUPercent: sm.CPUPercent, RSSBytes: sm.RSSBytes})
		}
	}
	writeJSON(w, 200, out)
}

func (s *Server) hostInfo(w http.ResponseWriter, r *http.Request) {
	vms, err := s.svc.List(r.Context())
	if err != nil {
		writeErr(w, err)
		return
	}
	out := api.HostInfo{Accel: s.accel, VMs: map[api.State]int{}, WarmPool: s.svc.PoolReady(), Templates: []api.Template{}}
	for _, v := range vms {
		out.VMs[api.State(v.State)]++
		if v.State == store.StateRunning || v.State == store.StatePaused || v.State == store.StateCreating {
			out.MemoryCommittedBytes += v.MemoryMiB << 20
		}
	}
	out.Running, out.Suspended = out.VMs[api.StateRunning], out.VMs[api.StateSuspended]
	out.MemoryTotalBytes, out.MemoryAvailableBytes, _ = meminfo()
	var st syscall.Statfs_t
	if syscall.Statfs(s.cfg.DataDir, &st) == nil {
		out.DiskFreeBytes = int64(st.Bavail) * st.Bsize
	}
	ts, err := s.svc.Templates()
	if err != nil {
		s.log.Warn("list templates", "err", err)
	}
	for _, t := range ts {
		out.Templates = append(out.Templates, api.Template{Key: t.Key, ImageHash: t.ImageHash, CPUs: t.CPUs, MemoryMiB: t.MemoryMiB,
			DiskBytes: t.DiskBytes, Accel: t.Accel, QEMU: t.QEMU, Machine: t.Machine, ColdBootMs: t.ColdBootMs, CreatedAt: t.CreatedAt})
	}
	writeJSON(w, 200, out)
}

// listAllEvents serves GET /v1/events: the admin reads every VM's events, a
// VM's token (one that may read events, see auth.RunPerms) its VM's, with
// the same filter as GET /v1/vms/{id}/events. Without after, a list is the
// newest limit events and a stream starts with the next event. With
// follow=1 the answer stays open: server-sent events when the client
// accepts text/event-stream (a browser's EventSource, whose reconnects
// resume from Last-Event-ID), NDJSON otherwise.
func (s *Server) listAllEvents(w http.ResponseWriter, r *http.Request) {
	p := principal(r)
	vmID := "" // every VM
	if !p.Admin {
		if p.VMID == "" {
			// a token not bound to a VM must never read every VM's events
			writeError(w, http.StatusForbidden, api.CodeForbidden, "only the admin token reads every VM's events; use a VM's token")
			return
		}
		if err := p.CanAny(p.VMID, auth.RunPerms...); err != nil {
			writeError(w, http.StatusForbidden, api.CodeForbidden, strings.TrimPrefix(err.Error(), auth.ErrForbidden.Error()+": "))
			return
		}
		vmID = p.VMID
	}
	q := r.URL.Query()
	limit, err := eventLimit(q)
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
		return
	}
	follow := q.Get("follow") == "1" || q.Get("follow") == "true"
	sse := follow && strings.Contains(r.Header.Get("Accept"), "text/event-stream")
	afterText := q.Get("after")
	if sse && afterText == "" {
		afterText = r.Header.Get("Last-Event-ID")
	}
	var after int64
	if afterText != "" {
		if after, err = eventAfter(afterText); err != nil {
			writeError(w, http.StatusBadRequest, api.CodeInvalid, err.Error())
			return
		}
	} else if follow {
		last, err := s.store.LastEventSeq(r.Context())
		if err != nil {
			writeErr(w, err)
			return
		}
		after = last
	}
	visible := eventFilter(r)
	if !follow {
		var es []*store.Event
		var err error
		if afterText == "" {
			es, err = s.store.LatestEvents(r.Context(), vmID, limit) // the newest limit
		} else {
			es, err = s.svc.Events(r.Context(), vmID, after, limit)
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		out := api.ListEventsResponse{Events: []api.Event{}}
		for _, e := range es {
			if visible(e) {
				out.Events = append(out.Events, eventToAPI(e))
			}
		}
		writeJSON(w, 200, out)
		return
	}
	if sse {
		w.Header().Set("Content-Type", "text/event-stream")
	} else {
		w.Header().Set("Content-Type", "application/x-ndjson")
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(200)
	rc := http.NewResponseController(w)
	if sse {
		// a comment, so the browser's EventSource opens at once
		fmt.Fprintf(w, ": agentvm events after %d\n\n", after)
	}
	rc.Flush()
	s.svc.FollowEvents(r.Context(), vmID, after, func(e *store.Event) error {
		if !visible(e) {
			return nil
		}
		b, err := json.Marshal(eventToAPI(e))
		if err != nil {
			return err
		}
		if sse {
			_, err = fmt.Fprintf(w, "id: %d\ndata: %s\n\n", e.Seq, b)
		} else {
			_, err = fmt.Fprintf(w, "%s\n", b)
		}
		if err != nil {
			return err
		}
		return rc.Flush()
	})
}
