package conformance_test

import (
	"database/sql"
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/internal/testdb"
)

// Tokens start at 1: the implicit high-water of a resource without a row
// is 0, so token 0 (a zero-value or fake ticket) is stale everywhere and
// never stored. Before the fix, token 0 on a fresh resource was accepted
// and stored a row with high-water 0.
func TestTokenZero(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		tk := fencetest.NewTicket("fresh", 0)
		called := false
		err := tg.run(t.Context(), tk, func(querier) error { called = true; return nil })
		var se *fence.StaleError
		if !errors.As(err, &se) || *se != (fence.StaleError{Resource: "fresh", Token: 0, HighWater: 0}) {
			t.Fatalf("token 0 on a fresh resource: %v, want *StaleError with high-water 0", err)
		}
		if called {
			t.Error("fn called")
		}
		wantReleases(t, tk, 1)
		if hw := tg.highWater(t, "fresh"); hw != -1 {
			t.Errorf("high-water row %d stored for token 0", hw)
		}
		// Guard alike, and one stale resource among several.
		err = tg.guarded(t.Context(), fencetest.NewTicket("fresh", 0), nil2, fence.WithResources("a", "b"))
		if !errors.As(err, &se) || se.Resource != "a" {
			t.Fatalf("Guard with token 0: %v", err)
		}
		if err := tg.run(t.Context(), fencetest.NewTicket("fresh", 1), nil2); err != nil {
			t.Fatalf("token 1 after token 0: %v", err)
		}
	})
}

// sqlTargets are the database/sql targets, whose admin pool is a plain
// *sql.DB for tests that manage transactions themselves.
var sqlTargets = map[string]fence.Dialect{"sql/postgres": fence.Postgres, "sql/mysql": fence.MySQL, "sql/sqlite": fence.SQLite}

// Guard twice in one transaction with the same ticket: the first call
// raised the high-water to the token, so the second sees token <=
// high-water and reports it stale (the token must be above the high-water); the transaction
// must be rolled back. This is documented: call Guard once per
// transaction (WithResources for several resources).
func TestGuardTwiceSameTx(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		d, ok := sqlTargets[tg.name]
		if !ok {
			t.Skip("database/sql targets only; pgxfence.Guard shares the statement")
		}
		ctx := t.Context()
		tx, err := tg.admin.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		tk := fencetest.NewTicket("twice", 5)
		if err := sqlfence.Guard(ctx, tx, d, tk); err != nil {
			t.Fatal(err)
		}
		err = sqlfence.Guard(ctx, tx, d, tk)
		var se *fence.StaleError
		if !errors.As(err, &se) || se.Token != 5 || se.HighWater != 5 {
			t.Fatalf("second Guard: %v, want stale with high-water == token", err)
		}
	})
}

// pgxfence.Run with a pgx.Tx as db would only create and release a
// savepoint, then release the ticket before the outer transaction commits:
// a newer holder could write in between, and the outer commit would then
// land out of order (release only after commit). Run refuses it. Before the fix Run returned
// nil and released the ticket while the outer transaction was still open.
func TestPgxNestedTxRefused(t *testing.T) {
	tg := openPgx(t)
	pool, err := pgxpool.New(t.Context(), testdbDSN(t, tg))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := t.Context()
	outer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Rollback(ctx)
	tk := fencetest.NewTicket("nested", 3)
	called := false
	err = pgxfence.Run(ctx, outer, tk, func(pgx.Tx) error { called = true; return nil })
	if !errors.Is(err, pgxfence.ErrNestedTx) {
		t.Fatalf("Run with a pgx.Tx: %v, want ErrNestedTx", err)
	}
	if called {
		t.Error("fn called")
	}
	wantReleases(t, tk, 1)
	// The outer transaction is untouched and usable; Guard is the way.
	if err := pgxfence.Guard(ctx, outer, fencetest.NewTicket("nested", 3)); err != nil {
		t.Fatalf("Guard in the outer transaction: %v", err)
	}
	if err := outer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if hw := tg.highWater(t, "nested"); hw != 3 {
		t.Errorf("high-water = %d, want 3", hw)
	}
	// A pool connection (*pgxpool.Conn) begins a real transaction: fine.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := pgxfence.Run(ctx, conn, fencetest.NewTicket("nested", 4), func(pgx.Tx) error { return nil }); err != nil {
		t.Fatalf("Run with a *pgxpool.Conn: %v", err)
	}
	if hw := tg.highWater(t, "nested"); hw != 4 {
		t.Errorf("high-water = %d, want 4 (committed for real)", hw)
	}
}

// testdbDSN returns a DSN for tg's PostgreSQL database.
func testdbDSN(t *testing.T, tg *target) string {
	t.Helper()
	var db string
	if err := tg.admin.QueryRow("SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(testdb.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, db)
}

// A nil *pgx.Conn is a non-nil Beginner whose Begin panics. The panic
// goes on, but the ticket is released first (core.Run's deferred
// release). Before the fix the ticket was never released.
func TestPgxNilConnReleases(t *testing.T) {
	tk := fencetest.NewTicket("k", 1)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		var conn *pgx.Conn
		_ = pgxfence.Run(t.Context(), conn, tk, func(pgx.Tx) error { return nil })
	}()
	wantReleases(t, tk, 1)
}

// sqlfence.Run with a *sql.Conn begins and commits a real transaction: the
// bump is visible from another connection as soon as Run returns.
func TestSQLConnCommitsForReal(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		d, ok := sqlTargets[tg.name]
		if !ok {
			t.Skip("database/sql targets only")
		}
		ctx := t.Context()
		conn, err := tg.admin.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := sqlfence.Run(ctx, conn, d, fencetest.NewTicket("conn", 2), nil2sql); err != nil {
			t.Fatal(err)
		}
		if hw := tg.highWater(t, "conn"); hw != 2 {
			t.Errorf("high-water = %d, want 2", hw)
		}
	})
}

// mysqlTarget opens the sql/mysql target with DSN changes.
func mysqlTarget(t *testing.T, change func(cfg *mysql.Config)) *target {
	t.Helper()
	cfg, err := mysql.ParseDSN(testdb.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	change(cfg)
	return openSQL(t, "sql/mysql", "mysql", cfg.FormatDSN(), fence.MySQL, fence.MySQL)
}

// The MySQL statements under strict and unusual SQL modes, with and
// without interpolateParams (client-side escaping, which must follow
// NO_BACKSLASH_ESCAPES), on keys that need escaping or that a PAD SPACE
// or case-insensitive collation would fold together.
func TestMySQLSQLModes(t *testing.T) {
	keys := []string{"a", "A", "a ", "a  ", "a\x00", "\x00", "\xff", "\xff\x00 ", "'", `\`, `\'`, `"`, "a'; DROP TABLE items; --", "ä", "a\t", "a\n"}
	for _, mode := range []string{
		"ANSI,STRICT_ALL_TABLES",
		"TRADITIONAL,NO_BACKSLASH_ESCAPES",
		"ANSI_QUOTES,ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION",
		"PAD_CHAR_TO_FULL_LENGTH,NO_UNSIGNED_SUBTRACTION,PIPES_AS_CONCAT,IGNORE_SPACE",
		"",
	} {
		for _, interpolate := range []bool{false, true} {
			t.Run(fmt.Sprintf("%q interpolateParams=%v", mode, interpolate), func(t *testing.T) {
				tg := mysqlTarget(t, func(cfg *mysql.Config) {
					if cfg.Params == nil {
						cfg.Params = map[string]string{}
					}
					cfg.Params["sql_mode"] = "'" + mode + "'"
					cfg.InterpolateParams = interpolate
				})
				ctx := t.Context()
				var got string
				if err := tg.admin.QueryRowContext(ctx, "SELECT @@SESSION.sql_mode").Scan(&got); err != nil {
					t.Fatal(err)
				}
				t.Logf("sql_mode = %q", got)
				for i, k := range keys {
					if err := tg.run(ctx, fencetest.NewTicket(k, uint64(100+i)), nil2); err != nil {
						t.Fatalf("key %q: %v", k, err)
					}
				}
				for i, k := range keys {
					if hw := tg.highWater(t, k); hw != int64(100+i) {
						t.Errorf("key %q: high-water = %d, want %d", k, hw, 100+i)
					}
					err := tg.run(ctx, fencetest.NewTicket(k, uint64(100+i)), nil2)
					var se *fence.StaleError
					if !errors.As(err, &se) || se.Resource != k || se.HighWater != uint64(100+i) {
						t.Errorf("key %q repeated: %v, want stale", k, err)
					}
					if err := tg.run(ctx, fencetest.NewTicket(k, uint64(200+i)), nil2); err != nil {
						t.Errorf("key %q raised: %v", k, err)
					}
				}
				if n := tg.queryInt(t, "SELECT COUNT(*) FROM ticketing_fence"); n != int64(len(keys)) {
					t.Errorf("rows = %d, want %d distinct resources", n, len(keys))
				}
			})
		}
	}
}

// An accepted bump must not change what LAST_INSERT_ID() tells the user
// about their own insert in the same transaction; a rejection sets the
// connection's LAST_INSERT_ID() to the flag (the transaction is rolled
// back anyway) and must not make the next, accepted bump on that same
// connection look rejected.
func TestMySQLLastInsertID(t *testing.T) {
	tg := mysqlTarget(t, func(*mysql.Config) {})
	ctx := t.Context()
	conn, err := tg.admin.Conn(ctx) // one connection throughout
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lastID := func(tx *sql.Tx) (n uint64) {
		if err := tx.QueryRowContext(ctx, "SELECT LAST_INSERT_ID()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for i, r := range []string{"lid-new", "lid-new"} { // insert, then raise
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := tx.ExecContext(ctx, "INSERT INTO fence_log (token) VALUES (1), (2)")
		if err != nil {
			t.Fatal(err)
		}
		mine, _ := res.LastInsertId()
		if err := sqlfence.Guard(ctx, tx, fence.MySQL, fencetest.NewTicket(r, uint64(10+i))); err != nil {
			t.Fatalf("Guard %d: %v", i, err)
		}
		if got := lastID(tx); got != uint64(mine) {
			t.Errorf("bump %d: LAST_INSERT_ID() = %d after an accepted bump, want %d (the user's insert)", i, got, mine)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// Rejected, then accepted, on the same connection.
	for _, tc := range []struct {
		token uint64
		stale bool
	}{{5, true}, {12, false}, {12, true}, {13, false}} {
		err := sqlfence.Run(ctx, conn, fence.MySQL, fencetest.NewTicket("lid-new", tc.token), nil2sql)
		if errors.Is(err, fence.ErrStale) != tc.stale || (err != nil && !tc.stale) {
			t.Fatalf("token %d on one connection: %v, want stale=%v", tc.token, err, tc.stale)
		}
	}
}

// A custom high-water table (WithTable) with an AUTO_INCREMENT column:
// the accepted insert of a new resource reports the new id as the
// statement's insert id. Before the fix the rejection flag was
// LAST_INSERT_ID(1), so the first accepted insert (id 1) was taken for a
// rejection and reported as stale.
func TestMySQLCustomTableAutoIncrement(t *testing.T) {
	tg := mysqlTarget(t, func(*mysql.Config) {})
	tg.mustExec(t, "CREATE TABLE my_fence (id BIGINT AUTO_INCREMENT UNIQUE, resource VARBINARY(255) PRIMARY KEY, "+
		"high_water BIGINT NOT NULL, updated_at DATETIME(6) NOT NULL) ENGINE=InnoDB")
	ctx := t.Context()
	for i, tc := range []struct {
		key   string
		token uint64
		stale bool
	}{{"k1", 1, false}, {"k2", 1, false}, {"k1", 1, true}, {"k1", 2, false}} {
		err := tg.run(ctx, fencetest.NewTicket(tc.key, tc.token), nil2, fence.WithTable("my_fence"))
		if errors.Is(err, fence.ErrStale) != tc.stale || (err != nil && !tc.stale) {
			t.Fatalf("step %d (%s, token %d): %v, want stale=%v", i, tc.key, tc.token, err, tc.stale)
		}
	}
	if hw := tg.highWaterIn(t, "my_fence", "k1"); hw != 2 {
		t.Errorf("high-water = %d, want 2", hw)
	}
}
