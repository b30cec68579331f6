package store

import (
	"context"
	"time"
)

// Event is one entry of a VM's event log.
type Event struct {
	Seq     int64             `json:"seq"`
	VMID    string            `json:"vm_id"`
	Time    time.Time         `json:"time"`
	Type    string            `json:"type"`  // lifecycle, exec, terminal, ssh, service, policy, ...
	Actor   string            `json:"actor"` // admin, token:<id>, system, idle-policy, restart-policy...
	Message string            `json:"message"`
	Data    map[string]string `json:"data,omitempty"`
}

// MaxEventsPerVM bounds the event log of one VM; older events are pruned
// (every 100 inserts). A variable so tests can use a small bound.
var MaxEventsPerVM = 5000

// AddEvent appends an event (setting its Seq) and prunes the VM's oldest
// events beyond MaxEventsPerVM now and then.
func (s *Store) AddEvent(ctx context.Context, e *Event) error {
	if badText([]any{e.VMID}) {
		return ErrBadText
	}
	if badText([]any{e.Type, e.Actor, e.Message}) {
		return ErrBadText
	}
	s.eventMu.Lock()
	defer s.eventMu.Unlock()
	err := s.queryRow(ctx, `INSERT INTO events (vm_id, time, type, actor, message, attrs) VALUES (?,?,?,?,?,?) RETURNING seq`,
		e.VMID, nanos(e.Time), e.Type, e.Actor, e.Message, jsonText(e.Data)).Scan(&e.Seq)
	if err != nil {
		return err
	}
	if e.Seq%100 == 0 {
		s.exec(ctx, `DELETE FROM events WHERE vm_id=? AND seq <= (SELECT seq FROM events WHERE vm_id=? ORDER BY seq DESC LIMIT 1 OFFSET ?)`,
			e.VMID, e.VMID, MaxEventsPerVM)
	}
	return nil
}

// ListEvents returns a VM's events with seq > after, oldest first (at most
// limit); vmID "" lists the events of every VM.
func (s *Store) ListEvents(ctx context.Context, vmID string, after int64, limit int) ([]*Event, error) {
	q, args := `SELECT seq, vm_id, time, type, actor, message, attrs FROM events WHERE vm_id=? AND seq>? ORDER BY seq LIMIT ?`, []any{vmID, after, limit}
	if vmID == "" {
		q, args = `SELECT seq, vm_id, time, type, actor, message, attrs FROM events WHERE seq>? ORDER BY seq LIMIT ?`, []any{after, limit}
	}
	return s.queryEvents(ctx, q, args...)
}

func (s *Store) queryEvents(ctx context.Context, q string, args ...any) ([]*Event, error) {
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Event
	for rows.Next() {
		var e Event
		var at int64
		var attrs string
		if err := rows.Scan(&e.Seq, &e.VMID, &at, &e.Type, &e.Actor, &e.Message, &attrs); err != nil {
			return nil, err
		}
		e.Time = fromNanos(at)
		if err := jsonCols("event", attrs, &e.Data); err != nil {
			return nil, err
		}
		out = append(out, &e)
	}
	return out, rows.Err()
}

// LatestEvents returns a VM's newest limit events, oldest first; vmID ""
// lists the newest of every VM's.
func (s *Store) LatestEvents(ctx context.Context, vmID string, limit int) ([]*Event, error) {
	q, args := `SELECT seq, vm_id, time, type, actor, message, attrs FROM events WHERE vm_id=? ORDER BY seq DESC LIMIT ?`, []any{vmID, limit}
	if vmID == "" {
		q, args = `SELECT seq, vm_id, time, type, actor, message, attrs FROM events ORDER BY seq DESC LIMIT ?`, []any{limit}
	}
	out, err := s.queryEvents(ctx, q, args...)
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, err
}

// DeleteEvents removes a VM's events.
func (s *Store) DeleteEvents(ctx context.Context, vmID string) error {
	_, err := s.exec(ctx, `DELETE FROM events WHERE vm_id=?`, vmID)
	return err
}

// LastEventSeq is the newest event's seq (0 when there is none).
func (s *Store) LastEventSeq(ctx context.Context) (int64, error) {
	var seq int64
	err := s.queryRow(ctx, `SELECT COALESCE(MAX(seq), 0) FROM events`).Scan(&seq)
	return seq, err
}
