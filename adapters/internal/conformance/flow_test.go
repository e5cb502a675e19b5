package conformance_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

var errBoom = errors.New("business failure")

func insertItem(id, v int64) func(querier) error {
	return func(q querier) error {
		return q.exec(context.Background(), "INSERT INTO items (id, v) VALUES (?, ?)", id, v)
	}
}

func (tg *target) itemCount(t testing.TB) int64 {
	t.Helper()
	return tg.queryInt(t, "SELECT COUNT(*) FROM items")
}

func wantReleases(t *testing.T, tk *fencetest.Ticket, n int) {
	t.Helper()
	if got := tk.Releases(); got != n {
		t.Errorf("Release called %d times, want %d", got, n)
	}
}

func TestCommit(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		ctx := t.Context()
		tk := fencetest.NewTicket("orders/1", 5)
		if err := tg.run(ctx, tk, insertItem(1, 5)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		wantReleases(t, tk, 1)
		if hw := tg.highWater(t, "orders/1"); hw != 5 {
			t.Errorf("high-water = %d, want 5", hw)
		}
		if n := tg.itemCount(t); n != 1 {
			t.Errorf("items = %d, want 1", n)
		}
		// A higher token on the existing row is accepted too.
		tk = fencetest.NewTicket("orders/1", 6)
		if err := tg.run(ctx, tk, insertItem(2, 6)); err != nil {
			t.Fatalf("Run with token 6: %v", err)
		}
		wantReleases(t, tk, 1)
		if hw := tg.highWater(t, "orders/1"); hw != 6 {
			t.Errorf("high-water = %d, want 6", hw)
		}
	})
}

func TestStale(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		ctx := t.Context()
		if err := tg.run(ctx, fencetest.NewTicket("k", 10), insertItem(1, 10)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		for _, tok := range []uint64{5, 10, 0} {
			tk := fencetest.NewTicket("k", tok)
			called := false
			err := tg.run(ctx, tk, func(q querier) error { called = true; return nil })
			var se *fence.StaleError
			if !errors.As(err, &se) || !errors.Is(err, fence.ErrStale) {
				t.Fatalf("token %d: err = %v, want *fence.StaleError", tok, err)
			}
			if want := (fence.StaleError{Resource: "k", Token: tok, HighWater: 10}); *se != want {
				t.Errorf("token %d: StaleError = %+v, want %+v", tok, *se, want)
			}
			if called {
				t.Errorf("token %d: fn was called for a stale token", tok)
			}
			wantReleases(t, tk, 1)
		}
		if hw := tg.highWater(t, "k"); hw != 10 {
			t.Errorf("high-water = %d, want 10", hw)
		}
	})
}

func TestBusinessError(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		tk := fencetest.NewTicket("k", 3)
		err := tg.run(t.Context(), tk, func(q querier) error {
			if err := insertItem(1, 3)(q); err != nil {
				return err
			}
			return errBoom
		})
		if !errors.Is(err, errBoom) || err != errBoom {
			t.Fatalf("err = %v, want the business error itself", err)
		}
		wantReleases(t, tk, 1)
		if hw := tg.highWater(t, "k"); hw != -1 {
			t.Errorf("high-water = %d after rollback, want no row", hw)
		}
		if n := tg.itemCount(t); n != 0 {
			t.Errorf("items = %d after rollback, want 0", n)
		}
	})
}

func TestPanic(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		tk := fencetest.NewTicket("k", 3)
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Fatalf("recovered %v, want the original panic value", r)
				}
			}()
			_ = tg.run(t.Context(), tk, func(q querier) error {
				if err := insertItem(1, 3)(q); err != nil {
					return err
				}
				panic("boom")
			})
			t.Fatal("Run returned instead of re-panicking")
		}()
		wantReleases(t, tk, 1)
		if hw := tg.highWater(t, "k"); hw != -1 {
			t.Errorf("high-water = %d after panic, want no row", hw)
		}
		if n := tg.itemCount(t); n != 0 {
			t.Errorf("items = %d after panic, want 0", n)
		}
		// The pool is still usable, and the key is not left locked.
		tk = fencetest.NewTicket("k", 4)
		if err := tg.run(ctxTimeout(t, 10*time.Second), tk, insertItem(1, 4)); err != nil {
			t.Fatalf("Run after panic: %v", err)
		}
	})
}

func TestLeaseExpired(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		for _, tc := range []struct {
			name      string
			remaining time.Duration
			opts      []fence.Option
		}{
			{"expired during fn", 0, nil},
			{"negative", -time.Second, nil},
			{"below commit margin", time.Second, []fence.Option{fence.WithCommitMargin(2 * time.Second)}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tk := fencetest.NewTicket("k-"+tc.name, 3)
				err := tg.run(t.Context(), tk, func(q querier) error {
					tk.SetRemaining(tc.remaining) // the lease runs out while fn works
					return insertItem(1, 3)(q)
				}, tc.opts...)
				if !errors.Is(err, fence.ErrLeaseExpired) {
					t.Fatalf("err = %v, want ErrLeaseExpired", err)
				}
				wantReleases(t, tk, 1)
				if hw := tg.highWater(t, "k-"+tc.name); hw != -1 {
					t.Errorf("high-water = %d, want no row (rolled back)", hw)
				}
				if n := tg.itemCount(t); n != 0 {
					t.Errorf("items = %d, want 0 (rolled back)", n)
				}
			})
		}
	})
}

func TestCommitUnknown(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		if tg.kill == "" {
			t.Skip("SQLite runs in-process: there is no connection to break")
		}
		// The connection is killed from the lease check, the last step
		// before COMMIT: after the check that fn left the transaction
		// open where that is a statement of its own (a connection that
		// broke earlier fails that check, and Run reports it as not
		// committed), before the query that checks and commits on pgx.
		ft := fencetest.NewTicket("k", 3)
		tk := &killingTicket{Ticket: ft}
		err := tg.run(ctxTimeout(t, 20*time.Second), tk, func(q querier) error {
			if err := insertItem(1, 3)(q); err != nil {
				return err
			}
			id, err := q.queryInt(context.Background(), tg.backendID)
			if err != nil {
				return err
			}
			tk.kill = func() {
				tg.mustExec(t, tg.kill, id)
				time.Sleep(50 * time.Millisecond) // let the server close the socket
			}
			return nil
		})
		if !errors.Is(err, fence.ErrCommitUnknown) {
			t.Fatalf("err = %v, want ErrCommitUnknown", err)
		}
		t.Logf("commit after a killed connection: %v", err)
		wantReleases(t, ft, 1)
		// The pool recovers.
		if err := tg.run(ctxTimeout(t, 10*time.Second), fencetest.NewTicket("k2", 1), insertItem(2, 1)); err != nil {
			t.Fatalf("Run after a broken connection: %v", err)
		}
	})
}

// killingTicket runs kill (once) when Run checks the lease, which is
// right before COMMIT.
type killingTicket struct {
	*fencetest.Ticket
	kill func()
}

func (k *killingTicket) Remaining() time.Duration {
	if k.kill != nil {
		k.kill()
		k.kill = nil
	}
	return k.Ticket.Remaining()
}

func TestReleaseError(t *testing.T) {
	errRel := errors.New("release failed")
	forEach(t, func(t *testing.T, tg *target) {
		tk := fencetest.NewTicket("k", 7)
		tk.SetReleaseError(errRel)
		err := tg.run(t.Context(), tk, insertItem(1, 7))
		var re *fence.ReleaseError
		if !errors.As(err, &re) || re.Primary != nil || !errors.Is(err, errRel) || !errors.Is(err, fence.ErrRelease) {
			t.Fatalf("err = %v, want *ReleaseError with nil Primary", err)
		}
		if !fence.Committed(err) {
			t.Error("Committed(err) = false for a committed transaction")
		}
		if hw := tg.highWater(t, "k"); hw != 7 {
			t.Errorf("high-water = %d, want 7 (committed)", hw)
		}
		wantReleases(t, tk, 1)

		// A stale token stays visible behind a release error.
		tk = fencetest.NewTicket("k", 6)
		tk.SetReleaseError(errRel)
		err = tg.run(t.Context(), tk, insertItem(2, 6))
		if !errors.Is(err, fence.ErrStale) || !errors.Is(err, fence.ErrRelease) || fence.Committed(err) {
			t.Fatalf("err = %v, want stale and release errors, not committed", err)
		}
		// And so does a business error.
		tk = fencetest.NewTicket("k", 8)
		tk.SetReleaseError(errRel)
		err = tg.run(t.Context(), tk, func(querier) error { return errBoom })
		if !errors.Is(err, errBoom) || !errors.Is(err, errRel) || fence.Committed(err) {
			t.Fatalf("err = %v, want business and release errors, not committed", err)
		}
		wantReleases(t, tk, 1)
	})
}

func TestKeysAndTokens(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		ctx := t.Context()
		long := strings.Repeat("\xff\x00\xe9", 85) // 255 bytes, not UTF-8
		if len(long) != 255 {
			t.Fatalf("len = %d", len(long))
		}
		// Byte strings that differ only in case, padding or a NUL are
		// different resources: no collation folds them together.
		distinct := []string{long, "a", "A", "a ", "a\x00", "\x00", "ä"}
		for i, key := range distinct {
			if err := tg.run(ctx, fencetest.NewTicket(key, uint64(10+i)), nil2); err != nil {
				t.Fatalf("key %q: %v", key, err)
			}
		}
		for i, key := range distinct {
			if hw := tg.highWater(t, key); hw != int64(10+i) {
				t.Errorf("key %q: high-water = %d, want %d", key, hw, 10+i)
			}
		}
		err := tg.run(ctx, fencetest.NewTicket(long, 10), nil2)
		var se *fence.StaleError
		if !errors.As(err, &se) || se.Resource != long {
			t.Fatalf("stale on the long key: %v", err)
		}

		for _, tc := range []struct {
			name  string
			key   string
			token uint64
			opts  []fence.Option
			want  error
		}{
			{"256-byte key", long + "x", 1, nil, fence.ErrInvalidResource},
			{"empty key", "", 1, nil, fence.ErrInvalidResource},
			{"empty resource option", "k", 1, []fence.Option{fence.WithResource("")}, fence.ErrInvalidResource},
			{"no resources", "k", 1, []fence.Option{fence.WithResources()}, fence.ErrInvalidResource},
			{"token above int64", "k", math.MaxInt64 + 1, nil, fence.ErrTokenRange},
			{"max uint64 token", "k", math.MaxUint64, nil, fence.ErrTokenRange},
			{"unsafe table", "k", 1, []fence.Option{fence.WithTable("t; DROP TABLE items")}, fence.ErrInvalidTable},
			{"quoted table", "k", 1, []fence.Option{fence.WithTable(`"t"`)}, fence.ErrInvalidTable},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tk := fencetest.NewTicket(tc.key, tc.token)
				called := false
				err := tg.run(ctx, tk, func(querier) error { called = true; return nil }, tc.opts...)
				if !errors.Is(err, tc.want) {
					t.Fatalf("err = %v, want %v", err, tc.want)
				}
				if called {
					t.Error("fn called")
				}
				wantReleases(t, tk, 1)
			})
		}

		// The largest storable token is stored exactly.
		if err := tg.run(ctx, fencetest.NewTicket("max", math.MaxInt64), nil2); err != nil {
			t.Fatalf("token MaxInt64: %v", err)
		}
		if hw := tg.highWater(t, "max"); hw != math.MaxInt64 {
			t.Errorf("high-water = %d, want MaxInt64", hw)
		}
		err = tg.run(ctx, fencetest.NewTicket("max", math.MaxInt64), nil2)
		if !errors.As(err, &se) || se.HighWater != math.MaxInt64 {
			t.Fatalf("repeat of MaxInt64: %v, want stale with high-water MaxInt64", err)
		}
	})
}

func nil2(querier) error { return nil }

func TestResources(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		ctx := t.Context()
		// WithResource replaces the key.
		if err := tg.run(ctx, fencetest.NewTicket("key", 5), nil2, fence.WithResource("other")); err != nil {
			t.Fatal(err)
		}
		if tg.highWater(t, "key") != -1 || tg.highWater(t, "other") != 5 {
			t.Fatalf("WithResource: key=%d other=%d", tg.highWater(t, "key"), tg.highWater(t, "other"))
		}
		// Several resources, duplicates and order do not matter.
		if err := tg.run(ctx, fencetest.NewTicket("key", 6), nil2, fence.WithResources("b", "other", "a", "b")); err != nil {
			t.Fatal(err)
		}
		for _, r := range []string{"a", "b", "other"} {
			if hw := tg.highWater(t, r); hw != 6 {
				t.Errorf("%s: high-water = %d, want 6", r, hw)
			}
		}
		// One stale resource rejects the whole transaction: the others
		// bumped before it are rolled back.
		if err := tg.run(ctx, fencetest.NewTicket("key", 9), nil2, fence.WithResource("z")); err != nil {
			t.Fatal(err)
		}
		err := tg.run(ctx, fencetest.NewTicket("key", 7), insertItem(1, 7), fence.WithResources("a", "z"))
		var se *fence.StaleError
		if !errors.As(err, &se) || se.Resource != "z" || se.HighWater != 9 {
			t.Fatalf("err = %v, want stale on z", err)
		}
		if hw := tg.highWater(t, "a"); hw != 6 {
			t.Errorf("a: high-water = %d, want 6 (rolled back)", hw)
		}
		if n := tg.itemCount(t); n != 0 {
			t.Errorf("items = %d, want 0", n)
		}
	})
}

func TestCustomTable(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		ddl := map[string]string{
			"pgx/postgres":      "CREATE TABLE my_fence (resource BYTEA PRIMARY KEY, high_water BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL)",
			"pgx-conn/postgres": "CREATE TABLE my_fence (resource BYTEA PRIMARY KEY, high_water BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL)",
			"sql/postgres":      "CREATE TABLE my_fence (resource BYTEA PRIMARY KEY, high_water BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL)",
			"sql/mysql":         "CREATE TABLE my_fence (resource VARBINARY(255) PRIMARY KEY, high_water BIGINT NOT NULL, updated_at DATETIME(6) NOT NULL)",
			"sql/sqlite":        "CREATE TABLE my_fence (resource BLOB PRIMARY KEY, high_water INTEGER NOT NULL, updated_at TEXT NOT NULL)",
		}[tg.name]
		tg.mustExec(t, ddl)
		ctx := t.Context()
		if err := tg.run(ctx, fencetest.NewTicket("k", 4), nil2, fence.WithTable("my_fence")); err != nil {
			t.Fatal(err)
		}
		if hw := tg.highWaterIn(t, "my_fence", "k"); hw != 4 {
			t.Errorf("my_fence high-water = %d, want 4", hw)
		}
		if hw := tg.highWater(t, "k"); hw != -1 {
			t.Errorf("default table touched: %d", hw)
		}
		err := tg.run(ctx, fencetest.NewTicket("k", 4), nil2, fence.WithTable("my_fence"))
		if !errors.Is(err, fence.ErrStale) {
			t.Errorf("err = %v, want stale", err)
		}
		// A table that does not exist is fence.ErrNotMigrated, naming
		// the option and where the CREATE TABLE is.
		err = tg.run(ctx, fencetest.NewTicket("k", 5), nil2, fence.WithTable("missing_fence"))
		if !errors.Is(err, fence.ErrNotMigrated) || errors.Is(err, fence.ErrStale) || !strings.Contains(err.Error(), "missing_fence (fence.WithTable)") {
			t.Errorf("missing table: err = %v, want fence.ErrNotMigrated naming the table", err)
		}
	})
}

func TestGuard(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		ctx := t.Context()
		tk := fencetest.NewTicket("k", 2)
		if err := tg.guarded(ctx, tk, insertItem(1, 2)); err != nil {
			t.Fatalf("guarded: %v", err)
		}
		wantReleases(t, tk, 0) // Guard never releases
		if hw := tg.highWater(t, "k"); hw != 2 {
			t.Errorf("high-water = %d, want 2", hw)
		}
		tk = fencetest.NewTicket("k", 1)
		err := tg.guarded(ctx, tk, insertItem(2, 1))
		var se *fence.StaleError
		if !errors.As(err, &se) || se.HighWater != 2 || se.Token != 1 {
			t.Fatalf("err = %v, want stale (token 1, high-water 2)", err)
		}
		tk = fencetest.NewTicket("k", 3)
		tk.SetRemaining(0)
		if err := tg.guarded(ctx, tk, insertItem(3, 3)); !errors.Is(err, fence.ErrLeaseExpired) {
			t.Fatalf("err = %v, want ErrLeaseExpired from CheckLease", err)
		}
		if n := tg.itemCount(t); n != 1 {
			t.Errorf("items = %d, want 1", n)
		}
	})
}
