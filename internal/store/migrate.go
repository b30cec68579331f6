package store

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations are the schema's numbered steps: migrations[i] takes a database
// from version i to i+1, in one transaction, and PRAGMA user_version records
// the version reached. Never change a step that has been released: add the
// next one, here and in pgMigrations (migrate_pg.go), which keeps the numbers.
var migrations = []string{
	// 1: the tables. A database from before numbered migrations (version 0,
	// its tables already there) passes through unchanged.
	`CREATE TABLE IF NOT EXISTS snapshots (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	created_at INTEGER NOT NULL,
	data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS vms (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	idempotency_key TEXT UNIQUE,
	net_index INTEGER NOT NULL UNIQUE,
	created_at INTEGER NOT NULL,
	data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tokens (
	id TEXT PRIMARY KEY,
	hash TEXT NOT NULL UNIQUE,
	vm_id TEXT NOT NULL,
	expires_at INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS tokens_vm ON tokens (vm_id);
CREATE TABLE IF NOT EXISTS ports (
	vm_id TEXT NOT NULL,
	port INTEGER NOT NULL,
	kind TEXT NOT NULL,
	public INTEGER NOT NULL,
	host_addr TEXT NOT NULL,
	host_port INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	PRIMARY KEY (vm_id, port, kind)
);
CREATE TABLE IF NOT EXISTS domains (
	domain TEXT PRIMARY KEY,
	vm_id TEXT NOT NULL,
	port INTEGER NOT NULL,
	created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS networks (
	name TEXT PRIMARY KEY,
	created_at INTEGER NOT NULL,
	data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
	seq INTEGER PRIMARY KEY AUTOINCREMENT,
	vm_id TEXT NOT NULL,
	time INTEGER NOT NULL,
	data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_vm ON events (vm_id, seq);`,
	// 2: a VM's state as a real column, filled from the JSON record, so
	// that queries (and other stores) need not parse it.
	`ALTER TABLE vms ADD COLUMN state TEXT NOT NULL DEFAULT '';
UPDATE vms SET state = COALESCE(json_extract(data, '$.state'), '');
CREATE INDEX vms_state ON vms(state);`,
	// 3: E2B-compatible sandboxes: what the E2B API keeps about a VM beyond
	// agentvm's own record.
	`CREATE TABLE sandboxes (
	vm_id TEXT PRIMARY KEY,
	template_id TEXT NOT NULL,
	metadata TEXT NOT NULL,
	end_at INTEGER NOT NULL,
	auto_pause INTEGER NOT NULL,
	created_at INTEGER NOT NULL
);`,
	// 4: facts about the database itself: which daemon owns it.
	`CREATE TABLE meta (
	key TEXT PRIMARY KEY,
	value TEXT NOT NULL
);`,
	// 5: cluster nodes and the node each VM runs on (a cluster needs
	// PostgreSQL; SQLite keeps the same schema).
	`CREATE TABLE nodes (
	id TEXT PRIMARY KEY,
	name TEXT NOT NULL UNIQUE,
	address TEXT NOT NULL,
	generation INTEGER NOT NULL,
	lease_expires INTEGER NOT NULL,
	joined_at INTEGER NOT NULL,
	data TEXT NOT NULL
);
ALTER TABLE vms ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
CREATE INDEX vms_node ON vms (node_id);`,
	// 6: a column per field of every record (columns.go): the JSON in
	// data is copied into them by fillColumns.
	`ALTER TABLE vms ADD COLUMN cpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN disk_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN labels TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN env TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN pid INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN template TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN machine_id TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN error TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN started_at INTEGER;
ALTER TABLE vms ADD COLUMN create_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN cold_boot INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN disk TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN layers TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN source TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN layout TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN hot_memory_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN saved_by TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN next_cpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN next_memory_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN resume_on_start INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN idle_timeout_s INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN delete_after_s INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN restart TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN network TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN egress TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN vm_id TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN vm_name TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN cpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN disk_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN env TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN disk TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN layers TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN state_file TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN paused_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN shape_key TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN network TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN egress TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN network_egress TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN hot_memory_mib INTEGER NOT NULL DEFAULT 0;
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
ALTER TABLE nodes ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0;
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
	`ALTER TABLE snapshots ADD COLUMN stored_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE snapshots ADD COLUMN stored_manifest TEXT NOT NULL DEFAULT '';
ALTER TABLE vms ADD COLUMN stored_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE vms ADD COLUMN stored_manifest TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;`,
	// 9: an E2B sandbox's lifecycle: a filesystem-only timeout pause,
	// auto-resume, and the timeout an auto-resume gives it again.
	`ALTER TABLE sandboxes ADD COLUMN pause_disk INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN timeout_ms INTEGER NOT NULL DEFAULT 0;`,
	// 10: PostgreSQL's notifications of writes to the cached tables; this
	// process is SQLite's only writer, so nothing here.
	`SELECT 1;`,
	// 11: an E2B sandbox whose ports answer only with its traffic token.
	`ALTER TABLE sandboxes ADD COLUMN private_traffic INTEGER NOT NULL DEFAULT 0;`,
	// 12: templates built from a Dockerfile, and the cache of their steps
	// (each a snapshot keyed by its parent and its exact inputs).
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
	build_ms INTEGER NOT NULL,
	created_at INTEGER NOT NULL,
	built_at INTEGER NOT NULL
);
CREATE TABLE template_layers (
	key TEXT PRIMARY KEY,
	snapshot_id TEXT NOT NULL,
	parent TEXT NOT NULL,
	step TEXT NOT NULL,
	created_at INTEGER NOT NULL
);`,
	// 13: hosted git repositories, their webhooks, the VMs that push to
	// them without a credential, and repository tokens.
	`CREATE TABLE repos (
	name TEXT PRIMARY KEY,
	hooks TEXT NOT NULL,
	created_at INTEGER NOT NULL
);
CREATE TABLE repo_vms (
	vm_id TEXT PRIMARY KEY,
	repo TEXT NOT NULL
);
ALTER TABLE tokens ADD COLUMN repo TEXT NOT NULL DEFAULT '';
ALTER TABLE tokens ADD COLUMN branches TEXT NOT NULL DEFAULT '';`,
}

// migrate brings db to the newest schema version, and refuses a database
// made by a newer agentvm (its records may hold what this one cannot keep).
func migrate(ctx context.Context, db *sql.DB) error {
	var have int
	if err := db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&have); err != nil {
		return err
	}
	if have > len(migrations) {
		return fmt.Errorf("the database is at schema version %d, this agentvm knows %d: it was used by a newer agentvm; run that one", have, len(migrations))
	}
	for v := have; v < len(migrations); v++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			tx.Rollback()
			return fmt.Errorf("schema migration %d: %w", v+1, err)
		}
		if fill := fills[v+1]; fill != nil {
			if err := fill(ctx, tx, false); err != nil {
				tx.Rollback()
				return fmt.Errorf("schema migration %d: %w", v+1, err)
			}
		}
		// PRAGMA takes no parameters; v+1 is ours.
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, v+1)); err != nil {
			tx.Rollback()
			return fmt.Errorf("schema migration %d: %w", v+1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("schema migration %d: %w", v+1, err)
		}
	}
	return nil
}
