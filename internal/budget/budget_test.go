package budget

import (
	"errors"
	"sync"
	"testing"
)

func TestTakeAndRelease(t *testing.T) {
	m := New(10 << 20)
	a, err := m.Take(6<<20, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Take(5<<20, "b"); !errors.Is(err, ErrExhausted) {
		t.Fatalf("over the limit: %v", err)
	}
	a()
	a() // once
	if m.Used() != 0 {
		t.Fatalf("used %d after release", m.Used())
	}
	if _, err := m.Take(10<<20, "c"); err != nil {
		t.Fatal(err)
	}
	var unlimited *Memory
	if _, err := unlimited.Take(1<<40, "x"); err != nil || New(0) != nil {
		t.Fatal("nil budget limits")
	}
}

func TestConcurrentNeverOver(t *testing.T) {
	m := New(100)
	var wg sync.WaitGroup
	var mu sync.Mutex
	peak := int64(0)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if rel, err := m.Take(30, "x"); err == nil {
					mu.Lock()
					peak = max(peak, m.Used())
					mu.Unlock()
					rel()
				}
			}
		}()
	}
	wg.Wait()
	if peak > 100 || m.Used() != 0 {
		t.Fatalf("peak %d, used %d", peak, m.Used())
	}
}
