package main

// The table of issue 15 (go run ./bench -lifecycle): each operation of the
// issue measured for 1 GiB and 4 GiB VMs in one run, against a template cold
// boot measured in the same run, with the issue's own "now" figures and
// targets beside. Three servers of this run's binary: one on an empty
// template dir (the cold boots), the main one (cached templates, no warm
// pool) and one with --warm-pool 1.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentvm/agentvm/api"
)

var (
	lcRuns     = 3 // -lc-runs: measured repetitions per row and size
	lcMemories = "1024,4096"
	lcDetail   = false // -lc-detail: also the older per-phase lifecycle report
)

func init() {
	flag.IntVar(&lcRuns, "lc-runs", lcRuns, "-lifecycle: measured repetitions of each table row per VM size")
	flag.StringVar(&lcMemories, "lc-memories", lcMemories, "-lifecycle: comma-separated VM sizes in MiB for the table (each grows live to twice its size)")
	flag.BoolVar(&lcDetail, "lc-detail", false, "-lifecycle: after the table, also run the per-phase report (pause/resume, suspend, snapshot, fork 1/4/8, vCPU hot-add) on one -lc-memory VM")
}

// lcDirtyMiBs is the rate the dirtying process in the fork parent writes at.
const lcDirtyMiBs = 50

// dirtyCmd starts a background python3 that rewrites a 64 MiB bytearray at
// lcDirtyMiBs MiB/s (256 KiB slice assignments, alternating two patterns, paced
// by the clock) and writes "<bytes written> <seconds>" to /tmp/bench-dirty.rate
// every second; it prints its pid.
var dirtyCmd = `cat > /tmp/bench-dirty.py <<'EOF'
import time
n = 64 << 20
c = 256 << 10
rate = ` + strconv.Itoa(lcDirtyMiBs) + ` << 20
b = bytearray(n)
pat = [b'\x01' * c, b'\x02' * c]
t0 = time.monotonic()
last = t0
w = o = k = 0
while True:
    b[o:o + c] = pat[k & 1]
    o += c
    w += c
    if o >= n:
        o = 0
        k += 1
    now = time.monotonic()
    if now - last >= 1:
        with open('/tmp/bench-dirty.rate', 'w') as f:
            f.write('%d %.3f\n' % (w, now - t0))
        last = now
    d = t0 + w / rate - now
    if d > 0:
        time.sleep(d)
EOF
rm -f /tmp/bench-dirty.rate
nohup python3 /tmp/bench-dirty.py >/dev/null 2>&1 & echo $!`

// lcRowDefs are the table's rows in print order: key, operation, the issue's
// "now" and its target p50 in ms (0: no target of its own).
var lcRowDefs = []struct {
	key, op, now, target string
	targetMs             float64
}{
	{"cold_boot", "cold boot: first create, empty template dir, to first exec", "-", "(ratio base)", 0},
	{"wake", "exec on a suspended VM (wake to first output)", "2.5 s (bench p50 1.36 s)", "<= 0.4 s", 400},
	{"create_from_snapshot", "create --from SNAPSHOT to first exec", "2.3 s", "<= 0.5 s", 500},
	{"fork2", "fork --count 2, children answering exec", "4.4 s", "<= 1.0 s", 1000},
	{"fork1", "fork --count 1, child answering exec", "-", "(N=1 base)", 0},
	{"fork8", "fork --count 8, children answering exec", "-", "<= 2x N=1", 0},
	{"suspend", "suspend", "2.3 s (bench p50 0.26 s)", "<= 1 s", 1000},
	{"grow", "memory resize, live grow to 2x, until guest MemTotal shows it", "next start only", "<= 1 s", 1000},
	{"create_no_pool", "create from the template without the warm pool, to first exec", "0.86 s", "<= 0.4 s", 400},
	{"create_pool", "create from the warm pool, to first exec", "65 ms", "<= 50 ms", 50},
	{"fork_pause_idle", "fork parent pause (server parent_pause_ms), parent idle", "13-27 ms idle", "-", 0},
	{"fork_pause_dirty", "fork parent pause, parent dirtying 50 MiB/s", "unmeasured", "<= 10 ms", 10},
}

// LCRow is one operation on one VM size.
type LCRow struct {
	Key          string  `json:"key"`
	Op           string  `json:"operation"`
	MemoryMiB    int64   `json:"memory_mib"`
	Stats        Stats   `json:"stats"`
	OverColdBoot float64 `json:"p50_over_cold_boot,omitempty"`
	IssueNow     string  `json:"issue_now"`
	Target       string  `json:"target_p50"`
	Meets        *bool   `json:"meets_target,omitempty"` // nil: no target, or not measured
	Detail       string  `json:"detail,omitempty"`
	Error        string  `json:"error,omitempty"`
}

// LCTable is the -lifecycle table.
type LCTable struct {
	Client    string   `json:"client"`
	Runs      int      `json:"runs_per_row"`
	Memories  []int64  `json:"memories_mib"`
	StateNote string   `json:"state_format"`
	Rows      []*LCRow `json:"rows"`
}

func (t *LCTable) row(key string, mem int64) *LCRow {
	for _, r := range t.Rows {
		if r.Key == key && r.MemoryMiB == mem {
			return r
		}
	}
	return nil
}

// set records samples (and the error that cut them short, if any) in a row.
func (t *LCTable) set(key string, mem int64, samples []float64, err error) {
	r := t.row(key, mem)
	r.Stats = summarize(samples)
	if err != nil {
		r.Error = err.Error()
		logf("%s, %d MiB: %v (continuing)", key, mem, err)
	} else {
		logf("%s, %d MiB: p50 %.1f ms (n=%d)", key, mem, r.Stats.P50, r.Stats.N)
	}
}

func parseMemories(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n < 256 || n > 64<<10 {
			return nil, fmt.Errorf("-lc-memories: %q is not a VM size in MiB (256..65536)", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// runLifecycleTable measures every row for every size; a failing row is
// recorded in the row and the joined error, and the others still run.
func (b *bench) runLifecycleTable(ctx context.Context, lc *LifecycleReport) error {
	mems, err := parseMemories(lcMemories)
	if err != nil {
		return err
	}
	if lcRuns < 1 {
		return errors.New("-lc-runs must be at least 1")
	}
	t := &LCTable{Client: "Go client (pkg/client), wall time around the SDK calls", Runs: lcRuns, Memories: mems,
		StateNote: "server default --state-format (auto)"}
	lc.Table = t
	for _, d := range lcRowDefs {
		for _, mem := range mems {
			t.Rows = append(t.Rows, &LCRow{Key: d.key, Op: d.op, MemoryMiB: mem, IssueNow: d.now, Target: d.target})
		}
	}
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	note(b.lcColdBoots(ctx, t))
	for _, mem := range mems {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		note(b.lcMainRows(ctx, t, mem))
	}
	if ctx.Err() == nil {
		note(b.lcPoolRows(ctx, t))
	}
	t.judge()
	return errors.Join(errs...)
}

// subServer starts another server of this run's binary under b.tmp/name:
// on the cached templates unless freshTemplates, with a warm pool of pool.
func (b *bench) subServer(ctx context.Context, name string, freshTemplates bool, pool int) (*bench, error) {
	dir := filepath.Join(b.tmp, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	var srv *server
	var err error
	if pool > 0 && !freshTemplates {
		srv, err = b.startPoolServer(ctx, name)
	} else {
		srv, err = startServer(ctx, b.srv.bin, dir, !freshTemplates, pool)
	}
	if err != nil {
		return nil, err
	}
	return &bench{o: b.o, srv: srv, c: srv.client, r: b.r, tmp: dir, vms: map[string]int{}}, nil
}

// close deletes a sub-server's VMs and snapshots and stops it.
func (b *bench) close() {
	b.cleanup()
	b.deleteSnapshots()
	if err := b.srv.stop(); err != nil {
		logf("stopping the server in %s: %v", b.tmp, err)
	}
	b.srv.removeRunDir()
}

// lcColdBoots: on a server with an empty template dir, the first create of
// each size cold-boots its template; timed to the first exec.
func (b *bench) lcColdBoots(ctx context.Context, t *LCTable) error {
	sub, err := b.subServer(ctx, "coldboot", true, 0)
	if err != nil {
		return fmt.Errorf("cold boot server: %w", err)
	}
	defer func() {
		sub.close()
		os.RemoveAll(sub.tmp) // its templates: a saved state per size
	}()
	var errs []error
	for _, mem := range t.Memories {
		logf("cold boot of the %d MiB template (empty template dir)", mem)
		v, _, toExec, _, err := sub.createToExec(ctx, api.CreateVMRequest{Memory: api.Size(mem << 20)})
		if err != nil {
			err = fmt.Errorf("cold boot %d MiB: %w", mem, err)
			errs = append(errs, err)
			t.set("cold_boot", mem, nil, err)
			continue
		}
		t.set("cold_boot", mem, []float64{msf(toExec)}, nil)
		t.row("cold_boot", mem).Detail = fmt.Sprintf("server create_ms %d", v.CreateMs)
		if err := sub.remove(v.ID); err != nil {
			logf("%v", err)
		}
	}
	return errors.Join(errs...)
}

// lcCreates times runs creates of req to their first exec, each VM deleted
// (untimed) before the next.
func (b *bench) lcCreates(ctx context.Context, req api.CreateVMRequest, before func() error) ([]float64, error) {
	var out []float64
	for i := 0; i < lcRuns; i++ {
		if before != nil {
			if err := before(); err != nil {
				return out, err
			}
		}
		v, _, toExec, _, err := b.createToExec(ctx, req)
		if v != nil {
			b.remove(v.ID)
		}
		if err != nil {
			return out, err
		}
		out = append(out, msf(toExec))
	}
	return out, nil
}

// lcMainRows measures the rows that run on the main server (no warm pool)
// for VMs of mem MiB.
func (b *bench) lcMainRows(ctx context.Context, t *LCTable, mem int64) error {
	req := api.CreateVMRequest{Memory: api.Size(mem << 20)}
	logf("%d MiB: warm-up create (builds the cached template if missing; not measured)", mem)
	v, _, _, _, err := b.createToExec(ctx, req)
	if err != nil {
		return fmt.Errorf("%d MiB warm-up create: %w", mem, err)
	}
	b.remove(v.ID)
	var errs []error
	rowErr := func(key string, samples []float64, err error) {
		t.set(key, mem, samples, err)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s, %d MiB: %w", key, mem, err))
		}
	}

	logf("%d MiB: creates without a warm pool", mem)
	runs, err := b.lcCreates(ctx, req, nil)
	rowErr("create_no_pool", runs, err)

	logf("%d MiB: live grow to %d MiB", mem, 2*mem)
	runs, err = b.lcGrows(ctx, req, mem)
	rowErr("grow", runs, err)

	if err := b.lcOneVM(ctx, t, mem, rowErr); err != nil {
		errs = append(errs, fmt.Errorf("%d MiB: %w", mem, err))
	}
	return errors.Join(errs...)
}

// lcGrows: runs fresh VMs grown live from mem to twice mem, each until the
// guest's MemTotal shows it.
func (b *bench) lcGrows(ctx context.Context, req api.CreateVMRequest, mem int64) ([]float64, error) {
	var out []float64
	for i := 0; i < lcRuns; i++ {
		v, _, _, _, err := b.createToExec(ctx, req)
		if err != nil {
			return out, err
		}
		before, err := b.guestMemTotal(ctx, v.ID)
		if err == nil {
			var total time.Duration
			_, total, _, err = b.liveGrow(ctx, v.ID, before, mem, 2*mem)
			if err == nil {
				out = append(out, msf(total))
			}
		}
		b.remove(v.ID)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// lcOneVM measures, on one VM holding 200 MiB of resident memory: suspend and
// wake, create --from a snapshot of it, forks of 2, 1 and (at most 1 GiB) 8
// children, then forks of 1 while a process in it dirties 50 MiB/s.
func (b *bench) lcOneVM(ctx context.Context, t *LCTable, mem int64, rowErr func(string, []float64, error)) error {
	v, _, _, _, err := b.createToExec(ctx, api.CreateVMRequest{Memory: api.Size(mem << 20)})
	if err != nil {
		return fmt.Errorf("create the VM: %w", err)
	}
	vm := v.ID
	defer b.remove(vm)
	if err := b.holdMemory(ctx, vm); err != nil {
		return err
	}
	logf("%d MiB: suspend and wake", mem)
	sus, wake, err := b.suspendWake(ctx, vm, lcRuns)
	rowErr("suspend", sus, err)
	rowErr("wake", wake, err)
	if err != nil {
		if _, err := b.firstExec(ctx, vm); err != nil {
			return fmt.Errorf("VM unusable after suspend/wake: %w", err)
		}
	}
	logf("%d MiB: create --from a snapshot", mem)
	runs, err := b.createFromSnapshot(ctx, vm, lcRuns)
	rowErr("create_from_snapshot", runs, err)

	forks := func(n, runs int) (ready, pause []float64, err error) {
		for i := 0; i < runs; i++ {
			fr := ForkRun{Count: n}
			if err := b.forkOnce(ctx, vm, &fr); err != nil {
				return ready, pause, err
			}
			ready, pause = append(ready, fr.AllExecMs), append(pause, float64(fr.ParentPauseMs))
		}
		return ready, pause, nil
	}
	logf("%d MiB: forks of 2, 1 and 8 children", mem)
	ready, _, err := forks(2, lcRuns)
	rowErr("fork2", ready, err)
	ready, pause, err := forks(1, lcRuns)
	rowErr("fork1", ready, err)
	rowErr("fork_pause_idle", pause, err)
	if mem <= 1024 {
		ready, _, err = forks(8, 1)
		rowErr("fork8", ready, err)
	} else {
		t.row("fork8", mem).Detail = "not run above 1 GiB (8 children of a 4 GiB VM overcommit this host)"
	}

	logf("%d MiB: forks of 1 while the parent dirties %d MiB/s", mem, lcDirtyMiBs)
	pause, rate, err := b.lcDirtyForks(ctx, vm, func() ([]float64, error) {
		_, p, err := forks(1, lcRuns)
		return p, err
	})
	rowErr("fork_pause_dirty", pause, err)
	if rate > 0 {
		t.row("fork_pause_dirty", mem).Detail = fmt.Sprintf("dirtier measured %.1f MiB/s in the parent during the forks", rate)
	}
	return nil
}

// dirtyRate reads the dirtier's progress file: bytes written and seconds.
func (b *bench) dirtyRate(ctx context.Context, vm string) (float64, float64, error) {
	res, err := b.c.Exec(ctx, vm, api.ExecRequest{Cmd: []string{"cat", "/tmp/bench-dirty.rate"}})
	if err != nil {
		return 0, 0, err
	}
	var w, s float64
	if _, err := fmt.Sscan(res.Stdout, &w, &s); err != nil || res.ExitCode != 0 {
		return 0, 0, fmt.Errorf("dirtier progress %q (exit %d): %v", res.Stdout, res.ExitCode, err)
	}
	return w, s, nil
}

// lcDirtyForks starts the dirtier in vm, runs measure while it runs and
// stops it; it returns measure's results and the rate (MiB/s) the dirtier
// reached over the measurement, from its own progress file.
func (b *bench) lcDirtyForks(ctx context.Context, vm string, measure func() ([]float64, error)) ([]float64, float64, error) {
	res, err := b.c.Exec(ctx, vm, api.ExecRequest{Shell: dirtyCmd, Timeout: api.Duration(time.Minute)})
	if err != nil {
		return nil, 0, fmt.Errorf("start the dirtier: %w", err)
	}
	pid, perr := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if res.ExitCode != 0 || perr != nil {
		return nil, 0, fmt.Errorf("start the dirtier: exit %d, out %q, err %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	defer func() {
		kctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b.c.Exec(kctx, vm, api.ExecRequest{Cmd: []string{"kill", strconv.Itoa(pid)}})
	}()
	// Wait until it has written for 2 s (its bytearray allocated, the pace settled).
	var w0, s0 float64
	for deadline := time.Now().Add(time.Minute); ; {
		w0, s0, err = b.dirtyRate(ctx, vm)
		if err == nil && s0 >= 2 {
			break
		}
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("dirtier not running after 1 min: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	out, err := measure()
	w1, s1, rerr := b.dirtyRate(ctx, vm)
	var rate float64
	if rerr == nil && s1 > s0 {
		rate = (w1 - w0) / (s1 - s0) / (1 << 20)
	}
	if err == nil && rate < lcDirtyMiBs*0.8 {
		err = fmt.Errorf("the dirtier reached %.1f MiB/s, not %d (progress: %v)", rate, lcDirtyMiBs, rerr)
	}
	return out, rate, err
}

// lcPoolRows: a server with --warm-pool 1 on the cached templates; per size,
// a first create (a miss that starts the refill), then runs creates each
// made once the pool holds a VM of the shape.
func (b *bench) lcPoolRows(ctx context.Context, t *LCTable) error {
	sub, err := b.subServer(ctx, "pool", false, 1)
	if err != nil {
		return fmt.Errorf("warm pool server: %w", err)
	}
	defer sub.close()
	var errs []error
	for _, mem := range t.Memories {
		logf("%d MiB: creates from the warm pool", mem)
		req := api.CreateVMRequest{Memory: api.Size(mem << 20)}
		v, _, _, _, err := sub.createToExec(ctx, req)
		if err == nil {
			sub.remove(v.ID)
			runs, perr := sub.lcCreates(ctx, req, func() error {
				return waitPool(ctx, sub.c.Health, fmt.Sprintf("1x%d", mem))
			})
			t.set("create_pool", mem, runs, perr)
			err = perr
		} else {
			t.set("create_pool", mem, nil, err)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("create_pool, %d MiB: %w", mem, err))
		}
	}
	return errors.Join(errs...)
}

// judge fills the ratios to the cold boot and the target verdicts.
func (t *LCTable) judge() {
	yes := func(ok bool) *bool { return &ok }
	for _, d := range lcRowDefs {
		for _, mem := range t.Memories {
			r := t.row(d.key, mem)
			if r.Stats.N == 0 {
				continue
			}
			if cb := t.row("cold_boot", mem); cb.Stats.N > 0 {
				r.OverColdBoot = math.Round(r.Stats.P50/cb.Stats.P50*1e5) / 1e5
			}
			switch {
			case d.targetMs > 0:
				r.Meets = yes(r.Stats.P50 <= d.targetMs)
			case d.key == "fork8":
				if f1 := t.row("fork1", mem); f1.Stats.N > 0 {
					r.Meets = yes(r.Stats.P50 <= 2*f1.Stats.P50)
					r.Detail = fmt.Sprintf("N=8 / N=1 = %.2fx", ratio(r.Stats.P50, f1.Stats.P50))
				}
			}
		}
	}
}
