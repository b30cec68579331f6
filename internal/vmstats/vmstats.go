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

type series struct {
	pid      int
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

	// readProc reads a process's CPU seconds and RSS (tests replace it).
	readProc func(pid int) (cpuSec float64, rss int64, err error)
	now      func() time.Time
}

// New returns a sampler that keeps Window of samples taken every interval.
func New(interval time.Duration) *Sampler {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	return &Sampler{interval: interval, size: int(Window / interval), series: map[string]*series{},
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
// suspended or deleted: a wake starts a new QEMU and a new series).
func (s *Sampler) Sample(procs []Proc) {
	now := s.now()
	seen := make(map[string]bool, len(procs))
	for _, p := range procs {
		seen[p.VMID] = true
		cpu, rss, err := s.readProc(p.PID)
		s.mu.Lock()
		sr := s.series[p.VMID]
		if sr == nil || sr.pid != p.PID {
			sr = &series{pid: p.PID, ring: make([]Sample, 0, min(s.size, 64))}
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

// readProc reads user+system CPU seconds from /proc/<pid>/stat and the
// resident set from /proc/<pid>/statm.
func readProc(pid int) (float64, int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	cpu, err := parseStat(string(b))
	if err != nil {
		return 0, 0, err
	}
	m, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(m))
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("statm of %d: %q", pid, m)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, 0, err
	}
	return cpu, pages * int64(os.Getpagesize()), nil
}

// parseStat returns utime+stime in seconds from a /proc/<pid>/stat line.
// The command name (field 2) may contain spaces and parentheses: fields are
// counted from the last ')'.
func parseStat(line string) (float64, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad stat line")
	}
	f := strings.Fields(line[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat line")
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad stat times")
	}
	return float64(ut+st) / clockTicks, nil
}
