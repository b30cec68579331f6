package vm

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentvm/agentvm/internal/store"
)

// Actors of events the service causes itself.
const (
	ActorSystem        = "system"
	ActorIdlePolicy    = "idle-policy"
	ActorRestartPolicy = "restart-policy"
)

// eventHub fans new events out to followers.
type eventHub struct {
	mu   sync.Mutex
	subs map[chan *store.Event]string // channel -> vm id
}

// Event records an event for a VM in the database (and the VM's log) and
// hands it to followers.
func (s *Service) Event(vmID, typ, actor, format string, args ...any) {
	e := &store.Event{VMID: vmID, Time: time.Now().UTC(), Type: typ, Actor: actor, Message: fmt.Sprintf(format, args...)}
	s.addEvent(e)
}

// EventData is Event with structured fields.
func (s *Service) EventData(vmID, typ, actor string, data map[string]string, format string, args ...any) {
	e := &store.Event{VMID: vmID, Time: time.Now().UTC(), Type: typ, Actor: actor, Message: fmt.Sprintf(format, args...), Data: data}
	s.addEvent(e)
}

func (s *Service) addEvent(e *store.Event) {
	if err := s.store.AddEvent(context.Background(), e); err != nil {
		s.log.Warn("record event", "vm", e.VMID, "err", err)
		return
	}
	s.logEvent(e.VMID, "%s: %s (by %s)", e.Type, e.Message, e.Actor)
	s.events.mu.Lock()
	for ch, id := range s.events.subs {
		if id == e.VMID || id == "" {
			select {
			case ch <- e:
			default: // a follower that does not keep up re-reads from the store
			}
		}
	}
	s.events.mu.Unlock()
}

// Events returns a VM's events after seq (oldest first, at most limit);
// vmID "" returns every VM's.
func (s *Service) Events(ctx context.Context, vmID string, after int64, limit int) ([]*store.Event, error) {
	return s.store.ListEvents(ctx, vmID, after, limit)
}

// FollowEvents streams a VM's events after seq to fn until ctx ends or fn
// returns an error; vmID "" follows every VM's.
func (s *Service) FollowEvents(ctx context.Context, vmID string, after int64, fn func(*store.Event) error) error {
	ch := make(chan *store.Event, 256)
	s.events.mu.Lock()
	if s.events.subs == nil {
		s.events.subs = map[chan *store.Event]string{}
	}
	s.events.subs[ch] = vmID
	s.events.mu.Unlock()
	defer func() {
		s.events.mu.Lock()
		delete(s.events.subs, ch)
		s.events.mu.Unlock()
	}()
	last := after
	catchUp := func() error {
		for {
			es, err := s.store.ListEvents(ctx, vmID, last, 500)
			if err != nil {
				return err
			}
			for _, e := range es {
				if err := fn(e); err != nil {
					return err
				}
				last = e.Seq
			}
			if len(es) < 500 {
				return nil
			}
		}
	}
	if err := catchUp(); err != nil {
		return err
	}
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-ch:
			if e.Seq <= last {
				continue
			}
			if err := catchUp(); err != nil { // from the store: nothing is skipped or doubled
				return err
			}
		case <-tick.C:
			if err := catchUp(); err != nil {
				return err
			}
		}
	}
}
