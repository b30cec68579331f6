package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/agentvm/agentvm/api"
)

// The restore crash loop (issue 28, item 9): creates from the template in a
// loop, each deleted at once, on the distribution's QEMU and on the one
// AGENTVM_QEMU names (QEMU 10 from bookworm-backports on Debian 12), one
// server each, counting the restores whose QEMU crashed (and were retried)
// and the creates that failed.

// CrashLoopReport is the result of -crashloop.
type CrashLoopReport struct {
	Runs []crashLoopRun `json:"runs"`
}

type crashLoopRun struct {
	QEMU    string   `json:"qemu"`
	Creates int      `json:"creates"`
	Crashes int      `json:"restores_crashed"`
	Failed  int      `json:"creates_failed"`
	Errors  []string `json:"errors,omitempty"`
	Signals []string `json:"crash_exits,omitempty"`
	P50Ms   float64  `json:"create_p50_ms"`
}

var crashLoopCreates = 500

func (b *bench) runCrashLoop(ctx context.Context) error {
	r := &CrashLoopReport{}
	b.r.CrashLoop = r
	qemus := []string{"qemu-system-x86_64"}
	if q := os.Getenv("AGENTVM_QEMU"); q != "" && q != qemus[0] {
		qemus = append(qemus, q)
	}
	for i, q := range qemus {
		s, err := startServer(ctx, b.srv.bin, fmt.Sprintf("%s/crashloop-%d", b.tmp, i), true, 0, "--qemu", q)
		if err != nil {
			return err
		}
		run := crashLoopRun{QEMU: q}
		var ms []float64
		for n := 0; n < crashLoopCreates && ctx.Err() == nil; n++ {
			v, err := s.client.CreateVM(ctx, api.CreateVMRequest{})
			run.Creates++
			if err != nil {
				run.Failed++
				if len(run.Errors) < 5 {
					run.Errors = append(run.Errors, err.Error())
				}
				continue
			}
			ms = append(ms, float64(v.CreateMs))
			evs, _ := s.client.Events(ctx, v.ID, 0)
			for _, e := range evs {
				if strings.Contains(e.Message, "restore from") && strings.Contains(e.Message, "crashed") {
					run.Crashes++
					if len(run.Signals) < 5 {
						run.Signals = append(run.Signals, e.Message)
					}
				}
			}
			if err := s.client.DeleteVM(ctx, v.ID); err != nil {
				run.Errors = append(run.Errors, "delete: "+err.Error())
			}
			if (n+1)%50 == 0 {
				logf("crashloop: %s: %d creates, %d crashed restores, %d failed", q, n+1, run.Crashes, run.Failed)
			}
		}
		run.P50Ms = summarize(ms).P50
		r.Runs = append(r.Runs, run)
		s.stop()
	}
	return nil
}

// PrintCrashLoop prints the -crashloop results.
func (r *Report) PrintCrashLoop(w io.Writer) {
	if r.CrashLoop == nil {
		return
	}
	fmt.Fprintln(w, "Creates from the template in a loop (each deleted at once): QEMU crashes during the restore, and creates that failed")
	for _, run := range r.CrashLoop.Runs {
		fmt.Fprintf(w, "  %-45s %4d creates: %d restores crashed (retried), %d failed; create p50 %.0f ms\n", run.QEMU, run.Creates, run.Crashes, run.Failed, run.P50Ms)
		for _, s := range run.Signals {
			fmt.Fprintf(w, "    %s\n", s)
		}
		for _, e := range run.Errors {
			fmt.Fprintf(w, "    error: %s\n", e)
		}
	}
}
