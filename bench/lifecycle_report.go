package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// LifecycleReport holds the results of `go run ./bench -lifecycle`.
type LifecycleReport struct {
	VMMemoryMiB      int64  `json:"vm_memory_mib"`
	VMDiskBytes      int64  `json:"vm_disk_bytes"`
	VMTemplate       string `json:"vm_template"`
	VMCreateServerMs int64  `json:"vm_create_server_ms"` // includes a template cold boot if this shape had none
	VMCreateToExecMs int64  `json:"vm_create_to_first_exec_ms"`

	PauseWall         Stats   `json:"pause_wall"`
	PauseServer       Stats   `json:"pause_server_took_ms"`
	ResumeWall        Stats   `json:"resume_wall"`
	ResumeServer      Stats   `json:"resume_server_took_ms"`
	ExecAfterResumeMs float64 `json:"exec_after_resume_ms"`

	HolderRSSMiB      int64   `json:"holder_rss_mib"`
	HolderRSSAfterMiB int64   `json:"holder_rss_after_wakes_mib"`
	SuspendWall       Stats   `json:"suspend_wall"`
	SuspendServer     Stats   `json:"suspend_server_took_ms"`
	SuspendPaused     Stats   `json:"suspend_server_paused_ms"`
	SuspendBytes      []int64 `json:"suspend_state_bytes"`
	WakeToExec        Stats   `json:"wake_to_first_exec"`

	SnapshotWall   Stats   `json:"snapshot_wall"`
	SnapshotPaused Stats   `json:"snapshot_paused_ms"`
	SnapshotBytes  []int64 `json:"snapshot_state_bytes"`

	Forks []ForkRun `json:"forks"`

	HotAdd          []HotAddRun `json:"hot_add"`
	RestartResizeMs int64       `json:"stop_start_resize_to_exec_ms"`

	Table *LCTable `json:"table,omitempty"` // the issue 15 table

	ResumeTargetMs  float64 `json:"target_resume_ms"`
	WakeTargetMs    float64 `json:"target_wake_to_exec_ms"`
	ForkPauseTarget float64 `json:"target_fork_parent_pause_ms"`
	Fork4Over1      float64 `json:"fork4_ready_over_fork1_ready,omitempty"`
	Fork8Over1      float64 `json:"fork8_ready_over_fork1_ready,omitempty"`
	Fork4Over1Ret   float64 `json:"fork4_returned_over_fork1_returned,omitempty"`
	Fork8Over1Ret   float64 `json:"fork8_returned_over_fork1_returned,omitempty"`
}

// HotAddRun is one live vCPU hot-add, until the guest has them online.
type HotAddRun struct {
	To     int   `json:"to_cpus"`
	WallMs int64 `json:"wall_ms"`
}

// ForkRun is one live fork into Count children.
type ForkRun struct {
	Count           int     `json:"count"`
	HostMemAvailMiB int64   `json:"host_mem_available_mib_before"`
	ParentPauseMs   int64   `json:"parent_pause_ms"`
	StateBytes      int64   `json:"state_bytes"`
	ServerTookMs    int64   `json:"server_took_ms"`
	ReturnedMs      float64 `json:"fork_returned_ms"`
	AllExecMs       float64 `json:"all_children_exec_ms"` // from the fork call start
	ChildExec       Stats   `json:"child_exec_done_from_fork_start"`
	ExecRetries     int     `json:"exec_retries"`
	Children        int     `json:"children"`
	Error           string  `json:"error,omitempty"`
}

func (lc *LifecycleReport) forkBy(n int) *ForkRun {
	for i := range lc.Forks {
		if lc.Forks[i].Count == n && lc.Forks[i].Error == "" {
			return &lc.Forks[i]
		}
	}
	return nil
}

func (lc *LifecycleReport) computeRatios() {
	lc.ResumeTargetMs, lc.WakeTargetMs, lc.ForkPauseTarget = 50, 1000, 100
	f1, f4, f8 := lc.forkBy(1), lc.forkBy(4), lc.forkBy(8)
	if f1 != nil && f4 != nil {
		lc.Fork4Over1, lc.Fork4Over1Ret = ratio(f4.AllExecMs, f1.AllExecMs), ratio(f4.ReturnedMs, f1.ReturnedMs)
	}
	if f1 != nil && f8 != nil {
		lc.Fork8Over1, lc.Fork8Over1Ret = ratio(f8.AllExecMs, f1.AllExecMs), ratio(f8.ReturnedMs, f1.ReturnedMs)
	}
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func mibList(bs []int64) string {
	if len(bs) == 0 {
		return "n/a"
	}
	parts := make([]string, len(bs))
	for i, b := range bs {
		parts[i] = mib(b)
	}
	return strings.Join(parts, ", ")
}

func verdict(ok bool) string {
	if ok {
		return "MET"
	}
	return "MISSED"
}

// PrintLifecycle writes the human-readable lifecycle report.
func (r *Report) PrintLifecycle(w io.Writer) {
	lc := r.Lifecycle
	line := strings.Repeat("=", 78)
	fmt.Fprintln(w, line)
	fmt.Fprintln(w, "agentvm lifecycle benchmark  ", r.StartedAt.Format(time.RFC3339), " took", r.FinishedAt.Sub(r.StartedAt).Round(time.Second))
	fmt.Fprintln(w, line)
	fmt.Fprintf(w, "Host: accel=%s  qemu=%q  nproc=%d  loadavg at start=%s  server=%s\n",
		r.Host.Accel, r.Host.QEMUVersion, r.Host.NProc, r.Host.LoadAvgAtStart, r.Host.ServerVersion)
	if lc == nil {
		fmt.Fprintln(w, "(no lifecycle results)")
		r.printTail(w, line)
		return
	}
	if lc.Table != nil {
		printLCTable(w, lc.Table)
	}
	if lc.VMMemoryMiB == 0 { // the per-phase report did not run (-lc-detail)
		r.printTail(w, line)
		return
	}
	fmt.Fprintln(w, "Per-phase report (-lc-detail):")
	fmt.Fprintf(w, "VM: %d MiB, %.1f GiB disk (default), template %s\n", lc.VMMemoryMiB, float64(lc.VMDiskBytes)/(1<<30), lc.VMTemplate)
	fmt.Fprintf(w, "  setup create (not a result): server create_ms %d, create -> first exec %d ms\n\n", lc.VMCreateServerMs, lc.VMCreateToExecMs)

	fmt.Fprintf(w, "1. Pause / resume, %d cycles on the running VM (after 1 warm-up cycle)\n", lc.PauseWall.N)
	statsLine(w, "PauseVM (client wall)", lc.PauseWall)
	statsLine(w, "PauseVM (server op.took_ms)", lc.PauseServer)
	statsLine(w, "ResumeVM (client wall)", lc.ResumeWall)
	statsLine(w, "ResumeVM (server op.took_ms)", lc.ResumeServer)
	if lc.ResumeWall.N > 0 {
		fmt.Fprintf(w, "  target resume <= %.0f ms: wall p50 %.1f ms -> %s (server p50 %.0f ms)\n", lc.ResumeTargetMs,
			lc.ResumeWall.P50, verdict(lc.ResumeWall.P50 <= lc.ResumeTargetMs), lc.ResumeServer.P50)
		fmt.Fprintf(w, "  first exec after the last resume: %.1f ms\n", lc.ExecAfterResumeMs)
	}
	fmt.Fprintln(w)

	fmt.Fprintf(w, "2. Suspend (save to disk, QEMU exits) and wake by exec, %d cycles\n", lc.SuspendWall.N)
	fmt.Fprintf(w, "  guest memory: a python3 holding %d MiB resident (still %d MiB after the wakes)\n", lc.HolderRSSMiB, lc.HolderRSSAfterMiB)
	statsLine(w, "SuspendVM (client wall)", lc.SuspendWall)
	statsLine(w, "SuspendVM (server op.took_ms)", lc.SuspendServer)
	statsLine(w, "SuspendVM (server op.paused_ms)", lc.SuspendPaused)
	fmt.Fprintf(w, "  suspend state bytes: %s\n", mibList(lc.SuspendBytes))
	statsLine(w, "suspended -> exec `true` returned", lc.WakeToExec)
	if lc.WakeToExec.N > 0 {
		fmt.Fprintf(w, "  target wake to first exec <= %.0f ms: p50 %.1f ms -> %s\n", lc.WakeTargetMs, lc.WakeToExec.P50,
			verdict(lc.WakeToExec.P50 <= lc.WakeTargetMs))
		if lc.SuspendWall.P50 > 0 {
			fmt.Fprintf(w, "  wake p50 / suspend p50 = %.2f\n", lc.WakeToExec.P50/lc.SuspendWall.P50)
		}
	}
	fmt.Fprintln(w)

	fmt.Fprintf(w, "3. Snapshot of the running VM, %d snapshots (deleted after)\n", lc.SnapshotWall.N)
	statsLine(w, "Snapshot (client wall)", lc.SnapshotWall)
	statsLine(w, "Snapshot guest pause (paused_ms)", lc.SnapshotPaused)
	fmt.Fprintf(w, "  snapshot state bytes: %s\n", mibList(lc.SnapshotBytes))
	if lc.SnapshotWall.P50 > 0 {
		fmt.Fprintf(w, "  guest pause p50 / snapshot wall p50 = %.2f (share of the call the guest is frozen)\n",
			lc.SnapshotPaused.P50/lc.SnapshotWall.P50)
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "4. Live fork of the running VM (children deleted before the next N, untimed)")
	fmt.Fprintf(w, "  %-3s %10s %11s %12s %12s %14s %12s %9s\n", "N", "parent", "state", "fork call", "server", "all children", "mem avail", "retries")
	fmt.Fprintf(w, "  %-3s %10s %11s %12s %12s %14s %12s %9s\n", "", "pause ms", "bytes", "returned ms", "took ms", "exec'd ms", "before MiB", "")
	for _, f := range lc.Forks {
		if f.Error != "" {
			fmt.Fprintf(w, "  %-3d FAILED (host MemAvailable %d MiB before): %s\n", f.Count, f.HostMemAvailMiB, f.Error)
			continue
		}
		fmt.Fprintf(w, "  %-3d %10d %11s %12.0f %12d %14.0f %12d %9d\n", f.Count, f.ParentPauseMs, mib(f.StateBytes),
			f.ReturnedMs, f.ServerTookMs, f.AllExecMs, f.HostMemAvailMiB, f.ExecRetries)
	}
	for _, f := range lc.Forks {
		if f.Error == "" {
			fmt.Fprintf(w, "  target parent pause <= %.0f ms, N=%d: %d ms -> %s\n", lc.ForkPauseTarget, f.Count, f.ParentPauseMs,
				verdict(float64(f.ParentPauseMs) <= lc.ForkPauseTarget))
		}
	}
	ratioLine(w, "all children exec'd: N=4 / N=1", lc.Fork4Over1)
	ratioLine(w, "all children exec'd: N=8 / N=1", lc.Fork8Over1)
	ratioLine(w, "fork call returned:  N=4 / N=1", lc.Fork4Over1Ret)
	ratioLine(w, "fork call returned:  N=8 / N=1", lc.Fork8Over1Ret)
	if lc.Fork4Over1 > 0 {
		fmt.Fprintf(w, "  target N=4 ready <= 2x N=1: %.2fx -> %s\n", lc.Fork4Over1, verdict(lc.Fork4Over1 <= 2))
	}
	fmt.Fprintln(w)

	if len(lc.HotAdd) > 0 {
		fmt.Fprintln(w, "5. Resize the running VM's vCPUs (returns once the guest has them online)")
		for _, h := range lc.HotAdd {
			fmt.Fprintf(w, "  hot-add to %d vCPUs: %d ms\n", h.To, h.WallMs)
		}
		if lc.RestartResizeMs > 0 {
			last := lc.HotAdd[len(lc.HotAdd)-1].WallMs
			fmt.Fprintf(w, "  baseline without hotplug: stop + start with 8 vCPUs + first exec: %d ms (%.0fx the last hot-add)\n",
				lc.RestartResizeMs, float64(lc.RestartResizeMs)/float64(max(last, 1)))
		}
		fmt.Fprintln(w)
	}

	fmt.Fprintln(w, "Bytes moved per save:")
	fmt.Fprintf(w, "  suspend:  %s\n", mibList(lc.SuspendBytes))
	fmt.Fprintf(w, "  snapshot: %s\n", mibList(lc.SnapshotBytes))
	for _, f := range lc.Forks {
		if f.Error == "" {
			fmt.Fprintf(w, "  fork x%d:  %s (one state file shared by all children)\n", f.Count, mib(f.StateBytes))
		}
	}
	fmt.Fprintln(w)
	r.printTail(w, line)
}

// printLCTable prints the issue 15 table: per row and size p50, n, min,
// max, the ratio to the same run's cold boot, the figure and target.
func printLCTable(w io.Writer, t *LCTable) {
	fmt.Fprintf(w, "\nIssue 15 lifecycle table: %s; %s; ms; x cold = p50 / this run's cold boot of the same size\n", t.Client, t.StateNote)
	hdr := "  %-64s %4s %2s %8s %8s %8s %8s  %-24s %-11s %s\n"
	fmt.Fprintf(w, hdr, "operation", "mem", "n", "p50", "min", "max", "x cold", "issue's \"now\"", "target p50", "meets target")
	for _, d := range lcRowDefs {
		for i, mem := range t.Memories {
			r := t.row(d.key, mem)
			op := ""
			if i == 0 {
				op = d.op
			}
			size := fmt.Sprintf("%dG", mem>>10)
			if mem%1024 != 0 {
				size = fmt.Sprintf("%dM", mem)
			}
			if r.Stats.N == 0 {
				why := r.Error
				if why == "" {
					why = r.Detail
				}
				if why == "" {
					why = "not measured"
				}
				fmt.Fprintf(w, "  %-64s %4s  -  (%s)\n", op, size, why)
				continue
			}
			meets := "-"
			if r.Meets != nil {
				meets = map[bool]string{true: "yes", false: "no"}[*r.Meets]
			}
			xcold := "-"
			if r.OverColdBoot > 0 {
				xcold = fmt.Sprintf("%.4f", r.OverColdBoot)
			}
			fmt.Fprintf(w, "  %-64s %4s %2d %8.0f %8.0f %8.0f %8s  %-24s %-11s %s\n", op, size, r.Stats.N, r.Stats.P50, r.Stats.Min, r.Stats.Max,
				xcold, d.now, d.target, meets)
			if r.Error != "" {
				fmt.Fprintf(w, "  %-64s        error: %s\n", "", r.Error)
			}
			if r.Detail != "" {
				fmt.Fprintf(w, "  %-64s        %s\n", "", r.Detail)
			}
		}
	}
	for _, mem := range t.Memories {
		met, judged := 0, 0
		for _, r := range t.Rows {
			if r.MemoryMiB == mem && r.Meets != nil {
				judged++
				if *r.Meets {
					met++
				}
			}
		}
		fmt.Fprintf(w, "  targets met, %d MiB: %d of %d measured rows with a target\n", mem, met, judged)
	}
	fmt.Fprintln(w)
}

func (r *Report) printTail(w io.Writer, line string) {
	fmt.Fprintln(w, "Notes:")
	for _, n := range r.Notes {
		fmt.Fprintln(w, "  -", n)
	}
	if len(r.Errors) > 0 {
		fmt.Fprintln(w, "Errors:")
		for _, e := range r.Errors {
			fmt.Fprintln(w, "  -", e)
		}
	}
	fmt.Fprintln(w, line)
}

func lifecycleNotes() []string {
	notes := []string{
		"The table runs on three servers of this run's binary: the cold boots on one with an empty template dir (the first create of each size " +
			"cold-boots its template; the image is cached and not measured), the main one on the cached templates without a warm pool, " +
			"and one with --warm-pool 1 for the warm pool row (each of its creates is made once the pool holds a VM of the shape).",
		"Wall times are client-side around Go client (pkg/client) calls, not the CLI the issue timed; 'to first exec' ends when an exec of `true` returns.",
		"Suspend, wake, create --from and the forks run on one VM of each size with a python3 holding 200 MiB resident (as -restore); " +
			"live grow and the creates use fresh VMs. Children and VMs are deleted untimed.",
		"Live grow: each size to twice its size (1 -> 2 GiB, 4 -> 8 GiB), from the resize call until the guest's MemTotal shows all but 64 MiB of it.",
		fmt.Sprintf("Fork parent pause is the server's parent_pause_ms of fork --count 1: idle, then with a python3 in the parent rewriting a 64 MiB bytearray "+
			"at %d MiB/s (256 KiB slice writes, alternating patterns); the rate it reached is read from its own progress file.", lcDirtyMiBs),
		"fork --count 8 runs only for VMs of at most 1 GiB, once; its target is N=8 <= 2x N=1 (the N=1 row's p50).",
		"Under TCG with a QEMU before 9.0 (Debian 12's 7.2) every live save is stop-and-copy (qemu.precopyUnreliable): the fork parent " +
			"is paused for the whole save. AGENTVM_QEMU=/opt/agentvm/qemu-10/bin/qemu-system-x86_64 makes the servers use QEMU 10 (live precopy).",
	}
	if lcDetail {
		notes = append(notes, fmt.Sprintf("-lc-detail: the per-phase report runs on one %d MiB VM after the table (its setup create is not a result).", lcMemoryMiB),
			"Per-phase fork 'all children exec'd' is timed from the fork call start until every child answered an exec of `true`; ratios are N=k / N=1; "+
				"a 507 (insufficient memory) is reported as a failed row.")
	}
	return notes
}

// lifecycleJSON is what -json writes with -lifecycle.
type lifecycleJSON struct {
	StartedAt  time.Time        `json:"started_at"`
	FinishedAt time.Time        `json:"finished_at"`
	Host       Host             `json:"host"`
	Lifecycle  *LifecycleReport `json:"lifecycle"`
	Notes      []string         `json:"notes"`
	Errors     []string         `json:"errors,omitempty"`
}
