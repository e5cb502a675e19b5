// Package core is the transaction flow shared by the fence adapters:
// begin, check-and-bump, business function, lease check, commit, release.
package core

import (
	"context"
	"errors"
	"fmt"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
)

// Tx is what the flow needs from a driver transaction.
type Tx interface {
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// CheckedTx is a Tx that can check, inside its commit's own round trip,
// that it is still the transaction Guard ran in: Run then skips Driver.Ended
// on the success path and calls EndedLocally and CommitChecked instead,
// saving the check's round trip.
type CheckedTx interface {
	Tx
	// EndedLocally reports, without asking the database, whether the
	// transaction is known to have ended (the connection is idle): true
	// means ended, false that it may still be Guard's (CommitChecked
	// checks the rest).
	EndedLocally() bool
	// CommitChecked commits only if the transaction is still Guard's,
	// checked in the same round trip as the COMMIT. It returns
	// ErrEndedAtCommit (wrapped) if it was not: nothing was committed and
	// the transaction was rolled back. Any other error is the commit's,
	// classified by Driver.Definite. After CommitChecked returns, the
	// transaction is over whatever the outcome (Rollback is a no-op) and
	// the connection is given back.
	CommitChecked(ctx context.Context) error
}

// ErrEndedAtCommit is returned by CheckedTx.CommitChecked when the check
// in the commit's round trip found that the transaction is no longer
// Guard's.
var ErrEndedAtCommit = errors.New("the transaction is no longer the fenced one")

// Driver adapts one driver family to the flow. T is the transaction type
// handed to the business function (pgx.Tx, *sql.Tx).
type Driver[T any] struct {
	// Pkg prefixes error messages ("pgxfence").
	Pkg string
	// Check, if not nil, validates the driver's own settings before begin;
	// its error is returned as is.
	Check func() error
	// Begin starts a transaction.
	Begin func(ctx context.Context) (T, Tx, error)
	// Guard performs the check-and-bump for plan inside tx.
	Guard func(ctx context.Context, tx T, plan fence.Plan) error
	// BeginGuard, if not nil, is tried before Begin: it starts a
	// transaction and performs Guard's check-and-bump in the same round
	// trip, with Guard's outcomes. handled false means it sent nothing:
	// Run goes on with Begin and Guard. Otherwise an error with raw nil
	// is a failed begin, and an error with raw not nil is Guard's
	// (Run rolls raw back).
	BeginGuard func(ctx context.Context, plan fence.Plan) (tx T, raw Tx, handled bool, err error)
	// Ended, if not nil, reports whether tx is no longer the transaction that Guard
	// ran in (the business function committed or rolled back, explicitly
	// or implicitly): (true, nil). (false, nil) means it still is; an
	// error means it could not tell. Run calls it once after fn, right
	// before the commit (unless the Tx is a CheckedTx, which checks in its
	// commit), and may call it again after fn failed; it may
	// consume state that Guard left in tx (a savepoint), since nothing but
	// COMMIT or ROLLBACK follows.
	Ended func(ctx context.Context, tx T) (bool, error)
	// Definite reports whether a failed commit's error is a definite answer
	// from the database (the transaction did not commit). Everything else
	// is reported as fence.ErrCommitUnknown.
	Definite func(err error) bool
}

// TxEnded is the error for a transaction that fn ended, wrapping fn's own
// error, if any.
func TxEnded(pkg string, fnErr error) error {
	const msg = "committed or rolled back since the check-and-bump; writes may be durable, unfenced"
	if fnErr != nil {
		return fmt.Errorf("%s: %w: %s: %w", pkg, fence.ErrTxEnded, msg, fnErr)
	}
	return fmt.Errorf("%s: %w: %s", pkg, fence.ErrTxEnded, msg)
}

// leaseOver reports whether primary is an outcome after which the lock is
// expected to be gone: a stale token (a newer holder wrote, so this lease
// ended) or a lease that ran out before the commit.
func leaseOver(primary error) bool {
	return errors.Is(primary, fence.ErrStale) || errors.Is(primary, fence.ErrLeaseExpired)
}

// Run executes the fenced flow and always releases the ticket exactly once
// (when ticket is not nil), also when anything panics: fn, the driver's
// Begin, Guard or Commit (a nil pointer inside a non-nil Beginner, say),
// or the ticket's own Key or Token. On a panic an open transaction is
// rolled back first, then the ticket is released, then the panic goes on.
//
// After a stale token or an expired lease (fence.ErrLeaseExpired) the
// release's answer "not held" (broker.ErrNotHeld: the lease had already
// ended) is what the caller expects, not a failure: Run returns the
// primary error alone. Every other release failure is returned as a
// *fence.ReleaseError carrying the primary outcome.
func Run[T any](ctx context.Context, d Driver[T], ticket fence.Ticket, fn func(T) error, opts []fence.Option) (err error) {
	if fence.NilTicket(ticket) { // nothing to release
		return fence.ErrNilTicket
	}
	var (
		// raw is the open transaction: set after Begin, cleared once
		// COMMIT or ROLLBACK returned.
		raw      Tx
		released bool
	)
	// Release exactly once, whatever happens, after the outcome is settled.
	release := func(primary error) error {
		released = true
		if rerr := ticket.Release(context.WithoutCancel(ctx)); rerr != nil {
			if leaseOver(primary) && errors.Is(rerr, broker.ErrNotHeld) {
				return primary // the lease is over: "not held" is expected
			}
			return &fence.ReleaseError{Primary: primary, Err: rerr}
		}
		return primary
	}
	defer func() {
		// Reached with the ticket unreleased only during a panic (or
		// runtime.Goexit), anywhere below: roll back what is open,
		// release, and let the panic go on.
		if released {
			return
		}
		if raw != nil {
			_ = raw.Rollback(context.WithoutCancel(ctx))
		}
		_ = release(nil)
	}()
	rollback := func(primary error) error {
		// A rollback error is not reported: an unfinished transaction is
		// rolled back by the server when its connection goes away.
		_ = raw.Rollback(context.WithoutCancel(ctx))
		raw = nil
		return release(primary)
	}

	plan, err := fence.NewPlan(ticket, opts...)
	if err != nil {
		return release(err)
	}
	if tr := plan.Tracer; tr != nil {
		// Traced from here on: the end is reported with Run's result,
		// after the release (on a panic: before the release, with the
		// result nil, and the panic goes on).
		tok := uint64(plan.Token)
		ctx = tr.TraceFenceStart(ctx, fence.TraceFenceStartData{Resources: plan.Resources, Table: plan.Table, Token: tok})
		tctx := ctx
		defer func() {
			tr.TraceFenceEnd(tctx, fence.TraceFenceEndData{Resources: plan.Resources, Table: plan.Table, Token: tok, Err: err})
		}()
	}
	if d.Check != nil {
		if err := d.Check(); err != nil {
			return release(err)
		}
	}
	if fn == nil {
		return release(fmt.Errorf("%s: nil function", d.Pkg))
	}
	var (
		tx      T
		began   Tx
		guarded bool
	)
	if d.BeginGuard != nil {
		tx, began, guarded, err = d.BeginGuard(ctx, plan)
		if guarded && err != nil {
			if began == nil {
				return release(fmt.Errorf("%s: begin: %w", d.Pkg, err))
			}
			raw = began
			return rollback(err)
		}
	}
	if !guarded {
		tx, began, err = d.Begin(ctx)
		if err != nil {
			return release(fmt.Errorf("%s: begin: %w", d.Pkg, err))
		}
	}
	raw = began

	if !guarded {
		if err := d.Guard(ctx, tx, plan); err != nil {
			return rollback(err)
		}
	}
	txEnded := func() (bool, error) {
		if d.Ended == nil {
			return false, nil
		}
		return d.Ended(ctx, tx)
	}
	if err := fn(tx); err != nil {
		if ended, _ := txEnded(); ended {
			return rollback(TxEnded(d.Pkg, err))
		}
		return rollback(err)
	}
	if err := ctx.Err(); err != nil {
		return rollback(fmt.Errorf("%s: before commit: %w", d.Pkg, err))
	}
	// The high-water row lock is only ours while Guard's transaction is
	// open: if fn ended it, committing now would report unfenced writes
	// as fenced. A CheckedTx tells what it can for free here, and checks
	// the rest in the commit's round trip.
	checked, oneTrip := raw.(CheckedTx)
	if oneTrip {
		if checked.EndedLocally() {
			return rollback(TxEnded(d.Pkg, nil))
		}
	} else if ended, err := txEnded(); err != nil {
		return rollback(fmt.Errorf("%s: before commit: %w", d.Pkg, err))
	} else if ended {
		return rollback(TxEnded(d.Pkg, nil))
	}
	if err := fence.CheckLease(ticket, fence.WithCommitMargin(plan.CommitMargin)); err != nil {
		return rollback(err)
	}
	commit := raw.Commit
	if oneTrip {
		commit = checked.CommitChecked
	}
	if err := commit(ctx); err != nil {
		if errors.Is(err, ErrEndedAtCommit) {
			return rollback(TxEnded(d.Pkg, nil))
		}
		if d.Definite(err) {
			// The database answered: the transaction did not commit.
			return rollback(fmt.Errorf("%s: commit: %w", d.Pkg, err))
		}
		raw = nil
		return release(fmt.Errorf("%s: %w: %w", d.Pkg, fence.ErrCommitUnknown, err))
	}
	raw = nil
	return release(nil)
}

// NotMigrated is the error for a fence statement that found no high-water
// table: it matches fence.ErrNotMigrated, wraps the driver's error err,
// and says what to run. up is the call that creates fence.DefaultTable
// ("migrations.Up(ctx, db, fence.MySQL)"), files where the table's
// CREATE TABLE is for a table of the user's own (fence.WithTable).
func NotMigrated(pkg, table, up, files string, err error) error {
	if table == fence.DefaultTable {
		return fmt.Errorf("%s: %w: table %s is missing: run %s once before fenced writes (at start-up; it is safe to run from every process); nothing was written: %w",
			pkg, fence.ErrNotMigrated, table, up, err)
	}
	return fmt.Errorf("%s: %w: table %s (fence.WithTable) is missing: create it with the columns of the migration's CREATE TABLE (%s); %s creates only %s; nothing was written: %w",
		pkg, fence.ErrNotMigrated, table, files, up, fence.DefaultTable, err)
}
