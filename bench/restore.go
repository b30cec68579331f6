package main

// The restore benchmark (go run ./bench -restore): the operations that
// restore a VM's own memory, with the state saved as one migration stream
// (agentvm serve --state-format stream, the old way) and as a page-for-page
// RAM file mapped at the restore (--state-format pages), for 1 GiB and
// 4 GiB VMs, in one run. Each format gets its own server (same binary, same
// cached templates); each VM first makes 200 MiB of its memory resident.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
)

const (
	rsRuns = 3 // measured repetitions of each operation
)

var (
	rsMemories = []int64{1024, 4096}
	rsFormats  = []string{"stream", "pages", "mapped-ram"}
)

func init() {
	flag.Func("rs-formats", "-restore: comma-separated --state-format of each server, the first the ratios' base (default stream,pages,mapped-ram; mapped-ram suspends with QEMU's mapped-ram from QEMU 9.0 on, a stream before)", func(v string) error {
		rsFormats = nil
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			switch {
			case f != "stream" && f != "pages" && f != "mapped-ram" && f != "auto":
				return fmt.Errorf("state format %q: want stream, pages, mapped-ram or auto", f)
			case slices.Contains(rsFormats, f):
				return fmt.Errorf("state format %q given twice", f)
			}
			rsFormats = append(rsFormats, f)
		}
		if len(rsFormats) < 2 {
			return errors.New("want at least two formats to compare")
		}
		return nil
	})
}

// RestoreRow is one operation's p50 (ms) per memory size and format.
type RestoreRow struct {
	Op        string             `json:"op"`
	MemoryMiB int64              `json:"memory_mib"`
	P50       map[string]float64 `json:"p50_ms"` // format -> p50
	Runs      map[string][]float64
}

// restoreOps are measured in this order on each VM.
var restoreOps = []string{
	"suspend (wall)",
	"exec on a suspended VM (wake to first output)",
	"create --from SNAPSHOT to first exec",
	"fork --count 2 to children answering exec",
	"fork --count 1 to child answering exec",
	"fork --count 8 to children answering exec",
}

func (b *bench) runRestore(ctx context.Context) error {
	rows := map[string]*RestoreRow{}
	key := func(op string, mem int64) string { return op + "|" + fmt.Sprint(mem) }
	for _, op := range restoreOps {
		for _, mem := range rsMemories {
			rows[key(op, mem)] = &RestoreRow{Op: op, MemoryMiB: mem, P50: map[string]float64{}, Runs: map[string][]float64{}}
		}
	}
	var errs []error
	for _, format := range rsFormats {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sub, err := b.formatServer(ctx, format)
		if err != nil {
			return fmt.Errorf("server with --state-format %s: %w", format, err)
		}
		for _, mem := range rsMemories {
			if ctx.Err() != nil {
				break
			}
			logf("restore bench: %s format, %d MiB VM", format, mem)
			res, err := sub.restoreRound(ctx, mem)
			for op, runs := range res {
				r := rows[key(op, mem)]
				r.Runs[format] = runs
				r.P50[format] = summarize(runs).P50
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s format, %d MiB: %w", format, mem, err))
				logf("restore bench: %v (continuing)", errs[len(errs)-1])
			}
		}
		sub.cleanup()
		sub.deleteSnapshots()
		if err := sub.srv.stop(); err != nil {
			logf("stopping the %s server: %v", format, err)
		}
		sub.srv.removeRunDir()
	}
	var out []*RestoreRow
	for _, op := range restoreOps {
		for _, mem := range rsMemories {
			out = append(out, rows[key(op, mem)])
		}
	}
	printRestore(os.Stdout, out)
	var sb strings.Builder
	printRestore(&sb, out)
	b.r.Notes = append(b.r.Notes, strings.Split(strings.TrimSpace(sb.String()), "\n")...)
	return errors.Join(errs...)
}

func printRestore(w io.Writer, rows []*RestoreRow) {
	base := rsFormats[0]
	fmt.Fprintf(w, "\nRestores of a VM's own memory, p50 of %d runs (ms), one server per --state-format (stream: one migration stream; pages: RAM file mapped copy-on-write; mapped-ram: suspends with QEMU's mapped-ram where QEMU has it, the rest as pages; auto: suspends as a stream, the rest as pages); ratio: %s / format (above 1: faster than %s)\n", rsRuns, base, base)
	fmt.Fprintf(w, "%-48s %6s", "operation", "memory")
	for _, f := range rsFormats {
		fmt.Fprintf(w, " %10s", f)
	}
	for _, f := range rsFormats[1:] {
		fmt.Fprintf(w, " %14s", "ratio "+f)
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		seen := false
		for _, f := range rsFormats {
			seen = seen || r.P50[f] != 0
		}
		if !seen {
			continue
		}
		fmt.Fprintf(w, "%-48s %4dG", r.Op, r.MemoryMiB>>10)
		for _, f := range rsFormats {
			fmt.Fprintf(w, " %10.0f", r.P50[f])
		}
		for _, f := range rsFormats[1:] {
			fmt.Fprintf(w, " %13.2fx", ratio(r.P50[base], r.P50[f]))
		}
		fmt.Fprintln(w)
	}
}

// formatServer starts a server of this run's binary that saves in format.
func (b *bench) formatServer(ctx context.Context, format string) (*bench, error) {
	dir := filepath.Join(b.tmp, "restore-"+format)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	os.Setenv("AGENTVM_TEMPLATE_DIR", b.srv.templateDir)
	os.Setenv("AGENTVM_STATE_FORMAT", format)
	defer os.Unsetenv("AGENTVM_TEMPLATE_DIR")
	defer os.Unsetenv("AGENTVM_STATE_FORMAT")
	srv, err := startServer(ctx, b.srv.bin, dir, true, 0)
	if err != nil {
		return nil, err
	}
	return &bench{o: b.o, srv: srv, c: srv.client, r: b.r, tmp: dir, vms: map[string]int{}}, nil
}

// restoreRound measures every operation on one VM of mem MiB.
func (b *bench) restoreRound(ctx context.Context, mem int64) (map[string][]float64, error) {
	res := map[string][]float64{}
	v, err := b.c.CreateVM(ctx, api.CreateVMRequest{Memory: api.Size(mem << 20)})
	if err != nil {
		return res, fmt.Errorf("create: %w", err)
	}
	b.track(v.ID, v.PID)
	defer b.remove(v.ID)
	if _, err := b.firstExec(ctx, v.ID); err != nil {
		return res, err
	}
	if err := b.holdMemory(ctx, v.ID); err != nil {
		return res, err
	}
	sus, wake, err := b.suspendWake(ctx, v.ID, rsRuns)
	res[restoreOps[0]], res[restoreOps[1]] = sus, wake
	if err != nil {
		return res, err
	}
	from, err := b.createFromSnapshot(ctx, v.ID, rsRuns)
	res[restoreOps[2]] = from
	if err != nil {
		return res, err
	}
	forks := []struct {
		op    string
		count int
		runs  int
	}{{restoreOps[3], 2, rsRuns}, {restoreOps[4], 1, 1}}
	if mem <= 1024 {
		forks = append(forks, struct {
			op    string
			count int
			runs  int
		}{restoreOps[5], 8, 1})
	}
	for _, f := range forks {
		for i := 0; i < f.runs; i++ {
			d, err := b.timeFork(ctx, v.ID, f.count)
			if err != nil {
				return res, fmt.Errorf("fork x%d: %w", f.count, err)
			}
			res[f.op] = append(res[f.op], d)
		}
	}
	return res, nil
}

// holdMemory makes ~200 MiB of the guest's memory resident (every page written).
func (b *bench) holdMemory(ctx context.Context, vm string) error {
	r, err := b.c.Exec(ctx, vm, api.ExecRequest{Shell: holdCmd, Timeout: api.Duration(time.Minute)})
	if err != nil {
		return fmt.Errorf("start the memory holder: %w", err)
	}
	pid, perr := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if r.ExitCode != 0 || perr != nil {
		return fmt.Errorf("start the memory holder: exit %d, out %q", r.ExitCode, r.Stdout)
	}
	for deadline := time.Now().Add(3 * time.Minute); ; {
		rss, err := b.rssMiB(ctx, vm, pid)
		if err != nil {
			return err
		}
		if rss >= lcHoldMiB-8 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("memory holder reached only %d MiB", rss)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// suspendWake suspends vm and wakes it with an exec of `true`, runs times:
// the suspend calls' wall times and the wakes' (suspend state to exec returned).
func (b *bench) suspendWake(ctx context.Context, vm string, runs int) (suspend, wake []float64, err error) {
	for i := 0; i < runs; i++ {
		t0 := time.Now()
		s, err := b.c.SuspendVM(ctx, vm)
		d := time.Since(t0)
		if err != nil || s.State != api.StateSuspended {
			return suspend, wake, fmt.Errorf("suspend: %v (state %v)", err, s)
		}
		suspend = append(suspend, msf(d))
		time.Sleep(time.Second) // the wake is what is measured
		t1 := time.Now()
		if err := b.execTrue(ctx, vm); err != nil {
			return suspend, wake, fmt.Errorf("exec waking the VM: %w", err)
		}
		wake = append(wake, msf(time.Since(t1)))
	}
	return suspend, wake, nil
}

// createFromSnapshot snapshots vm once (untimed) and times runs creates
// --from the snapshot, each until its first exec; the VMs and the snapshot
// are deleted (untimed).
func (b *bench) createFromSnapshot(ctx context.Context, vm string, runs int) ([]float64, error) {
	var out []float64
	sn, err := b.c.Snapshot(ctx, vm, "bench-rs-"+randSuffix())
	if err != nil {
		return out, fmt.Errorf("snapshot: %w", err)
	}
	b.trackSnap(sn.ID)
	defer b.c.DeleteSnapshot(ctx, sn.ID)
	for i := 0; i < runs; i++ {
		t0 := time.Now()
		c, err := b.c.CreateVM(ctx, api.CreateVMRequest{From: sn.ID})
		if err != nil {
			return out, fmt.Errorf("create --from: %w", err)
		}
		b.track(c.ID, c.PID)
		_, err = b.firstExec(ctx, c.ID)
		d := time.Since(t0)
		b.remove(c.ID)
		if err != nil {
			return out, fmt.Errorf("first exec in a VM from the snapshot: %w", err)
		}
		out = append(out, msf(d))
	}
	return out, nil
}

// timeFork forks vm into count children and returns the ms until every
// child has answered an exec; the children are deleted (untimed).
func (b *bench) timeFork(ctx context.Context, vm string, count int) (float64, error) {
	fr := ForkRun{Count: count}
	err := b.forkOnce(ctx, vm, &fr)
	return fr.AllExecMs, err
}
