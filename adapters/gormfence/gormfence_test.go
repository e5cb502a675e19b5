package gormfence_test

import (
	"context"
	"errors"
	"testing"

	"gorm.io/gorm"

	"github.com/ticketing-dev/ticketing/adapters/gormfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

// hookTicket is a fencetest.Ticket that runs onRelease when released.
type hookTicket struct {
	*fencetest.Ticket
	onRelease func()
}

func (h *hookTicket) Release(ctx context.Context) error {
	if h.onRelease != nil {
		h.onRelease()
	}
	return h.Ticket.Release(ctx)
}

func put(id int64, val string) func(tx *gorm.DB) error {
	return func(tx *gorm.DB) error {
		return tx.Save(&Item{ID: id, Val: val}).Error
	}
}

func TestRun(t *testing.T) {
	for _, tc := range envs() {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.open(t)
			ctx := t.Context()
			if d, err := gormfence.Dialect(e.db); err != nil || d != e.dialect {
				t.Fatalf("Dialect: %v, %v; want %v", d, err, e.dialect)
			}

			t.Run("write", func(t *testing.T) {
				tk := fencetest.NewTicket("acct-1", 10)
				if err := gormfence.Run(ctx, e.db, tk, put(1, "ten")); err != nil {
					t.Fatalf("Run: %v", err)
				}
				if v := e.itemVal(t, 1); v != "ten" {
					t.Errorf("row 1 = %q, want ten", v)
				}
				if hw := e.highWater(t, "acct-1"); hw != 10 {
					t.Errorf("high-water %d, want 10", hw)
				}
				if tk.Releases() != 1 {
					t.Errorf("releases %d, want 1", tk.Releases())
				}
			})

			t.Run("stale", func(t *testing.T) {
				tk := fencetest.NewTicket("acct-1", 9)
				called := false
				err := gormfence.Run(ctx, e.db, tk, func(tx *gorm.DB) error {
					called = true
					return put(2, "nine")(tx)
				})
				var stale *fence.StaleError
				if !errors.As(err, &stale) || !errors.Is(err, fence.ErrStale) {
					t.Fatalf("Run with a stale token: %v, want a *fence.StaleError", err)
				}
				if stale.Token != 9 || stale.HighWater != 10 {
					t.Errorf("StaleError %+v, want token 9, high-water 10", stale)
				}
				if called {
					t.Error("fn ran with a stale token")
				}
				if v := e.itemVal(t, 2); v != "" {
					t.Errorf("row 2 = %q after a stale token, want nothing", v)
				}
				if hw := e.highWater(t, "acct-1"); hw != 10 {
					t.Errorf("high-water %d, want 10", hw)
				}
				if tk.Releases() != 1 {
					t.Errorf("releases %d, want 1", tk.Releases())
				}
			})

			t.Run("fn error rolls back", func(t *testing.T) {
				boom := errors.New("boom")
				tk := fencetest.NewTicket("acct-2", 5)
				err := gormfence.Run(ctx, e.db, tk, func(tx *gorm.DB) error {
					if err := put(3, "five")(tx); err != nil {
						return err
					}
					return boom
				})
				if err != boom {
					t.Fatalf("Run: %v, want fn's error as is", err)
				}
				if v := e.itemVal(t, 3); v != "" {
					t.Errorf("row 3 = %q after fn failed, want nothing", v)
				}
				if hw := e.highWater(t, "acct-2"); hw != 0 {
					t.Errorf("high-water %d after fn failed, want no bump", hw)
				}
				if tk.Releases() != 1 {
					t.Errorf("releases %d, want 1", tk.Releases())
				}
			})

			t.Run("commit then release", func(t *testing.T) {
				atRelease := "(not released)"
				tk := &hookTicket{Ticket: fencetest.NewTicket("acct-3", 7)}
				tk.onRelease = func() {
					if tk.Releases() == 0 { // what the first release sees
						atRelease = e.itemVal(t, 4)
					}
				}
				if err := gormfence.Run(ctx, e.db, tk, put(4, "seven")); err != nil {
					t.Fatalf("Run: %v", err)
				}
				if atRelease != "seven" {
					t.Errorf("at release, another connection saw row 4 = %q: released before commit", atRelease)
				}
				if tk.Releases() != 1 {
					t.Errorf("releases %d, want 1", tk.Releases())
				}
			})

			t.Run("release error after commit", func(t *testing.T) {
				tk := fencetest.NewTicket("acct-4", 3)
				tk.SetReleaseError(errors.New("lock service unreachable"))
				err := gormfence.Run(ctx, e.db, tk, put(5, "three"))
				var rerr *fence.ReleaseError
				if !errors.As(err, &rerr) || rerr.Primary != nil || !fence.Committed(err) {
					t.Fatalf("Run: %v, want a *fence.ReleaseError with a nil Primary", err)
				}
				if v := e.itemVal(t, 5); v != "three" {
					t.Errorf("row 5 = %q, want three (committed)", v)
				}
			})

			t.Run("lease expired", func(t *testing.T) {
				tk := fencetest.NewTicket("acct-5", 4)
				err := gormfence.Run(ctx, e.db, tk, func(tx *gorm.DB) error {
					tk.SetRemaining(0)
					return put(6, "four")(tx)
				})
				if !errors.Is(err, fence.ErrLeaseExpired) {
					t.Fatalf("Run: %v, want fence.ErrLeaseExpired", err)
				}
				if v := e.itemVal(t, 6); v != "" {
					t.Errorf("row 6 = %q after the lease ran out, want nothing", v)
				}
			})

			t.Run("fn commits", func(t *testing.T) {
				tk := fencetest.NewTicket("acct-6", 4)
				err := gormfence.Run(ctx, e.db, tk, func(tx *gorm.DB) error {
					if err := put(7, "four")(tx); err != nil {
						return err
					}
					return tx.Commit().Error
				})
				if !errors.Is(err, fence.ErrTxEnded) {
					t.Fatalf("Run: %v, want fence.ErrTxEnded", err)
				}
				if tk.Releases() != 1 {
					t.Errorf("releases %d, want 1", tk.Releases())
				}
			})

			t.Run("nested", func(t *testing.T) {
				tk := fencetest.NewTicket("acct-7", 4)
				outer := e.db.WithContext(ctx).Begin()
				if outer.Error != nil {
					t.Fatal(outer.Error)
				}
				defer outer.Rollback()
				err := gormfence.Run(ctx, outer, tk, put(8, "four"))
				if !errors.Is(err, gormfence.ErrNestedTx) {
					t.Fatalf("Run in a transaction: %v, want ErrNestedTx", err)
				}
				if tk.Releases() != 1 {
					t.Errorf("releases %d, want 1", tk.Releases())
				}
			})

			t.Run("prepared statements", func(t *testing.T) {
				// PrepareStmt: GORM's transaction is a *gorm.PreparedStmtTX
				// around the *sql.Tx.
				pdb := e.db.Session(&gorm.Session{PrepareStmt: true})
				tk := fencetest.NewTicket("acct-9", 3)
				if err := gormfence.Run(ctx, pdb, tk, put(10, "three")); err != nil {
					t.Fatalf("Run with PrepareStmt: %v", err)
				}
				boom := errors.New("boom")
				err := gormfence.Run(ctx, pdb, fencetest.NewTicket("acct-9", 4), func(tx *gorm.DB) error {
					if err := put(11, "four")(tx); err != nil {
						return err
					}
					return boom
				})
				if err != boom {
					t.Fatalf("Run with PrepareStmt: %v, want fn's error", err)
				}
				if v, w := e.itemVal(t, 10), e.itemVal(t, 11); v != "three" || w != "" || e.highWater(t, "acct-9") != 3 {
					t.Errorf("rows 10, 11 = %q, %q, high-water %d; want three, nothing, 3", v, w, e.highWater(t, "acct-9"))
				}
			})

			t.Run("guard", func(t *testing.T) {
				tk := fencetest.NewTicket("acct-8", 2)
				err := e.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					if err := gormfence.Guard(ctx, tx, tk); err != nil {
						return err
					}
					if err := put(9, "two")(tx); err != nil {
						return err
					}
					if err := gormfence.CheckTx(ctx, tx); err != nil {
						return err
					}
					return fence.CheckLease(tk)
				})
				if err != nil {
					t.Fatalf("Guard in db.Transaction: %v", err)
				}
				if v := e.itemVal(t, 9); v != "two" || e.highWater(t, "acct-8") != 2 {
					t.Errorf("row 9 = %q, high-water %d; want two, 2", v, e.highWater(t, "acct-8"))
				}
			})
		})
	}
}

func TestUnknownDialector(t *testing.T) {
	tk := fencetest.NewTicket("k", 1)
	err := gormfence.Run(t.Context(), nil, tk, func(*gorm.DB) error { return nil })
	if !errors.Is(err, fence.ErrDialect) {
		t.Errorf("nil db: %v, want fence.ErrDialect", err)
	}
	if tk.Releases() != 1 {
		t.Errorf("releases %d, want 1", tk.Releases())
	}
}
