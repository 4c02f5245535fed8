package pgstore_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/extra/pgstore"
	"github.com/guardrail-go/guardrail/fault/faulttest"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/storetest"
)

// must returns v, and panics if err is not nil: for constructors given a
// Config known to be valid.

// middleware returns the Server's Middleware for a test with one caller.
func middleware(store idempotency.Store, cfg idempotency.Config) func(http.Handler) http.Handler {
	cfg.SingleTenant = true
	srv, err := idempotency.New(store, cfg)
	if err != nil {
		panic(err)
	}
	return srv.Middleware
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const envDSN = "GUARDRAIL_TEST_POSTGRES_DSN"

func dsn(tb testing.TB) string {
	tb.Helper()
	d := os.Getenv(envDSN)
	if d == "" {
		tb.Skip(envDSN + " is not set: set it to a PostgreSQL DSN (for example postgres://postgres@127.0.0.1:5432/test?sslmode=disable) to run the PostgreSQL store tests")
	}
	return d
}

// newPool connects to the test database, through proxyAddr when set.
func newPool(tb testing.TB, proxyAddr string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn(tb))
	if err != nil {
		tb.Fatalf("%s: %v", envDSN, err)
	}
	if proxyAddr != "" {
		host, port, _ := net.SplitHostPort(proxyAddr)
		p, _ := strconv.Atoi(port)
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
		cfg.ConnConfig.Fallbacks = nil
		cfg.ConnConfig.ConnectTimeout = time.Second
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if err := pool.Ping(context.Background()); err != nil {
		tb.Fatalf("PostgreSQL (%s) is not reachable: %v", envDSN, err)
	}
	return pool
}

// testTable creates a table unique to the test, so packages and tests
// running at the same time never share rows, and drops it afterwards.
func testTable(tb testing.TB, pool *pgxpool.Pool) (*pgstore.Store, string) {
	tb.Helper()
	table := "guardrail_idem_test_" + idempotency.NewToken()[:12]
	s := must(pgstore.New(pool, pgstore.Config{Table: table}))
	if err := s.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return s, table
}

func harness() storetest.Harness {
	return storetest.Harness{New: func(t *testing.T) storetest.Subject {
		direct := newPool(t, "")
		_, table := testTable(t, direct)
		host := direct.Config().ConnConfig.Host
		port := direct.Config().ConnConfig.Port
		// The store reaches PostgreSQL through a proxy that the outage test cuts.
		proxy := faulttest.StartProxy(t, net.JoinHostPort(host, strconv.Itoa(int(port))))
		pool := newPool(t, proxy.Addr())
		return storetest.Subject{
			Store: must(pgstore.New(pool, pgstore.Config{Table: table})),
			Advance: func(d time.Duration) {
				// The database's clock, moved forward for this table's rows.
				_, err := direct.Exec(context.Background(),
					"UPDATE "+table+" SET expires_at = expires_at - $1::float8 * interval '1 millisecond'", d.Milliseconds())
				if err != nil {
					t.Fatal(err)
				}
			},
			Down: proxy.Down,
			Up:   func() { proxy.Up(t) },
		}
	}}
}

func TestConformance(t *testing.T) { storetest.Run(t, harness()) }

func TestHTTP(t *testing.T) { storetest.RunHTTP(t, harness()) }

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	pool := newPool(t, "")
	table := "guardrail_idem_test_" + idempotency.NewToken()[:12]
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	s := must(pgstore.New(pool, pgstore.Config{Table: table}))
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- s.Migrate(t.Context()) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Migrate: %v", err)
		}
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Errorf("second Migrate: %v", err)
	}
}

func TestSweepDeletesOnlyExpired(t *testing.T) {
	pool := newPool(t, "")
	s, table := testTable(t, pool)
	ctx := t.Context()
	fp := idempotency.Fingerprint{1}
	// 1500 expired rows (more than one sweep batch) and two live ones.
	_, err := pool.Exec(ctx, "INSERT INTO "+table+` (key, fingerprint, token, expires_at)
		SELECT 'old' || g, '\x01', 't', now() - interval '1 second' FROM generate_series(1, 1500) g`)
	if err != nil {
		t.Fatal(err)
	}
	live, err := s.Begin(ctx, "live", fp, time.Minute)
	if err != nil || live.State != idempotency.StateAcquired {
		t.Fatal(live.State, err)
	}
	done, _ := s.Begin(ctx, "done", fp, time.Minute)
	if err := s.Complete(ctx, "done", done.Token, &idempotency.Response{Status: 201}, time.Hour); err != nil {
		t.Fatal(err)
	}
	n, err := s.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1500 {
		t.Errorf("Sweep deleted %d rows, want 1500", n)
	}
	var left int
	pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&left)
	if left != 2 {
		t.Errorf("%d rows left, want the 2 live ones", left)
	}
	if res, _ := s.Begin(ctx, "done", fp, time.Minute); res.State != idempotency.StateCompleted || res.Response.Status != 201 {
		t.Errorf("live response after Sweep: %v", res.State)
	}
}

func TestSchemaQualifiedTable(t *testing.T) {
	pool := newPool(t, "")
	schema := "guardrail_idem_schema_" + idempotency.NewToken()[:8]
	if _, err := pool.Exec(t.Context(), "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	s := must(pgstore.New(pool, pgstore.Config{Table: schema + ".idem"}))
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	res, err := s.Begin(t.Context(), "k", idempotency.Fingerprint{}, time.Second)
	if err != nil || res.State != idempotency.StateAcquired {
		t.Fatalf("Begin on %s.idem: %v %v", schema, res.State, err)
	}
}

func TestNewRefusesBadTables(t *testing.T) {
	db := (*pgxpool.Pool)(nil) // never used: New does no I/O
	for _, table := range []string{"a.b.c", "billing.", ".keys", strings.Repeat("x", 64), "a\x00b"} {
		if _, err := pgstore.New(db, pgstore.Config{Table: table}); !errors.Is(err, pgstore.ErrInvalidConfig) || !strings.Contains(err.Error(), "pgstore: Config.Table is") {
			t.Errorf("New with Table %q: %v, want an error naming Config.Table", table, err)
		}
	}
	for _, table := range []string{"", "keys", "billing.keys", strings.Repeat("x", 63)} {
		if _, err := pgstore.New(db, pgstore.Config{Table: table}); err != nil {
			t.Errorf("New with Table %q: %v", table, err)
		}
	}
	if _, err := pgstore.New(nil, pgstore.Config{}); err == nil {
		t.Error("New accepted a nil DB")
	}
}

// TestMigrateIndexesALongTable: a table name of the longest length
// PostgreSQL allows still gets both its indexes; an index name cut by
// PostgreSQL to the table's own was skipped by IF NOT EXISTS.
func TestMigrateIndexesALongTable(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	table := "g" + idempotency.NewToken()[:12] + strings.Repeat("x", 50) // 63 bytes
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP TABLE IF EXISTS "`+table+`"`) })
	s := must(pgstore.New(pool, pgstore.Config{Table: table}))
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = $1`, table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 { // the primary key's, expires_at's, (scope, expires_at)'s
		t.Fatalf("%d indexes on a %d-byte table, want 3", n, len(table))
	}
}

// TestMigrateUpgradesATableWithoutScope: Migrate adds the scope column and
// its index to a table made by an earlier version, keeping its rows, and
// BeginScoped then counts callers' keys on it.
func TestMigrateUpgradesATableWithoutScope(t *testing.T) {
	pool := newPool(t, "")
	ctx := t.Context()
	table := "guardrail_idem_test_" + idempotency.NewToken()[:12]
	t.Cleanup(func() { pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	_, err := pool.Exec(ctx, `CREATE TABLE `+table+` (
  key text PRIMARY KEY, fingerprint bytea NOT NULL, token text, status integer, header jsonb, body bytea,
  body_omitted boolean NOT NULL DEFAULT false, expires_at timestamptz NOT NULL);
`)
	if err != nil {
		t.Fatal(err)
	}
	fp := idempotency.Fingerprint{1}
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, status, header, expires_at) VALUES ('old', $1, 201, '{}', now() + interval '1 hour')`, fp[:])
	if err != nil {
		t.Fatal(err)
	}
	s := must(pgstore.New(pool, pgstore.Config{Table: table}))
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Begin(ctx, "old", idempotency.Fingerprint{1}, time.Minute); err != nil || res.State != idempotency.StateCompleted {
		t.Fatalf("the old row after Migrate: %v, %v", res.State, err)
	}
	for i, want := range []error{nil, nil, idempotency.ErrScopeFull} {
		_, err := s.BeginScoped(ctx, "caller", "k"+strconv.Itoa(i), idempotency.Fingerprint{1}, time.Minute, 2)
		if !errors.Is(err, want) {
			t.Fatalf("BeginScoped %d: %v, want %v", i, err, want)
		}
	}
}

// BenchmarkScopedBegin measures a new key (lock, then release) without a
// quota (Begin) and with one (BeginScoped, the caller holding 1,000
// completed keys under a quota of 10,000): what the count per caller
// costs.
func BenchmarkScopedBegin(b *testing.B) { storetest.BenchmarkScopedBegin(b, benchStore(b)) }

func benchStore(b *testing.B) *pgstore.Store {
	s, _ := testTable(b, newPool(b, ""))
	return s
}
