package core_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/adapters/internal/core"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeTx struct {
	commits, rollbacks int
	commitErr          error
}

func (f *fakeTx) Commit(context.Context) error   { f.commits++; return f.commitErr }
func (f *fakeTx) Rollback(context.Context) error { f.rollbacks++; return nil }

var (
	errDefinite = errors.New("server said no")
	errBroken   = errors.New("connection reset")
	errBegin    = errors.New("cannot begin")
	errGuard    = errors.New("guard failed")
	errFn       = errors.New("fn failed")
)

func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name          string
		beginErr      error
		guardErr      error
		commitErr     error
		fn            func(tk *fencetest.Ticket, cancel context.CancelFunc) error
		nilFn         bool
		want          error
		wantCommits   int
		wantRollbacks int
	}{
		{name: "commit", wantCommits: 1},
		{name: "begin fails", beginErr: errBegin, want: errBegin},
		{name: "guard fails", guardErr: errGuard, want: errGuard, wantRollbacks: 1},
		{name: "fn fails", fn: func(*fencetest.Ticket, context.CancelFunc) error { return errFn }, want: errFn, wantRollbacks: 1},
		{name: "nil fn", nilFn: true, want: nil},
		{name: "lease expired", fn: func(tk *fencetest.Ticket, _ context.CancelFunc) error { tk.SetRemaining(0); return nil },
			want: fence.ErrLeaseExpired, wantRollbacks: 1},
		{name: "cancelled before commit", fn: func(_ *fencetest.Ticket, cancel context.CancelFunc) error { cancel(); return nil },
			want: context.Canceled, wantRollbacks: 1},
		{name: "commit refused", commitErr: errDefinite, want: errDefinite, wantCommits: 1, wantRollbacks: 1},
		{name: "commit unknown", commitErr: errBroken, want: fence.ErrCommitUnknown, wantCommits: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			tx := &fakeTx{commitErr: tc.commitErr}
			tk := fencetest.NewTicket("k", 1)
			d := core.Driver[*fakeTx]{
				Pkg: "test",
				Begin: func(context.Context) (*fakeTx, core.Tx, error) {
					if tc.beginErr != nil {
						return nil, nil, tc.beginErr
					}
					return tx, tx, nil
				},
				Guard:    func(context.Context, *fakeTx, fence.Plan) error { return tc.guardErr },
				Definite: func(err error) bool { return errors.Is(err, errDefinite) },
			}
			fn := func(*fakeTx) error {
				if tc.fn != nil {
					return tc.fn(tk, cancel)
				}
				return nil
			}
			if tc.nilFn {
				fn = nil
			}
			err := core.Run(ctx, d, tk, fn, nil)
			switch {
			case tc.nilFn:
				if err == nil {
					t.Fatal("nil fn accepted")
				}
			case tc.want == nil && err != nil:
				t.Fatalf("err = %v", err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.want == fence.ErrCommitUnknown && !errors.Is(err, errBroken) {
				t.Errorf("ErrCommitUnknown must wrap the driver error: %v", err)
			}
			if tx.commits != tc.wantCommits || tx.rollbacks != tc.wantRollbacks {
				t.Errorf("commits=%d rollbacks=%d, want %d and %d", tx.commits, tx.rollbacks, tc.wantCommits, tc.wantRollbacks)
			}
			if tk.Releases() != 1 {
				t.Errorf("released %d times, want 1", tk.Releases())
			}
		})
	}
}

func TestRunPanicInGuard(t *testing.T) {
	tx := &fakeTx{}
	tk := fencetest.NewTicket("k", 1)
	d := core.Driver[*fakeTx]{
		Pkg:      "test",
		Begin:    func(context.Context) (*fakeTx, core.Tx, error) { return tx, tx, nil },
		Guard:    func(context.Context, *fakeTx, fence.Plan) error { panic("driver bug") },
		Definite: func(error) bool { return true },
	}
	func() {
		defer func() {
			if r := recover(); r != "driver bug" {
				t.Fatalf("recovered %v", r)
			}
		}()
		_ = core.Run(t.Context(), d, tk, func(*fakeTx) error { return nil }, nil)
	}()
	if tx.rollbacks != 1 || tk.Releases() != 1 {
		t.Errorf("rollbacks=%d releases=%d, want 1 and 1", tx.rollbacks, tk.Releases())
	}
}

func TestRunNilTicket(t *testing.T) {
	if err := core.Run[*fakeTx](t.Context(), core.Driver[*fakeTx]{}, nil, nil, nil); !errors.Is(err, fence.ErrNilTicket) {
		t.Fatalf("err = %v", err)
	}
}

// After a stale token, or a lease that ran out before the commit, the
// release answered "not held" (broker.ErrNotHeld: the lease was over) is
// expected: Run returns the primary error (the *fence.StaleError, the
// fence.ErrLeaseExpired) alone. Every other combination still reports the
// release failure in a *fence.ReleaseError with the primary outcome.
// Before the fixes the stale error, and then the expired lease, always
// came wrapped.
func TestRunReleaseAfterStale(t *testing.T) {
	stale := &fence.StaleError{Resource: "k", Token: 1, HighWater: 2}
	unconfirmed := broker.ErrReleaseUnconfirmed
	for _, tc := range []struct {
		name       string
		guardErr   error
		fnErr      error
		releaseErr error
		expire     bool // fn lets the lease run out: Run's primary is ErrLeaseExpired
		alone      bool // err is the primary outcome itself
	}{
		{name: "stale, N", guardErr: stale, releaseErr: broker.ErrNotHeld, alone: true},
		{name: "stale, N wrapped", guardErr: stale, releaseErr: fmt.Errorf("release: %w", broker.ErrNotHeld), alone: true},
		{name: "stale, unconfirmed", guardErr: stale, releaseErr: unconfirmed},
		{name: "stale, closed", guardErr: stale, releaseErr: broker.ErrClosed},
		{name: "lease expired, N", expire: true, releaseErr: broker.ErrNotHeld, alone: true},
		{name: "lease expired, unconfirmed", expire: true, releaseErr: unconfirmed},
		{name: "committed, N", releaseErr: broker.ErrNotHeld},
		{name: "fn failed, N", fnErr: errFn, releaseErr: broker.ErrNotHeld},
		{name: "guard failed, N", guardErr: errGuard, releaseErr: broker.ErrNotHeld},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := &fakeTx{}
			tk := fencetest.NewTicket("k", 1)
			tk.SetReleaseError(tc.releaseErr)
			d := core.Driver[*fakeTx]{
				Pkg:      "test",
				Begin:    func(context.Context) (*fakeTx, core.Tx, error) { return tx, tx, nil },
				Guard:    func(context.Context, *fakeTx, fence.Plan) error { return tc.guardErr },
				Definite: func(error) bool { return true },
			}
			err := core.Run(t.Context(), d, tk, func(*fakeTx) error {
				if tc.expire {
					tk.SetRemaining(0)
				}
				return tc.fnErr
			}, nil)
			primary := tc.guardErr
			if primary == nil {
				primary = tc.fnErr
			}
			isPrimary := func(err error) bool { return err == primary }
			if tc.expire {
				isPrimary = func(err error) bool {
					return errors.Is(err, fence.ErrLeaseExpired) && !errors.Is(err, fence.ErrRelease) && !errors.Is(err, tc.releaseErr)
				}
			}
			var re *fence.ReleaseError
			switch {
			case tc.alone:
				if !isPrimary(err) || errors.Is(err, fence.ErrRelease) {
					t.Fatalf("err = %v, want the primary error alone", err)
				}
			case !errors.As(err, &re) || !isPrimary(re.Primary) || !errors.Is(err, tc.releaseErr):
				t.Fatalf("err = %v, want a *fence.ReleaseError with primary %v", err, primary)
			}
			if tk.Releases() != 1 {
				t.Errorf("released %d times", tk.Releases())
			}
		})
	}
}

// A fence.Ticket interface holding a nil pointer (a nil *broker.Ticket)
// is refused like a nil interface, before any of its methods is called.
// Before the fix its Key method panicked, and so did the deferred release.
func TestRunTypedNilTicket(t *testing.T) {
	var tk *broker.Ticket
	var ftk *fencetest.Ticket
	for _, ticket := range []fence.Ticket{tk, ftk} {
		began := false
		d := core.Driver[*fakeTx]{
			Pkg:   "test",
			Begin: func(context.Context) (*fakeTx, core.Tx, error) { began = true; return &fakeTx{}, &fakeTx{}, nil },
		}
		if err := core.Run(t.Context(), d, ticket, func(*fakeTx) error { return nil }, nil); err != fence.ErrNilTicket {
			t.Errorf("%T: err = %v, want ErrNilTicket", ticket, err)
		}
		if began {
			t.Errorf("%T: began a transaction", ticket)
		}
	}
}

// Run asks the driver, right before COMMIT, whether fn ended the
// transaction; if so nothing is committed and the error matches
// fence.ErrTxEnded alone (not ErrCommitUnknown). The databases' own
// checks are tested in adapters/internal/conformance (TestTxEnded).
func TestRunEnded(t *testing.T) {
	errCheck := errors.New("check failed")
	for _, tc := range []struct {
		name          string
		ended         bool
		endedErr      error
		fnErr         error
		want          []error
		wantNot       []error
		wantCommits   int
		wantRollbacks int
	}{
		{name: "open", wantCommits: 1},
		{name: "ended", ended: true, want: []error{fence.ErrTxEnded}, wantNot: []error{fence.ErrCommitUnknown, fence.ErrRelease}, wantRollbacks: 1},
		{name: "cannot tell", endedErr: errCheck, want: []error{errCheck}, wantNot: []error{fence.ErrTxEnded, fence.ErrCommitUnknown}, wantRollbacks: 1},
		{name: "ended, fn failed", ended: true, fnErr: errFn, want: []error{fence.ErrTxEnded, errFn}, wantRollbacks: 1},
		{name: "open, fn failed", fnErr: errFn, want: []error{errFn}, wantNot: []error{fence.ErrTxEnded}, wantRollbacks: 1},
		{name: "cannot tell, fn failed", endedErr: errCheck, fnErr: errFn, want: []error{errFn}, wantNot: []error{fence.ErrTxEnded, errCheck}, wantRollbacks: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := &fakeTx{}
			tk := fencetest.NewTicket("k", 1)
			d := core.Driver[*fakeTx]{
				Pkg:      "test",
				Begin:    func(context.Context) (*fakeTx, core.Tx, error) { return tx, tx, nil },
				Guard:    func(context.Context, *fakeTx, fence.Plan) error { return nil },
				Ended:    func(context.Context, *fakeTx) (bool, error) { return tc.ended, tc.endedErr },
				Definite: func(error) bool { return false },
			}
			err := core.Run(t.Context(), d, tk, func(*fakeTx) error { return tc.fnErr }, nil)
			if len(tc.want) == 0 && err != nil {
				t.Fatalf("err = %v", err)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("err = %v, want it to match %v", err, w)
				}
			}
			for _, w := range tc.wantNot {
				if errors.Is(err, w) {
					t.Errorf("err = %v matches %v", err, w)
				}
			}
			if tc.fnErr != nil && !tc.ended && err != tc.fnErr {
				t.Errorf("err = %v, want fn's error as is", err)
			}
			if tx.commits != tc.wantCommits || tx.rollbacks != tc.wantRollbacks || tk.Releases() != 1 {
				t.Errorf("commits=%d rollbacks=%d releases=%d, want %d, %d, 1", tx.commits, tx.rollbacks, tk.Releases(), tc.wantCommits, tc.wantRollbacks)
			}
		})
	}
}

// checkedTx is a fakeTx that checks in its commit (core.CheckedTx).
type checkedTx struct {
	fakeTx
	endedLocally bool
	checkedErr   error
	checked      int
}

func (c *checkedTx) EndedLocally() bool { return c.endedLocally }
func (c *checkedTx) CommitChecked(context.Context) error {
	c.checked++
	return c.checkedErr
}

// A CheckedTx replaces Ended and Commit on the success path: its
// CommitChecked commits, its ErrEndedAtCommit is reported as ErrTxEnded,
// and what it knows locally (an idle connection) comes before the lease
// check, as Ended does (writes that fn committed matter more than an
// expired lease).
func TestRunCheckedTx(t *testing.T) {
	for _, tc := range []struct {
		name          string
		endedLocally  bool
		checkedErr    error
		expire        bool
		want          error
		wantChecked   int
		wantRollbacks int
	}{
		{name: "commit", wantChecked: 1},
		{name: "ended at commit", checkedErr: fmt.Errorf("x: %w", core.ErrEndedAtCommit), want: fence.ErrTxEnded, wantChecked: 1, wantRollbacks: 1},
		{name: "ended locally", endedLocally: true, want: fence.ErrTxEnded, wantRollbacks: 1},
		{name: "ended locally, lease expired", endedLocally: true, expire: true, want: fence.ErrTxEnded, wantRollbacks: 1},
		{name: "lease expired", expire: true, want: fence.ErrLeaseExpired, wantRollbacks: 1},
		{name: "commit refused", checkedErr: errDefinite, want: errDefinite, wantChecked: 1, wantRollbacks: 1},
		{name: "commit unknown", checkedErr: errBroken, want: fence.ErrCommitUnknown, wantChecked: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := &checkedTx{endedLocally: tc.endedLocally, checkedErr: tc.checkedErr}
			tk := fencetest.NewTicket("k", 1)
			endedCalls := 0
			d := core.Driver[*checkedTx]{
				Pkg:      "test",
				Begin:    func(context.Context) (*checkedTx, core.Tx, error) { return tx, tx, nil },
				Guard:    func(context.Context, *checkedTx, fence.Plan) error { return nil },
				Ended:    func(context.Context, *checkedTx) (bool, error) { endedCalls++; return false, nil },
				Definite: func(err error) bool { return errors.Is(err, errDefinite) },
			}
			err := core.Run(t.Context(), d, tk, func(*checkedTx) error {
				if tc.expire {
					tk.SetRemaining(0)
				}
				return nil
			}, nil)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tx.checked != tc.wantChecked || tx.commits != 0 || tx.rollbacks != tc.wantRollbacks || endedCalls != 0 {
				t.Errorf("CommitChecked %d (want %d), Commit %d (want 0), Rollback %d (want %d), Ended %d (want 0)",
					tx.checked, tc.wantChecked, tx.commits, tx.rollbacks, tc.wantRollbacks, endedCalls)
			}
			if tk.Releases() != 1 {
				t.Errorf("releases = %d", tk.Releases())
			}
		})
	}
}
