package server

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/auth"
	"github.com/agentvm/agentvm/internal/store"
	"github.com/agentvm/agentvm/internal/vm"
)

func TestValidateExec(t *testing.T) {
	ok := []api.ExecRequest{{Cmd: []string{"true"}}, {Shell: "echo hi", User: "agent", Cwd: "/tmp", Env: map[string]string{"A": "1"}}}
	for _, r := range ok {
		if _, err := validateExec(&r); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	bad := []api.ExecRequest{{}, {Cmd: []string{"a"}, Shell: "b"}, {Cmd: []string{""}}, {Cmd: []string{"a"}, Cwd: "rel"},
		{Cmd: []string{"a"}, User: "Bad User"}, {Cmd: []string{"a"}, Env: map[string]string{"1X": ""}}, {Cmd: []string{"a"}, Timeout: -1}}
	for _, r := range bad {
		if _, err := validateExec(&r); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
}

func TestErrorMapping(t *testing.T) {
	for err, status := range map[error]int{
		fmt.Errorf("%w: x", vm.ErrInvalid):      400,
		fmt.Errorf("%w: x", vm.ErrNotFound):     404,
		fmt.Errorf("%w: x", vm.ErrConflict):     409,
		fmt.Errorf("%w: x", vm.ErrInsufficient): 507,
		fmt.Errorf("%w: x", vm.ErrUnavailable):  503,
		errors.New("boom"):                      500,
	} {
		rec := httptest.NewRecorder()
		writeErr(rec, err)
		if rec.Code != status || !strings.Contains(rec.Body.String(), `"message":"x"`) && status != 500 {
			t.Errorf("%v: %d %s", err, rec.Code, rec.Body)
		}
	}
}

func TestAuth(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := &Server{token: "avm_secret", tokens: auth.New(st, "avm_secret")}
	h := s.auth(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !principal(r).Admin {
			w.WriteHeader(500)
			return
		}
		admin(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })(w, r)
	}))
	for hdr, want := range map[string]int{"": 401, "Bearer wrong": 401, "avm_secret": 401, "Bearer avm_secret": 204, "bearer avm_secret": 204,
		"Bearer avt_0123": 401} {
		req := httptest.NewRequest("GET", "/v1/vms", nil)
		if hdr != "" {
			req.Header.Set("Authorization", hdr)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("%q: %d, want %d", hdr, rec.Code, want)
		}
	}
}

func TestBearer(t *testing.T) {
	req := httptest.NewRequest("GET", "/v1/vms/x/terminals/t?access_token=q", nil)
	if got := bearer(req); got != "" {
		t.Fatalf("query token accepted without a WebSocket upgrade: %q", got)
	}
	req.Header.Set("Upgrade", "websocket")
	if got := bearer(req); got != "q" {
		t.Fatalf("WebSocket query token: %q", got)
	}
	req.Header.Set("Authorization", "Bearer h")
	if got := bearer(req); got != "h" {
		t.Fatalf("header first: %q", got)
	}
}

// A saved state this QEMU cannot restore is a 409 with its own code, and
// the message names both QEMU versions.
func TestStateIncompatibleMapping(t *testing.T) {
	err := fmt.Errorf("wake box: %w", &vm.StateIncompatibleError{What: "VM box's suspended state", Why: "saved by QEMU 10.0.2, newer than this server's QEMU 7.2.22"})
	rec := httptest.NewRecorder()
	writeErr(rec, err)
	body := rec.Body.String()
	if rec.Code != 409 || !strings.Contains(body, `"code":"state_incompatible"`) || !strings.Contains(body, "10.0.2") || !strings.Contains(body, "7.2.22") {
		t.Errorf("%d %s", rec.Code, body)
	}
}
