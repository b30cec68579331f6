package vm

import "sync"

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

// add holds m until the returned func is called. After kill it kills m at
// once: the daemon is going.
func (u *unfinished) add(m Machine) (done func()) {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		m.Kill()
		return func() {}
	}
	if u.ms == nil {
		u.ms = map[Machine]struct{}{}
	}
	u.ms[m] = struct{}{}
	u.mu.Unlock()
	return func() {
		u.mu.Lock()
		delete(u.ms, m)
		u.mu.Unlock()
	}
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
