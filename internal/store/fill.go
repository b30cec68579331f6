package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
)

// fills run inside a migration's transaction after the step of their
// number: Go code for what SQL cannot say in both dialects.
var fills = map[int]func(ctx context.Context, tx *sql.Tx, pg bool) error{
	6: fillColumns,
}

// fillColumns copies every record's JSON (the data column up to schema 6)
// into the columns migration 6 added, through the same writers the store
// uses, so a record reads the same before and after. A table that later
// migrations give more columns is written with its schema-6 columns only.
func fillColumns(ctx context.Context, tx *sql.Tx, pg bool) error {
	bind := func(q string) string {
		if pg {
			return rebind(q)
		}
		return q
	}
	tables := []struct {
		name, key string
		q         columnQueries
		args      func([]byte) ([]any, error)
	}{
		{"vms", "id", queriesFor("vms", vmCols6), fillRecord(func(v *VM) []any {
			return vmArgs(v)[:strings.Count(vmCols6, ",")+1]
		})},
		{"snapshots", "id", queriesFor("snapshots", snapshotCols6), fillRecord(func(sn *Snapshot) []any {
			return snapshotArgs(sn)[:strings.Count(snapshotCols6, ",")+1]
		})},
		{"networks", "name", networkQ, fillRecord(networkArgs)},
		{"tokens", "id", queriesFor("tokens", tokenCols6), fillRecord(func(t *Token) []any {
			return tokenArgs(t)[:strings.Count(tokenCols6, ",")+1]
		})},
	}
	for _, tb := range tables {
		if err := fillTable(ctx, tx, bind, `SELECT `+tb.key+`, data FROM `+tb.name, tb.q.update, tb.args); err != nil {
			return fmt.Errorf("%s: %w", tb.name, err)
		}
	}
	err := fillTable(ctx, tx, bind, `SELECT seq, data FROM events`, `UPDATE events SET type=?, actor=?, message=?, attrs=? WHERE seq=?`,
		func(b []byte) ([]any, error) {
			var e Event
			err := json.Unmarshal(b, &e)
			return []any{e.Type, e.Actor, e.Message, jsonText(e.Data)}, err
		})
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	err = fillTable(ctx, tx, bind, `SELECT id, data FROM nodes`, `UPDATE nodes SET cpus=?, memory_mib=?, qemu_version=?, machine_type=?, cpu_model=?, accel=? WHERE id=?`,
		func(b []byte) ([]any, error) {
			var n Node
			err := json.Unmarshal(b, &n)
			return []any{n.CPUs, n.MemoryMiB, n.QEMUVersion, n.MachineType, n.CPUModel, n.Accel}, err
		})
	if err != nil {
		return fmt.Errorf("nodes: %w", err)
	}
	return nil
}

// fillRecord decodes one JSON record into a new T and gives its writer's
// arguments but the first (the key, which fillTable adds last).
func fillRecord[T any](args func(*T) []any) func([]byte) ([]any, error) {
	return func(b []byte) ([]any, error) {
		var x T
		if err := json.Unmarshal(b, &x); err != nil {
			return nil, err
		}
		return args(&x)[1:], nil
	}
}

// fillTable reads every (key, data) of sel, then runs update with the
// arguments args makes of the data, and the key last. A record that does
// not decode fails the migration: nothing is dropped unread.
func fillTable(ctx context.Context, tx *sql.Tx, bind func(string) string, sel, update string, args func([]byte) ([]any, error)) error {
	type row struct {
		key  any
		data string
	}
	rows, err := tx.QueryContext(ctx, sel)
	if err != nil {
		return err
	}
	var all []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.key, &r.data); err != nil {
			rows.Close()
			return err
		}
		all = append(all, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	q := bind(update)
	for _, r := range all {
		a, err := args([]byte(r.data))
		if err != nil {
			return fmt.Errorf("record %v: %w", r.key, err)
		}
		if _, err := tx.ExecContext(ctx, q, append(a, r.key)...); err != nil {
			return fmt.Errorf("record %v: %w", r.key, err)
		}
	}
	return nil
}
