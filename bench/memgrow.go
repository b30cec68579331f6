package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
)

// The live memory grow benchmark: a running 1 GiB VM resized to 4 GiB,
// from the resize call until the guest's MemTotal shows the new memory,
// against the way there was before live grow (stop, resize, start: a boot
// from disk) as the baseline.

// MemGrowReport is the result of -memgrow.
type MemGrowReport struct {
	FromMiB      int64   `json:"from_mib"`
	ToMiB        int64   `json:"to_mib"`
	ResizeCall   Stats   `json:"resize_call"`            // the API call (returns once QEMU reports the memory plugged)
	ToMemTotal   Stats   `json:"resize_to_memtotal"`     // resize call to MemTotal grown in the guest
	ColdBaseline Stats   `json:"stop_resize_start"`      // stop, resize, start, MemTotal grown
	MemTotalMiB  [2]int  `json:"guest_memtotal_mib"`     // before and after, last sample
	Ratio        float64 `json:"baseline_over_live_p50"` // ColdBaseline / ToMemTotal
}

var memGrowSamples = 5

// guestMemTotal reads MemTotal (MiB) in the VM.
func (b *bench) guestMemTotal(ctx context.Context, id string) (int, error) {
	ex, err := b.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"awk", "/^MemTotal:/ {print int($2/1024)}", "/proc/meminfo"}})
	if err != nil {
		return 0, err
	}
	var n int
	if _, err := fmt.Sscan(strings.TrimSpace(ex.Stdout), &n); err != nil {
		return 0, fmt.Errorf("MemTotal: %q", ex.Stdout)
	}
	return n, nil
}

// waitGuestMemTotal polls MemTotal until it reaches min MiB.
func (b *bench) waitGuestMemTotal(ctx context.Context, id string, min int) (int, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n, err := b.guestMemTotal(ctx, id)
		if err != nil || n >= min {
			return n, err
		}
		if time.Now().After(deadline) {
			return n, fmt.Errorf("MemTotal stayed at %d MiB, want %d", n, min)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *bench) runMemGrow(ctx context.Context) error {
	r := &MemGrowReport{FromMiB: 1024, ToMiB: 4096}
	b.r.MemGrow = r
	shape := api.CreateVMRequest{Memory: api.Size(r.FromMiB << 20), Disk: vmDisk}
	grownBy := int(r.ToMiB-r.FromMiB) - 64
	newVM := func() (string, int, error) {
		v, err := b.c.CreateVM(ctx, shape)
		if err != nil {
			return "", 0, err
		}
		b.track(v.ID, v.PID)
		n, err := b.guestMemTotal(ctx, v.ID)
		return v.ID, n, err
	}
	logf("memgrow: first create (builds the template when missing; not measured)")
	id, _, err := newVM()
	if err != nil {
		return err
	}
	if err := b.remove(id); err != nil {
		return err
	}
	logf("memgrow: %d live grows %d -> %d MiB", memGrowSamples, r.FromMiB, r.ToMiB)
	var calls, totals, cold []float64
	for i := 0; i < memGrowSamples; i++ {
		id, before, err := newVM()
		if err != nil {
			return err
		}
		call, total, after, err := b.liveGrow(ctx, id, before, r.FromMiB, r.ToMiB)
		if err != nil {
			return err
		}
		calls, totals = append(calls, millis(call)), append(totals, millis(total))
		r.MemTotalMiB = [2]int{before, after}
		if i < 2 { // the baseline: the same VM back to FromMiB and up again through a boot from disk
			if _, err := b.c.StopVM(ctx, id); err != nil {
				return err
			}
			if _, err := b.c.ResizeVM(ctx, id, api.ResizeRequest{Memory: api.Size(r.FromMiB << 20)}); err != nil {
				return err
			}
			if _, err := b.c.StartVM(ctx, id); err != nil {
				return err
			}
			before, err := b.guestMemTotal(ctx, id)
			if err != nil {
				return err
			}
			t0 := time.Now()
			if _, err := b.c.StopVM(ctx, id); err != nil {
				return err
			}
			if _, err := b.c.ResizeVM(ctx, id, api.ResizeRequest{Memory: api.Size(r.ToMiB << 20)}); err != nil {
				return err
			}
			if _, err := b.c.StartVM(ctx, id); err != nil {
				return err
			}
			if _, err := b.waitGuestMemTotal(ctx, id, before+grownBy); err != nil {
				return err
			}
			cold = append(cold, millis(time.Since(t0)))
		}
		if err := b.remove(id); err != nil {
			return err
		}
	}
	r.ResizeCall, r.ToMemTotal, r.ColdBaseline = summarize(calls), summarize(totals), summarize(cold)
	r.Ratio = ratio(r.ColdBaseline.P50, r.ToMemTotal.P50)
	return nil
}

// liveGrow resizes the running VM id from fromMiB to toMiB and waits until
// the guest's MemTotal (before MiB at the start) has grown by all but 64 MiB
// of it: the resize call's time, the time until MemTotal showed it, and the
// MemTotal then.
func (b *bench) liveGrow(ctx context.Context, id string, before int, fromMiB, toMiB int64) (call, total time.Duration, after int, err error) {
	t0 := time.Now()
	v, err := b.c.ResizeVM(ctx, id, api.ResizeRequest{Memory: api.Size(toMiB << 20)})
	if err != nil {
		return 0, 0, 0, err
	}
	call = time.Since(t0)
	if v.MemoryMiB != toMiB || v.NextMemoryMiB != 0 {
		return call, 0, 0, fmt.Errorf("resize did not grow live: %d MiB, next %d MiB (%s)", v.MemoryMiB, v.NextMemoryMiB, opMessage(v))
	}
	after, err = b.waitGuestMemTotal(ctx, id, before+int(toMiB-fromMiB)-64)
	return call, time.Since(t0), after, err
}

func opMessage(v *api.VM) string {
	if v.Op == nil {
		return ""
	}
	return v.Op.Message
}

// PrintMemGrow prints the -memgrow results.
func (r *Report) PrintMemGrow(w io.Writer) {
	m := r.MemGrow
	if m == nil {
		return
	}
	fmt.Fprintf(w, "Live memory grow %d -> %d MiB (1 vCPU), same server, same run\n", m.FromMiB, m.ToMiB)
	statsLine(w, "resize call (QEMU reports it plugged)", m.ResizeCall)
	statsLine(w, "resize -> guest MemTotal grown", m.ToMemTotal)
	statsLine(w, "stop, resize, start -> MemTotal (baseline)", m.ColdBaseline)
	fmt.Fprintf(w, "  guest MemTotal %d -> %d MiB; baseline / live p50 = %.1fx (target: live <= 1000 ms)\n",
		m.MemTotalMiB[0], m.MemTotalMiB[1], m.Ratio)
}
