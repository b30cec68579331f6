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
	s.now = func() time.Time { return now }
	s.readProc = func(pid int) (float64, int64, error) { return cpu, int64(pid) << 20, nil }
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
	s.Sample(nil)
	if s.Samples("a") != nil {
		t.Fatal("a VM no longer running keeps its series")
	}
}

func TestReadSelf(t *testing.T) {
	cpu, rss, err := readProc(os.Getpid())
	if err != nil || cpu < 0 || rss <= 0 {
		t.Fatalf("readProc(self) = %v, %v, %v", cpu, rss, err)
	}
	if _, err := parseStat("12 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0"); err != nil {
		t.Fatal(err)
	}
	if c, _ := parseStat("12 (a b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0"); c != 3 {
		t.Fatalf("utime+stime of a name with spaces and parens: %v, want 3 s", c)
	}
}
