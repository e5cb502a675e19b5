package core_test

import (
	"context"
	"testing"

	"github.com/ticketing-dev/ticketing/adapters/internal/core"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

type panicTx struct {
	fakeTx
	commitPanics bool
}

func (p *panicTx) Commit(ctx context.Context) error {
	if p.commitPanics {
		p.commits++
		panic("commit bug")
	}
	return p.fakeTx.Commit(ctx)
}

// panickyTicket panics in Token, as a broken Ticket implementation might.
type panickyTicket struct{ *fencetest.Ticket }

func (panickyTicket) Token() uint64 { panic("token bug") }

// Release must happen exactly once on every path, also when the driver
// panics outside fn: in Begin (a nil *pgx.Conn inside a non-nil Beginner
// does that), in Commit, or in the ticket's own methods. Before the fix,
// a panic in Begin, Commit or NewPlan left the ticket unreleased (the lock
// lingered until its lease ended) and a panic in Commit skipped the
// rollback.
func TestRunPanicOutsideFn(t *testing.T) {
	for _, tc := range []struct {
		name          string
		beginPanics   bool
		commitPanics  bool
		ticketPanics  bool
		want          any
		wantRollbacks int
	}{
		{name: "begin", beginPanics: true, want: "begin bug"},
		{name: "commit", commitPanics: true, want: "commit bug", wantRollbacks: 1},
		{name: "ticket token", ticketPanics: true, want: "token bug"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := &panicTx{commitPanics: tc.commitPanics}
			ft := fencetest.NewTicket("k", 1)
			var tk fence.Ticket = ft
			if tc.ticketPanics {
				tk = panickyTicket{ft}
			}
			d := core.Driver[*panicTx]{
				Pkg: "test",
				Begin: func(context.Context) (*panicTx, core.Tx, error) {
					if tc.beginPanics {
						panic("begin bug")
					}
					return tx, tx, nil
				},
				Guard:    func(context.Context, *panicTx, fence.Plan) error { return nil },
				Definite: func(error) bool { return true },
			}
			func() {
				defer func() {
					if r := recover(); r != tc.want {
						t.Fatalf("recovered %v, want %v", r, tc.want)
					}
				}()
				_ = core.Run(t.Context(), d, tk, func(*panicTx) error { return nil }, nil)
			}()
			if ft.Releases() != 1 {
				t.Errorf("released %d times, want 1", ft.Releases())
			}
			if tx.rollbacks != tc.wantRollbacks {
				t.Errorf("rollbacks = %d, want %d", tx.rollbacks, tc.wantRollbacks)
			}
		})
	}
}

// A panic in fn after a definite commit failure cannot happen, but a
// panic in Release itself must not lead to a second Release.
func TestRunPanicInRelease(t *testing.T) {
	tx := &fakeTx{}
	tk := &releasePanics{fencetest.NewTicket("k", 1), 0}
	d := core.Driver[*fakeTx]{
		Pkg:      "test",
		Begin:    func(context.Context) (*fakeTx, core.Tx, error) { return tx, tx, nil },
		Guard:    func(context.Context, *fakeTx, fence.Plan) error { return nil },
		Definite: func(error) bool { return true },
	}
	func() {
		defer func() { _ = recover() }()
		_ = core.Run(t.Context(), d, tk, func(*fakeTx) error { return nil }, nil)
	}()
	if tk.n != 1 || tx.commits != 1 || tx.rollbacks != 0 {
		t.Errorf("releases=%d commits=%d rollbacks=%d, want 1, 1, 0", tk.n, tx.commits, tx.rollbacks)
	}
}

type releasePanics struct {
	*fencetest.Ticket
	n int
}

func (r *releasePanics) Release(context.Context) error { r.n++; panic("release bug") }
