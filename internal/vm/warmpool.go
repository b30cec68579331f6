package vm

import (
	"fmt"
	"slices"
	"sync"
)

// poolKey is a warm pool's shape: the image and the VM's size.
type poolKey struct {
	image string // "" is the default image
	cpus  int
	mem   int64
}

func (k poolKey) String() string {
	s := fmt.Sprintf("%dx%d", k.cpus, k.mem)
	if k.image != "" {
		s = k.image + "/" + s
	}
	return s
}

// maxPoolShapes bounds how many shapes keep warm VMs; the least recently created
// shape's pool is dropped to make room for a new one.
const maxPoolShapes = 3

// warmPool is the warm pool's bookkeeping: which pool VMs are ready per
// shape, which shapes are being filled, and which shapes are recent enough
// to keep. It makes and destroys nothing itself (the Service restores and
// destroys the VMs, pool.go), so it is tested without QEMU.
type warmPool struct {
	size int // ready VMs to keep per shape; 0 disables the pool

	mu      sync.Mutex
	ready   map[poolKey][]string // ready pool VM ids per shape, oldest first
	filling map[poolKey]bool
	order   []poolKey // kept shapes, the most recently created first
	closed  bool
	fills   sync.WaitGroup // refills under way
}

func newWarmPool(size int) *warmPool {
	return &warmPool{size: size, ready: map[poolKey][]string{}, filling: map[poolKey]bool{}}
}

// pop takes a ready VM of key's shape ("" if there is none).
func (p *warmPool) pop(key poolKey) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := p.ready[key]
	if len(ids) == 0 {
		return ""
	}
	p.ready[key] = ids[1:]
	return ids[0]
}

// push makes id a ready VM of key's shape (not once the pool is closed:
// the server's drain destroys every pool VM).
func (p *warmPool) push(key poolKey, id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.ready[key] = append(p.ready[key], id)
	}
}

// touch records key as the most recently created shape and forgets the
// shapes beyond maxPoolShapes, returning their ready VMs for the caller to
// destroy.
func (p *warmPool) touch(key poolKey) (evicted []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	order := []poolKey{key}
	for _, k := range p.order {
		if k != key {
			order = append(order, k)
		}
	}
	if len(order) > maxPoolShapes {
		for _, k := range order[maxPoolShapes:] {
			evicted = append(evicted, p.ready[k]...)
			delete(p.ready, k)
		}
		order = order[:maxPoolShapes]
	}
	p.order = order
	return evicted
}

// startFill claims the refill of key's shape: false when the pool is off,
// closed or full for that shape, or another refill of it is under way.
// A true answer must be followed by endFill.
func (p *warmPool) startFill(key poolKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.size <= 0 || p.closed || p.filling[key] || len(p.ready[key]) >= p.size {
		return false
	}
	p.filling[key] = true
	p.fills.Add(1)
	return true
}

func (p *warmPool) endFill(key poolKey) {
	p.mu.Lock()
	delete(p.filling, key)
	p.mu.Unlock()
	p.fills.Done()
}

// wants reports whether a refill of key's shape should make another VM:
// the shape is still kept, below size, and the pool is open.
func (p *warmPool) wants(key poolKey) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closed && len(p.ready[key]) < p.size && slices.Contains(p.order, key)
}

func (p *warmPool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// close stops refills and forgets every ready VM; done is closed once the
// refills under way have finished (each one finishes or undoes its VM).
func (p *warmPool) close() (done <-chan struct{}) {
	p.mu.Lock()
	p.closed = true
	p.ready = map[poolKey][]string{}
	p.mu.Unlock()
	ch := make(chan struct{})
	go func() { p.fills.Wait(); close(ch) }()
	return ch
}

// counts is the number of ready VMs per shape (poolKey.String).
func (p *warmPool) counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, ids := range p.ready {
		out[k.String()] = len(ids)
	}
	return out
}
