package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

// A create whose lifecycle cannot hold is refused before any VM is made:
// autoResume needs autoPause, and cannot wake a filesystem-only pause.
func TestCreateLifecycleRefused(t *testing.T) {
	h := newEnvdHarness(t)
	for body, want := range map[string]string{
		`{"autoResume":{"enabled":true}}`:                                          "autoResume can only be enabled with autoPause",
		`{"autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`: "cannot be combined with autoPauseMemory: false",
		`{"autoPauseMemory":false}`:                                                "autoPauseMemory: false is only allowed with autoPause",
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
// pause is a stop, a pause with memory a suspend, no autoPause a delete;
// a paused or stopped sandbox is left alone, and so is one whose end a
// wake moved after the loop listed it.
func TestExpireLifecycle(t *testing.T) {
	ctx := context.Background()
	past := time.Now().Add(-time.Second)
	for _, c := range []struct {
		sb    store.Sandbox
		state store.State
		end   time.Time // the end in the store when expire runs
		want  string
	}{
		{store.Sandbox{AutoPause: true}, "", past, "suspend"},
		{store.Sandbox{AutoPause: true, PauseDisk: true}, "", past, "stop"},
		{store.Sandbox{}, "", past, "delete"},
		{store.Sandbox{AutoPause: true, PauseDisk: true}, store.StateStopped, past, ""},
		{store.Sandbox{AutoPause: true}, store.StateSuspended, past, ""},
		{store.Sandbox{}, store.StateStopped, past, ""}, // pause({memory: false}) without autoPause
		{store.Sandbox{AutoPause: true}, "", time.Now().Add(time.Hour), ""},
	} {
		h := newEnvdHarness(t)
		h.vms.state = c.state
		listed := c.sb
		listed.VMID, listed.TemplateID, listed.EndAt, listed.CreatedAt = "vm1", "base", past, time.Now()
		now := listed
		now.EndAt = c.end
		if err := h.s.cfg.Store.PutSandbox(ctx, &now); err != nil {
			t.Fatal(err)
		}
		h.s.expire(ctx, &listed)
		if got := strings.Join(h.vms.calls, ","); got != c.want {
			t.Errorf("%+v in state %q, end in %v: calls %q, want %q", c.sb, c.state, time.Until(c.end).Round(time.Minute), got, c.want)
		}
	}

	// A sandbox whose VM is gone loses its record; one whose VM could not
	// be read (the database, for a moment) keeps it for the next tick.
	for _, c := range []struct {
		err  error
		kept bool
	}{{fmt.Errorf("%w: no VM", vm.ErrNotFound), false}, {errors.New("the database is unreachable"), true}} {
		h := newEnvdHarness(t)
		sb := store.Sandbox{VMID: "vm1", TemplateID: "base", EndAt: past, CreatedAt: time.Now()}
		if err := h.s.cfg.Store.PutSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
		h.vms.getErr = c.err
		h.s.expire(ctx, &sb)
		if _, err := h.s.cfg.Store.GetSandboxFresh(ctx, "vm1"); (err == nil) != c.kept {
			t.Errorf("expire when the VM read failed with %q: sandbox record kept %v, want %v", c.err, err == nil, c.kept)
		}
	}
}

// A request to a paused sandbox wakes it only when it asked for
// autoResume; the wake gives it at least its timeout (never less than it
// had), and a wake that failed is not tried again at once.
func TestAutoResume(t *testing.T) {
	ctx := context.Background()
	h := newEnvdHarness(t)
	h.vms.state = store.StateSuspended
	put := func(auto bool, end time.Time) {
		t.Helper()
		if err := h.s.cfg.Store.PutSandbox(ctx, &store.Sandbox{VMID: "vm1", TemplateID: "base", AutoPause: true, AutoResume: auto,
			Timeout: time.Hour, EndAt: end, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	end := func() time.Time {
		sb, _ := h.s.cfg.Store.GetSandbox(ctx, "vm1")
		return sb.EndAt
	}
	v, _ := h.vms.Get(ctx, "vm1")
	put(false, time.Now().Add(-time.Minute))
	if _, woke := h.s.Reach(ctx, v); woke || len(h.vms.calls) != 0 {
		t.Fatalf("a sandbox without autoResume was woken: %v", h.vms.calls)
	}
	put(true, time.Now().Add(-time.Minute))
	got, woke := h.s.Reach(ctx, v)
	if !woke || got.State != store.StateRunning || strings.Join(h.vms.calls, ",") != "wake" {
		t.Fatalf("autoResume: woke %v, %+v, calls %v", woke, got, h.vms.calls)
	}
	if e := end(); e.Before(time.Now().Add(50 * time.Minute)) {
		t.Fatalf("an auto-resumed sandbox ends at %v, want about an hour from now", e)
	}
	// Woken already (by another request): nothing to do.
	if _, woke := h.s.Reach(ctx, v); !woke || len(h.vms.calls) != 1 {
		t.Fatalf("a sandbox another request woke: woke %v, calls %v", woke, h.vms.calls)
	}
	// A longer life than its timeout is kept.
	later := time.Now().Add(3 * time.Hour).Truncate(time.Millisecond)
	put(true, later)
	h.vms.state = store.StateSuspended
	if _, woke := h.s.Reach(ctx, v); !woke || !end().Equal(later) {
		t.Fatalf("an auto-resume moved an end of %v to %v", later, end())
	}
	// Running past an autoPause end (the suspend not done yet) is paused
	// to a request as to E2B's answers; with autoResume the request
	// resumes it as it stands.
	h.vms.state, h.vms.calls = "", nil
	running, _ := h.vms.Get(ctx, "vm1")
	put(false, time.Now().Add(-time.Second))
	if _, ok := h.s.Reach(ctx, running); ok {
		t.Fatal("a sandbox its timeout is pausing was reached")
	}
	put(true, time.Now().Add(-time.Second))
	if _, ok := h.s.Reach(ctx, running); !ok || len(h.vms.calls) != 0 || end().Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("autoResume of a sandbox its timeout is pausing: %v, calls %v, end %v", ok, h.vms.calls, end())
	}
	// A wake that fails is not retried for every request.
	h.vms.state, h.vms.calls, h.vms.wakeErr = store.StateSuspended, nil, errors.New("no memory")
	for range 3 {
		if _, woke := h.s.Reach(ctx, v); woke {
			t.Fatal("a failed wake reported a woken sandbox")
		}
	}
	if len(h.vms.calls) != 1 {
		t.Fatalf("a failing auto-resume was tried %d times at once", len(h.vms.calls))
	}
}
