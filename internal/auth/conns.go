package auth

import (
	"fmt"
	"sync"
	"time"
)

// revokeMemory is how long a revoked token id is remembered. A connection
// registers after its login succeeded (an SSH handshake still has to finish,
// for instance); a revoke that lands in between must still end it. This is
// longer than any such gap: the SSH gateway's authentication deadline is 30 s.
const revokeMemory = 2 * time.Minute

// MaxConnsPerToken bounds the requests and connections one scoped token
// holds open at once (exec and terminal streams, followed logs, SSH
// connections, file transfers, preview requests): each costs the daemon
// goroutines and buffers, and one tenant must not be able to exhaust it.
const MaxConnsPerToken = 64

// ErrTooMany refuses a connection past MaxConnsPerToken.
var ErrTooMany = fmt.Errorf("this token already holds %d open requests and connections; close some and retry", MaxConnsPerToken)

// tracked is one long-lived connection opened with a scoped token.
type tracked struct {
	tokenID, vmID string
	end           func()
	timer         *time.Timer
	once          sync.Once
}

func (t *tracked) fire() { t.once.Do(t.end) }

// connRegistry knows the long-lived connections (SSH sessions, exec and
// terminal streams, followed logs, preview WebSockets, ...) of every scoped
// token, so that revocation and expiry end them: checking a token only at
// login would let a connection opened a minute before a revoke live on.
//
// It is per process: on a cluster the other nodes hear of a revoke through
// the store (cluster.go).
type connRegistry struct {
	mu      sync.Mutex
	byToken map[string]map[*tracked]struct{}
	revoked map[string]time.Time // token id -> when it was revoked
	goneVMs map[string]time.Time // VM id -> when its tokens were forgotten
}

// Track registers a long-lived connection opened by p: end is called once,
// from whichever goroutine notices, when p's token is revoked, when it
// expires, or when its VM's tokens are forgotten. end should cancel the connection's
// context and close its network connection. The returned func unregisters
// it; call it when the connection ends on its own. The admin token cannot be
// revoked and does not expire: for it Track does nothing. Stored admin keys
// (E2B admin keys) are tracked, but not capped.
//
// When the token is already expired or revoked, end is called before Track
// returns. A token that holds MaxConnsPerToken connections gets ErrTooMany
// (and end is not called).
func (s *Service) Track(p *Principal, end func()) (untrack func(), err error) {
	if p == nil || p.TokenID == "" {
		return func() {}, nil
	}
	return s.conns.add(p, s.now(), end)
}

func (r *connRegistry) add(p *Principal, now time.Time, end func()) (func(), error) {
	t := &tracked{tokenID: p.TokenID, vmID: p.VMID, end: end}
	r.mu.Lock()
	r.pruneLocked(now)
	_, revoked := r.revoked[p.TokenID]
	_, vmGone := r.goneVMs[p.VMID]
	if revoked || p.VMID != "" && vmGone || (!p.ExpiresAt.IsZero() && !now.Before(p.ExpiresAt)) {
		r.mu.Unlock()
		t.fire()
		return func() {}, nil
	}
	if !p.Admin && len(r.byToken[p.TokenID]) >= MaxConnsPerToken {
		r.mu.Unlock()
		return nil, ErrTooMany
	}
	if r.byToken == nil {
		r.byToken = map[string]map[*tracked]struct{}{}
	}
	set := r.byToken[p.TokenID]
	if set == nil {
		set = map[*tracked]struct{}{}
		r.byToken[p.TokenID] = set
	}
	set[t] = struct{}{}
	if !p.ExpiresAt.IsZero() {
		// One timer per connection: connections are few (each is a
		// goroutine or more already) and a timer costs nothing until it fires.
		t.timer = time.AfterFunc(p.ExpiresAt.Sub(now), func() {
			r.remove(t)
			t.fire()
		})
	}
	r.mu.Unlock()
	return func() { r.remove(t) }, nil
}

func (r *connRegistry) remove(t *tracked) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.timer != nil {
		t.timer.Stop()
	}
	if set := r.byToken[t.tokenID]; set != nil {
		delete(set, t)
		if len(set) == 0 {
			delete(r.byToken, t.tokenID)
		}
	}
}

// revoke ends every connection of a token and remembers the revoke for
// connections still on their way to registering.
func (r *connRegistry) revoke(tokenID string, now time.Time) {
	r.mu.Lock()
	r.pruneLocked(now)
	if r.revoked == nil {
		r.revoked = map[string]time.Time{}
	}
	r.revoked[tokenID] = now
	set := r.byToken[tokenID]
	delete(r.byToken, tokenID)
	r.mu.Unlock()
	endAll(set)
}

// tokenIDs lists the tokens that hold tracked connections.
func (r *connRegistry) tokenIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.byToken))
	for id := range r.byToken {
		out = append(out, id)
	}
	return out
}

// forgetVM ends every connection opened with a token of the VM vmID, and
// remembers the VM as revoke does its token.
func (r *connRegistry) forgetVM(vmID string, now time.Time) {
	ended := map[*tracked]struct{}{}
	r.mu.Lock()
	r.pruneLocked(now)
	if r.goneVMs == nil {
		r.goneVMs = map[string]time.Time{}
	}
	r.goneVMs[vmID] = now
	for id, set := range r.byToken {
		for t := range set {
			if t.vmID == vmID {
				ended[t] = struct{}{}
				delete(set, t)
			}
		}
		if len(set) == 0 {
			delete(r.byToken, id)
		}
	}
	r.mu.Unlock()
	endAll(ended)
}

// endAll calls end outside the registry's lock: closing a connection can
// take a while (an SSH close writes to the peer).
func endAll(set map[*tracked]struct{}) {
	for t := range set {
		if t.timer != nil {
			t.timer.Stop()
		}
		t.fire()
	}
}

func (r *connRegistry) pruneLocked(now time.Time) {
	for id, at := range r.revoked {
		if now.Sub(at) > revokeMemory {
			delete(r.revoked, id)
		}
	}
	for id, at := range r.goneVMs {
		if now.Sub(at) > revokeMemory {
			delete(r.goneVMs, id)
		}
	}
}
