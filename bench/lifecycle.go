package main

// The lifecycle benchmark (go run ./bench -lifecycle): the table of issue 15
// (lifecycle_table.go) and, with -lc-detail, pause/resume, suspend and
// wake-to-first-exec, snapshot interruption, live fork and vCPU hot-add, all
// on one VM of -lc-memory MiB (default 1 GiB).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
	"github.com/agentvm/agentvm/pkg/client"
)

const (
	lcPauseCycles = 10
	lcSuspends    = 3
	lcSnapshots   = 3
	lcHoldMiB     = 200
)

var lcForkCounts = []int{1, 4, 8}

// lcMemoryMiB is the VM memory (-lc-memory, default 1024 MiB); disk: server default.
var lcMemoryMiB int64 = 1024

// holdCmd starts a background python3 that keeps ~200 MiB resident (every page touched).
const holdCmd = `nohup python3 -c 'import time; b=bytearray(200<<20); [b.__setitem__(i,1) for i in range(0,len(b),4096)]; time.sleep(10**9)' >/dev/null 2>&1 & echo $!`

// runLifecycle runs the lifecycle table, then with -lc-detail the phases.
// Snapshots it made are deleted on every exit path here; VMs are deleted by
// b.cleanup in run.
func (b *bench) runLifecycle(ctx context.Context) (err error) {
	lc := &LifecycleReport{}
	b.r.Lifecycle = lc
	h, err := b.c.Health(ctx)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	b.r.Host.Accel = h.Accel
	b.r.Host.ServerVersion = h.Version
	if q := os.Getenv("AGENTVM_QEMU"); q != "" { // the servers run this QEMU
		b.r.Host.QEMUVersion = qemuVersionOf(q) + " (AGENTVM_QEMU=" + q + ")"
	}

	defer b.deleteSnapshots()

	tableErr := b.runLifecycleTable(ctx, lc)
	if !lcDetail || ctx.Err() != nil {
		return tableErr
	}
	if tableErr != nil {
		defer func() { err = errors.Join(fmt.Errorf("table: %w", tableErr), err) }()
	}

	logf("creating the %d MiB VM (the first create of this shape cold-boots its template once, ~30 s; not measured)", lcMemoryMiB)
	t0 := time.Now()
	v, err := b.c.CreateVM(ctx, api.CreateVMRequest{Memory: api.Size(lcMemoryMiB << 20)})
	if err != nil {
		return fmt.Errorf("create %d MiB VM: %w", lcMemoryMiB, err)
	}
	b.track(v.ID, v.PID)
	if _, err := b.firstExec(ctx, v.ID); err != nil {
		return fmt.Errorf("first exec in %s: %w", v.ID, err)
	}
	lc.VMCreateToExecMs = ms(time.Since(t0))
	lc.VMCreateServerMs = v.CreateMs
	lc.VMMemoryMiB = v.MemoryMiB
	lc.VMDiskBytes = v.DiskBytes
	lc.VMTemplate = v.Template
	logf("VM %s ready (%d MiB, create_ms %d, create->exec %d ms)", v.ID, v.MemoryMiB, v.CreateMs, lc.VMCreateToExecMs)
	vm := v.ID
	if v.CreateMs > 10000 {
		b.r.Notes = append(b.r.Notes, fmt.Sprintf("No template of this shape was cached: this run's setup create cold-booted it (create_ms %d; not measured).", v.CreateMs))
	}

	phases := []struct {
		name string
		f    func(context.Context, string, *LifecycleReport) error
	}{
		{"pause/resume", b.lcPauseResume},
		{"suspend/wake", b.lcSuspend},
		{"snapshot", b.lcSnapshot},
		{"fork", b.lcFork},
		{"resize", b.lcResize},
	}
	var errs []error
	for _, p := range phases {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		logf("lifecycle phase: %s", p.name)
		if perr := p.f(ctx, vm, lc); perr != nil {
			perr = fmt.Errorf("%s: %w", p.name, perr)
			logf("phase failed (continuing): %v", perr)
			errs = append(errs, perr) // run() records the joined error in the report
			// Make sure the VM is usable for the next phase (wakes it if needed).
			if _, werr := b.firstExec(ctx, vm); werr != nil {
				return errors.Join(append(errs, fmt.Errorf("VM %s unusable after %s: %w", vm, p.name, werr))...)
			}
		}
	}
	return errors.Join(errs...)
}

// execTrue runs `true` once and fails on a non-zero exit.
func (b *bench) execTrue(ctx context.Context, id string) error {
	res, err := b.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("true exited %d (stderr %q)", res.ExitCode, res.Stderr)
	}
	return err
}

func opOf(v *api.VM) api.OpStats {
	if v == nil || v.Op == nil {
		return api.OpStats{}
	}
	return *v.Op
}

// lcPauseResume: N cycles of PauseVM/ResumeVM on the running VM (one warm-up cycle).
func (b *bench) lcPauseResume(ctx context.Context, vm string, lc *LifecycleReport) error {
	var pw, ps, rw, rs []float64
	for i := -1; i < lcPauseCycles; i++ {
		t0 := time.Now()
		p, err := b.c.PauseVM(ctx, vm)
		pd := time.Since(t0)
		if err != nil {
			return fmt.Errorf("pause %d: %w", i+1, err)
		}
		if p.State != api.StatePaused {
			return fmt.Errorf("pause %d: state %q after pause", i+1, p.State)
		}
		t1 := time.Now()
		r, err := b.c.ResumeVM(ctx, vm)
		rd := time.Since(t1)
		if err != nil {
			return fmt.Errorf("resume %d: %w", i+1, err)
		}
		if r.State != api.StateRunning {
			return fmt.Errorf("resume %d: state %q after resume", i+1, r.State)
		}
		if i < 0 {
			continue // warm-up
		}
		pw, rw = append(pw, msf(pd)), append(rw, msf(rd))
		ps, rs = append(ps, float64(opOf(p).TookMs)), append(rs, float64(opOf(r).TookMs))
	}
	lc.PauseWall, lc.PauseServer = summarize(pw), summarize(ps)
	lc.ResumeWall, lc.ResumeServer = summarize(rw), summarize(rs)
	t0 := time.Now()
	if err := b.execTrue(ctx, vm); err != nil {
		return fmt.Errorf("exec after the last resume: %w", err)
	}
	lc.ExecAfterResumeMs = msf(time.Since(t0))
	logf("pause wall p50 %.1f ms (server %.0f), resume wall p50 %.1f ms (server %.0f)",
		lc.PauseWall.P50, lc.PauseServer.P50, lc.ResumeWall.P50, lc.ResumeServer.P50)
	return nil
}

// rssMiB returns the VmRSS of pid inside the VM in MiB.
func (b *bench) rssMiB(ctx context.Context, vm string, pid int) (int64, error) {
	res, err := b.c.Exec(ctx, vm, api.ExecRequest{Shell: fmt.Sprintf("awk '/^VmRSS:/{print $2}' /proc/%d/status", pid)})
	if err != nil {
		return 0, err
	}
	kb, err := strconv.ParseInt(strings.TrimSpace(res.Stdout), 10, 64)
	if err != nil || res.ExitCode != 0 {
		return 0, fmt.Errorf("no VmRSS for pid %d (exit %d, out %q, err %q)", pid, res.ExitCode, res.Stdout, res.Stderr)
	}
	return kb >> 10, nil
}

// lcSuspend: make ~200 MiB of guest memory resident, then N x (suspend, exec `true`
// which wakes the VM).
func (b *bench) lcSuspend(ctx context.Context, vm string, lc *LifecycleReport) error {
	res, err := b.c.Exec(ctx, vm, api.ExecRequest{Shell: holdCmd, Timeout: api.Duration(time.Minute)})
	if err != nil {
		return fmt.Errorf("start the memory holder: %w", err)
	}
	pid, perr := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if res.ExitCode != 0 || perr != nil {
		return fmt.Errorf("start the memory holder: exit %d, out %q, err %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	t0 := time.Now()
	for {
		rss, err := b.rssMiB(ctx, vm, pid)
		if err != nil {
			return fmt.Errorf("memory holder: %w", err)
		}
		lc.HolderRSSMiB = rss
		if rss >= lcHoldMiB-8 {
			break
		}
		if time.Since(t0) > 3*time.Minute {
			return fmt.Errorf("memory holder pid %d reached only %d MiB RSS in 3 min", pid, rss)
		}
		time.Sleep(500 * time.Millisecond)
	}
	logf("memory holder pid %d resident: %d MiB after %.1f s", pid, lc.HolderRSSMiB, time.Since(t0).Seconds())

	var sw, ss, sp, wake []float64
	for i := 0; i < lcSuspends; i++ {
		t0 := time.Now()
		v, err := b.c.SuspendVM(ctx, vm)
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("suspend %d: %w", i+1, err)
		}
		if v.State != api.StateSuspended {
			return fmt.Errorf("suspend %d: state %q", i+1, v.State)
		}
		op := opOf(v)
		sw, ss, sp = append(sw, msf(d)), append(ss, float64(op.TookMs)), append(sp, float64(op.PausedMs))
		lc.SuspendBytes = append(lc.SuspendBytes, op.Bytes)
		time.Sleep(time.Second) // let the host settle: the wake is what is measured
		t1 := time.Now()
		err = b.execTrue(ctx, vm)
		wd := time.Since(t1)
		if err != nil {
			return fmt.Errorf("exec waking from suspend %d: %w", i+1, err)
		}
		wake = append(wake, msf(wd))
		logf("suspend %d/%d: wall %.0f ms (server %d ms), %d MiB state; wake to first exec %.0f ms",
			i+1, lcSuspends, msf(d), op.TookMs, op.Bytes>>20, msf(wd))
	}
	lc.SuspendWall, lc.SuspendServer, lc.SuspendPaused = summarize(sw), summarize(ss), summarize(sp)
	lc.WakeToExec = summarize(wake)
	// The holder survived three suspend/wake cycles with its memory.
	if rss, err := b.rssMiB(ctx, vm, pid); err != nil {
		return fmt.Errorf("memory holder after the wakes: %w", err)
	} else {
		lc.HolderRSSAfterMiB = rss
	}
	return nil
}

func randSuffix() string {
	var r [3]byte
	rand.Read(r[:])
	return hex.EncodeToString(r[:])
}

// lcSnapshot: N snapshots of the running VM; deleted right after (untimed).
func (b *bench) lcSnapshot(ctx context.Context, vm string, lc *LifecycleReport) error {
	var wall, paused []float64
	prefix := "bench-lc-" + randSuffix()
	for i := 0; i < lcSnapshots; i++ {
		t0 := time.Now()
		sn, err := b.c.Snapshot(ctx, vm, fmt.Sprintf("%s-%d", prefix, i+1))
		d := time.Since(t0)
		if err != nil {
			return fmt.Errorf("snapshot %d: %w", i+1, err)
		}
		b.trackSnap(sn.ID)
		wall, paused = append(wall, msf(d)), append(paused, float64(sn.PausedMs))
		lc.SnapshotBytes = append(lc.SnapshotBytes, sn.Bytes)
		logf("snapshot %d/%d: wall %.0f ms, guest paused %d ms, %d MiB state", i+1, lcSnapshots, msf(d), sn.PausedMs, sn.Bytes>>20)
		if err := b.execTrue(ctx, vm); err != nil {
			return fmt.Errorf("exec after snapshot %d: %w", i+1, err)
		}
	}
	lc.SnapshotWall, lc.SnapshotPaused = summarize(wall), summarize(paused)
	b.deleteSnapshots()
	return nil
}

func (b *bench) trackSnap(id string) {
	b.mu.Lock()
	b.snaps = append(b.snaps, id)
	b.mu.Unlock()
}

// deleteSnapshots deletes the snapshots this run made (and any other on this
// private server, whose data dir is fresh).
func (b *bench) deleteSnapshots() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b.mu.Lock()
	ids := append([]string(nil), b.snaps...)
	b.snaps = nil
	b.mu.Unlock()
	if list, err := b.c.ListSnapshots(ctx); err == nil {
		for _, s := range list {
			ids = append(ids, s.ID)
		}
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		if err := b.c.DeleteSnapshot(ctx, id); err != nil && !client.IsNotFound(err) {
			logf("delete snapshot %s: %v", id, err)
			b.mu.Lock()
			b.snaps = append(b.snaps, id) // retried by the final cleanup
			b.mu.Unlock()
		}
	}
}

func memAvailMiB() int64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb >> 10
		}
	}
	return -1
}

// lcFork: for each N, fork the running VM into N children, time the fork call and
// until every child answers an exec of `true`; delete the children before the next N.
func (b *bench) lcFork(ctx context.Context, vm string, lc *LifecycleReport) error {
	var ferrs []error
	for _, n := range lcForkCounts {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fr := ForkRun{Count: n, HostMemAvailMiB: memAvailMiB()}
		need := int64(n) * lcMemoryMiB
		if fr.HostMemAvailMiB >= 0 && fr.HostMemAvailMiB < need+128 {
			logf("fork x%d: host MemAvailable %d MiB < %d MiB needed; the server should answer 507", n, fr.HostMemAvailMiB, need+128)
		}
		err := b.forkOnce(ctx, vm, &fr)
		lc.Forks = append(lc.Forks, fr)
		if err != nil {
			var ae *client.APIError
			if errors.As(err, &ae) && ae.Status == http.StatusInsufficientStorage {
				logf("fork x%d: server answered 507: %v (reported, not a failure)", n, err)
				continue
			}
			ferrs = append(ferrs, fmt.Errorf("fork x%d: %w", n, err)) // try the next N anyway
			continue
		}
		logf("fork x%d: parent paused %d ms, %d MiB state, fork returned %.0f ms (server %d ms), all children exec'd %.0f ms",
			n, fr.ParentPauseMs, fr.StateBytes>>20, fr.ReturnedMs, fr.ServerTookMs, fr.AllExecMs)
		if err := b.execTrue(ctx, vm); err != nil {
			return errors.Join(append(ferrs, fmt.Errorf("parent exec after fork x%d: %w", n, err))...)
		}
	}
	return errors.Join(ferrs...)
}

func (b *bench) forkOnce(ctx context.Context, vm string, fr *ForkRun) error {
	var children []string
	defer func() {
		// Delete the children (untimed, in parallel) before the next N.
		var wg sync.WaitGroup
		for _, id := range children {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := b.remove(id); err != nil {
					logf("fork cleanup: %v", err)
				}
			}()
		}
		wg.Wait()
	}()
	fctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	res, err := b.c.Fork(fctx, vm, fr.Count)
	returned := time.Since(t0)
	if err != nil {
		fr.Error = err.Error()
		// A failed fork may still have left children behind: list and track them.
		if vms, lerr := b.c.ListVMs(context.Background()); lerr == nil {
			for _, v := range vms {
				if v.ID != vm {
					b.track(v.ID, v.PID)
					children = append(children, v.ID)
				}
			}
		}
		return err
	}
	for _, c := range res.Children {
		b.track(c.ID, c.PID)
		children = append(children, c.ID)
	}
	fr.ReturnedMs = msf(returned)
	fr.ParentPauseMs, fr.StateBytes, fr.ServerTookMs = res.ParentPauseMs, res.StateBytes, res.TookMs
	fr.Children = len(res.Children)
	if len(res.Children) != fr.Count {
		return fmt.Errorf("asked for %d children, got %d", fr.Count, len(res.Children))
	}
	var wg sync.WaitGroup
	errs := make([]error, len(children))
	retries := make([]int, len(children))
	var mu sync.Mutex
	var per []float64
	for i, id := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			retries[i], errs[i] = b.firstExec(fctx, id)
			mu.Lock()
			per = append(per, msf(time.Since(t0)))
			mu.Unlock()
		}()
	}
	wg.Wait()
	fr.AllExecMs = msf(time.Since(t0))
	fr.ChildExec = summarize(per)
	for _, r := range retries {
		fr.ExecRetries += r
	}
	if err := errors.Join(errs...); err != nil {
		fr.Error = err.Error()
		return err
	}
	return nil
}

// lcResize hot-adds vCPUs to the running VM (1 -> 2 -> 4), each call until
// the guest sees them online, against the way without hotplug: stop, start
// with the new count, first exec.
func (b *bench) lcResize(ctx context.Context, vm string, lc *LifecycleReport) error {
	nproc := func() (string, error) {
		res, err := b.c.Exec(ctx, vm, api.ExecRequest{Cmd: []string{"nproc"}})
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(res.Stdout), nil
	}
	for _, n := range []int{2, 4} {
		t0 := time.Now()
		v, err := b.c.ResizeVM(ctx, vm, api.ResizeRequest{CPUs: n})
		if err != nil {
			return fmt.Errorf("hot-add to %d vCPUs: %w", n, err)
		}
		d := ms(time.Since(t0))
		if got, err := nproc(); err != nil || got != strconv.Itoa(n) || v.CPUs != n {
			return fmt.Errorf("after hot-adding to %d vCPUs: nproc %q, cpus %d, %v", n, got, v.CPUs, err)
		}
		lc.HotAdd = append(lc.HotAdd, HotAddRun{To: n, WallMs: d})
		logf("hot-add to %d vCPUs: %d ms", n, d)
	}
	logf("baseline: stop, start with 8 vCPUs, first exec")
	t0 := time.Now()
	if _, err := b.c.StopVM(ctx, vm); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if _, err := b.c.ResizeVM(ctx, vm, api.ResizeRequest{CPUs: 8}); err != nil {
		return fmt.Errorf("resize a stopped VM: %w", err)
	}
	if _, err := b.c.StartVM(ctx, vm); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	if _, err := b.firstExec(ctx, vm); err != nil {
		return err
	}
	lc.RestartResizeMs = ms(time.Since(t0))
	if got, err := nproc(); err != nil || got != "8" {
		return fmt.Errorf("after a restart with 8 vCPUs: nproc %q, %v", got, err)
	}
	logf("stop + start with 8 vCPUs + first exec: %d ms", lc.RestartResizeMs)
	return nil
}
