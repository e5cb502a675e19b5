package conformance_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/migrations"
)

// bareDB is an empty database (no migrations) and how to reach it.
type bareDB struct {
	name    string
	driver  string // database/sql driver name
	dialect fence.Dialect
	dsn     func(testing.TB) string
	// driverErr reports whether err carries the driver's own error type.
	driverErr func(err error) bool
	// found is how the dialect error names the database by its driver.
	found string
}

var bareDBs = []bareDB{
	{"postgres", "pgx", fence.Postgres, testdb.Postgres,
		func(err error) bool { var e *pgconn.PgError; return errors.As(err, &e) }, "github.com/jackc/pgx/v5/stdlib"},
	{"mysql", "mysql", fence.MySQL, testdb.MySQL,
		func(err error) bool { var e *mysql.MySQLError; return errors.As(err, &e) }, "github.com/go-sql-driver/mysql"},
	{"sqlite", "sqlite", fence.SQLite, testdb.SQLite,
		func(err error) bool { var e *sqlite.Error; return errors.As(err, &e) }, "modernc.org/sqlite"},
}

func constName(d fence.Dialect) string {
	return map[fence.Dialect]string{fence.Postgres: "fence.Postgres", fence.MySQL: "fence.MySQL", fence.SQLite: "fence.SQLite"}[d]
}

func openDB(t *testing.T, driverName, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// fenceRows counts the rows of the fence table.
func fenceRows(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM "+fence.DefaultTable).Scan(&n); err != nil {
		t.Fatalf("count fence rows: %v", err)
	}
	return n
}

// TestNotMigrated: Run and Guard on a database without the migrations
// return an error matching fence.ErrNotMigrated that names the table and
// what to run, and still carries the driver's error; the function is not
// called, the ticket is released once. Before, the raw driver error
// (`relation "ticketing_fence" does not exist`, MySQL's 1146, SQLite's
// "no such table") came back with no word of the migrations.
func TestNotMigrated(t *testing.T) {
	type runner struct {
		name string
		run  func(ctx context.Context, tk fence.Ticket, fn func() error, opts ...fence.Option) error
		// guard runs Guard in a transaction of its own and rolls back.
		guard     func(ctx context.Context, tk fence.Ticket, opts ...fence.Option) error
		up        string // what the error must tell to run
		driverErr func(error) bool
	}
	type opener struct {
		name string
		open func(t *testing.T) runner
	}
	var runners []opener
	for _, b := range bareDBs {
		runners = append(runners, opener{"sql/" + b.name, func(t *testing.T) runner {
			db := openDB(t, b.driver, b.dsn(t))
			return runner{
				name: "sql/" + b.name,
				run: func(ctx context.Context, tk fence.Ticket, fn func() error, opts ...fence.Option) error {
					return sqlfence.Run(ctx, db, b.dialect, tk, func(*sql.Tx) error { return fn() }, opts...)
				},
				guard: func(ctx context.Context, tk fence.Ticket, opts ...fence.Option) error {
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer tx.Rollback()
					return sqlfence.Guard(ctx, tx, b.dialect, tk, opts...)
				},
				up:        "migrations.Up(ctx, db, " + constName(b.dialect) + ")",
				driverErr: b.driverErr,
			}
		}})
	}
	runners = append(runners, opener{"pgx/postgres", func(t *testing.T) runner {
		pool := newPgxPool(t, testdb.Postgres(t), nil)
		return runner{
			name: "pgx/postgres",
			run: func(ctx context.Context, tk fence.Ticket, fn func() error, opts ...fence.Option) error {
				return pgxfence.Run(ctx, pool, tk, func(pgx.Tx) error { return fn() }, opts...)
			},
			guard: func(ctx context.Context, tk fence.Ticket, opts ...fence.Option) error {
				tx, err := pool.Begin(ctx)
				if err != nil {
					return err
				}
				defer tx.Rollback(context.WithoutCancel(ctx))
				return pgxfence.Guard(ctx, tx, tk, opts...)
			},
			up:        "pgxmigrations.Up(ctx, pool)",
			driverErr: bareDBs[0].driverErr,
		}
	}})
	for _, o := range runners {
		t.Run(o.name, func(t *testing.T) {
			t.Parallel()
			r := o.open(t)
			ctx := t.Context()
			check := func(what string, err error, table string, words ...string) {
				t.Helper()
				if !errors.Is(err, fence.ErrNotMigrated) {
					t.Fatalf("%s %s: %v, want fence.ErrNotMigrated", r.name, what, err)
				}
				if errors.Is(err, fence.ErrDialectMismatch) || errors.Is(err, fence.ErrStale) {
					t.Errorf("%s %s: %v matches another sentinel too", r.name, what, err)
				}
				if !r.driverErr(err) {
					t.Errorf("%s %s: %v: the driver's error is not reachable with errors.As", r.name, what, err)
				}
				for _, w := range append(words, table) {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s %s: %q does not say %q", r.name, what, err, w)
					}
				}
				t.Logf("%s %s: %v", r.name, what, err)
			}
			called := false
			fn := func() error { called = true; return nil }
			for _, token := range []uint64{7, 0} { // 0: only the read of the high-water runs
				tk := fencetest.NewTicket("orders/1", token)
				check("Run", r.run(ctx, tk, fn), fence.DefaultTable, r.up)
				wantReleases(t, tk, 1)
			}
			check("Guard", r.guard(ctx, fencetest.NewTicket("orders/1", 7)), fence.DefaultTable, r.up)
			tk := fencetest.NewTicket("orders/1", 7)
			check("Run WithTable", r.run(ctx, tk, fn, fence.WithTable("app_fence")), "app_fence", "fence.WithTable", "migrations.Files")
			wantReleases(t, tk, 1)
			if called {
				t.Error("the function was called")
			}
		})
	}
}

// TestFnMissingTable: a missing table of the business function's own is
// its error, unchanged: only the fence's own statements are mapped to
// fence.ErrNotMigrated.
func TestFnMissingTable(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		var fnErr error
		err := tg.run(t.Context(), fencetest.NewTicket("k", 3), func(q querier) error {
			_, fnErr = q.queryInt(t.Context(), "SELECT COUNT(*) FROM no_such_table_of_mine")
			return fnErr
		})
		if fnErr == nil || err != fnErr {
			t.Fatalf("Run: %v, want the function's error %v unchanged", err, fnErr)
		}
		if errors.Is(err, fence.ErrNotMigrated) {
			t.Errorf("the function's error matches fence.ErrNotMigrated: %v", err)
		}
	})
}

// TestRunWrongDialect: sqlfence.Run with a dialect that is not the
// database's fails with fence.ErrDialectMismatch naming both, writes
// nothing, does not call the function, and releases the ticket once.
// Through the usual drivers (known by type, for a *sql.DB and a
// *sql.Conn) nothing is sent; through a wrapper driver sqlfence does not
// know, the database's rejection of the fence's statement (a syntax
// error, an unknown function) is mapped. Before, the raw syntax error
// came back (MariaDB's 1064, PostgreSQL's 42601, SQLite's "no such
// function"), or on PostgreSQL with fence.SQLite a type error.
func TestRunWrongDialect(t *testing.T) {
	for _, b := range bareDBs {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			dsn := b.dsn(t)
			admin := openDB(t, b.driver, dsn)
			if err := migrations.Up(ctx, admin, b.dialect); err != nil {
				t.Fatal(err)
			}
			conn, err := admin.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			wrapped := openDB(t, "wrapped-"+b.driver, dsn)
			for _, pass := range []fence.Dialect{fence.Postgres, fence.MySQL, fence.SQLite} {
				if pass == b.dialect {
					continue
				}
				for _, via := range []struct {
					name  string
					db    sqlfence.Beginner
					known bool
				}{{"db", admin, true}, {"conn", conn, true}, {"wrapped", wrapped, false}} {
					tk := fencetest.NewTicket("k", 9)
					called := false
					err := sqlfence.Run(ctx, via.db, pass, tk, func(*sql.Tx) error { called = true; return nil })
					what := b.name + " " + via.name + " with " + constName(pass)
					if !errors.Is(err, fence.ErrDialectMismatch) {
						t.Errorf("%s: %v, want fence.ErrDialectMismatch", what, err)
						continue
					}
					words := []string{constName(pass)}
					if via.known {
						words = append(words, b.found, "pass "+constName(b.dialect), "Nothing was sent")
					} else if !b.driverErr(err) {
						t.Errorf("%s: %v: the driver's error is not reachable with errors.As", what, err)
					}
					for _, w := range words {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("%s: %q does not say %q", what, err, w)
						}
					}
					if called {
						t.Errorf("%s: the function was called", what)
					}
					wantReleases(t, tk, 1)
					t.Logf("%s: %v", what, err)
				}
			}
			if n := fenceRows(t, admin); n != 0 {
				t.Errorf("%d high-water rows written", n)
			}
			// The right dialect works through all three.
			for i, db := range []sqlfence.Beginner{admin, conn, wrapped} {
				if err := sqlfence.Run(ctx, db, b.dialect, fencetest.NewTicket("k", uint64(10+i)), nil2sql); err != nil {
					t.Errorf("right dialect: %v", err)
				}
			}
		})
	}
}
