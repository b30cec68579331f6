package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
)

// The recording benchmark (issue 34's measure): a terminal that prints
// 50 MiB, with the VM's recording on and off, alternating on one VM, as
// the time from the command's Enter to its end marker in the client.

// RecordReport is the result of -record.
type RecordReport struct {
	MiB   int     `json:"mib"`
	On    Stats   `json:"recording_on_ms"`
	Off   Stats   `json:"recording_off_ms"`
	Ratio float64 `json:"throughput_on_over_off_p50"`
}

var recordRounds = 3

func (b *bench) runRecord(ctx context.Context) error {
	r := &RecordReport{MiB: 50}
	b.r.Record = r
	v, err := b.c.CreateVM(ctx, api.CreateVMRequest{Name: "bench-record", Memory: 1 << 30})
	if err != nil {
		return err
	}
	b.track(v.ID, v.PID)
	var on, off []float64
	for i := 0; i < 2*recordRounds; i++ {
		recording := i%2 == 0
		if err := b.c.SetRecording(ctx, v.ID, recording); err != nil {
			return err
		}
		name := fmt.Sprintf("flood%d", i)
		if _, err := b.c.CreateTerminal(ctx, v.ID, api.TermCreate{Name: name}); err != nil {
			return err
		}
		d, err := b.floodTerminal(ctx, v.ID, name, r.MiB)
		if err != nil {
			return err
		}
		if recording {
			on = append(on, d)
		} else {
			off = append(off, d)
		}
		logf("record: round %d/%d, recording %v: %.0f ms", i+1, 2*recordRounds, recording, d)
		b.c.KillTerminal(ctx, v.ID, name)
	}
	r.On, r.Off = summarize(on), summarize(off)
	r.Ratio = ratio(r.Off.P50, r.On.P50)
	return nil
}

// floodTerminal prints mib MiB in a terminal and returns the milliseconds
// from the Enter to the end marker.
func (b *bench) floodTerminal(ctx context.Context, vm, name string, mib int) (float64, error) {
	tm, err := b.c.AttachTerminal(ctx, vm, name, clientAttach())
	if err != nil {
		return 0, err
	}
	defer tm.Close()
	t0 := time.Now()
	fmt.Fprintf(tm, "head -c %d /dev/zero | tr '\\0' y; echo; echo flood-$((40+2))-end\r", mib<<20)
	want := []byte("flood-42-end")
	var tail []byte
	buf := make([]byte, 256<<10)
	for {
		n, err := tm.Read(buf)
		tail = append(tail, buf[:n]...)
		if bytes.Contains(tail, want) {
			return float64(time.Since(t0).Milliseconds()), nil
		}
		if len(tail) > 64 {
			tail = tail[len(tail)-64:]
		}
		if err == io.EOF || err != nil {
			return 0, fmt.Errorf("terminal %s: %v", name, err)
		}
	}
}

// PrintRecord prints the -record table.
func (r *Report) PrintRecord(w io.Writer) {
	g := r.Record
	if g == nil {
		return
	}
	fmt.Fprintf(w, "\nRecording: a terminal printing %d MiB, recording on and off alternately on one VM, %d rounds each\n", g.MiB, recordRounds)
	statsLine(w, "recording on", g.On)
	statsLine(w, "recording off", g.Off)
	fmt.Fprintf(w, "  throughput with recording over without (p50)  %.3fx (the issue wants >= 0.9x)\n", g.Ratio)
}

func clientAttach() client.AttachOptions {
	return client.AttachOptions{Cols: 120, Rows: 40, NoScrollback: true}
}
