package store

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// Network is a private network.
type Network struct {
	Name      string    `json:"name"`
	Egress    *Egress   `json:"egress,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// networkCols are the networks table's columns, the key first.
const networkCols = `name, egress, created_at`

var networkQ = queriesFor("networks", networkCols)

func networkArgs(n *Network) []any { return []any{n.Name, jsonText(n.Egress), nanos(n.CreatedAt)} }

func scanNetwork(sc scanner) (*Network, error) {
	var n Network
	var egress string
	var created int64
	if err := sc.Scan(&n.Name, &egress, &created); err != nil {
		return nil, err
	}
	n.CreatedAt = fromNanos(created)
	return &n, jsonCols("network "+n.Name, egress, &n.Egress)
}

// CreateNetwork inserts a network; ErrConflict if the name is taken.
func (s *Store) CreateNetwork(ctx context.Context, n *Network) error {
	_, err := s.exec(ctx, networkQ.insert, networkArgs(n)...)
	return mapErr(err)
}

// UpdateNetwork replaces a network's record.
func (s *Store) UpdateNetwork(ctx context.Context, n *Network) error {
	r, err := s.exec(ctx, networkQ.update, updateArgs(networkArgs(n))...)
	if err != nil {
		return err
	}
	if k, _ := r.RowsAffected(); k == 0 {
		return ErrNotFound
	}
	return nil
}

// GetNetwork finds a network by name.
func (s *Store) GetNetwork(ctx context.Context, name string) (*Network, error) {
	n, err := scanNetwork(s.queryRow(ctx, networkQ.list+` WHERE name=?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	return n, err
}

// ListNetworks returns every network, oldest first.
func (s *Store) ListNetworks(ctx context.Context) ([]*Network, error) {
	rows, err := s.query(ctx, networkQ.list+` ORDER BY created_at, name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Network
	for rows.Next() {
		n, err := scanNetwork(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// DeleteNetwork removes a network record; ErrNotFound if unknown.
func (s *Store) DeleteNetwork(ctx context.Context, name string) error {
	r, err := s.exec(ctx, `DELETE FROM networks WHERE name=?`, name)
	if err != nil {
		return err
	}
	if k, _ := r.RowsAffected(); k == 0 {
		return ErrNotFound
	}
	return nil
}
