// Package vmstats keeps the last hour of each running VM's CPU and memory
// use, sampled from its QEMU process on the host.
//
// It reads /proc/<pid>/stat (user+system CPU time) and /proc/<pid>/statm
// (resident pages) of each QEMU: two small reads per VM per interval, no
// guest round trip, nothing that wakes a suspended VM. CPU is what QEMU
// spent running the guest (under TCG, emulation included), as a percentage
// of one host core; memory is QEMU's resident set, the guest's RAM that the
// host actually holds (template pages shared between clones count in each).
package vmstats

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Sample is one measurement of a VM.
type Sample struct {
	Time time.Time `json:"time"`
	// CPUPercent is QEMU's CPU use since the previous sample, in percent of
	// one host core (200 = two cores busy).
	CPUPercent float64 `json:"cpu_percent"`
	// RSSBytes is QEMU's resident memory.
	RSSBytes int64 `json:"rss_bytes"`
}

// Proc is a VM's QEMU process.
type Proc struct {
	VMID string
	PID  int
}

// Window is how long samples are kept.
const Window = time.Hour

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture agentvm runs on.
const clockTicks = 100

// procStat is one read of a process.
type procStat struct {
	cpuSec float64 // user+system CPU time
	rss    int64   // resident bytes
	start  uint64  // start time, in clock ticks since boot (/proc/<pid>/stat field 22)
}

type series struct {
	pid      int
	start    uint64   // with pid, the process's identity: a reused pid is another QEMU
	ring     []Sample // oldest first once full: ring[next:] then ring[:next]
	next     int
	full     bool
	lastCPU  float64 // seconds
	lastTime time.Time
}

// Sampler holds a bounded ring of samples per VM.
type Sampler struct {
	interval time.Duration
	size     int

	mu     sync.Mutex
	series map[string]*series

	// readProc reads a process (tests replace it).
	readProc func(pid int) (procStat, error)
	now      func() time.Time
}

// New returns a sampler that keeps Window of samples taken every interval
// (at least one sample, for an interval longer than Window).
func New(interval time.Duration) *Sampler {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	return &Sampler{interval: interval, size: max(1, int(Window/interval)), series: map[string]*series{},
		readProc: readProc, now: time.Now}
}

// Interval is the time between samples.
func (s *Sampler) Interval() time.Duration { return s.interval }

// Run samples the processes list returns every interval until ctx ends.
func (s *Sampler) Run(ctx context.Context, list func(context.Context) []Proc) {
	s.Sample(list(ctx))
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sample(list(ctx))
		}
	}
}

// Sample measures procs once. VMs not in procs are forgotten (stopped,
// suspended or deleted: a wake starts a new QEMU and a new series). A
// process is known by its pid and start time, so a pid the kernel reused
// for another QEMU starts a new series too.
func (s *Sampler) Sample(procs []Proc) {
	now := s.now()
	seen := make(map[string]bool, len(procs))
	for _, p := range procs {
		seen[p.VMID] = true
		st, err := s.readProc(p.PID)
		cpu, rss := st.cpuSec, st.rss
		s.mu.Lock()
		sr := s.series[p.VMID]
		if sr == nil || sr.pid != p.PID || err == nil && sr.start != st.start {
			sr = &series{pid: p.PID, start: st.start, ring: make([]Sample, 0, min(s.size, 64))}
			s.series[p.VMID] = sr
		}
		if err == nil {
			if !sr.lastTime.IsZero() {
				sm := Sample{Time: now.UTC(), RSSBytes: rss}
				if dt := now.Sub(sr.lastTime).Seconds(); dt > 0 && cpu >= sr.lastCPU {
					sm.CPUPercent = 100 * (cpu - sr.lastCPU) / dt
				}
				sr.add(sm, s.size)
			}
			sr.lastCPU, sr.lastTime = cpu, now
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	for id := range s.series {
		if !seen[id] {
			delete(s.series, id)
		}
	}
	s.mu.Unlock()
}

func (sr *series) add(sm Sample, size int) {
	if len(sr.ring) < size {
		sr.ring = append(sr.ring, sm)
		return
	}
	sr.ring[sr.next] = sm
	sr.next = (sr.next + 1) % size
	sr.full = true
}

// Samples returns a VM's samples, oldest first (nil when none).
func (s *Sampler) Samples(vmID string) []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	sr := s.series[vmID]
	if sr == nil {
		return nil
	}
	out := make([]Sample, 0, len(sr.ring))
	if sr.full {
		out = append(out, sr.ring[sr.next:]...)
		out = append(out, sr.ring[:sr.next]...)
	} else {
		out = append(out, sr.ring...)
	}
	return out
}

// readProc reads user+system CPU seconds and the start time from
// /proc/<pid>/stat and the resident set from /proc/<pid>/statm.
func readProc(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	cpu, start, err := parseStat(string(b))
	if err != nil {
		return procStat{}, err
	}
	m, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return procStat{}, err
	}
	f := strings.Fields(string(m))
	if len(f) < 2 {
		return procStat{}, fmt.Errorf("statm of %d: %q", pid, m)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return procStat{}, err
	}
	return procStat{cpuSec: cpu, rss: pages * int64(os.Getpagesize()), start: start}, nil
}

// parseStat returns utime+stime in seconds and the start time (clock ticks
// since boot) from a /proc/<pid>/stat line. The command name (field 2) may
// contain spaces and parentheses: fields are counted from the last ')'.
func parseStat(line string) (float64, uint64, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("bad stat line")
	}
	f := strings.Fields(line[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15,
	// starttime field 22.
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("short stat line")
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	start, err3 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, fmt.Errorf("bad stat fields")
	}
	return float64(ut+st) / clockTicks, start, nil
}
