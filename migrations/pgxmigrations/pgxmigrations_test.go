package pgxmigrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/migrations/pgxmigrations"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// migrationLock is the advisory lock the migrations hold while they run
// (package migrations' lockKey), as pg_locks shows a bigint key.
const migrationLock = "locktype = 'advisory' AND classid = x'7469636b'::int::oid AND objid = x'65746e67'::int::oid " +
	"AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"

func newPool(t *testing.T, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// checkPool: the pool is still open, every connection the migrations
// borrowed is back, and none of them holds the migration lock. A
// connection broken by a cancellation is destroyed by the pool in the
// background: wait for that (bounded), it is not a leak.
func checkPool(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); pool.Stat().AcquiredConns() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still acquired from the pool", pool.Stat().AcquiredConns())
		}
		time.Sleep(5 * time.Millisecond)
	}
	var locks int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM pg_locks WHERE "+migrationLock).Scan(&locks); err != nil {
		t.Fatalf("pool after the migrations: %v", err)
	}
	if locks != 0 {
		t.Errorf("%d migration locks still held", locks)
	}
}

func TestUpDown(t *testing.T) {
	ctx := t.Context()
	// One connection: the migrations must never wait for a second one.
	pool := newPool(t, testdb.Postgres(t), 1)
	if err := pgxmigrations.Up(ctx, pool); err != nil {
		t.Fatalf("Up: %v", err)
	}
	checkPool(t, pool)
	if _, err := pool.Exec(ctx, "INSERT INTO ticketing_fence (resource, high_water) VALUES ($1, 7)", []byte("k")); err != nil {
		t.Fatalf("insert into the new table: %v", err)
	}
	if err := pgxmigrations.Up(ctx, pool); err != nil {
		t.Fatalf("second Up: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM ticketing_fence").Scan(&n); err != nil || n != 1 {
		t.Fatalf("after the second Up: rows=%d err=%v, want 1 row", n, err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM ticketing_goose_version WHERE version_id = 1 AND is_applied").Scan(&n); err != nil || n != 1 {
		t.Fatalf("version 1 applied %d times (err %v), want once", n, err)
	}
	if err := pgxmigrations.Down(ctx, pool); err != nil {
		t.Fatalf("Down: %v", err)
	}
	checkPool(t, pool)
	if _, err := pool.Exec(ctx, "SELECT 1 FROM ticketing_fence"); err == nil {
		t.Fatal("ticketing_fence still exists after Down")
	}
}

// TestUpCancelledWhileLocked: Up waiting for the migration lock held by
// another process returns ctx's error when ctx ends, and leaves the pool
// clean: no connection kept, no lock left behind, and a later Up works.
func TestUpCancelledWhileLocked(t *testing.T) {
	ctx := t.Context()
	dsn := testdb.Postgres(t)
	pool := newPool(t, dsn, 2)
	other, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(context.WithoutCancel(ctx))
	if _, err := other.Exec(ctx, "SELECT pg_advisory_lock(x'7469636b65746e67'::bigint)"); err != nil {
		t.Fatal(err)
	}

	upCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pgxmigrations.Up(upCtx, pool) }()
	// Cancel once Up waits in the server for the lock.
	for {
		var waiting bool
		if err := other.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND "+migrationLock+")").Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Up returned while the lock was held: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Up: %v, want context.Canceled", err)
	}
	if _, err := other.Exec(ctx, "SELECT pg_advisory_unlock(x'7469636b65746e67'::bigint)"); err != nil {
		t.Fatal(err)
	}
	checkPool(t, pool)
	if err := pgxmigrations.Up(ctx, pool); err != nil {
		t.Fatalf("Up after the cancelled one: %v", err)
	}
	checkPool(t, pool)
}

func TestNilPool(t *testing.T) {
	if err := pgxmigrations.Up(t.Context(), nil); err == nil {
		t.Fatal("Up(nil pool) succeeded")
	}
}
