package vm

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// opLocks serialises the operations on each VM: one at a time, each named,
// so that a caller turned away learns what runs (a 409 naming it). A VM's
// entry goes with the VM (forget).
type opLocks struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex // by VM id
	busy  map[string]string      // VM id -> the operation holding its lock
}

func (o *opLocks) mutex(id string) *sync.Mutex {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.locks == nil {
		o.locks, o.busy = map[string]*sync.Mutex{}, map[string]string{}
	}
	l := o.locks[id]
	if l == nil {
		l = &sync.Mutex{}
		o.locks[id] = l
	}
	return l
}

// mark marks id as held by op and returns the unlock, which does its
// work once however often it is called (a held VM's release and a
// deferred unlock of the same lock may both run).
func (o *opLocks) mark(id, op string, l *sync.Mutex) func() {
	o.setBusy(id, op)
	var once sync.Once
	return func() { once.Do(func() { o.setBusy(id, ""); l.Unlock() }) }
}

// lock waits its turn: internal steps and wake-on-request use it, so
// concurrent requests share one wake.
func (o *opLocks) lock(id, op string) func() {
	l := o.mutex(id)
	l.Lock()
	return o.mark(id, op, l)
}

// wait is lock that gives up when ctx ends. Delete uses it: it must win
// over whatever runs on the VM (a wake after a daemon restart, a
// snapshot), not fail with "in progress; retry".
func (o *opLocks) wait(ctx context.Context, id, op string) (func(), error) {
	l := o.mutex(id)
	for !l.TryLock() {
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w: cannot %s VM %s: %s is still in progress (waited: %v); retry when it is done", ErrConflict, op, id, o.busyWith(id), ctx.Err())
		case <-t.C:
		}
	}
	return o.mark(id, op, l), nil
}

// try takes the VM for a user-requested operation; if another one is in
// progress the caller gets a 409 naming it (retry when it is done).
func (o *opLocks) try(id, name, op string) (func(), error) {
	l := o.mutex(id)
	if !l.TryLock() {
		return nil, fmt.Errorf("%w: cannot %s VM %s: %s is in progress; retry when it is done", ErrConflict, op, name, o.busyWith(id))
	}
	return o.mark(id, op, l), nil
}

// busyWith names the operation holding id's lock.
func (o *opLocks) busyWith(id string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if op := o.busy[id]; op != "" {
		return op
	}
	return "another operation"
}

func (o *opLocks) isBusy(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.busy[id] != ""
}

func (o *opLocks) setBusy(id, op string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if op == "" {
		delete(o.busy, id)
	} else {
		o.busy[id] = op
	}
}

// forget drops the entry of a deleted VM (whose lock the caller holds):
// nobody can take it again.
func (o *opLocks) forget(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.locks, id)
}
