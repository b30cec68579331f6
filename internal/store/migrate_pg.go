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
	// 6: a column per field of every record (columns.go): the JSON in
	// data is copied into them by fillColumns.
	`ALTER TABLE vms ADD COLUMN cpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN memory_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN disk_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN labels TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN env TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN pid INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN template TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN machine_id TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN error TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN started_at BIGINT;
ALTER TABLE vms ADD COLUMN create_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN cold_boot BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE vms ADD COLUMN disk TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN layers TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN source TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN layout TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN hot_memory_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN saved_by TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN next_cpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN next_memory_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN resume_on_start BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE vms ADD COLUMN idle_timeout_s BIGINT NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN delete_after_s BIGINT NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN restart TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN network TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN egress TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN vm_id TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN vm_name TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN cpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN memory_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN disk_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN env TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN disk TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN layers TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN state_file TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN paused_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN shape_key TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN network TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN egress TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN network_egress TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN hot_memory_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN saved_by TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
ALTER TABLE networks ADD COLUMN egress TEXT NOT NULL DEFAULT '';
ALTER TABLE tokens ADD COLUMN allow TEXT NOT NULL DEFAULT '';
ALTER TABLE tokens ADD COLUMN user_name TEXT NOT NULL DEFAULT '';
ALTER TABLE tokens ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE tokens ADD COLUMN ssh_keys TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN type TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN actor TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN message TEXT NOT NULL DEFAULT '';
ALTER TABLE events ADD COLUMN attrs TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN cpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN memory_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN qemu_version TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN machine_type TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN cpu_model TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN accel TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN peer_address TEXT NOT NULL DEFAULT '';`,
	// 7: the JSON records, now in columns, go.
	`ALTER TABLE vms DROP COLUMN data;
ALTER TABLE snapshots DROP COLUMN data;
ALTER TABLE networks DROP COLUMN data;
ALTER TABLE tokens DROP COLUMN data;
ALTER TABLE events DROP COLUMN data;
ALTER TABLE nodes DROP COLUMN data;`,
	// 8: snapshots and suspended VMs kept in the object store; draining nodes.
	`ALTER TABLE snapshots ADD COLUMN stored_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN stored_manifest TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN stored_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN stored_manifest TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN draining BOOLEAN NOT NULL DEFAULT false;`,
	// 9: an E2B sandbox's lifecycle: a filesystem-only timeout pause,
	// auto-resume, and the timeout an auto-resume gives it again.
	`ALTER TABLE sandboxes ADD COLUMN pause_disk BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE sandboxes ADD COLUMN auto_resume BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE sandboxes ADD COLUMN timeout_ms BIGINT NOT NULL DEFAULT 0;`,
	// 10: every statement that writes the tables the read cache holds
	// notifies every listening node at its commit (cache.go): not lost
	// between the write and a notify of the writer's own, never sent for a
	// write rolled back, whoever writes.
	`CREATE FUNCTION agentvm_store_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_notify('` + NotifyChannel + `', '` + cacheNotice + `');
	RETURN NULL;
END
$$;
CREATE TRIGGER vms_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON vms
	FOR EACH STATEMENT EXECUTE FUNCTION agentvm_store_changed();
CREATE TRIGGER sandboxes_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON sandboxes
	FOR EACH STATEMENT EXECUTE FUNCTION agentvm_store_changed();
CREATE TRIGGER ports_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON ports
	FOR EACH STATEMENT EXECUTE FUNCTION agentvm_store_changed();`,
	// 11: an E2B sandbox whose ports answer only with its traffic token.
	`ALTER TABLE sandboxes ADD COLUMN private_traffic BOOLEAN NOT NULL DEFAULT false;`,
	// 12: templates built from a Dockerfile, and the cache of their steps.
	`CREATE TABLE templates (
	name TEXT PRIMARY KEY,
	snapshot_id TEXT NOT NULL,
	base TEXT NOT NULL,
	dockerfile TEXT NOT NULL,
	layers TEXT NOT NULL,
	steps TEXT NOT NULL,
	start_cmd TEXT NOT NULL,
	ready TEXT NOT NULL,
	env TEXT NOT NULL,
	workdir TEXT NOT NULL,
	user_name TEXT NOT NULL,
	expose TEXT NOT NULL,
	build_log TEXT NOT NULL,
	build_ms BIGINT NOT NULL,
	created_at BIGINT NOT NULL,
	built_at BIGINT NOT NULL
);
CREATE TABLE template_layers (
	key TEXT PRIMARY KEY,
	snapshot_id TEXT NOT NULL,
	parent TEXT NOT NULL,
	step TEXT NOT NULL,
	created_at BIGINT NOT NULL
);`,
	// 13: hosted git repositories (see migrate.go).
	`CREATE TABLE repos (
	name TEXT PRIMARY KEY,
	hooks TEXT NOT NULL,
	created_at BIGINT NOT NULL
);
CREATE TABLE repo_vms (
	vm_id TEXT PRIMARY KEY,
	repo TEXT NOT NULL
);
ALTER TABLE tokens ADD COLUMN repo TEXT NOT NULL DEFAULT '';
ALTER TABLE tokens ADD COLUMN branches TEXT NOT NULL DEFAULT '';`,
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
	// Nodes running an older agentvm would read and write the old schema
	// under a newer one: a cluster is upgraded stopped.
	if have >= 5 { // the nodes table exists
		var live int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM nodes WHERE lease_expires > now()`).Scan(&live); err != nil {
			return fmt.Errorf("schema migration: %w", err)
		}
		if live > 0 {
			return fmt.Errorf("the database is at schema version %d and this agentvm brings it to %d, but %d cluster node(s) hold a live lease: stop every node of the cluster (or wait for the lease of one that died to run out), then start the upgraded ones", have, len(pgMigrations), live)
		}
	}
	for v := have; v < len(pgMigrations); v++ {
		if _, err := tx.ExecContext(ctx, pgMigrations[v]); err != nil {
			return fmt.Errorf("schema migration %d: %w", v+1, err)
		}
		if fill := fills[v+1]; fill != nil {
			if err := fill(ctx, tx, true); err != nil {
				return fmt.Errorf("schema migration %d: %w", v+1, err)
			}
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
