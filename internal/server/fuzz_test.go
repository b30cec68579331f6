package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/vm"
)

// decodeBody runs body through decodeJSON as a handler does. On failure
// it checks the answer is a 400 with an API error body.
func decodeBody(t *testing.T, body []byte, v any) bool {
	t.Helper()
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/v1/vms", bytes.NewReader(body))
	if decodeJSON(w, r, v) {
		return true
	}
	var e api.Error
	if w.Code != http.StatusBadRequest || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Error.Code != api.CodeInvalid || e.Error.Message == "" {
		t.Fatalf("rejected body answered %d %q", w.Code, w.Body.String())
	}
	return false
}

// FuzzCreateVMRequest feeds request bodies through the create path's
// decoding and validation (createVM, then CreateOptions.Validate): a body
// is rejected or yields options within every documented bound.
func FuzzCreateVMRequest(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `null`, `{"name":"web","cpus":2,"memory":"2G","disk":"20G"}`, `{"memory":1024,"disk":8192}`,
		`{"name":"a","labels":{"team":"x","a.b/c":"v"},"env":{"API_KEY":"s3cret"},"idempotency_key":"k1"}`,
		`{"network":"dev","egress":{"mode":"allow","allow":["10.0.0.0/8","1.2.3.4","example.com"],"allow_host":[8080]}}`,
		`{"egress":{"mode":"deny"}}`, `{"egress":{"mode":"bogus"}}`, `{"egress":null}`,
		`{"from":"snap-1","idle_timeout":"15m","delete_after":86400,"restart":"on-failure"}`,
		`{"idle_timeout":"-1s"}`, `{"delete_after":-5}`, `{"idle_timeout":1e300}`, `{"restart":"sometimes"}`,
		`{"name":"vm-0123456789ab"}`, `{"name":"-bad"}`, `{"name":"UPPER"}`, `{"cpus":-1}`, `{"cpus":65}`,
		`{"cpus":1e10}`, `{"memory":"64M"}`, `{"memory":-1}`, `{"memory":"1e-9"}`, `{"disk":"2P"}`, `{"memory":true}`,
		`{"env":{"1BAD":"x"}}`, `{"env":{"OK":"a\u0000b"}}`, `{"labels":{"":"x"}}`, `{"unknown":1}`,
		`{"name":"a"} trailing`, `{"name":"a"`, `[1,2]`, `"str"`, `{"name":"a","name":"b"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req api.CreateVMRequest
		if !decodeBody(t, body, &req) {
			return
		}
		if req.Memory < 0 || req.Disk < 0 || req.IdleTimeout < 0 || req.DeleteAfter < 0 {
			t.Fatalf("decoded negative values: memory %d disk %d idle %d delete %d",
				req.Memory, req.Disk, req.IdleTimeout, req.DeleteAfter)
		}
		o := createOptions(&req, req.IdempotencyKey)
		if o.Validate() != nil {
			return
		}
		switch {
		case o.CPUs < 1 || o.CPUs > vm.MaxCPUs:
			t.Fatalf("accepted cpus %d", o.CPUs)
		case o.MemoryMiB < vm.MinMemoryMiB || o.MemoryMiB > 1<<30:
			t.Fatalf("accepted memory %d MiB", o.MemoryMiB)
		case o.DiskBytes <= 0 || o.DiskBytes > 1<<50:
			t.Fatalf("accepted disk %d bytes", o.DiskBytes)
		case o.IdleTimeout < 0 || o.DeleteAfter < 0:
			t.Fatalf("accepted negative timeouts: idle %v, delete after %v", o.IdleTimeout, o.DeleteAfter)
		case !vm.ValidRestart(o.Restart):
			t.Fatalf("accepted restart %q", o.Restart)
		case len(o.IdempotencyKey) > 200:
			t.Fatalf("accepted a %d-byte idempotency key", len(o.IdempotencyKey))
		}
		if o.Name != "" {
			if err := vm.ValidateName(o.Name); err != nil {
				t.Fatalf("accepted name: %v", err)
			}
		}
		if _, err := vm.EgressToNetwork(o.Egress); err != nil {
			t.Fatalf("accepted egress %+v: %v", o.Egress, err)
		}
		for k, v := range o.Env {
			if !vm.ValidEnv(k, v) {
				t.Fatalf("accepted env %q=%q", k, v)
			}
		}
	})
}

// FuzzExecRequest feeds request bodies through execVM's decoding and
// validateExec: a body is rejected or yields a well-formed guest request.
func FuzzExecRequest(f *testing.F) {
	for _, s := range []string{
		`{"cmd":["ls","-l"]}`, `{"shell":"echo hi | wc -c"}`, `{"cmd":["id"],"user":"alice","cwd":"/tmp","env":{"A":"1"}}`,
		`{"cmd":["sleep","9"],"timeout":"1s"}`, `{"shell":"x","timeout":0.0000001}`, `{"shell":"x","timeout":1e300}`,
		`{"shell":"x","stdin":"input\n"}`, ``, `{}`, `{"cmd":[]}`, `{"cmd":[""]}`, `{"cmd":["ls"],"shell":"ls"}`,
		`{"cmd":["ls"],"user":"Root"}`, `{"cmd":["ls"],"user":"a\u0000"}`, `{"cmd":["ls"],"cwd":"rel"}`,
		`{"cmd":["ls"],"cwd":"/a\u0000b"}`, `{"cmd":["ls"],"env":{"A=B":"x"}}`, `{"cmd":["ls"],"timeout":"-1s"}`,
		`{"cmd":["ls"],"timeout":-1}`, `{"cmd":"ls"}`, `{"cmd":["ls"],"extra":1}`, `{"cmd":[null]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req api.ExecRequest
		if !decodeBody(t, body, &req) {
			return
		}
		g, err := validateExec(&req)
		if err != nil {
			return
		}
		switch {
		case (len(g.Argv) > 0) == (g.Shell != ""):
			t.Fatalf("accepted argv %q with shell %q: want exactly one", g.Argv, g.Shell)
		case len(g.Argv) > 0 && g.Argv[0] == "":
			t.Fatal("accepted an empty argv[0]")
		case g.User != "" && !userRe.MatchString(g.User):
			t.Fatalf("accepted user %q", g.User)
		case g.Cwd != "" && (!path.IsAbs(g.Cwd) || strings.ContainsRune(g.Cwd, 0)):
			t.Fatalf("accepted cwd %q", g.Cwd)
		case g.TimeoutMS < 0 || (g.TimeoutMS > 0) != (req.Timeout > 0):
			t.Fatalf("timeout %v became %d ms", time.Duration(req.Timeout), g.TimeoutMS)
		}
		for k, v := range g.Env {
			if !vm.ValidEnv(k, v) {
				t.Fatalf("accepted env %q=%q", k, v)
			}
		}
	})
}
