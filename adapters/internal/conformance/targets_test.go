package conformance_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/internal/testdb"
	_ "github.com/ticketing-dev/ticketing/internal/testdb/containerdb" // testdb's container sources: Auto falls back to them
	"github.com/ticketing-dev/ticketing/migrations"
)

// querier is a transaction as the tests' business functions see it.
type querier interface {
	exec(ctx context.Context, query string, args ...any) error
	queryInt(ctx context.Context, query string, args ...any) (int64, error)
	// commit commits the transaction through the driver's own Commit,
	// which a business function must never do (TestTxEnded).
	commit(ctx context.Context) error
}

// target is one adapter on one database, with a fresh database that has
// the migrations applied plus the tables items and fence_log.
type target struct {
	name    string
	dialect fence.Dialect
	// admin is a separate pool for set-up and assertions.
	admin *sql.DB
	// run is the adapter's Run.
	run func(ctx context.Context, tk fence.Ticket, fn func(querier) error, opts ...fence.Option) error
	// guarded runs fn in a transaction the test manages itself, fenced
	// with the adapter's Guard; it commits when Guard, fn, the adapter's
	// CheckTx and fence.CheckLease succeed, and never releases the ticket.
	guarded func(ctx context.Context, tk fence.Ticket, fn func(querier) error, opts ...fence.Option) error
	// checkTx is the adapter's CheckTx on the transaction behind q.
	checkTx func(ctx context.Context, q querier) error
	// backendID returns the id of the transaction's server connection, and
	// kill terminates it from outside; nil for SQLite.
	backendID string
	kill      string
	// plainTx runs fn in an unfenced transaction (for benchmarks).
	plainTx func(ctx context.Context, fn func(querier) error) error
	// pool is the pgx targets' pool, nil for the others.
	pool *pgxpool.Pool
}

// q rewrites ? placeholders for PostgreSQL.
func (tg *target) q(query string) string {
	if tg.dialect != fence.Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (tg *target) mustExec(t testing.TB, query string, args ...any) {
	t.Helper()
	if _, err := tg.admin.ExecContext(context.Background(), tg.q(query), args...); err != nil {
		t.Fatalf("%s: %s: %v", tg.name, query, err)
	}
}

func (tg *target) queryInt(t testing.TB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := tg.admin.QueryRowContext(context.Background(), tg.q(query), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %s: %v", tg.name, query, err)
	}
	return n
}

// highWater returns the stored high-water of resource, or -1 if no row.
func (tg *target) highWater(t testing.TB, resource string) int64 {
	t.Helper()
	return tg.highWaterIn(t, fence.DefaultTable, resource)
}

func (tg *target) highWaterIn(t testing.TB, table, resource string) int64 {
	t.Helper()
	var n int64
	err := tg.admin.QueryRowContext(context.Background(), tg.q("SELECT high_water FROM "+table+" WHERE resource = ?"), []byte(resource)).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return -1
	}
	if err != nil {
		t.Fatalf("%s: read high-water: %v", tg.name, err)
	}
	return n
}

type sqlQ struct {
	tg *target
	tx *sql.Tx
}

func (s sqlQ) exec(ctx context.Context, query string, args ...any) error {
	_, err := s.tx.ExecContext(ctx, s.tg.q(query), args...)
	return err
}

func (s sqlQ) queryInt(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := s.tx.QueryRowContext(ctx, s.tg.q(query), args...).Scan(&n)
	return n, err
}

func (s sqlQ) commit(context.Context) error { return s.tx.Commit() }

type pgxQ struct {
	tg *target
	tx pgx.Tx
}

func (p pgxQ) exec(ctx context.Context, query string, args ...any) error {
	_, err := p.tx.Exec(ctx, p.tg.q(query), args...)
	return err
}

func (p pgxQ) queryInt(ctx context.Context, query string, args ...any) (int64, error) {
	var n int64
	err := p.tx.QueryRow(ctx, p.tg.q(query), args...).Scan(&n)
	return n, err
}

func (p pgxQ) commit(ctx context.Context) error { return p.tx.Commit(ctx) }

type kind struct {
	name    string
	dialect fence.Dialect
	open    func(t testing.TB) *target
}

var kinds = []kind{
	{"pgx/postgres", fence.Postgres, openPgx},
	{"pgx-conn/postgres", fence.Postgres, openPgxConn},
	{"sql/postgres", fence.Postgres, func(t testing.TB) *target {
		return openSQL(t, "sql/postgres", "pgx", testdb.Postgres(t), fence.Postgres, fence.Postgres)
	}},
	{"sql/mysql", fence.MySQL, func(t testing.TB) *target {
		return openSQL(t, "sql/mysql", "mysql", testdb.MySQL(t), fence.MySQL, fence.MySQL)
	}},
	{"sql/sqlite", fence.SQLite, func(t testing.TB) *target {
		return openSQL(t, "sql/sqlite", "sqlite", testdb.SQLite(t), fence.SQLite, fence.SQLite)
	}},
}

// forEach runs f as a subtest for every adapter and dialect.
func forEach(t *testing.T, f func(t *testing.T, tg *target)) {
	t.Helper()
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel() // separate databases
			f(t, k.open(t))
		})
	}
}

func openAdmin(t testing.TB, driver, dsn string, d fence.Dialect) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := migrations.Up(context.Background(), db, d); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	var stmts []string
	switch d {
	case fence.Postgres:
		stmts = []string{
			"CREATE TABLE items (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)",
			"CREATE TABLE fence_log (id BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL)",
		}
	case fence.MySQL:
		stmts = []string{
			"CREATE TABLE items (id BIGINT PRIMARY KEY, v BIGINT NOT NULL) ENGINE=InnoDB",
			"CREATE TABLE fence_log (id BIGINT AUTO_INCREMENT PRIMARY KEY, token BIGINT NOT NULL) ENGINE=InnoDB",
		}
	case fence.SQLite:
		stmts = []string{
			"CREATE TABLE items (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)",
			"CREATE TABLE fence_log (id INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER NOT NULL)",
		}
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	return db
}

func openSQL(t testing.TB, name, driver, dsn string, d fence.Dialect, md fence.Dialect) *target {
	t.Helper()
	tg := &target{name: name, dialect: md, admin: openAdmin(t, driver, dsn, md)}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	if md == fence.SQLite {
		// SQLite's busy handler polls with growing sleeps and is not fair:
		// with 16 writers polling, one can starve past the busy timeout.
		// A small pool makes writers queue in database/sql instead, as
		// the sqlfence documentation recommends.
		db.SetMaxOpenConns(4)
		db.SetMaxIdleConns(4)
	}
	t.Cleanup(func() { db.Close() })
	tg.run = func(ctx context.Context, tk fence.Ticket, fn func(querier) error, opts ...fence.Option) error {
		return sqlfence.Run(ctx, db, d, tk, func(tx *sql.Tx) error { return fn(sqlQ{tg, tx}) }, opts...)
	}
	tg.guarded = func(ctx context.Context, tk fence.Ticket, fn func(querier) error, opts ...fence.Option) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := sqlfence.Guard(ctx, tx, d, tk, opts...); err != nil {
			return err
		}
		if err := fn(sqlQ{tg, tx}); err != nil {
			return err
		}
		if err := sqlfence.CheckTx(ctx, tx, d); err != nil {
			return err
		}
		if err := fence.CheckLease(tk, opts...); err != nil {
			return err
		}
		return tx.Commit()
	}
	tg.checkTx = func(ctx context.Context, q querier) error { return sqlfence.CheckTx(ctx, q.(sqlQ).tx, d) }
	tg.plainTx = func(ctx context.Context, fn func(querier) error) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := fn(sqlQ{tg, tx}); err != nil {
			return err
		}
		return tx.Commit()
	}
	switch md {
	case fence.Postgres:
		tg.backendID, tg.kill = "SELECT pg_backend_pid()", "SELECT pg_terminate_backend(?, 5000)"
	case fence.MySQL:
		tg.backendID, tg.kill = "SELECT CONNECTION_ID()", "KILL CONNECTION ?"
	}
	return tg
}

func openPgx(t testing.TB) *target {
	t.Helper()
	return openPgxTuned(t, nil)
}

// openPgxTuned is openPgx with the pool's config also changed by tune (if
// not nil).
func openPgxTuned(t testing.TB, tune func(*pgxpool.Config)) *target {
	t.Helper()
	dsn := testdb.Postgres(t)
	tg := &target{name: "pgx/postgres", dialect: fence.Postgres, admin: openAdmin(t, "pgx", dsn, fence.Postgres)}
	pool := newPgxPool(t, dsn, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 32
		if tune != nil {
			tune(cfg)
		}
	})
	tg.pool = pool
	tg.run = func(ctx context.Context, tk fence.Ticket, fn func(querier) error, opts ...fence.Option) error {
		return pgxfence.Run(ctx, pool, tk, func(tx pgx.Tx) error { return fn(pgxQ{tg, tx}) }, opts...)
	}
	tg.guarded = func(ctx context.Context, tk fence.Ticket, fn func(querier) error, opts ...fence.Option) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if err := pgxfence.Guard(ctx, tx, tk, opts...); err != nil {
			return err
		}
		if err := fn(pgxQ{tg, tx}); err != nil {
			return err
		}
		if err := pgxfence.CheckTx(ctx, tx); err != nil {
			return err
		}
		if err := fence.CheckLease(tk, opts...); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	tg.checkTx = func(ctx context.Context, q querier) error { return pgxfence.CheckTx(ctx, q.(pgxQ).tx) }
	tg.plainTx = func(ctx context.Context, fn func(querier) error) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fn(pgxQ{tg, tx}) })
	}
	tg.backendID, tg.kill = "SELECT pg_backend_pid()", "SELECT pg_terminate_backend(?, 5000)"
	return tg
}

// newPgxPool opens a pgx pool on dsn with its config changed by tune (if
// not nil), closed when the test ends.
func newPgxPool(t testing.TB, dsn string, tune func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if tune != nil {
		tune(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// openPgxConn is openPgx with Run given a *pgxpool.Conn acquired for each
// call (and released after it): Run's path for a connection the caller
// holds, which it does not give back.
func openPgxConn(t testing.TB) *target {
	t.Helper()
	tg := openPgx(t)
	tg.name = "pgx-conn/postgres"
	pool := tg.pool
	tg.run = func(ctx context.Context, tk fence.Ticket, fn func(querier) error, opts ...fence.Option) error {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer c.Release()
		err = pgxfence.Run(ctx, c, tk, func(tx pgx.Tx) error { return fn(pgxQ{tg, tx}) }, opts...)
		if st := c.Conn().PgConn().TxStatus(); st != 'I' && !c.Conn().IsClosed() {
			return fmt.Errorf("Run left the caller's connection in transaction status %q (Run: %v)", st, err)
		}
		return err
	}
	return tg
}

// ctxTimeout is a test context with a deadline, so a lock wait that never
// ends fails the test instead of hanging it.
func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}
