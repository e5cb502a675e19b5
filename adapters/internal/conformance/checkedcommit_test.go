package conformance_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/internal/testdb"
)

// fn commits with the pool's tx.Commit, which gives the connection back
// to the pool; someone else (here fn itself, holding it past Run's
// return) acquires the same connection and opens a transaction of its
// own. fn's write is durable: Run must report fence.ErrTxEnded, not "not
// committed" (an aborted transaction of the other holder read as Run's)
// nor an unknown commit, and must send nothing on the other holder's
// connection.
func TestPgxPoolTxCommittedInFnConnReused(t *testing.T) {
	dsn := testdb.Postgres(t)
	admin := openAdmin(t, "pgx", dsn, fence.Postgres)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ctx := t.Context()
	for i, other := range []struct {
		name  string
		stmts []string
	}{
		{"other holder in a transaction", []string{"BEGIN"}},
		{"other holder in an aborted transaction", []string{"BEGIN", "SELECT 1/0"}},
	} {
		t.Run(other.name, func(t *testing.T) {
			id := int64(1000 + i)
			var held *pgxpool.Conn
			err := pgxfence.Run(ctx, pool, fencetest.NewTicket("reuse", uint64(id)), func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, "INSERT INTO items (id, v) VALUES ($1, 0)", id); err != nil {
					return err
				}
				if err := tx.Commit(ctx); err != nil {
					return err
				}
				c, err := pool.Acquire(ctx)
				if err != nil {
					return err
				}
				held = c
				for _, s := range other.stmts {
					_, _ = c.Exec(ctx, s)
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
