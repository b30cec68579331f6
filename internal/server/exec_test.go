package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/internal/budget"
	"github.com/agentvm/agentvm/internal/guest"
)

// floodExec is an exec stream whose command writes more stdout than a
// buffered exec keeps, and reports a guest error.
type floodExec struct {
	t      *testing.T
	stdout int // bytes of stdout to write
	stderr string
}

func (f *floodExec) Wait(stdout, stderr io.Writer) (*guest.ExitStatus, error) {
	chunk := []byte(strings.Repeat("y\n", 128<<10)) // 256 KiB, an agent frame
	for left := f.stdout; left > 0; left -= len(chunk) {
		p := chunk[:min(left, len(chunk))]
		// The writer must keep taking output after the cap, or the stream
		// stops being drained and the command blocks on a full pipe.
		if n, err := stdout.Write(p); n != len(p) || err != nil {
			f.t.Fatalf("stdout write after %d bytes = %d, %v", f.stdout-left, n, err)
		}
	}
	io.WriteString(stderr, f.stderr)
	return &guest.ExitStatus{ExitCode: 3}, &guest.ExecError{Message: "exec: some guest error"}
}

func (f *floodExec) Close() error { return nil }

func TestExecBufferedCapsOutput(t *testing.T) {
	for _, tc := range []struct {
		name          string
		stdout        int
		wantTruncated bool
	}{
		{"under the cap", 1 << 20, false},
		{"at the cap", maxBufferedOutput, false},
		{"over the cap", maxBufferedOutput + 5<<20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rec := httptest.NewRecorder()
			req := httptest.NewRequestWithContext(ctx, "POST", "/v1/vms/x/exec", nil)
			execBuffered(rec, req, &floodExec{t: t, stdout: tc.stdout, stderr: "warning\n"}, nil)
			var res api.ExecResult
			if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
				t.Fatalf("%d %.200s: %v", rec.Code, rec.Body, err)
			}
			if want := min(tc.stdout, maxBufferedOutput); len(res.Stdout) != want || res.StdoutTruncated != tc.wantTruncated {
				t.Fatalf("stdout %d bytes, truncated %v; want %d, %v", len(res.Stdout), res.StdoutTruncated, want, tc.wantTruncated)
			}
			if res.Stderr != "warning\nexec: some guest error\n" || res.StderrTruncated || res.ExitCode != 3 {
				t.Fatalf("stderr %q (truncated %v), exit %d", res.Stderr, res.StderrTruncated, res.ExitCode)
			}
		})
	}
}

// nulExec writes n NUL bytes, which JSON escapes six times over.
type nulExec struct{ n int }

func (f nulExec) Wait(stdout, stderr io.Writer) (*guest.ExitStatus, error) {
	stdout.Write(make([]byte, f.n))
	return &guest.ExitStatus{}, nil
}

func (nulExec) Close() error { return nil }

// A buffered exec takes what it keeps from the daemon's memory budget: with
// the budget held by others it keeps less and says why, gives back what it
// took, and its output is escaped into the response, not into a copy.
func TestExecBufferedBudget(t *testing.T) {
	mem := budget.New(8 << 20)
	other, err := mem.Take(5<<20, "another request")
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	execBuffered(rec, httptest.NewRequest("POST", "/v1/vms/x/exec", nil), &floodExec{t: t, stdout: 12 << 20, stderr: "warning\n"}, mem)
	var res api.ExecResult
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
		t.Fatalf("%.200s: %v", rec.Body, err)
	}
	if !res.StdoutTruncated || res.TruncatedBy != "memory_budget" || len(res.Stdout) > 3<<20 || len(res.Stdout) == 0 || res.ExitCode != 3 {
		t.Fatalf("kept %d bytes, truncated %v by %q, exit %d", len(res.Stdout), res.StdoutTruncated, res.TruncatedBy, res.ExitCode)
	}
	if mem.Used() != 5<<20 {
		t.Fatalf("the exec kept %d bytes of the budget after it answered", mem.Used()-5<<20)
	}
	other()
	rec = httptest.NewRecorder()
	execBuffered(rec, httptest.NewRequest("POST", "/v1/vms/x/exec", nil), nulExec{4 << 20}, mem)
	res = api.ExecResult{}
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || res.Stdout != string(make([]byte, 4<<20)) || res.StdoutTruncated || res.TruncatedBy != "" {
		t.Fatalf("NUL output: %v, %d bytes, truncated %v %q", err, len(res.Stdout), res.StdoutTruncated, res.TruncatedBy)
	}
}
