package e2b

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// The timeout loop's fanout runs at most n functions at once and one per
// key, and frees a key and a slot when its function returns.
func TestFanout(t *testing.T) {
	f := newFanout(2)
	release := make(chan struct{})
	var ran atomic.Int32
	block := func() { ran.Add(1); <-release }
	if !f.try("a", block) || !f.try("b", block) {
		t.Fatal("two slots, two keys: refused")
	}
	if f.try("a", func() {}) {
		t.Error("a second run of a busy key started")
	}
	if f.try("c", func() {}) || !f.full() {
		t.Error("a third run started with two slots")
	}
	close(release)
	f.wait()
	if ran.Load() != 2 || f.full() {
		t.Fatalf("ran %d, full %v after the wait", ran.Load(), f.full())
	}
	var done atomic.Int32
	for i := range 2 {
		if !f.try(fmt.Sprint("k", i), func() { done.Add(1) }) {
			t.Errorf("run %d refused after the slots were freed", i)
		}
	}
	f.wait()
	if done.Load() != 2 {
		t.Fatalf("%d of 2 runs done", done.Load())
	}
}
