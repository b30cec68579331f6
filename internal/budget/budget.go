// Package budget is the daemon-wide memory budget: what requests hold in
// the daemon's memory on a guest's or a caller's behalf (buffered exec
// output, decoded screenshots) is taken from one budget before it is
// allocated, so no set of tokens, however many, can push the daemon past
// it. A request that finds it spent is refused (503) before it has done
// anything, or keeps less (a buffered exec's output is truncated and says
// why).
package budget

import (
	"errors"
	"fmt"
	"sync"
)

// ErrExhausted is a request the budget cannot cover now.
var ErrExhausted = errors.New("the daemon's memory budget is in use")

// DefaultLimit is serve --memory-budget's default: 1 GiB.
const DefaultLimit = 1 << 30

// Memory is a budget of bytes. A nil *Memory is unlimited.
type Memory struct {
	limit int64
	mu    sync.Mutex
	used  int64
}

// New returns a budget of limit bytes (limit <= 0: unlimited, nil).
func New(limit int64) *Memory {
	if limit <= 0 {
		return nil
	}
	return &Memory{limit: limit}
}

// Take reserves n bytes for what, or fails with ErrExhausted saying how
// much is in use. release gives them back; call it once.
func (m *Memory) Take(n int64, what string) (release func(), err error) {
	if m == nil || n <= 0 {
		return func() {}, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.used+n > m.limit {
		return nil, fmt.Errorf("%w: %s needs %d MiB and %d of %d MiB are held by other requests (serve --memory-budget); retry later",
			ErrExhausted, what, (n+(1<<20)-1)>>20, m.used>>20, m.limit>>20)
	}
	m.used += n
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			m.used -= n
			m.mu.Unlock()
		})
	}, nil
}

// Used is how many bytes are reserved now.
func (m *Memory) Used() int64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used
}

// Limit is the budget's size (0: unlimited).
func (m *Memory) Limit() int64 {
	if m == nil {
		return 0
	}
	return m.limit
}
