package vm

import (
	"slices"
	"testing"
	"time"
)

func TestWarmPoolShapes(t *testing.T) {
	p := newWarmPool(2)
	for i := 1; i <= maxPoolShapes; i++ {
		k := poolKey{"", 1, int64(i)}
		p.touch(k)
		p.push(k, "vm"+k.String())
	}
	// A new shape evicts the least recently created one and hands back its VMs.
	if ev := p.touch(poolKey{"browser", 2, 512}); !slices.Equal(ev, []string{"vm1x1"}) {
		t.Fatalf("evicted %v", ev)
	}
	if p.order[0] != (poolKey{"browser", 2, 512}) || len(p.order) != maxPoolShapes {
		t.Fatalf("order %v", p.order)
	}
	// A known shape moves to the front and evicts nothing.
	if ev := p.touch(poolKey{"", 1, 2}); len(ev) != 0 || p.order[0] != (poolKey{"", 1, 2}) || len(p.order) != maxPoolShapes {
		t.Fatalf("evicted %v, order %v", ev, p.order)
	}
	if got := p.counts(); got["1x2"] != 1 || got["1x3"] != 1 || len(got) != 2 {
		t.Fatalf("counts %v", got)
	}
	if p.wants(poolKey{"", 1, 1}) {
		t.Fatal("an evicted shape is refilled")
	}
	if !p.wants(poolKey{"browser", 2, 512}) {
		t.Fatal("a kept shape below size is not refilled")
	}
}

func TestWarmPoolPopPush(t *testing.T) {
	p := newWarmPool(2)
	k := poolKey{"", 1, 1024}
	p.touch(k)
	if id := p.pop(k); id != "" {
		t.Fatalf("pop of an empty pool: %q", id)
	}
	p.push(k, "a")
	p.push(k, "b")
	if p.wants(k) {
		t.Fatal("a full shape wants more")
	}
	if a, b, c := p.pop(k), p.pop(k), p.pop(k); a != "a" || b != "b" || c != "" {
		t.Fatalf("pops %q %q %q", a, b, c)
	}
}

func TestWarmPoolFills(t *testing.T) {
	k := poolKey{"", 1, 1024}
	if off := newWarmPool(0); off.startFill(k) {
		t.Fatal("a disabled pool fills")
	}
	p := newWarmPool(1)
	p.touch(k)
	if !p.startFill(k) {
		t.Fatal("first fill refused")
	}
	if p.startFill(k) {
		t.Fatal("two fills of one shape")
	}
	if !p.startFill(poolKey{"", 2, 1024}) {
		t.Fatal("a fill of another shape refused")
	}
	p.endFill(poolKey{"", 2, 1024})
	done := p.close()
	select {
	case <-done:
		t.Fatal("close finished with a fill under way")
	case <-time.After(50 * time.Millisecond):
	}
	if p.wants(k) || !p.isClosed() {
		t.Fatal("a closed pool wants VMs")
	}
	p.endFill(k)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("close did not finish after the last fill ended")
	}
	if p.startFill(k) {
		t.Fatal("a closed pool fills")
	}
	p.push(k, "late")
	if got := p.counts(); len(got) != 0 {
		t.Fatalf("counts %v", got)
	}
}
