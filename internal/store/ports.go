package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// Port is a port of a VM exposed by the server: an HTTP preview (public or
// token-only) or a raw TCP listener on the host.
type Port struct {
	VMID      string    `json:"vm_id"`
	Port      int       `json:"port"`
	Kind      string    `json:"kind"`   // "http" or "tcp"
	Public    bool      `json:"public"` // http: no token needed
	HostAddr  string    `json:"host_addr,omitempty"`
	HostPort  int       `json:"host_port,omitempty"` // tcp: the host listener
	CreatedAt time.Time `json:"created_at"`
}

// Domain maps a custom host name to a VM port.
type Domain struct {
	Domain    string    `json:"domain"`
	VMID      string    `json:"vm_id"`
	Port      int       `json:"port"`
	CreatedAt time.Time `json:"created_at"`
}

// PutPort inserts or replaces an exposure.
func (s *Store) PutPort(ctx context.Context, p *Port) error {
	_, err := s.exec(ctx, `INSERT INTO ports (vm_id, port, kind, public, host_addr, host_port, created_at) VALUES (?,?,?,?,?,?,?)
		ON CONFLICT (vm_id, port, kind) DO UPDATE SET public=excluded.public, host_addr=excluded.host_addr,
		host_port=excluded.host_port, created_at=excluded.created_at`,
		p.VMID, p.Port, p.Kind, p.Public, p.HostAddr, p.HostPort, p.CreatedAt.UnixNano())
	return mapErr(err)
}

// DeletePort removes an exposure; ErrNotFound if there was none.
func (s *Store) DeletePort(ctx context.Context, vmID string, port int, kind string) error {
	r, err := s.exec(ctx, `DELETE FROM ports WHERE vm_id=? AND port=? AND kind=?`, vmID, port, kind)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// ListPorts returns the exposures of one VM, or of all VMs when vmID is "".
func (s *Store) ListPorts(ctx context.Context, vmID string) ([]*Port, error) {
	gen, cached := s.cache.begin()
	cached = cached && vmID != ""
	if cached {
		if ps, ok := s.cache.portsOf(vmID); ok {
			return ps, nil
		}
	}
	ps, err := s.listPorts(ctx, vmID)
	if err == nil && cached && (len(ps) > 0 || s.vmExists(ctx, vmID)) {
		s.cache.putPorts(gen, vmID, ps)
	}
	return ps, err
}

func (s *Store) listPorts(ctx context.Context, vmID string) ([]*Port, error) {
	q, args := `SELECT vm_id, port, kind, public, host_addr, host_port, created_at FROM ports`, []any{}
	if vmID != "" {
		q += ` WHERE vm_id=?`
		args = append(args, vmID)
	}
	rows, err := s.query(ctx, q+` ORDER BY vm_id, port, kind`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Port
	for rows.Next() {
		var p Port
		var ts int64
		if err := rows.Scan(&p.VMID, &p.Port, &p.Kind, &p.Public, &p.HostAddr, &p.HostPort, &ts); err != nil {
			return nil, err
		}
		p.CreatedAt = time.Unix(0, ts).UTC()
		out = append(out, &p)
	}
	return out, rows.Err()
}

// DeletePorts removes every exposure and domain of a VM.
func (s *Store) DeletePorts(ctx context.Context, vmID string) error {
	if _, err := s.exec(ctx, `DELETE FROM ports WHERE vm_id=?`, vmID); err != nil {
		return err
	}
	_, err := s.exec(ctx, `DELETE FROM domains WHERE vm_id=?`, vmID)
	return err
}

// PutDomain maps a domain; ErrConflict if it maps to another VM already.
func (s *Store) PutDomain(ctx context.Context, d *Domain) error {
	_, err := s.exec(ctx, `INSERT INTO domains (domain, vm_id, port, created_at) VALUES (?,?,?,?)
		ON CONFLICT(domain) DO UPDATE SET port=excluded.port WHERE domains.vm_id=excluded.vm_id`,
		d.Domain, d.VMID, d.Port, d.CreatedAt.UnixNano())
	if err != nil {
		return mapErr(err)
	}
	got, err := s.GetDomain(ctx, d.Domain)
	if err != nil {
		return err
	}
	if got.VMID != d.VMID {
		return ErrConflict
	}
	return nil
}

// GetDomain finds a custom domain.
func (s *Store) GetDomain(ctx context.Context, domain string) (*Domain, error) {
	var d Domain
	var ts int64
	err := s.queryRow(ctx, `SELECT domain, vm_id, port, created_at FROM domains WHERE domain=?`, domain).Scan(&d.Domain, &d.VMID, &d.Port, &ts)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, ErrNotFound
		}
		return nil, err
	}
	d.CreatedAt = time.Unix(0, ts).UTC()
	return &d, nil
}

// ListDomains returns the domains of one VM (all when vmID is "").
func (s *Store) ListDomains(ctx context.Context, vmID string) ([]*Domain, error) {
	q, args := `SELECT domain, vm_id, port, created_at FROM domains`, []any{}
	if vmID != "" {
		q += ` WHERE vm_id=?`
		args = append(args, vmID)
	}
	rows, err := s.query(ctx, q+` ORDER BY domain`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Domain
	for rows.Next() {
		var d Domain
		var ts int64
		if err := rows.Scan(&d.Domain, &d.VMID, &d.Port, &ts); err != nil {
			return nil, err
		}
		d.CreatedAt = time.Unix(0, ts).UTC()
		out = append(out, &d)
	}
	return out, rows.Err()
}

// DeleteDomain removes a domain; ErrNotFound if unknown.
func (s *Store) DeleteDomain(ctx context.Context, domain string) error {
	r, err := s.exec(ctx, `DELETE FROM domains WHERE domain=?`, domain)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}
