package vmstats

import (
	"os"
	"testing"
	"time"
)

func TestRingAndCPU(t *testing.T) {
	s := New(10 * time.Second)
	now := time.Unix(1000, 0)
	cpu := 0.0
	start := uint64(100)
	s.now = func() time.Time { return now }
	s.readProc = func(pid int) (procStat, error) {
		return procStat{cpuSec: cpu, rss: int64(pid) << 20, start: start}, nil
	}
	for i := 0; i < s.size+50; i++ {
		s.Sample([]Proc{{VMID: "a", PID: 7}})
		now = now.Add(10 * time.Second)
		cpu += 5 // 5 s of CPU per 10 s: 50%
	}
	got := s.Samples("a")
	if len(got) != s.size || s.size != 360 {
		t.Fatalf("kept %d samples (size %d), want the last hour: 360", len(got), s.size)
	}
	for i, sm := range got {
		if sm.CPUPercent != 50 || sm.RSSBytes != 7<<20 {
			t.Fatalf("sample %d: %+v", i, sm)
		}
		if i > 0 && !sm.Time.After(got[i-1].Time) {
			t.Fatalf("samples out of order at %d", i)
		}
	}
	// A new QEMU (wake, restart) starts a new series; a VM that stops
	// running is forgotten.
	s.Sample([]Proc{{VMID: "a", PID: 8}})
	if n := len(s.Samples("a")); n != 0 {
		t.Fatalf("after a new pid: %d samples, want 0", n)
	}
	s.Sample([]Proc{{VMID: "a", PID: 8}})
	if n := len(s.Samples("a")); n != 1 {
		t.Fatalf("the same process again: %d samples, want 1", n)
	}
	// The same pid reused by another process (another start time): a new
	// series, not a CPU delta across two processes.
	start = 5000
	s.Sample([]Proc{{VMID: "a", PID: 8}})
	if n := len(s.Samples("a")); n != 0 {
		t.Fatalf("after the pid was reused: %d samples, want 0", n)
	}
	s.Sample(nil)
	if s.Samples("a") != nil {
		t.Fatal("a VM no longer running keeps its series")
	}
}

func TestReadSelf(t *testing.T) {
	st, err := readProc(os.Getpid())
	if err != nil || st.cpuSec < 0 || st.rss <= 0 || st.start == 0 {
		t.Fatalf("readProc(self) = %+v, %v", st, err)
	}
	line := "12 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0 98765 1000 10"
	c, start, err := parseStat(line)
	if err != nil || c != 3 || start != 98765 {
		t.Fatalf("a name with spaces and parens: %v s, start %d, %v; want 3 s, start 98765", c, start, err)
	}
	if _, _, err := parseStat("12 (x) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0"); err == nil {
		t.Fatal("a line without the start time parsed")
	}
}

func TestIntervalLongerThanWindow(t *testing.T) {
	s := New(2 * Window) // must not panic
	s.readProc = func(int) (procStat, error) { return procStat{cpuSec: 1, rss: 1, start: 1}, nil }
	for i := 0; i < 3; i++ {
		s.Sample([]Proc{{VMID: "a", PID: 1}})
	}
	if n := len(s.Samples("a")); n != 1 {
		t.Fatalf("%d samples, want 1", n)
	}
}
