package store

import (
	"context"
	"errors"
	"fmt"
)

// ErrOwned means the database already belongs to another daemon.
var ErrOwned = errors.New("the database belongs to another agentvm")

// ClaimOwner records owner (the identity of a daemon's data dir) as the one
// daemon using this database, or refuses with ErrOwned when another data
// dir's daemon already did. VM records name files in their daemon's data
// dir and VMs run on its host: two daemons sharing one store would each
// take the other's VMs for crashed ones. Sharing one database between hosts
// is the multi-node mode's (leases and placement), not this.
func (s *Store) ClaimOwner(ctx context.Context, owner string) error {
	if owner == "" {
		return errors.New("empty owner")
	}
	if _, err := s.exec(ctx, `INSERT INTO meta (key, value) VALUES ('owner', ?) ON CONFLICT (key) DO NOTHING`, owner); err != nil {
		return err
	}
	var have string
	if err := s.queryRow(ctx, `SELECT value FROM meta WHERE key = 'owner'`).Scan(&have); err != nil {
		return err
	}
	if have != owner {
		return fmt.Errorf("%w (data dir %s; this one is %s): give each agentvm its own database", ErrOwned, have, owner)
	}
	return nil
}

// MetaOnce records value under key unless the key has a value already, and
// returns the value the key has: of all the daemons that call it with
// their own value, every one gets the first's.
func (s *Store) MetaOnce(ctx context.Context, key, value string) (string, error) {
	if key == "" || value == "" {
		return "", errors.New("empty meta key or value")
	}
	if _, err := s.exec(ctx, `INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`, key, value); err != nil {
		return "", err
	}
	var have string
	err := s.queryRow(ctx, `SELECT value FROM meta WHERE key = ?`, key).Scan(&have)
	return have, err
}
