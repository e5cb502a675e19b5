package conformance_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/internal/commitorder"
)

// TestCommitOrderUnderLoad is the fence's commit order under load
// (internal/commitorder): 16 goroutines × 200 fenced transactions on one
// resource with shuffled tokens, each appending its token to fence_log while it holds the fence.
// The logged tokens in id (= commit) order must strictly increase; every
// rejection must be a *fence.StaleError with HighWater >= Token; nothing
// else may fail (a MySQL deadlock is a failure, never retried); the final
// high-water must be the last logged token; every ticket must be released
// once.
func TestCommitOrderUnderLoad(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		commitorder.Test(t, ctxTimeout(t, 90*time.Second), commitOrderConfig(tg, tg.run))
	})
}

// TestCommitOrderNegativeControl shows that TestCommitOrderUnderLoad can
// fail: a naive fence that reads the high-water without a lock, then bumps
// it, lets out-of-order tokens commit, and the same harness sees it.
func TestCommitOrderNegativeControl(t *testing.T) {
	for _, k := range kinds {
		if k.name != "sql/postgres" {
			continue
		}
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			tg := k.open(t)
			naive := func(ctx context.Context, tk fence.Ticket, fn func(querier) error, _ ...fence.Option) error {
				tx, err := tg.admin.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				defer tk.Release(ctx)
				var hw int64
				err = tx.QueryRowContext(ctx, "SELECT high_water FROM ticketing_fence WHERE resource = $1", []byte(tk.Key())).Scan(&hw)
				if err != nil && !errors.Is(err, sql.ErrNoRows) {
					return err
				}
				if int64(tk.Token()) <= hw {
					return &fence.StaleError{Resource: tk.Key(), Token: tk.Token(), HighWater: uint64(hw)}
				}
				if err := fn(sqlQ{tg, tx}); err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, "INSERT INTO ticketing_fence (resource, high_water) VALUES ($1, $2) "+
					"ON CONFLICT (resource) DO UPDATE SET high_water = EXCLUDED.high_water", []byte(tk.Key()), int64(tk.Token())); err != nil {
					return err
				}
				return tx.Commit()
			}
			tg.admin.SetMaxOpenConns(32)
			violations := commitorder.Load(t, ctxTimeout(t, 90*time.Second), commitOrderConfig(tg, naive))
			if len(violations) == 0 {
				t.Fatal("the harness did not detect the naive fence")
			}
			t.Logf("negative control: the harness found %d commit-order violations in the naive fence, e.g. %s", len(violations), violations[0])
		})
	}
}

type runFunc func(ctx context.Context, tk fence.Ticket, fn func(querier) error, opts ...fence.Option) error

// commitOrderConfig is the commit-order load on tg's fence_log with run as the fence.
func commitOrderConfig(tg *target, run runFunc) commitorder.Config {
	placeholder := "?"
	if tg.dialect == fence.Postgres {
		placeholder = "$1"
	}
	return commitorder.Config{
		Name:     tg.name,
		Resource: "commit-order",
		Run: func(ctx context.Context, tk fence.Ticket, fn func(commitorder.Exec) error) error {
			return run(ctx, tk, func(q querier) error { return fn(q.exec) })
		},
		DB:          tg.admin,
		LogTable:    "fence_log",
		Placeholder: placeholder,
	}
}

// TestOppositeOrders: transactions fencing {a, b} and {b, a} concurrently
// never deadlock, because resources are bumped in sorted order.
func TestOppositeOrders(t *testing.T) {
	const workers, perWorker = 8, 40
	forEach(t, func(t *testing.T, tg *target) {
		ctx := ctxTimeout(t, 60*time.Second)
		var counter atomic.Uint64
		var accepted atomic.Int64
		errs := make(chan error, workers*perWorker)
		var wg sync.WaitGroup
		for w := range workers {
			order := []string{"a", "b"}
			if w%2 == 1 {
				order = []string{"b", "a"}
			}
			wg.Go(func() {
				for range perWorker {
					tk := fencetest.NewTicket("unused", counter.Add(1))
					err := tg.run(ctx, tk, func(querier) error {
						time.Sleep(200 * time.Microsecond)
						return nil
					}, fence.WithResources(order...))
					switch {
					case err == nil:
						accepted.Add(1)
					case errors.Is(err, fence.ErrStale):
					default:
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("unexpected error (deadlock?): %v", err)
		}
		a, b := tg.highWater(t, "a"), tg.highWater(t, "b")
		if a != b {
			t.Errorf("high-waters differ: a=%d b=%d", a, b)
		}
		t.Logf("opposite orders %s: accepted=%d of %d", tg.name, accepted.Load(), workers*perWorker)
	})
}
