package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"
)

// Sandbox is what the E2B-compatible API keeps about one of its VMs.
type Sandbox struct {
	VMID       string
	TemplateID string
	Metadata   map[string]string
	EndAt      time.Time // when the timeout deletes (or, with AutoPause, suspends) it; zero: never
	AutoPause  bool
	// PauseDisk makes the timeout's pause filesystem-only (agentvm's
	// stop: disk kept, memory and processes not); false keeps memory.
	PauseDisk bool
	// AutoResume wakes the sandbox, when paused, on the next request to
	// it (its preview or envd), for at least another Timeout.
	AutoResume bool
	// PrivateTraffic: its ports answer only requests that carry its traffic
	// access token (E2B's network.allowPublicTraffic: false).
	PrivateTraffic bool
	Timeout        time.Duration // the life it was last given; zero: none
	CreatedAt      time.Time
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMs(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// PutSandbox inserts or replaces a sandbox record.
func (s *Store) PutSandbox(ctx context.Context, sb *Sandbox) error {
	md, err := json.Marshal(sb.Metadata)
	if err != nil {
		return err
	}
	_, err = s.exec(ctx, `INSERT INTO sandboxes (vm_id, template_id, metadata, end_at, auto_pause, pause_disk, auto_resume, private_traffic, timeout_ms, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)
		ON CONFLICT (vm_id) DO UPDATE SET template_id=excluded.template_id, metadata=excluded.metadata,
		end_at=excluded.end_at, auto_pause=excluded.auto_pause, pause_disk=excluded.pause_disk,
		auto_resume=excluded.auto_resume, private_traffic=excluded.private_traffic, timeout_ms=excluded.timeout_ms, created_at=excluded.created_at`,
		sb.VMID, sb.TemplateID, string(md), unixMs(sb.EndAt), sb.AutoPause, sb.PauseDisk, sb.AutoResume, sb.PrivateTraffic, sb.Timeout.Milliseconds(), sb.CreatedAt.UnixNano())
	return err
}

// SetSandboxEnd changes a sandbox's end time; ErrNotFound if there is no record.
func (s *Store) SetSandboxEnd(ctx context.Context, vmID string, end time.Time) error {
	r, err := s.exec(ctx, `UPDATE sandboxes SET end_at=? WHERE vm_id=?`, unixMs(end), vmID)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// SetSandboxTimeout gives a sandbox a new life: it ends at end, and an
// auto-resume later gives it timeout again; ErrNotFound if there is no record.
func (s *Store) SetSandboxTimeout(ctx context.Context, vmID string, end time.Time, timeout time.Duration) error {
	r, err := s.exec(ctx, `UPDATE sandboxes SET end_at=?, timeout_ms=? WHERE vm_id=?`, unixMs(end), timeout.Milliseconds(), vmID)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// DeleteSandbox removes a sandbox record (no error if there was none).
func (s *Store) DeleteSandbox(ctx context.Context, vmID string) error {
	_, err := s.exec(ctx, `DELETE FROM sandboxes WHERE vm_id=?`, vmID)
	return err
}

const sandboxCols = `vm_id, template_id, metadata, end_at, auto_pause, pause_disk, auto_resume, private_traffic, timeout_ms, created_at`

func scanSandbox(row interface{ Scan(...any) error }) (*Sandbox, error) {
	var sb Sandbox
	var md string
	var end, timeout, created int64
	if err := row.Scan(&sb.VMID, &sb.TemplateID, &md, &end, &sb.AutoPause, &sb.PauseDisk, &sb.AutoResume, &sb.PrivateTraffic, &timeout, &created); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(md), &sb.Metadata); err != nil {
		return nil, err
	}
	sb.EndAt, sb.CreatedAt = fromMs(end), time.Unix(0, created).UTC()
	sb.Timeout = time.Duration(timeout) * time.Millisecond
	return &sb, nil
}

// GetSandbox returns a sandbox record; ErrNotFound if there is none (from
// the read cache when it may: for routing; see GetSandboxFresh).
func (s *Store) GetSandbox(ctx context.Context, vmID string) (*Sandbox, error) {
	return s.getSandbox(ctx, vmID, true)
}

// GetSandboxFresh is GetSandbox from the database (on PostgreSQL; on SQLite the
// cache is exact and serves it too): for what decides the
// sandbox's fate (its end), which must see another node's write at once.
func (s *Store) GetSandboxFresh(ctx context.Context, vmID string) (*Sandbox, error) {
	return s.getSandbox(ctx, vmID, false)
}

func (s *Store) getSandbox(ctx context.Context, vmID string, fromCache bool) (*Sandbox, error) {
	gen, cached := s.cache.begin()
	if cached && (fromCache || !s.pg) { // on SQLite, this process the only writer, the cache is exact
		if sb, known := s.cache.sandbox(vmID); known && sb == nil {
			return nil, ErrNotFound
		} else if known {
			return sb, nil
		}
	}
	sb, err := scanSandbox(s.queryRow(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE vm_id=?`, vmID))
	if errors.Is(err, sql.ErrNoRows) {
		sb, err = nil, ErrNotFound
	}
	// Whether a VM is a sandbox is cached for VMs that exist (a name
	// that does not exist must not grow the cache).
	if cached && (err == nil || errors.Is(err, ErrNotFound) && s.vmExists(ctx, vmID)) {
		s.cache.putSandbox(gen, vmID, sb)
	}
	return sb, err
}

// ListSandboxes returns every sandbox record, newest first.
func (s *Store) ListSandboxes(ctx context.Context) ([]*Sandbox, error) {
	rows, err := s.query(ctx, `SELECT `+sandboxCols+` FROM sandboxes ORDER BY created_at DESC, vm_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}
