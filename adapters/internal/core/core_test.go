package core_test

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/adapters/internal/core"
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
