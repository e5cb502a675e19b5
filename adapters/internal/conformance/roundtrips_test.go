package conformance_test

import (
	"context"
	"errors"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/internal/testdb"
)

// countingConn counts the client's writes to the server. pgconn sends a
// request (a query, or the messages of one extended-protocol execution)
// in one write and then reads the answer, so on a plain TCP connection
// the writes are the round trips.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// The fence costs no round trip of its own on PostgreSQL, for each kind
// of db Run takes a connection from itself: the check-and-bump goes in
// the BEGIN's query, and the check that fn left the transaction open
// rides in the COMMIT's.
func TestPgxRoundTrips(t *testing.T) {
	dsn := testdb.Postgres(t)
	admin := openAdmin(t, "pgx", dsn, fence.Postgres)
	if _, err := admin.Exec("INSERT INTO items (id, v) VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	var writes atomic.Int64
	pool := newPgxPool(t, dsn, func(cfg *pgxpool.Config) {
		if cfg.ConnConfig.TLSConfig != nil {
			t.Fatalf("the DSN asks for TLS (%s): the writes would not be the round trips; use sslmode=disable", dsn)
		}
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{c, &writes}, nil
		}
		cfg.MaxConns = 1
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})

	ctx := t.Context()
	update := func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE items SET v = v + 1 WHERE id = $1", 1)
		return err
	}
	// trips runs op twice to warm the connection and the statement cache
	// (a first execution also prepares), then counts one more run.
	trips := func(t *testing.T, op func() error) int64 {
		t.Helper()
		for range 2 {
			if err := op(); err != nil {
				t.Fatal(err)
			}
		}
		writes.Store(0)
		if err := op(); err != nil {
			t.Fatal(err)
		}
		return writes.Load()
	}
	plain := trips(t, func() error { return pgx.BeginFunc(ctx, pool, update) })
	if plain != 3 {
		t.Fatalf("a plain transaction (BEGIN, UPDATE, COMMIT) made %d round trips, want 3: the count is off", plain)
	}
	var token atomic.Uint64
	run := func(db pgxfence.Beginner) func() error {
		return func() error { return pgxfence.Run(ctx, db, fencetest.NewTicket("rt", token.Add(1)), update) }
	}
	t.Run("pool", func(t *testing.T) {
		if n := trips(t, run(pool)); n != plain {
			t.Errorf("fenced with a *pgxpool.Pool: %d round trips, want %d (as many as plain)", n, plain)
		}
		if s := pool.Stat(); s.AcquiredConns() != 0 {
			t.Errorf("%d connections still acquired after Run", s.AcquiredConns())
		}
	})
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	t.Run("pool conn", func(t *testing.T) {
		if n := trips(t, run(c)); n != plain {
			t.Errorf("fenced with a *pgxpool.Conn: %d round trips, want %d", n, plain)
		}
	})
	t.Run("conn", func(t *testing.T) {
		if n := trips(t, run(c.Conn())); n != plain {
			t.Errorf("fenced with a *pgx.Conn: %d round trips, want %d", n, plain)
		}
		if st := c.Conn().PgConn().TxStatus(); st != 'I' {
			t.Errorf("connection left in transaction status %q", st)
		}
	})
	c.Release()

	// The outcomes of the query that checks and commits, for each kind of
	// db: a transaction that fn ended and began again is not committed
	// (the check fails, the COMMIT is skipped, and pgx closes the
	// connection); a COMMIT that fails (a deferred unique constraint) is
	// reported as not committed, not as unknown, and keeps the connection.
	// Nothing is left open or acquired.
	if _, err := admin.Exec("CREATE TABLE deferred (id BIGINT, CONSTRAINT deferred_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)"); err != nil {
		t.Fatal(err)
	}
	count := func(t *testing.T, table string, id int64) int64 {
		t.Helper()
		var n int64
		if err := admin.QueryRow("SELECT count(*) FROM "+table+" WHERE id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	exec := func(tx pgx.Tx, sql string, args ...any) error {
		_, err := tx.Exec(ctx, sql, args...)
		return err
	}
	for i, kind := range []string{"pool", "pool conn", "conn"} {
		t.Run(kind+" outcomes", func(t *testing.T) {
			// with runs f with the kind's db and returns the caller's
			// connection (nil for the pool) after f.
			with := func(f func(db pgxfence.Beginner)) *pgx.Conn {
				if kind == "pool" {
					f(pool)
					// A closed connection is destroyed in a goroutine of
					// the pool's, and counts as acquired until then.
					for deadline := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() != 0; time.Sleep(time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("%d connections still acquired 5 s after Run", pool.Stat().AcquiredConns())
						}
					}
					return nil
				}
				pc, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer pc.Release()
				if kind == "pool conn" {
					f(pc)
				} else {
					f(pc.Conn())
				}
				return pc.Conn()
			}
			base := int64(100 * (i + 1))
			conn := with(func(db pgxfence.Beginner) {
				err := pgxfence.Run(ctx, db, fencetest.NewTicket("outcomes", token.Add(1)), func(tx pgx.Tx) error {
					for _, step := range []struct {
						sql  string
						args []any
					}{
						{"INSERT INTO items (id, v) VALUES ($1, 0)", []any{base}},
						{"COMMIT", nil},
						{"BEGIN", nil},
						{"INSERT INTO items (id, v) VALUES ($1, 0)", []any{base + 1}},
					} {
						if err := exec(tx, step.sql, step.args...); err != nil {
							return err
						}
					}
					return nil
				})
				if !errors.Is(err, fence.ErrTxEnded) || errors.Is(err, fence.ErrCommitUnknown) {
					t.Errorf("COMMIT then BEGIN in fn: %v, want fence.ErrTxEnded", err)
				}
			})
			if count(t, "items", base) != 1 || count(t, "items", base+1) != 0 {
				t.Errorf("after COMMIT then BEGIN: row before the end %d (want 1, fn committed it), row after %d (want 0)",
					count(t, "items", base), count(t, "items", base+1))
			}
			if conn != nil && !conn.IsClosed() {
				t.Errorf("the connection of a failed check is still open, in transaction status %q", conn.PgConn().TxStatus())
			}

			conn = with(func(db pgxfence.Beginner) {
				err := pgxfence.Run(ctx, db, fencetest.NewTicket("outcomes", token.Add(1)), func(tx pgx.Tx) error {
					if err := exec(tx, "INSERT INTO deferred (id) VALUES ($1)", base); err != nil {
						return err
					}
					return exec(tx, "INSERT INTO deferred (id) VALUES ($1)", base)
				})
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "23505" || errors.Is(err, fence.ErrCommitUnknown) || errors.Is(err, fence.ErrTxEnded) {
					t.Errorf("COMMIT failing on a deferred constraint: %v, want the unique violation (23505), not unknown", err)
				}
				// The connection is kept, idle, and works: a fenced write
				// commits. A tx that fn kept is closed once Run returns
				// (pgx's own state, which a COMMIT sent behind its back
				// would not have set: the connection may be serving
				// another caller by then).
				var kept pgx.Tx
				if err := pgxfence.Run(ctx, db, fencetest.NewTicket("outcomes", token.Add(1)), func(tx pgx.Tx) error {
					kept = tx
					return update(tx)
				}); err != nil {
					t.Errorf("Run after a failed COMMIT: %v", err)
				}
				if err := exec(kept, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
					t.Errorf("the tx kept after Run: %v, want pgx.ErrTxClosed", err)
				}
			})
			// A statement of fn fails and fn returns nil: the transaction
			// is aborted ('E'); Run says it did not commit and keeps the
			// connection.
			conn = with(func(db pgxfence.Beginner) {
				err := pgxfence.Run(ctx, db, fencetest.NewTicket("outcomes", token.Add(1)), func(tx pgx.Tx) error {
					if err := exec(tx, "INSERT INTO items (id, v) VALUES ($1, 0)", base+2); err != nil {
						return err
					}
					_ = exec(tx, "SELECT 1/0")
					return nil
				})
				if !errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, fence.ErrCommitUnknown) || errors.Is(err, fence.ErrTxEnded) {
					t.Errorf("fn ignoring a failed statement: %v, want pgx.ErrTxCommitRollback", err)
				}
			})
			if n := count(t, "items", base+2); n != 0 {
				t.Errorf("%d rows committed by an aborted transaction", n)
			}
			if conn != nil && (conn.IsClosed() || conn.PgConn().TxStatus() != 'I') {
				t.Errorf("after an aborted transaction the connection is closed (%v) or in transaction status %q", conn.IsClosed(), conn.PgConn().TxStatus())
			}
			if n := count(t, "deferred", base); n != 0 {
				t.Errorf("%d rows committed by a failed COMMIT", n)
			}
			if conn != nil && (conn.IsClosed() || conn.PgConn().TxStatus() != 'I') {
				t.Errorf("after a failed COMMIT the connection is closed (%v) or in transaction status %q", conn.IsClosed(), conn.PgConn().TxStatus())
			}
		})
	}
}

// The check-and-bump that rides with the BEGIN carries the resource and
// the token as literals: a resource of any bytes (quotes, backslashes,
// NUL, not UTF-8) is stored as given, and a rejection reports the stored
// high-water, also the largest token: as the EXECUTE of the prepared
// statement, and as the statement itself on a connection that prepares
// none (QueryExecModeSimpleProtocol).
func TestPgxBumpLiterals(t *testing.T) {
	t.Run("prepared", func(t *testing.T) { testPgxBumpLiterals(t, openPgx(t)) })
	t.Run("simple protocol", func(t *testing.T) {
		testPgxBumpLiterals(t, openPgxTuned(t, func(cfg *pgxpool.Config) {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		}))
	})
}

func testPgxBumpLiterals(t *testing.T, tg *target) {
	ctx := t.Context()
	for _, r := range []string{"it's", `a\b'); DROP TABLE items; --`, "nul\x00byte", "\xff\xfe", "$1"} {
		for _, tok := range []uint64{7, math.MaxInt64} {
			if err := tg.run(ctx, fencetest.NewTicket(r, tok), nil2); err != nil {
				t.Fatalf("resource %q token %d: %v", r, tok, err)
			}
			var hw int64
			if err := tg.admin.QueryRow("SELECT high_water FROM "+fence.DefaultTable+" WHERE resource = $1", []byte(r)).Scan(&hw); err != nil || uint64(hw) != tok {
				t.Fatalf("resource %q: stored high-water %d (%v), want %d", r, hw, err, tok)
			}
			err := tg.run(ctx, fencetest.NewTicket(r, tok), nil2)
			var se *fence.StaleError
			if !errors.As(err, &se) || *se != (fence.StaleError{Resource: r, Token: tok, HighWater: tok}) {
				t.Fatalf("resource %q token %d again: %v, want a *fence.StaleError with high-water %d", r, tok, err, tok)
			}
		}
	}
}

// Run prepares its check-and-bump once per connection. If the prepared
// statement is dropped behind pgx's back (DEALLOCATE), Run still fences:
// it sends the statement as literals, and prepares it again next time.
func TestPgxBumpDeallocated(t *testing.T) {
	dsn := testdb.Postgres(t)
	openAdmin(t, "pgx", dsn, fence.Postgres)
	pool := newPgxPool(t, dsn, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	ctx := t.Context()
	prepared := func() []string {
		t.Helper()
		rows, err := pool.Query(ctx, "SELECT name FROM pg_prepared_statements WHERE name LIKE 'ticketing_fence_bump_%'")
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	run := func(tok uint64) error {
		return pgxfence.Run(ctx, pool, fencetest.NewTicket("dealloc", tok), func(pgx.Tx) error { return nil })
	}
	// Prepared by the first Run; dropped; the next Run sends literals
	// and forgets it; the one after prepares it again.
	for tok, want := range []int{1: 1, 2: 0, 3: 1, 4: 0} {
		if tok == 0 {
			continue
		}
		if err := run(uint64(tok)); err != nil {
			t.Fatalf("token %d: %v", tok, err)
		}
		names := prepared()
		if tok%2 == 1 {
			if len(names) != 1 {
				t.Fatalf("token %d: prepared bump statements %v, want one", tok, names)
			}
			if _, err := pool.Exec(ctx, "DEALLOCATE "+names[0]); err != nil {
				t.Fatal(err)
			}
		} else if len(names) != want {
			t.Fatalf("token %d: prepared bump statements %v, want none", tok, names)
		}
	}
	var se *fence.StaleError
	if err := run(4); !errors.As(err, &se) || se.HighWater != 4 {
		t.Fatalf("token 4 again: %v, want a *fence.StaleError with high-water 4", err)
	}
}
