// Package store persists agentvm's metadata (VMs, snapshots, tokens, port
// exposures and domains, private networks, events, cluster nodes) in SQLite
// or PostgreSQL: rows with a column per field (columns.go), numbered schema
// migrations (migrate.go, migrate_pg.go), and record types of its own: it
// imports nothing of the public API.
package store

import (
	"database/sql"
	"errors"
	"sync"
	"time"
)

var (
	// ErrNotFound means no row matched.
	ErrNotFound = errors.New("not found")
	// ErrConflict means a unique field (name, idempotency key) is taken.
	ErrConflict = errors.New("conflict")
	// ErrUnreachable means the database took no connection for as long as
	// a statement waits (retryBudget): it is down, restarting or cut off.
	ErrUnreachable = errors.New("the database is unreachable")
)

// Store is the metadata store, in SQLite or PostgreSQL (backend.go).
type Store struct {
	db *sql.DB
	pg bool // PostgreSQL: $n placeholders
	// retryFor is how long a statement waits for a database that takes no
	// connection (retryBudget).
	retryFor time.Duration
	// eventMu orders event inserts: a follower reads events by increasing
	// seq, and two PostgreSQL transactions could commit their sequence
	// numbers out of order (SQLite has one writer anyway).
	eventMu sync.Mutex
	// cache serves the reads that route requests (cache.go).
	cache *readCache
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}
