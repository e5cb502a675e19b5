package conformance_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

// TestRule19 is SEMANTICS.md rule 19 under load: 16 goroutines × 200
// fenced transactions on one resource (fresh at the start, so the first
// inserts race on the unique index too). Tokens come from an increasing
// atomic counter, four at a time, and each goroutine presents its four in
// shuffled order, so tokens arrive out of order both within and across
// goroutines. Every accepted transaction sleeps 0–2 ms while holding the
// fence and appends its token to fence_log.
//
// Why fence_log's id order is the commit order: an auto-increment id is
// assigned when the row is inserted, not at commit, so in general id order
// is not commit order. Here, though, the log insert happens after the
// check-and-bump, which holds the resource's row lock (Postgres, MySQL) or
// the database's writer lock (SQLite) until the transaction ends. So
// accepted transactions run their log inserts one after another, each
// after the previous one committed (or rolled back), and the ids, which
// the sequence hands out in increasing order, follow commit order. (No
// accepted transaction rolls back here.) Were the fence not holding a lock
// until commit, two transactions could both pass, and the id and commit
// orders would come apart — exactly what the assertions would catch.
//
// Assertions: the logged tokens in id (= commit) order are strictly
// increasing; every rejection is a *fence.StaleError with HighWater >=
// Token; nothing else fails (a MySQL deadlock is a failure, never
// retried); the final high-water is the last logged token; every ticket
// was released once.
func TestRule19(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		violations := rule19Load(t, tg, tg.run)
		for i, v := range violations {
			if i == 10 {
				t.Errorf("... and %d more", len(violations)-10)
				break
			}
			t.Errorf("rule 19 violated: %s", v)
		}
	})
}

// TestRule19NegativeControl shows that TestRule19 can fail: a naive fence
// that reads the high-water without a lock, then bumps it, lets
// out-of-order tokens commit, and the same harness sees it.
func TestRule19NegativeControl(t *testing.T) {
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
			violations := rule19Load(t, tg, naive)
			if len(violations) == 0 {
				t.Fatal("the harness did not detect the naive fence")
			}
			t.Logf("negative control: the harness found %d violations of rule 19 in the naive fence, e.g. %s", len(violations), violations[0])
		})
	}
}

type runFunc func(ctx context.Context, tk fence.Ticket, fn func(querier) error, opts ...fence.Option) error

// rule19Load runs the load against run, checks the outcomes, and returns
// the rule 19 violations found in the log (commit order).
func rule19Load(t *testing.T, tg *target, run runFunc) (violations []string) {
	const workers, perWorker, batch = 16, 200, 4
	{
		ctx := ctxTimeout(t, 90*time.Second)
		const resource = "rule19"
		var (
			counter         atomic.Uint64
			accepted, stale atomic.Int64
			mu              sync.Mutex
			failures        []error
		)
		fail := func(err error) {
			mu.Lock()
			defer mu.Unlock()
			failures = append(failures, err)
		}
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
				for range perWorker / batch {
					first := counter.Add(batch) - batch + 1
					tokens := make([]uint64, batch)
					for i := range tokens {
						tokens[i] = first + uint64(i)
					}
					rng.Shuffle(len(tokens), func(i, j int) { tokens[i], tokens[j] = tokens[j], tokens[i] })
					for _, tok := range tokens {
						sleep := time.Duration(rng.IntN(2001)) * time.Microsecond
						tk := fencetest.NewTicket(resource, tok)
						err := run(ctx, tk, func(q querier) error {
							time.Sleep(sleep / 2)
							if err := q.exec(ctx, "INSERT INTO fence_log (token) VALUES (?)", int64(tok)); err != nil {
								return err
							}
							time.Sleep(sleep - sleep/2)
							return nil
						})
						var se *fence.StaleError
						switch {
						case err == nil:
							accepted.Add(1)
						case errors.As(err, &se) && se.Token == tok && se.HighWater >= tok && se.Resource == resource:
							stale.Add(1)
						default:
							fail(fmt.Errorf("token %d: %w", tok, err))
						}
						if n := tk.Releases(); n != 1 {
							fail(fmt.Errorf("token %d: released %d times", tok, n))
						}
					}
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		for i, err := range failures {
			if i == 10 {
				t.Errorf("... and %d more failures", len(failures)-10)
				break
			}
			t.Errorf("unexpected outcome: %v", err)
		}
		t.Logf("rule19 %s: accepted=%d stale=%d failed=%d total=%d in %v",
			tg.name, accepted.Load(), stale.Load(), len(failures), workers*perWorker, elapsed.Round(time.Millisecond))
		if got := accepted.Load() + stale.Load() + int64(len(failures)); got != workers*perWorker {
			t.Errorf("outcomes = %d, want %d", got, workers*perWorker)
		}

		rows, err := tg.admin.QueryContext(context.Background(), "SELECT token FROM fence_log ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var logged []int64
		for rows.Next() {
			var tok int64
			if err := rows.Scan(&tok); err != nil {
				t.Fatal(err)
			}
			logged = append(logged, tok)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if int64(len(logged)) != accepted.Load() {
			t.Errorf("log has %d rows, accepted %d", len(logged), accepted.Load())
		}
		for i := 1; i < len(logged); i++ {
			if logged[i] <= logged[i-1] {
				violations = append(violations, fmt.Sprintf("commit #%d has token %d after token %d", i, logged[i], logged[i-1]))
			}
		}
		if len(logged) > 0 {
			if hw := tg.highWater(t, resource); hw != logged[len(logged)-1] {
				violations = append(violations, fmt.Sprintf("high-water %d, last accepted token %d", hw, logged[len(logged)-1]))
			}
		}
		if accepted.Load() == 0 || stale.Load() == 0 {
			t.Errorf("the load did not exercise both outcomes")
		}
	}
	return violations
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
