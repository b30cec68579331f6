package vm

import (
	"context"
	"fmt"
	"log/slog"
	"os"
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

// journal records what happens to VMs: events in the store, handed to
// their followers as they come, and lines in each VM's own log (the
// serial console's file, which the events are copied to). The Service
// embeds it: Event, Events and FollowEvents are its API.
type journal struct {
	store   Store
	log     *slog.Logger
	logPath func(vmID string) string // the VM's log file

	mu   sync.Mutex
	subs map[chan *store.Event]string // channel -> vm id
}

// Event records an event for a VM in the database (and the VM's log) and
// hands it to followers.
func (j *journal) Event(vmID, typ, actor, format string, args ...any) {
	e := &store.Event{VMID: vmID, Time: time.Now().UTC(), Type: typ, Actor: actor, Message: fmt.Sprintf(format, args...)}
	j.add(e)
}

// EventData is Event with structured fields.
func (j *journal) EventData(vmID, typ, actor string, data map[string]string, format string, args ...any) {
	e := &store.Event{VMID: vmID, Time: time.Now().UTC(), Type: typ, Actor: actor, Message: fmt.Sprintf(format, args...), Data: data}
	j.add(e)
}

func (j *journal) add(e *store.Event) {
	if err := j.store.AddEvent(context.Background(), e); err != nil {
		j.log.Warn("record event", "vm", e.VMID, "err", err)
		return
	}
	j.logEvent(e.VMID, "%s: %s (by %s)", e.Type, e.Message, e.Actor)
	j.mu.Lock()
	for ch, id := range j.subs {
		if id == e.VMID || id == "" {
			select {
			case ch <- e:
			default: // a follower that does not keep up re-reads from the store
			}
		}
	}
	j.mu.Unlock()
}

// logEvent appends a lifecycle line to the VM's log, beside the serial console
// and QEMU's own output, so `agentvm logs` tells the whole story.
func (j *journal) logEvent(id, format string, args ...any) {
	f, err := os.OpenFile(j.logPath(id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "[agentvm %s] %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

// Events returns a VM's events after seq (oldest first, at most limit);
// vmID "" returns every VM's.
func (j *journal) Events(ctx context.Context, vmID string, after int64, limit int) ([]*store.Event, error) {
	return j.store.ListEvents(ctx, vmID, after, limit)
}

// FollowEvents streams a VM's events after seq to fn until ctx ends or fn
// returns an error; vmID "" follows every VM's.
func (j *journal) FollowEvents(ctx context.Context, vmID string, after int64, fn func(*store.Event) error) error {
	ch := make(chan *store.Event, 256)
	j.mu.Lock()
	if j.subs == nil {
		j.subs = map[chan *store.Event]string{}
	}
	j.subs[ch] = vmID
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		delete(j.subs, ch)
		j.mu.Unlock()
	}()
	last := after
	catchUp := func() error {
		for {
			es, err := j.store.ListEvents(ctx, vmID, last, 500)
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
