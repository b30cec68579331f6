package vm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestOpLocks(t *testing.T) {
	var o opLocks
	unlock := o.lock("vm1", "snapshot")
	if !o.isBusy("vm1") || o.isBusy("vm2") {
		t.Fatal("busy flags")
	}
	if _, err := o.try("vm1", "box", "pause"); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "snapshot is in progress") {
		t.Fatalf("try while held: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := o.wait(ctx, "vm1", "delete"); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "snapshot is still in progress") {
		t.Fatalf("wait past its context: %v", err)
	}
	other, err := o.try("vm2", "other", "pause") // other VMs are not held up
	if err != nil {
		t.Fatal(err)
	}
	other()
	got := make(chan func())
	go func() { got <- o.lock("vm1", "wake") }()
	unlock()
	u := <-got // the waiter gets it once it is released
	if o.busyWith("vm1") != "wake" {
		t.Fatalf("held by %q", o.busyWith("vm1"))
	}
	o.forget("vm1")
	u()
	o.forget("vm2")
	if o.size() != 0 || o.isBusy("vm1") {
		t.Fatalf("%d entries left after forget", o.size())
	}
}

// size is the number of VMs with an entry.
func (o *opLocks) size() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.locks)
}
