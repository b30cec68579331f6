package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"
)

// The two backends share every query, written once with ? placeholders
// and the SQL both speak (ON CONFLICT upserts, RETURNING); what differs is
// this seam: placeholders ($n for PostgreSQL), the unique-violation check
// (mapErr), the schema's column types and how the schema version is kept
// (migrate.go, migrate_pg.go).

// Open opens (creating or migrating if needed) the store named by dsn:
// postgres:// or postgresql:// is a PostgreSQL database, sqlite:PATH or a
// plain path a SQLite file.
func Open(dsn string) (*Store, error) { return OpenContext(context.Background(), dsn) }

// OpenContext is Open with a context for the connection and the migrations.
func OpenContext(ctx context.Context, dsn string) (*Store, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return openPostgres(ctx, dsn)
	case strings.HasPrefix(dsn, "sqlite:"):
		path := strings.TrimPrefix(strings.TrimPrefix(dsn, "sqlite:"), "//")
		if path == "" {
			return nil, errors.New("store sqlite: no file path (want sqlite:PATH)")
		}
		return openSQLite(ctx, path)
	case dsn == "":
		return nil, errors.New("store: no database path or URL")
	}
	if scheme, _, ok := strings.Cut(dsn, "://"); ok && !strings.ContainsAny(scheme, "/.") {
		return nil, fmt.Errorf("store %s: unknown kind of database %q (want a file path, sqlite:PATH or postgres://...)", Redact(dsn), scheme)
	}
	return openSQLite(ctx, dsn)
}

func openSQLite(ctx context.Context, path string) (*Store, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	if err := migrate(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("database %s: %w", path, err)
	}
	return &Store{db: db, cache: newReadCache(true)}, nil
}

// pgConnectTimeout bounds each connection attempt when the URL sets no
// connect_timeout, so that an unreachable server fails the start-up.
const pgConnectTimeout = 15 * time.Second

func openPostgres(ctx context.Context, dsn string) (*Store, error) {
	where := Redact(dsn)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		// pgx's own message redacts the password.
		return nil, fmt.Errorf("store %s: %w", where, err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = pgConnectTimeout
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(4)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: cannot connect to PostgreSQL: %w", where, err)
	}
	if err := migratePostgres(ctx, db); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: %w", where, err)
	}
	return &Store{db: db, pg: true, retryFor: retryBudget, cache: newReadCache(false)}, nil
}

// Redact is dsn fit for messages and logs: a URL's password (in its user
// part or a password= parameter) is replaced; a path is kept.
func Redact(dsn string) string {
	if !strings.Contains(dsn, "://") {
		return dsn
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return redactUnparsed(dsn)
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

// redactUnparsed blanks the password of a URL that url.Parse refused (a
// bad port, say), which an error message still shows.
func redactUnparsed(dsn string) string {
	scheme, rest, _ := strings.Cut(dsn, "://")
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	auth, tail := rest[:end], rest[end:]
	if at := strings.LastIndex(auth, "@"); at >= 0 {
		if user, _, ok := strings.Cut(auth[:at], ":"); ok {
			auth = user + ":xxxxx" + auth[at:]
		}
	}
	if i := strings.Index(tail, "password="); i >= 0 {
		j := strings.IndexByte(tail[i:], '&')
		if j < 0 {
			j = len(tail) - i
		}
		tail = tail[:i] + "password=xxxxx" + tail[i+j:]
	}
	return scheme + "://" + auth + tail
}

// Backend names the kind of database: "sqlite" or "postgres".
func (s *Store) Backend() string {
	if s.pg {
		return "postgres"
	}
	return "sqlite"
}

// rebind turns the ? placeholders of a query into PostgreSQL's $1, $2...
// (no query of this package has a ? in a literal).
func rebind(q string) string {
	var b strings.Builder
	b.Grow(len(q) + 8)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

func (s *Store) bind(q string) string {
	if s.pg {
		return rebind(q)
	}
	return q
}

// ErrBadText refuses a write of a text value that PostgreSQL's text cannot
// hold: a NUL byte or invalid UTF-8. SQLite is held to the same, so that
// both backends keep the same rows.
var ErrBadText = errors.New("text with a NUL byte or invalid UTF-8 cannot be stored")

// badText reports whether a text argument is one ErrBadText refuses.
func badText(args []any) bool {
	for _, a := range args {
		if v, ok := a.(string); ok && (strings.IndexByte(v, 0) >= 0 || !utf8.ValidString(v)) {
			return true
		}
	}
	return false
}

// findsNothing is true of a read or delete by a value no row can hold (as
// writes refuse them) on PostgreSQL, which would fail the query instead
// of matching nothing.
func (s *Store) findsNothing(q string, args []any) bool {
	if !s.pg || !badText(args) {
		return false
	}
	verb, _, _ := strings.Cut(strings.TrimSpace(q), " ")
	return verb == "SELECT" || verb == "DELETE"
}

const noRows = `SELECT 1 WHERE false`

func (s *Store) exec(ctx context.Context, q string, args ...any) (res sql.Result, err error) {
	if s.findsNothing(q, args) {
		return driver.RowsAffected(0), nil
	}
	if verb, _, _ := strings.Cut(strings.TrimSpace(q), " "); verb != "DELETE" && badText(args) {
		return nil, ErrBadText
	}
	err = s.retry(ctx, func() error {
		res, err = s.db.ExecContext(ctx, s.bind(q), args...)
		return err
	})
	if cachedTables.MatchString(q) {
		s.wrote()
	}
	return res, err
}

func (s *Store) query(ctx context.Context, q string, args ...any) (rows *sql.Rows, err error) {
	if s.findsNothing(q, args) {
		return s.db.QueryContext(ctx, noRows)
	}
	s.cache.reads.Add(1)
	err = s.retry(ctx, func() error {
		rows, err = s.db.QueryContext(ctx, s.bind(q), args...)
		return err
	})
	return rows, err
}

// queryRow is for reads; the one write through it (AddEvent) checks its text.
func (s *Store) queryRow(ctx context.Context, q string, args ...any) *row {
	if s.findsNothing(q, args) {
		return &row{Row: s.db.QueryRowContext(ctx, noRows)}
	}
	s.cache.reads.Add(1)
	r := &row{}
	r.err = s.retry(ctx, func() error {
		r.Row = s.db.QueryRowContext(ctx, s.bind(q), args...)
		return r.Row.Err()
	})
	return r
}

// row is a query's row, or the error retry gave up with.
type row struct {
	*sql.Row
	err error
}

func (r *row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	return r.Row.Scan(dest...)
}

// retryBudget is how long a statement waits for a PostgreSQL that takes no
// connection (a restart, a failover) when SetRetryBudget did not say.
const retryBudget = 10 * time.Second

// SetRetryBudget sets how long a statement waits for a PostgreSQL that
// takes no connection. A cluster node gives a quarter of its lease: a
// write that waited lands before the node's lease can run out, so never
// after another node took its VMs over (the node fences itself a quarter
// of the lease before that).
func (s *Store) SetRetryBudget(d time.Duration) { s.retryFor = d }

// retry runs f again while it failed without the database doing anything
// (no connection, or one the server was ending), for at most s.retryFor;
// then the error says the database is unreachable.
func (s *Store) retry(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(s.retryFor)
	wait := 50 * time.Millisecond
	for {
		err := f()
		if err == nil || !s.pg || !undone(err) || ctx.Err() != nil {
			return err
		}
		if time.Now().Add(wait).After(deadline) {
			return fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// undone reports whether err says a PostgreSQL statement was not done: no
// connection could be made, the connection failed before the statement
// was sent, or the server ended the connection in a shutdown (a backend
// that is told to stop aborts the transaction it runs: a statement whose
// commit was done has its answer read before the server's goodbye).
func undone(err error) bool {
	var ce *pgconn.ConnectError
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
			return true
		}
		return false
	}
	return errors.As(err, &ce) || pgconn.SafeToRetry(err)
}

// pgUniqueViolation is PostgreSQL's SQLSTATE for a unique constraint.
const pgUniqueViolation = "23505"

// mapErr turns a unique-constraint violation of either backend into ErrConflict.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if (errors.As(err, &pe) && pe.Code == pgUniqueViolation) || strings.Contains(err.Error(), "UNIQUE constraint") {
		return fmt.Errorf("%w: %v", ErrConflict, err)
	}
	return err
}
