package vm

import (
	"fmt"
	"sync"
)

// unfinished holds the machines a launch or a template build has started
// and not yet handed over (published as a VM's instance) or ended. A
// running VM's QEMU outlives the daemon, by design; these must not: a
// daemon that stops (Close) kills them, since nothing would finish them,
// and a half-made VM's QEMU would run on, unowned, until the next start
// of the daemon found its record (or forever, if it never starts again).
type unfinished struct {
	mu     sync.Mutex
	closed bool
	ms     map[Machine]struct{}
}

// errStopping: the daemon is stopping, and kills what a launch starts.
var errStopping = fmt.Errorf("%w: the daemon is stopping", ErrUnavailable)

// add holds m until the returned func is called. After kill it kills m at
// once and answers errStopping: the daemon is going.
func (u *unfinished) add(m Machine) (release func(), err error) {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		m.Kill()
		return nil, errStopping
	}
	if u.ms == nil {
		u.ms = map[Machine]struct{}{}
	}
	u.ms[m] = struct{}{}
	u.mu.Unlock()
	return func() { u.release(m) }, nil
}

func (u *unfinished) release(m Machine) {
	u.mu.Lock()
	delete(u.ms, m)
	u.mu.Unlock()
}

// handOver ends the hold on m as its launch publishes it: from then on it
// runs on when the daemon stops. False when kill came first (m is killed).
func (u *unfinished) handOver(m Machine) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, held := u.ms[m]; !held {
		return false
	}
	delete(u.ms, m)
	return true
}

// stopping reports whether kill came.
func (u *unfinished) stopping() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.closed
}

// kill ends every machine held, and every one added from now on.
func (u *unfinished) kill() int {
	u.mu.Lock()
	u.closed = true
	ms := u.ms
	u.ms = nil
	u.mu.Unlock()
	for m := range ms {
		m.Kill()
	}
	return len(ms)
}
