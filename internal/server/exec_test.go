package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentvm/agentvm/api"
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
			execBuffered(rec, req, &floodExec{t: t, stdout: tc.stdout, stderr: "warning\n"})
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
