package main

// The stress benchmark (go run ./bench -stress): parallel creates, parallel
// execs over many VMs, create latency and host memory as running VMs pile up,
// and a suspend/list/wake pass over all of them. Baselines come from the same
// run: a create with one VM running, a sequential exec round trip.

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentvm/agentvm/api"
)

// stressVMs is the number of VMs running at the end (-stress-vms);
// stressSuspended the number of suspended VMs listed and woken one by one
// at the end (-stress-suspended).
var (
	stressVMs       = 50
	stressSuspended = 200
)

const (
	stressParallelCreates = 20
	stressExecsPerVM      = 5
	stressCreatesPerLevel = 3
)

// StressReport is what -stress measured.
type StressReport struct {
	ParallelCreates    Stats              `json:"parallel_creates"`
	ParallelCreateErrs []string           `json:"parallel_create_errors,omitempty"`
	SequentialExec     Stats              `json:"sequential_exec"`
	ParallelExecs      Stats              `json:"parallel_execs"`
	ParallelExecErrs   []string           `json:"parallel_exec_errors,omitempty"`
	CreateAt           map[int]Stats      `json:"create_at_running"`
	PSSPerVMMiB        map[int]float64    `json:"pss_per_vm_mib_at_running"`
	RSSPerVMMiB        map[int]float64    `json:"rss_per_vm_mib_at_running"`
	IdleCPUPerVMPct    map[int]float64    `json:"idle_cpu_per_vm_pct_of_a_core_at_running"`
	ParallelExecCPU    CPUUse             `json:"parallel_exec_cpu"`
	Suspended          int                `json:"suspended"`
	ListSuspended      Stats              `json:"list_suspended"`
	Wakes              Stats              `json:"wake_to_exec"`
	WakeErrs           []string           `json:"wake_errors,omitempty"`
	Ratios             map[string]float64 `json:"ratios"`
}

func (b *bench) runStress(ctx context.Context) error {
	sr := &StressReport{CreateAt: map[int]Stats{}, PSSPerVMMiB: map[int]float64{}, RSSPerVMMiB: map[int]float64{},
		IdleCPUPerVMPct: map[int]float64{}, Ratios: map[string]float64{}}
	b.r.Stress = sr
	h, err := b.c.Health(ctx)
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	b.r.Host.Accel, b.r.Host.ServerVersion = h.Accel, h.Version

	logf("warming the template (first create, not measured)")
	first, err := b.createReady(ctx)
	if err != nil {
		return err
	}
	running := []string{first.id}
	// Baseline: creates with one VM running.
	if err := b.createLevel(ctx, sr, &running); err != nil {
		return err
	}
	logf("sequential exec baseline")
	var seq []float64
	for i := 0; i < 20; i++ {
		t0 := time.Now()
		if _, err := b.c.Exec(ctx, first.id, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
			return fmt.Errorf("exec baseline: %w", err)
		}
		seq = append(seq, msf(time.Since(t0)))
	}
	sr.SequentialExec = summarize(seq)

	logf("%d parallel creates", stressParallelCreates)
	var mu sync.Mutex
	var lat []float64
	var wg sync.WaitGroup
	for i := 0; i < stressParallelCreates; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := b.createReady(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				sr.ParallelCreateErrs = append(sr.ParallelCreateErrs, err.Error())
				return
			}
			lat = append(lat, v.ms)
			running = append(running, v.id)
		}()
	}
	wg.Wait()
	sr.ParallelCreates = summarize(lat)

	execVMs := running
	if len(execVMs) > stressParallelCreates {
		execVMs = execVMs[len(execVMs)-stressParallelCreates:]
	}
	logf("%d parallel execs over %d VMs", stressExecsPerVM*len(execVMs), len(execVMs))
	lat = nil
	cpu0, wall0 := b.cpuNow(), time.Now()
	for _, id := range execVMs {
		for j := 0; j < stressExecsPerVM; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				r, err := b.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}})
				mu.Lock()
				defer mu.Unlock()
				if err == nil && r.ExitCode != 0 {
					err = fmt.Errorf("exit %d", r.ExitCode)
				}
				if err != nil {
					sr.ParallelExecErrs = append(sr.ParallelExecErrs, err.Error())
					return
				}
				lat = append(lat, msf(time.Since(t0)))
			}()
		}
	}
	wg.Wait()
	sr.ParallelExecs = summarize(lat)
	sr.ParallelExecCPU = b.cpuNow().since(cpu0, time.Since(wall0))

	for _, level := range []int{stressVMs / 2, stressVMs} {
		for len(running) < level-stressCreatesPerLevel {
			v, err := b.createReady(ctx)
			if err != nil {
				return err
			}
			running = append(running, v.id)
			if len(running)%10 == 0 {
				logf("%d VMs running", len(running))
			}
		}
		if err := b.createLevel(ctx, sr, &running); err != nil {
			return err
		}
	}

	logf("suspending %d VMs", len(running))
	for _, id := range running {
		if _, err := b.c.SuspendVM(ctx, id); err != nil {
			return fmt.Errorf("suspend %s: %w", id, err)
		}
	}
	if len(running) < stressSuspended {
		logf("creating and suspending %d more VMs", stressSuspended-len(running))
	}
	for len(running) < stressSuspended {
		v, err := b.createReady(ctx)
		if err != nil {
			return err
		}
		if _, err := b.c.SuspendVM(ctx, v.id); err != nil {
			return fmt.Errorf("suspend %s: %w", v.id, err)
		}
		running = append(running, v.id)
		if len(running)%25 == 0 {
			logf("%d VMs suspended", len(running))
		}
	}
	sr.Suspended = len(running)
	var lists []float64
	for i := 0; i < 10; i++ {
		t0 := time.Now()
		vms, err := b.c.ListVMs(ctx)
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		lists = append(lists, msf(time.Since(t0)))
		if i == 0 {
			logf("listed %d VMs", len(vms))
		}
	}
	sr.ListSuspended = summarize(lists)
	logf("waking them one by one (an exec wakes each; it is suspended again before the next)")
	lat = nil
	for _, id := range running {
		t0 := time.Now()
		r, err := b.c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("exit %d", r.ExitCode)
		}
		if err != nil {
			sr.WakeErrs = append(sr.WakeErrs, fmt.Sprintf("%s: %v", id, err))
			continue
		}
		lat = append(lat, msf(time.Since(t0)))
		if _, err := b.c.SuspendVM(ctx, id); err != nil {
			return fmt.Errorf("suspend %s again: %w", id, err)
		}
	}
	sr.Wakes = summarize(lat)

	base := sr.CreateAt[1].P50
	for n, s := range sr.CreateAt {
		if n != 1 {
			sr.Ratios[fmt.Sprintf("create_p50_at_%d_vs_1", n)] = ratio(s.P50, base)
		}
	}
	sr.Ratios["parallel_exec_p50_vs_sequential"] = ratio(sr.ParallelExecs.P50, sr.SequentialExec.P50)
	sr.Ratios["parallel_create_p50_vs_sequential"] = ratio(sr.ParallelCreates.P50, base)
	return nil
}

type readyVM struct {
	id string
	ms float64
}

// createReady creates a 512 MiB VM and waits for its first exec.
func (b *bench) createReady(ctx context.Context) (readyVM, error) {
	t0 := time.Now()
	id, err := b.create(ctx)
	if err != nil {
		return readyVM{}, fmt.Errorf("create: %w", err)
	}
	if _, err := b.firstExec(ctx, id); err != nil {
		return readyVM{}, fmt.Errorf("first exec in %s: %w", id, err)
	}
	return readyVM{id, msf(time.Since(t0))}, nil
}

// createLevel measures creates with len(*running) VMs running, keeps the new
// VMs running, and records the host memory per running VM.
func (b *bench) createLevel(ctx context.Context, sr *StressReport, running *[]string) error {
	at := len(*running)
	logf("%d creates with %d VMs running", stressCreatesPerLevel, at)
	var lat []float64
	for i := 0; i < stressCreatesPerLevel; i++ {
		v, err := b.createReady(ctx)
		if err != nil {
			return err
		}
		lat = append(lat, v.ms)
		*running = append(*running, v.id)
	}
	sr.CreateAt[at] = summarize(lat)
	// What idle VMs cost the host's CPU explains creates and execs getting
	// slower as VMs pile up: under TCG an idle guest's timer ticks are
	// emulated instructions.
	cpu0, wall0 := b.cpuNow(), time.Now()
	time.Sleep(5 * time.Second)
	if u := b.cpuNow().since(cpu0, time.Since(wall0)); len(*running) > 0 {
		sr.IdleCPUPerVMPct[len(*running)] = u.QEMUSec / u.WallSec / float64(len(*running)) * 100
	}
	pss, rss, n := qemuMemory()
	if n > 0 {
		sr.PSSPerVMMiB[n] = float64(pss) / float64(n) / (1 << 20)
		sr.RSSPerVMMiB[n] = float64(rss) / float64(n) / (1 << 20)
	}
	return nil
}

// CPUUse is the CPU time QEMUs and the daemon used over a wall-clock span.
type CPUUse struct {
	WallSec   float64 `json:"wall_s"`
	QEMUSec   float64 `json:"qemu_cpu_s"`
	DaemonSec float64 `json:"daemon_cpu_s"`
	// BusyPct is (QEMU + daemon) CPU over what the host's cores offered.
	BusyPct float64 `json:"host_busy_pct"`
}

// cpuSample is the CPU seconds used so far by each QEMU and by the daemon.
type cpuSample struct {
	qemu   map[int]float64
	daemon float64
}

func (b *bench) cpuNow() cpuSample {
	s := cpuSample{qemu: map[int]float64{}}
	for _, pid := range qemuPIDs() {
		s.qemu[pid] = cpuSeconds(pid)
	}
	s.daemon = cpuSeconds(b.srv.cmd.Process.Pid)
	return s
}

// since is the use between s0 and s over wall; a QEMU that started in
// between counts from zero.
func (s cpuSample) since(s0 cpuSample, wall time.Duration) CPUUse {
	u := CPUUse{WallSec: wall.Seconds(), DaemonSec: s.daemon - s0.daemon}
	for pid, sec := range s.qemu {
		u.QEMUSec += sec - s0.qemu[pid]
	}
	if u.WallSec > 0 {
		u.BusyPct = (u.QEMUSec + u.DaemonSec) / (u.WallSec * float64(runtime.NumCPU())) * 100
	}
	return u
}

// cpuSeconds is the user and system time of pid (0 if it is gone).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	// fields after the command: state(0) ... utime(11) stime(12), in USER_HZ (100)
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100
}

// qemuPIDs lists every QEMU on the host (the benchmark's server is the
// only one that should run).
func qemuPIDs() []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(cmd), "qemu-system") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// qemuMemory sums the proportional and resident set sizes of every QEMU.
func qemuMemory() (pss, rss int64, n int) {
	for _, pid := range qemuPIDs() {
		f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 2 {
				continue
			}
			kb, _ := strconv.ParseInt(fs[1], 10, 64)
			switch fs[0] {
			case "Pss:":
				pss += kb << 10
			case "Rss:":
				rss += kb << 10
			}
		}
		f.Close()
		n++
	}
	return pss, rss, n
}

// PrintStress writes the stress report.
func (r *Report) PrintStress(w io.Writer) {
	s := r.Stress
	if s == nil {
		return
	}
	fmt.Fprintf(w, "\nagentvm stress (%s, %d cores)\n", r.Host.Accel, r.Host.NProc)
	statsLine(w, fmt.Sprintf("%d parallel creates to first exec", stressParallelCreates), s.ParallelCreates)
	fmt.Fprintf(w, "  errors: %d\n", len(s.ParallelCreateErrs))
	statsLine(w, "sequential exec round trip (baseline)", s.SequentialExec)
	statsLine(w, fmt.Sprintf("%d parallel execs", s.ParallelExecs.N+len(s.ParallelExecErrs)), s.ParallelExecs)
	fmt.Fprintf(w, "  errors: %d\n", len(s.ParallelExecErrs))
	c := s.ParallelExecCPU
	fmt.Fprintf(w, "  CPU during them: %.1f s wall, QEMUs %.1f s, daemon %.1f s: host %.0f%% busy\n", c.WallSec, c.QEMUSec, c.DaemonSec, c.BusyPct)
	for _, n := range sortedKeys(s.CreateAt) {
		statsLine(w, fmt.Sprintf("create to first exec with %d running", n), s.CreateAt[n])
	}
	for _, n := range sortedKeys(s.PSSPerVMMiB) {
		fmt.Fprintf(w, "  host memory per VM at %d QEMUs: PSS %.0f MiB, RSS %.0f MiB\n", n, s.PSSPerVMMiB[n], s.RSSPerVMMiB[n])
	}
	for _, n := range sortedKeys(s.IdleCPUPerVMPct) {
		fmt.Fprintf(w, "  idle QEMU CPU per VM at %d running: %.1f%% of a core\n", n, s.IdleCPUPerVMPct[n])
	}
	statsLine(w, fmt.Sprintf("list with %d VMs suspended", s.Suspended), s.ListSuspended)
	statsLine(w, "wake to first exec, one by one", s.Wakes)
	fmt.Fprintf(w, "  wake errors: %d\n", len(s.WakeErrs))
	for _, k := range sortedKeys(s.Ratios) {
		ratioLine(w, k, s.Ratios[k])
	}
	for _, e := range append(append(s.ParallelCreateErrs, s.ParallelExecErrs...), s.WakeErrs...) {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
}

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	ks := make([]K, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
