package e2b

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/store"
)

// A create whose lifecycle cannot hold is refused before any VM is made:
// autoResume needs autoPause, and cannot wake a filesystem-only pause.
func TestCreateLifecycleRefused(t *testing.T) {
	h := newEnvdHarness(t)
	for body, want := range map[string]string{
		`{"autoResume":{"enabled":true}}`:                                          "autoResume can only be enabled with autoPause",
		`{"autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`: "cannot be combined with autoPauseMemory: false",
		`{"autoPauseMemory":false}`:                                                "autoPauseMemory is only allowed with autoPause",
	} {
		r := httptest.NewRequest("POST", "/sandboxes", strings.NewReader(body))
		w := httptest.NewRecorder()
		h.s.create(w, r, auth.Admin) // the fake VMs panic on a create
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), want) {
			t.Errorf("%s: %d %s, want 400 %q", body, w.Code, w.Body, want)
		}
	}
}

// The timeout pauses a sandbox as its lifecycle says: a filesystem-only
// pause is a stop, a pause with memory a suspend, and a paused or stopped
// sandbox is left alone.
func TestExpireLifecycle(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		sb    store.Sandbox
		state store.State
		want  string
	}{
		{store.Sandbox{AutoPause: true}, "", "suspend"},
		{store.Sandbox{AutoPause: true, PauseDisk: true}, "", "stop"},
		{store.Sandbox{AutoPause: true, PauseDisk: true}, store.StateStopped, ""},
		{store.Sandbox{AutoPause: true}, store.StateSuspended, ""},
	} {
		h := newEnvdHarness(t)
		h.vms.state = c.state
		sb := c.sb
		sb.VMID, sb.EndAt = "vm1", time.Now().Add(-time.Second)
		h.s.expire(ctx, &sb)
		if got := strings.Join(h.vms.calls, ","); got != c.want {
			t.Errorf("%+v in state %q: calls %q, want %q", c.sb, c.state, got, c.want)
		}
	}
}

// A request to a paused sandbox wakes it only when it asked for
// autoResume, and the wake gives it its timeout again.
func TestAutoResume(t *testing.T) {
	ctx := context.Background()
	h := newEnvdHarness(t)
	h.vms.state = store.StateSuspended
	past := time.Now().Add(-time.Minute)
	put := func(auto bool) {
		t.Helper()
		if err := h.s.cfg.Store.PutSandbox(ctx, &store.Sandbox{VMID: "vm1", TemplateID: "base", AutoPause: true, AutoResume: auto,
			Timeout: time.Hour, EndAt: past, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	v, _ := h.vms.Get(ctx, "vm1")
	put(false)
	if _, woke := h.s.AutoResume(ctx, v); woke || len(h.vms.calls) != 0 {
		t.Fatalf("a sandbox without autoResume was woken: %v", h.vms.calls)
	}
	put(true)
	got, woke := h.s.AutoResume(ctx, v)
	if !woke || got.State != store.StateRunning || strings.Join(h.vms.calls, ",") != "wake" {
		t.Fatalf("autoResume: woke %v, %+v, calls %v", woke, got, h.vms.calls)
	}
	sb, _ := h.s.cfg.Store.GetSandbox(ctx, "vm1")
	if sb.EndAt.Before(time.Now().Add(50 * time.Minute)) {
		t.Fatalf("an auto-resumed sandbox ends at %v, want about an hour from now", sb.EndAt)
	}
	// Running already: nothing to wake.
	if _, woke := h.s.AutoResume(ctx, got); woke || len(h.vms.calls) != 1 {
		t.Fatalf("a running sandbox was woken again: %v", h.vms.calls)
	}
}
