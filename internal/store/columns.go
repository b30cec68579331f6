package store

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Records are rows with a column per field (migration 6). A field that is
// itself structured (labels, a layer list, an egress policy, a SavedBy) is
// one text column holding its JSON, "" for none; times are Unix
// nanoseconds.

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

// jsonText is v's JSON for a structured column, "" for a nil value.
func jsonText(v any) string {
	b, _ := json.Marshal(v)
	if string(b) == "null" {
		return ""
	}
	return string(b)
}

// jsonCols decodes structured columns into their fields: pairs of the
// column's text and a pointer to the field.
func jsonCols(what string, pairs ...any) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		text := pairs[i].(string)
		if text == "" {
			continue
		}
		if err := json.Unmarshal([]byte(text), pairs[i+1]); err != nil {
			return fmt.Errorf("decode %s: %w", what, err)
		}
	}
	return nil
}

// nanos is t in Unix nanoseconds; the zero time is 0 (its UnixNano is
// out of range) and reads back as the zero time.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func nullNanos(t *time.Time) sql.NullInt64 {
	if t == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: nanos(*t), Valid: true}
}

func fromNullNanos(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromNanos(n.Int64)
	return &t
}

// columnQueries are the insert, the update by key and the select list of
// a table whose first column is its key.
type columnQueries struct {
	insert, update, list string
}

func queriesFor(table, cols string) columnQueries {
	names := strings.Split(cols, ", ")
	sets := make([]string, 0, len(names)-1)
	for _, n := range names[1:] {
		sets = append(sets, n+"=?")
	}
	return columnQueries{
		insert: `INSERT INTO ` + table + ` (` + cols + `) VALUES (` + strings.TrimSuffix(strings.Repeat("?,", len(names)), ",") + `)`,
		update: `UPDATE ` + table + ` SET ` + strings.Join(sets, ", ") + ` WHERE ` + names[0] + `=?`,
		list:   `SELECT ` + cols + ` FROM ` + table,
	}
}

// updateArgs moves the key (the first argument) to the end, for update.
func updateArgs(args []any) []any { return append(args[1:], args[0]) }
