package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

// ender is a way for a business function to end the fenced transaction
// early: statements it executes, or the driver's own Commit.
type ender struct {
	name   string
	stmts  []string
	commit bool // call the driver's Commit (then fn returns)
}

// enders returns the ways fn can end the transaction on tg's database.
func enders(tg *target) []ender {
	begin := "BEGIN"
	if tg.dialect == fence.MySQL {
		begin = "START TRANSACTION"
	}
	es := []ender{
		{name: "exec COMMIT", stmts: []string{"COMMIT"}},
		{name: "exec ROLLBACK", stmts: []string{"ROLLBACK"}},
		{name: "exec COMMIT then BEGIN", stmts: []string{"COMMIT", begin}},
		{name: "exec ROLLBACK then BEGIN", stmts: []string{"ROLLBACK", begin}},
		{name: "driver Commit", commit: true},
	}
	if tg.dialect == fence.MySQL {
		// Statements that commit implicitly (docs/fence.md lists them).
		es = append(es,
			ender{name: "TRUNCATE", stmts: []string{"TRUNCATE TABLE fence_log"}},
			ender{name: "CREATE TABLE", stmts: []string{"CREATE TABLE scratch (id INT)"}},
			ender{name: "START TRANSACTION inside", stmts: []string{"START TRANSACTION"}},
			ender{name: "LOCK TABLES", stmts: []string{"LOCK TABLES fence_log WRITE", "UNLOCK TABLES"}},
			ender{name: "TRUNCATE with autocommit=0", stmts: []string{"SET autocommit = 0", "TRUNCATE TABLE fence_log"}},
		)
	}
	return es
}

func (e ender) run(ctx context.Context, q querier) error {
	if e.commit {
		return q.commit(ctx)
	}
	for _, s := range e.stmts {
		if err := q.exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	return nil
}

// wantTxEnded checks that err reports the ended transaction, and only
// that: not a commit of unknown outcome, not a release failure.
func wantTxEnded(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, fence.ErrTxEnded) || errors.Is(err, fence.ErrCommitUnknown) || errors.Is(err, fence.ErrRelease) ||
		errors.Is(err, fence.ErrStale) || errors.Is(err, fence.ErrLeaseExpired) {
		t.Fatalf("err = %v, want fence.ErrTxEnded alone", err)
	}
}

// A business function that ends the transaction (COMMIT, ROLLBACK, an
// implicit commit, the driver's Commit) has left the fence: the
// high-water row is no longer locked, and later statements run outside
// the transaction that checked the token. Run must not report success.
// Before the fix, Run returned nil for every ender but the driver
// Commit (ErrCommitUnknown on pgx and MySQL) and SQLite's COMMIT/ROLLBACK
// (a commit error saying no transaction is active).
func TestTxEnded(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		for i, e := range enders(tg) {
			t.Run(e.name, func(t *testing.T) {
				ctx := ctxTimeout(t, 20*time.Second)
				key := "ended/" + e.name
				tk := fencetest.NewTicket(key, 5)
				id := int64(100 * (i + 1))
				err := tg.run(ctx, tk, func(q querier) error {
					if err := insertItem(id, 5)(q); err != nil {
						return err
					}
					if err := e.run(ctx, q); err != nil {
						return err
					}
					if e.commit {
						return nil
					}
					return insertItem(id+1, 5)(q) // after the end: unfenced
				})
				t.Logf("%s: %v (high-water %d)", e.name, err, tg.highWater(t, key))
				wantTxEnded(t, err)
				wantReleases(t, tk, 1)
				// Nothing is left open or locked: a newer holder goes through.
				if err := tg.run(ctxTimeout(t, 10*time.Second), fencetest.NewTicket(key, 6), nil2); err != nil {
					t.Fatalf("next holder: %v", err)
				}
			})
		}
	})
}

// The same when fn ends the transaction and then fails: the error says
// the transaction had ended (the writes before the end may be durable)
// and still carries fn's error.
func TestTxEndedThenError(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		tk := fencetest.NewTicket("ended-err", 5)
		err := tg.run(t.Context(), tk, func(q querier) error {
			if err := q.exec(t.Context(), "COMMIT"); err != nil {
				return err
			}
			return errBoom
		})
		if !errors.Is(err, fence.ErrTxEnded) || !errors.Is(err, errBoom) || errors.Is(err, fence.ErrCommitUnknown) {
			t.Fatalf("err = %v, want ErrTxEnded wrapping the business error", err)
		}
		wantReleases(t, tk, 1)
		// A business error in a transaction that is still open is
		// returned as is (TestBusinessError); after a failed statement
		// too (PostgreSQL aborts the transaction but it is still open).
		tk = fencetest.NewTicket("ended-err", 6)
		err = tg.run(t.Context(), tk, func(q querier) error {
			if err := q.exec(t.Context(), "SELECT * FROM no_such_table"); err == nil {
				t.Error("query of a missing table succeeded")
			}
			return errBoom
		})
		if err != errBoom {
			t.Fatalf("err = %v, want the business error itself", err)
		}
		if tg.dialect != fence.MySQL {
			return
		}
		// On MySQL/MariaDB a statement that commits implicitly does so
		// before it runs, so even when it fails (the table exists) the
		// transaction has ended.
		tk = fencetest.NewTicket("ended-err", 7)
		err = tg.run(t.Context(), tk, func(q querier) error {
			return q.exec(t.Context(), "CREATE TABLE items (id INT)")
		})
		if !errors.Is(err, fence.ErrTxEnded) || errors.Is(err, fence.ErrCommitUnknown) {
			t.Fatalf("failed CREATE TABLE: err = %v, want ErrTxEnded", err)
		}
		t.Logf("failed CREATE TABLE: %v; high-water %d", err, tg.highWater(t, "ended-err"))
		if hw := tg.highWater(t, "ended-err"); hw != 7 {
			t.Errorf("high-water = %d, want 7: committed by the failed statement", hw)
		}
	})
}

// The zombie: a holder with token 10 ends its transaction
// inside fn (an implicit commit on MySQL, COMMIT or ROLLBACK elsewhere),
// pauses, a newer holder with token 20 writes the row and commits, and
// the zombie wakes up and writes the row too. Before the fix both Runs
// returned nil and the row held the zombie's 10. Now the zombie's Run
// returns ErrTxEnded. Its write itself ran outside any fenced transaction:
// autocommitted (the row holds 10, and the error is the only sign), or,
// with MySQL's autocommit=0, in a new transaction that Run rolls back
// (the row keeps 20).
func TestZombieAfterTxEnded(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		type scenario struct {
			name    string
			stmts   []string
			wantRow int64
		}
		scs := []scenario{
			{"COMMIT", []string{"COMMIT"}, 10},
			{"ROLLBACK", []string{"ROLLBACK"}, 10},
		}
		if tg.dialect == fence.MySQL {
			scs = append(scs,
				scenario{"TRUNCATE", []string{"TRUNCATE TABLE fence_log"}, 10},
				scenario{"TRUNCATE with autocommit=0", []string{"SET autocommit = 0", "TRUNCATE TABLE fence_log"}, 20})
		}
		for i, sc := range scs {
			t.Run(sc.name, func(t *testing.T) {
				ctx := ctxTimeout(t, 20*time.Second)
				id := int64(i + 1)
				key := fmt.Sprintf("row/%d", id)
				tg.mustExec(t, "INSERT INTO items (id, v) VALUES (?, 0)", id)
				set := func(v int64) func(querier) error {
					return func(q querier) error {
						return q.exec(ctx, "UPDATE items SET v = ? WHERE id = ?", v, id)
					}
				}
				var newerErr error
				zombieErr := tg.run(ctx, fencetest.NewTicket(key, 10), func(q querier) error {
					if err := (ender{stmts: sc.stmts}).run(ctx, q); err != nil {
						return err
					}
					// The zombie pauses; the newer holder writes and commits.
					newerErr = tg.run(ctx, fencetest.NewTicket(key, 20), set(20))
					return set(10)(q) // the zombie wakes up and writes
				})
				row := tg.queryInt(t, "SELECT v FROM items WHERE id = ?", id)
				t.Logf("%s %s: zombie (token 10): %v; newer (token 20): %v; row = %d, high-water %d", tg.name,
					sc.name, zombieErr, newerErr, row, tg.highWater(t, key))
				if newerErr != nil {
					t.Fatalf("newer holder: %v", newerErr)
				}
				wantTxEnded(t, zombieErr)
				if row != sc.wantRow {
					t.Errorf("row = %d, want %d", row, sc.wantRow)
				}
			})
		}
	})
}

// Guard in a transaction the caller manages: CheckTx right before
// commit tells whether the transaction is still the one Guard ran in.
func TestGuardCheckTx(t *testing.T) {
	forEach(t, func(t *testing.T, tg *target) {
		ctx := ctxTimeout(t, 20*time.Second)
		// Still the same transaction: CheckTx passes, also twice.
		if err := tg.guarded(ctx, fencetest.NewTicket("g", 1), func(q querier) error {
			return tg.checkTx(ctx, q)
		}); err != nil {
			t.Fatalf("guarded with CheckTx inside: %v", err)
		}
		if hw := tg.highWater(t, "g"); hw != 1 {
			t.Fatalf("high-water = %d, want 1", hw)
		}
		for i, e := range enders(tg) {
			if e.commit {
				continue // the caller's own commit is the end
			}
			t.Run(e.name, func(t *testing.T) {
				err := tg.guarded(ctx, fencetest.NewTicket("g", uint64(2+i)), func(q querier) error {
					return e.run(ctx, q)
				})
				wantTxEnded(t, err)
			})
		}
	})
}

// On MySQL/MariaDB a deadlock rolls back the whole InnoDB transaction,
// the fence's bump and row lock included. A business function that
// ignores the error (a retry loop, say) goes on outside the fence; Run
// must not commit and report success.
func TestMySQLDeadlockEndsTx(t *testing.T) {
	tg := mysqlTarget(t, func(*mysql.Config) {})
	ctx := ctxTimeout(t, 20*time.Second)
	tg.mustExec(t, "INSERT INTO items (id, v) VALUES (1, 0), (2, 0)")
	// The other transaction changes many rows, so InnoDB picks the fenced
	// one, the smaller, as the deadlock victim.
	other, err := tg.admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback()
	for i := range 20 {
		if _, err := other.ExecContext(ctx, "INSERT INTO fence_log (token) VALUES (?)", i); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.ExecContext(ctx, "UPDATE items SET v = 1 WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	tk := fencetest.NewTicket("deadlock", 3)
	var victim, otherErr error
	err = tg.run(ctx, tk, func(q querier) error {
		if err := q.exec(ctx, "UPDATE items SET v = 3 WHERE id = 1"); err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() {
			_, err := other.ExecContext(ctx, "UPDATE items SET v = 1 WHERE id = 1") // waits for fn's row
			done <- err
		}()
		victim = q.exec(ctx, "UPDATE items SET v = 3 WHERE id = 2") // waits for other's row: a cycle
		otherErr = <-done
		return nil // the function ignores the deadlock
	})
	var myErr *mysql.MySQLError
	if !errors.As(victim, &myErr) || myErr.Number != 1213 || otherErr != nil {
		t.Fatalf("fn's statement: %v, the other's: %v; want fn's to be the deadlock victim (1213)", victim, otherErr)
	}
	t.Logf("after a deadlock that fn ignored: %v", err)
	wantTxEnded(t, err)
	if hw := tg.highWater(t, "deadlock"); hw != -1 {
		t.Errorf("high-water = %d, want no row (rolled back by the deadlock)", hw)
	}
}
