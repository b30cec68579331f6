package vm

import (
	"fmt"
	"sync"
)

// fence is this node's fence (node.go): why it is fenced ("": it is not),
// how many fences there have been, and the VMs they killed since the last
// Unfence. Its lock is taken inside Service.mu, never around it.
type fence struct {
	mu     sync.Mutex
	reason string
	epoch  int
	killed map[string]bool

	unfence sync.Mutex // serialises Unfence
}

// raise fences the node for reason.
func (f *fence) raise(reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reason = reason
	f.epoch++
}

// why is the reason the node is fenced ("": it is not).
func (f *fence) why() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reason
}

// check refuses an operation while the node is fenced.
func (f *fence) check() error {
	if r := f.why(); r != "" {
		return fmt.Errorf("%w: this node stopped its VMs and takes no operations until it is back in the cluster (%s)", ErrUnavailable, r)
	}
	return nil
}

// kill notes VMs a fence killed, for Unfence to record.
func (f *fence) kill(ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.killed == nil {
		f.killed = map[string]bool{}
	}
	for _, id := range ids {
		f.killed[id] = true
	}
}

// pending is what Unfence has to record: the fence's epoch and reason, and
// the VMs it killed.
func (f *fence) pending() (epoch int, reason string, ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := range f.killed {
		ids = append(ids, id)
	}
	return f.epoch, f.reason, ids
}

// lower ends the fence once ids are recorded, unless a new fence came
// since epoch.
func (f *fence) lower(epoch int, ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.epoch != epoch {
		return
	}
	f.reason = ""
	for _, id := range ids {
		delete(f.killed, id)
	}
}
