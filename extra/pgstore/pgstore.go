// Package pgstore is an idempotency.Store on PostgreSQL, shared by every
// instance that points at the same database.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/guardrail-go/guardrail/idempotency"
)

// DefaultTable is the table used when Config.Table is empty.
const DefaultTable = "guardrail_idempotency"

// DB is what the store needs from a connection: *pgxpool.Pool is the usual
// choice and is safe for concurrent use; a *pgx.Conn is not, so a Store on
// one is not either.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config configures a Store; New copies it and reports an invalid Table.
// The zero value is valid. A Config is a plain value, safe to share while
// nobody modifies it.
type Config struct {
	// Table is the table's name, optionally schema-qualified
	// ("billing.idempotency"), each name at most 63 bytes (PostgreSQL
	// would truncate a longer one). Empty means "guardrail_idempotency".
	Table string
}

// Store is an idempotency.Store on PostgreSQL. It is safe for concurrent use
// when its DB is (a *pgxpool.Pool is).
//
// One row per key. The lock is an INSERT ... ON CONFLICT that only takes an
// existing row over when its lease or TTL has ended, so taking a free key
// and taking over a dead holder's key are the same atomic statement.
// Completion, release and lease renewal are one UPDATE or DELETE that
// checks the lock token and the lease. Expiry is decided by the database's clock, never the
// callers', so instances with skewed clocks agree. Stored responses are
// committed rows: they survive a database restart or failover.
//
// Expired rows are ignored by every call but stay on disk until Sweep
// deletes them: call Sweep periodically.
//
// Store is an idempotency.ScopedStore: a row begun by BeginScoped records
// its caller's scope, and BeginScoped counts the caller's live rows (an
// index on scope and expiry, at most the quota read) in the statement
// that locks the key, under a transaction-level advisory lock on the
// caller taken in the same round trip (a pgx batch, which runs as one
// transaction), so concurrent calls from every instance never lock more
// than the quota. A DB without SendBatch (a *pgxpool.Pool, *pgx.Conn and
// pgx.Tx have it) counts without the lock: concurrent new keys of one
// caller may then exceed its quota by as many as run at once.
type Store struct {
	db         DB
	table      string // quoted
	index      string // quoted, unqualified
	scopeIndex string // quoted, unqualified

	beginSQL, beginScopedSQL, completeSQL, releaseSQL, extendSQL, sweepSQL string
}

// batcher is the part of *pgxpool.Pool, *pgx.Conn and pgx.Tx that sends
// several statements in one round trip and one transaction.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// ErrInvalidConfig is the sentinel of every error New returns for a Config
// it rejects.
var ErrInvalidConfig = errors.New("pgstore: invalid config")

// configError reports an invalid field. It Is ErrInvalidConfig.
type configError struct{ msg string }

func (e *configError) Error() string        { return e.msg }
func (e *configError) Is(target error) bool { return target == ErrInvalidConfig }

// New returns a Store on db. Create its table with Migrate, or run the SQL
// that Schema returns with your migration tool. It returns an error if db
// is nil, and one that Is ErrInvalidConfig if Config.Table is not a table
// name.
func New(db DB, cfg Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgstore: New: nil DB")
	}
	name := cfg.Table
	if name == "" {
		name = DefaultTable
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, &configError{fmt.Sprintf("pgstore: Config.Table is %q; want a table name, optionally qualified by one schema name (schema.table)", cfg.Table)}
	}
	for _, part := range parts {
		// PostgreSQL truncates longer names silently, so two long names
		// could end up naming one table.
		if part == "" || len(part) > maxIdentifier || strings.IndexByte(part, 0) >= 0 {
			return nil, &configError{fmt.Sprintf("pgstore: Config.Table is %q; want each name of schema.table non-empty, at most %d bytes, without NUL", cfg.Table, maxIdentifier)}
		}
	}
	s := &Store{
		db:    db,
		table: pgx.Identifier(parts).Sanitize(),
		// Both cut so that PostgreSQL does not truncate them to the table's
		// own name, which IF NOT EXISTS would then find and skip.
		index:      pgx.Identifier{truncate(parts[len(parts)-1], maxIdentifier-len("_expires_at_idx")) + "_expires_at_idx"}.Sanitize(),
		scopeIndex: pgx.Identifier{truncate(parts[len(parts)-1], maxIdentifier-len("_scope_idx")) + "_scope_idx"}.Sanitize(),
	}
	t := s.table
	// One round trip whatever the key's state: the INSERT takes a free or
	// expired key; when it did not, the SELECT reads the live row. The
	// SELECT sees the statement's snapshot, so a row inserted concurrently
	// after it began is seen by neither part; Begin then runs it again.
	// The first column says what the row is: 0 the key was taken, 1 the
	// live row, 2 (BeginScoped) the caller holds its quota, with the ms
	// until the first of its rows ends.
	begin := func(count, insert string) string {
		return `WITH ` + count + `ins AS (
  INSERT INTO ` + t + ` AS e (key, fingerprint, token, expires_at, scope)
  ` + insert + `
  ON CONFLICT (key) DO UPDATE SET
    fingerprint = EXCLUDED.fingerprint, token = EXCLUDED.token, status = NULL,
    header = NULL, body = NULL, body_omitted = false, expires_at = EXCLUDED.expires_at, scope = EXCLUDED.scope
  WHERE e.expires_at <= now()
  RETURNING true
)
SELECT 0, NULL::bytea, false, NULL::integer, NULL::jsonb, NULL::bytea, false, 0::bigint FROM ins
UNION ALL
SELECT 1, fingerprint, token IS NOT NULL, status, header, body, body_omitted,
  greatest(0, ceil(extract(epoch FROM expires_at - now()) * 1000))::bigint
FROM ` + t + ` WHERE key = $1 AND expires_at > now() AND NOT EXISTS (SELECT 1 FROM ins)`
	}
	values := `VALUES ($1, $2, $3, now() + $4::float8 * interval '1 millisecond', $5)`
	s.beginSQL = begin("", values)
	// At most $6 rows are read, by the scope index.
	s.beginScopedSQL = begin(`q AS (
  SELECT count(*) AS n, min(expires_at) AS first FROM (
    SELECT expires_at FROM `+t+` WHERE scope = $5 AND expires_at > now() ORDER BY expires_at LIMIT $6) live
),
`, `SELECT $1, $2, $3, now() + $4::float8 * interval '1 millisecond', $5 FROM q WHERE q.n < $6`) + `
UNION ALL
SELECT 2, NULL, false, NULL, NULL, NULL, false,
  coalesce(greatest(0, ceil(extract(epoch FROM q.first - now()) * 1000)), 0)::bigint
FROM q WHERE q.n >= $6 AND NOT EXISTS (SELECT 1 FROM ins)
  AND NOT EXISTS (SELECT 1 FROM ` + t + ` WHERE key = $1 AND expires_at > now())`
	s.completeSQL = `UPDATE ` + t + ` SET token = NULL, status = $3, header = $4, body = $5,
  body_omitted = $6, expires_at = now() + $7::float8 * interval '1 millisecond'
WHERE key = $1 AND token = $2 AND expires_at > now()`
	s.releaseSQL = `DELETE FROM ` + t + ` WHERE key = $1 AND token = $2 AND expires_at > now()`
	// token is NULL once completed, so token = $2 already excludes a
	// completed row; status IS NULL says so outright.
	s.extendSQL = `UPDATE ` + t + ` SET expires_at = now() + $3::float8 * interval '1 millisecond'
WHERE key = $1 AND token = $2 AND status IS NULL AND expires_at > now()`
	s.sweepSQL = `DELETE FROM ` + t + ` WHERE key IN (
  SELECT key FROM ` + t + ` WHERE expires_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED)`
	return s, nil
}

// maxIdentifier is the longest identifier PostgreSQL keeps whole
// (NAMEDATALEN - 1 in a default build).
const maxIdentifier = 63

// Migrate creates the store's table and index if they do not exist. It is
// safe to run from every instance at start-up: an advisory lock serialises
// concurrent runs.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, s.Schema()); err != nil {
		return fmt.Errorf("pgstore: migrate: %w", err)
	}
	return nil
}

// Schema returns the SQL Migrate runs, for those who manage migrations
// with their own tools.
func (s *Store) Schema() string {
	return `SELECT pg_advisory_xact_lock(hashtext('guardrail_idempotency_migrate')); -- serialises concurrent runs
CREATE TABLE IF NOT EXISTS ` + s.table + ` (
  key          text        PRIMARY KEY, -- scoped, hashed key (64 hex chars)
  fingerprint  bytea       NOT NULL,    -- SHA-256 of method, path, query, body
  token        text,                    -- lock holder; NULL once completed
  status       integer,                 -- NULL while in flight
  header       jsonb,
  body         bytea,
  body_omitted boolean     NOT NULL DEFAULT false,
  expires_at   timestamptz NOT NULL     -- lease end while in flight, then TTL end
);
CREATE INDEX IF NOT EXISTS ` + s.index + ` ON ` + s.table + ` (expires_at);
ALTER TABLE ` + s.table + ` ADD COLUMN IF NOT EXISTS scope text; -- the caller, for BeginScoped's count; NULL from Begin
CREATE INDEX IF NOT EXISTS ` + s.scopeIndex + ` ON ` + s.table + ` (scope, expires_at) WHERE scope IS NOT NULL;`
}

// truncate returns s cut to at most n bytes.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// sweepBatch bounds the rows one Sweep statement deletes, so a sweep after
// a long pause never holds many row locks at once.
const sweepBatch = 1000

// Sweep deletes expired rows, in batches, and returns how many. Run it
// periodically (every few minutes from one instance is plenty, a ticker or
// pg_cron); rows it has not reached yet are already ignored.
func (s *Store) Sweep(ctx context.Context) (int64, error) {
	var total int64
	for {
		tag, err := s.db.Exec(ctx, s.sweepSQL, sweepBatch)
		if err != nil {
			return total, fmt.Errorf("pgstore: sweep: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < sweepBatch {
			return total, nil
		}
	}
}

// maxBeginTries bounds Begin's loop, which runs again only when a
// concurrent change hid the key from both parts of its statement.
const maxBeginTries = 5

// Begin implements idempotency.Store in one statement.
func (s *Store) Begin(ctx context.Context, key string, fp idempotency.Fingerprint, lease time.Duration) (idempotency.Result, error) {
	return s.begin(ctx, "", key, fp, lease, -1)
}

// BeginScoped implements idempotency.ScopedStore in one round trip: the
// advisory lock on scope and the statement that counts its live rows and
// locks the key. A negative maxKeys counts nothing and takes no lock.
func (s *Store) BeginScoped(ctx context.Context, scope, key string, fp idempotency.Fingerprint, lease time.Duration, maxKeys int) (idempotency.Result, error) {
	if scope == "" {
		return idempotency.Result{}, errors.New("pgstore: begin: empty scope")
	}
	return s.begin(ctx, scope, key, fp, lease, maxKeys)
}

func (s *Store) begin(ctx context.Context, scope, key string, fp idempotency.Fingerprint, lease time.Duration, maxKeys int) (idempotency.Result, error) {
	var sc *string // NULL for Begin
	if scope != "" {
		sc = &scope
	}
	for range maxBeginTries {
		token := idempotency.NewToken()
		var (
			kind        int32
			rowFP       []byte
			locked      bool
			status      *int32
			header      http.Header
			body        []byte
			bodyOmitted bool
			leftMillis  int64
		)
		args := []any{key, fp[:], token, millis(lease), sc}
		var err error
		scan := func(row pgx.Row) error {
			return row.Scan(&kind, &rowFP, &locked, &status, &header, &body, &bodyOmitted, &leftMillis)
		}
		switch b, ok := s.db.(batcher); {
		case scope == "" || maxKeys < 0:
			err = scan(s.db.QueryRow(ctx, s.beginSQL, args...))
		case !ok:
			err = scan(s.db.QueryRow(ctx, s.beginScopedSQL, append(args, maxKeys)...))
		default:
			// One transaction: the lock, then the statement, whose snapshot
			// is taken after the lock is held, so it sees every row that
			// the caller's earlier holders of the lock committed.
			batch := &pgx.Batch{}
			batch.Queue(`SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))`, s.table, scope)
			batch.Queue(s.beginScopedSQL, append(args, maxKeys)...)
			br := b.SendBatch(ctx, batch)
			if _, err = br.Exec(); err == nil {
				err = scan(br.QueryRow())
			}
			if cerr := br.Close(); err == nil {
				err = cerr
			}
		}
		if errors.Is(err, pgx.ErrNoRows) {
			continue // changed under the statement: try again
		}
		if err != nil {
			return idempotency.Result{}, fmt.Errorf("pgstore: begin: %w", err)
		}
		switch {
		case kind == 0:
			return idempotency.Result{State: idempotency.StateAcquired, Token: token}, nil
		case kind == 2:
			return idempotency.Result{RetryIn: time.Duration(max(leftMillis, 0)) * time.Millisecond}, idempotency.ErrScopeFull
		case string(rowFP) != string(fp[:]):
			return idempotency.Result{State: idempotency.StateMismatch}, nil
		case locked:
			return idempotency.Result{State: idempotency.StateInFlight, RetryIn: time.Duration(leftMillis) * time.Millisecond}, nil
		case status == nil:
			return idempotency.Result{}, fmt.Errorf("pgstore: begin: completed row without a status (key %s)", key)
		}
		if len(header) == 0 {
			header = nil
		}
		if len(body) == 0 {
			body = nil
		}
		return idempotency.Result{State: idempotency.StateCompleted, Response: &idempotency.Response{
			Status: int(*status), Header: header, Body: body, BodyOmitted: bodyOmitted,
		}}, nil
	}
	return idempotency.Result{}, fmt.Errorf("pgstore: begin: key %s changed under %d tries", key, maxBeginTries)
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	header := resp.Header
	if header == nil {
		header = http.Header{}
	}
	tag, err := s.db.Exec(ctx, s.completeSQL, key, token, resp.Status, header, resp.Body, resp.BodyOmitted, millis(ttl))
	if err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return idempotency.ErrLockLost
	}
	return nil
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, key, token string) error {
	tag, err := s.db.Exec(ctx, s.releaseSQL, key, token)
	if err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return idempotency.ErrLockLost
	}
	return nil
}

// Extend implements idempotency.Store in one statement, on the database's
// clock.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	tag, err := s.db.Exec(ctx, s.extendSQL, key, token, millis(lease))
	if err != nil {
		return fmt.Errorf("pgstore: extend: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return idempotency.ErrLockLost
	}
	return nil
}

// millis is d in whole milliseconds, at least 1.
func millis(d time.Duration) int64 { return max(d.Milliseconds(), 1) }
