package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/agentvm/agentvm/api"
)

// Network is a private network.
type Network struct {
	Name      string      `json:"name"`
	Egress    *api.Egress `json:"egress,omitempty"`
	CreatedAt time.Time   `json:"created_at"`
}

// CreateNetwork inserts a network; ErrConflict if the name is taken.
func (s *Store) CreateNetwork(ctx context.Context, n *Network) error {
	data, _ := json.Marshal(n)
	_, err := s.exec(ctx, `INSERT INTO networks (name, created_at, data) VALUES (?,?,?)`, n.Name, n.CreatedAt.UnixNano(), string(data))
	return mapErr(err)
}

// UpdateNetwork replaces a network's record.
func (s *Store) UpdateNetwork(ctx context.Context, n *Network) error {
	data, _ := json.Marshal(n)
	r, err := s.exec(ctx, `UPDATE networks SET data=? WHERE name=?`, string(data), n.Name)
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
	var data string
	err := s.queryRow(ctx, `SELECT data FROM networks WHERE name=?`, name).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	var n Network
	return &n, json.Unmarshal([]byte(data), &n)
}

// ListNetworks returns every network, oldest first.
func (s *Store) ListNetworks(ctx context.Context) ([]*Network, error) {
	rows, err := s.query(ctx, `SELECT data FROM networks ORDER BY created_at, name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Network
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		var n Network
		if err := json.Unmarshal([]byte(data), &n); err != nil {
			return nil, err
		}
		out = append(out, &n)
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
