package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// pgMigrations are PostgreSQL's schema steps, numbered as SQLite's
// (migrations in migrate.go): step i of both makes the same tables, in each
// one's types, so a schema version means the same schema in either. A new
// step is added to both lists (TestMigrationListsMatch checks the counts).
// Records stay JSON in text columns, as in SQLite: the store reads them whole.
var pgMigrations = []string{
	// 1: the tables.
	`CREATE TABLE snapshots (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	created_at BIGINT NOT NULL,
	data TEXT NOT NULL
);
CREATE TABLE vms (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	idempotency_key TEXT UNIQUE,
	net_index INTEGER NOT NULL UNIQUE,
	created_at BIGINT NOT NULL,
	data TEXT NOT NULL
);
CREATE TABLE tokens (
	id TEXT PRIMARY KEY,
	hash TEXT NOT NULL UNIQUE,
	vm_id TEXT NOT NULL,
	expires_at BIGINT NOT NULL,
	created_at BIGINT NOT NULL,
	data TEXT NOT NULL
);
CREATE INDEX tokens_vm ON tokens (vm_id);
CREATE TABLE ports (
	vm_id TEXT NOT NULL,
	port INTEGER NOT NULL,
	kind TEXT NOT NULL,
	public BOOLEAN NOT NULL,
	host_addr TEXT NOT NULL,
	host_port INTEGER NOT NULL,
	created_at BIGINT NOT NULL,
	PRIMARY KEY (vm_id, port, kind)
);
CREATE TABLE domains (
	domain TEXT PRIMARY KEY,
	vm_id TEXT NOT NULL,
	port INTEGER NOT NULL,
	created_at BIGINT NOT NULL
);
CREATE TABLE networks (
	name TEXT PRIMARY KEY,
	created_at BIGINT NOT NULL,
	data TEXT NOT NULL
);
CREATE TABLE events (
	seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	vm_id TEXT NOT NULL,
	time BIGINT NOT NULL,
	data TEXT NOT NULL
);
CREATE INDEX events_vm ON events (vm_id, seq);`,
	// 2: a VM's state as a real column.
	`ALTER TABLE vms ADD COLUMN state TEXT NOT NULL DEFAULT '';
UPDATE vms SET state = COALESCE(data::jsonb->>'state', '');
CREATE INDEX vms_state ON vms (state);`,
	// 3: E2B-compatible sandboxes.
	`CREATE TABLE sandboxes (
	vm_id TEXT PRIMARY KEY,
	template_id TEXT NOT NULL,
	metadata TEXT NOT NULL,
	end_at BIGINT NOT NULL,
	auto_pause BOOLEAN NOT NULL,
	created_at BIGINT NOT NULL
);`,
	// 4: facts about the database itself: which daemon owns it.
	`CREATE TABLE meta (
	key TEXT PRIMARY KEY,
	value TEXT NOT NULL
);`,
	// 5: cluster nodes, their leases judged by the database's clock, and
	// the node each VM runs on.
	`CREATE TABLE nodes (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	address TEXT NOT NULL,
	generation BIGINT NOT NULL,
	lease_expires TIMESTAMPTZ NOT NULL,
	joined_at TIMESTAMPTZ NOT NULL,
	data TEXT NOT NULL
);
ALTER TABLE vms ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
CREATE INDEX vms_node ON vms (node_id);`,
}

// pgMigrateLock is the advisory lock key ("agentvm" in ASCII) that
// serialises the migrations of daemons sharing one database.
const pgMigrateLock = 0x6167656e74766d

// migratePostgres brings db to the newest schema version in one
// transaction under an advisory lock, so that daemons starting together
// migrate once, and refuses a database from a newer agentvm. The version
// is kept in the one-row table schema_version.
func migratePostgres(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(pgMigrateLock)); err != nil {
		return fmt.Errorf("schema migration lock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
	one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
	version INTEGER NOT NULL
)`); err != nil {
		return fmt.Errorf("schema version table: %w", err)
	}
	var have int
	err = tx.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&have)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("schema version: %w", err)
	}
	if have > len(pgMigrations) {
		return fmt.Errorf("the database is at schema version %d, this agentvm knows %d: it was used by a newer agentvm; run that one", have, len(pgMigrations))
	}
	if have == len(pgMigrations) {
		return tx.Commit()
	}
	for v := have; v < len(pgMigrations); v++ {
		if _, err := tx.ExecContext(ctx, pgMigrations[v]); err != nil {
			return fmt.Errorf("schema migration %d: %w", v+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_version (one, version) VALUES (TRUE, $1)
ON CONFLICT (one) DO UPDATE SET version = excluded.version`, len(pgMigrations)); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("schema migration: %w", err)
	}
	return nil
}
