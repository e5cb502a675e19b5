package conformance_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/internal/testdb"
)

// fn commits with tx.Commit and a transaction is open on the connection
// again: fn's own (BEGIN on tx.Conn()), or, had the pool's tx given the
// connection back, someone else's (here fn itself, holding it past Run's
// return). fn's write is durable: Run must report fence.ErrTxEnded, not
// "not committed" (an aborted transaction read as Run's) nor an unknown
// commit, and must send nothing on another holder's connection.
func TestPgxPoolTxCommittedInFnConnReused(t *testing.T) {
	dsn := testdb.Postgres(t)
	admin := openAdmin(t, "pgx", dsn, fence.Postgres)
	pool := newPgxPool(t, dsn, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	ctx := t.Context()
	id := int64(1000)
	for _, other := range []struct {
		name  string
		stmts []string
	}{
		{"in a transaction", []string{"BEGIN"}},
		{"in an aborted transaction", []string{"BEGIN", "SELECT 1/0"}},
	} {
		for _, kind := range []string{"pool", "pool conn", "conn"} {
			t.Run(kind+", "+other.name, func(t *testing.T) {
				id++
				var db pgxfence.Beginner = pool
				var pc *pgxpool.Conn
				if kind != "pool" {
					var err error
					if pc, err = pool.Acquire(ctx); err != nil {
						t.Fatal(err)
					}
					defer pc.Release()
					db = pc
					if kind == "conn" {
						db = pc.Conn()
					}
				}
				var held *pgxpool.Conn
				err := pgxfence.Run(ctx, db, fencetest.NewTicket("reuse", uint64(id)), func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, "INSERT INTO items (id, v) VALUES ($1, 0)", id); err != nil {
						return err
					}
					if err := tx.Commit(ctx); err != nil {
						return err
					}
					exec := tx.Conn().Exec
					if kind == "pool" {
						// Given back to the pool (the pool's tx does that)?
						actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
						defer cancel()
						if c, err := pool.Acquire(actx); err == nil {
							held = c
							exec = c.Exec
						}
					}
					for _, s := range other.stmts {
						_, _ = exec(ctx, s)
					}
					return nil
				})
				if held != nil {
					if st := held.Conn().PgConn().TxStatus(); held.Conn().IsClosed() || st == 'I' {
						t.Errorf("Run touched the other holder's connection: closed %v, status %q", held.Conn().IsClosed(), st)
					}
					_, _ = held.Exec(ctx, "ROLLBACK")
					held.Release()
				}
				var n int64
				if err := admin.QueryRow("SELECT count(*) FROM items WHERE id = $1", id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				t.Logf("Run: %v; rows committed by fn: %d", err, n)
				if n != 1 {
					t.Fatalf("fn's commit left %d rows, want 1", n)
				}
				wantTxEnded(t, err)
			})
		}
	}
}

// The same with the other holder in a goroutine of its own, as in a busy
// pool: after fn's tx.Commit, Run must not read the state of the
// connection that the pool gave to someone else (a data race under
// -race, and a status that is not Run's).
func TestPgxPoolTxCommittedInFnConnTaken(t *testing.T) {
	dsn := testdb.Postgres(t)
	openAdmin(t, "pgx", dsn, fence.Postgres)
	pool := newPgxPool(t, dsn, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	ctx := t.Context()
	var done chan error
	err := pgxfence.Run(ctx, pool, fencetest.NewTicket("taken", 1), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO items (id, v) VALUES ($1, 0)", 1100); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		done = make(chan error, 1)
		go func() {
			// The connection is free once the pool's tx gave it back; Run
			// may also keep it until it returns.
			c, err := pool.Acquire(ctx)
			if err != nil {
				done <- err
				return
			}
			defer c.Release()
			for range 20 {
				if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		time.Sleep(20 * time.Millisecond) // no happens-before with the other holder
		return nil
	})
	if done == nil {
		t.Fatalf("fn failed: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("the other holder: %v", err)
	}
	wantTxEnded(t, err)
}

// fn returns with a result it did not close: the connection is busy, and
// pgx's commit fails before sending anything (pgconn.SafeToRetry), then
// closes the connection, so the server rolls back. That is a definite
// "not committed", as it was when the check was a SELECT of its own, not
// fence.ErrCommitUnknown.
func TestPgxCommitNotSent(t *testing.T) {
	dsn := testdb.Postgres(t)
	admin := openAdmin(t, "pgx", dsn, fence.Postgres)
	pool, err := pgxpool.New(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := t.Context()
	for i, kind := range []string{"pool", "pool conn", "conn"} {
		t.Run(kind, func(t *testing.T) {
			id := int64(1200 + i)
			var db pgxfence.Beginner = pool
			if kind != "pool" {
				pc, err := pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer pc.Release()
				db = pc
				if kind == "conn" {
					db = pc.Conn()
				}
			}
			var rows pgx.Rows
			err := pgxfence.Run(ctx, db, fencetest.NewTicket("busy", uint64(id)), func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO items (id, v) VALUES ($1, 0)", id); err != nil {
					return err
				}
				var err error
				rows, err = tx.Query(ctx, "SELECT generate_series(1, 3)")
				return err
			})
			if rows != nil {
				rows.Close()
			}
			var n int64
			if err := admin.QueryRow("SELECT count(*) FROM items WHERE id = $1", id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			t.Logf("Run: %v; rows committed: %d", err, n)
			if err == nil || n != 0 {
				t.Fatalf("err %v, %d rows committed; want an error and none", err, n)
			}
			if errors.Is(err, fence.ErrCommitUnknown) || errors.Is(err, fence.ErrTxEnded) {
				t.Errorf("err = %v, want a definite failure (nothing was sent)", err)
			}
		})
	}
}
