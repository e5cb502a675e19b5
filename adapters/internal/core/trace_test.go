package core_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/ticketing-dev/ticketing/adapters/internal/core"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

type fenceKey struct{}

type recFence struct {
	starts []fence.TraceFenceStartData
	ends   []fence.TraceFenceEndData
	// releasesAtEnd is the ticket's releases when End was called.
	releasesAtEnd int
	tk            *fencetest.Ticket
	ctxOK         bool
}

func (r *recFence) TraceFenceStart(ctx context.Context, d fence.TraceFenceStartData) context.Context {
	r.starts = append(r.starts, d)
	return context.WithValue(ctx, fenceKey{}, "fence")
}

func (r *recFence) TraceFenceEnd(ctx context.Context, d fence.TraceFenceEndData) {
	r.ends = append(r.ends, d)
	r.releasesAtEnd = r.tk.Releases()
	r.ctxOK = ctx.Value(fenceKey{}) == "fence"
}

// TestRunTracer: a fence.WithTracer tracer sees the plan before the
// transaction begins (whose context is the tracer's), and Run's result
// after the release.
func TestRunTracer(t *testing.T) {
	stale := &fence.StaleError{Resource: "a", Token: 7, HighWater: 9}
	for _, tc := range []struct {
		name     string
		guardErr error
	}{
		{name: "committed"},
		{name: "stale", guardErr: stale},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := &fakeTx{}
			tk := fencetest.NewTicket("k", 7)
			rec := &recFence{tk: tk}
			var beginCtx context.Context
			d := core.Driver[*fakeTx]{
				Pkg: "test",
				Begin: func(ctx context.Context) (*fakeTx, core.Tx, error) {
					beginCtx = ctx
					return tx, tx, nil
				},
				Guard:    func(context.Context, *fakeTx, fence.Plan) error { return tc.guardErr },
				Definite: func(error) bool { return true },
			}
			err := core.Run(t.Context(), d, tk, func(*fakeTx) error { return nil },
				[]fence.Option{fence.WithResources("b", "a"), fence.WithTracer(rec)})
			if !errors.Is(err, tc.guardErr) {
				t.Fatalf("Run: %v, want %v", err, tc.guardErr)
			}
			if len(rec.starts) != 1 || len(rec.ends) != 1 {
				t.Fatalf("%d starts and %d ends, want 1 and 1", len(rec.starts), len(rec.ends))
			}
			st, en := rec.starts[0], rec.ends[0]
			if !slices.Equal(st.Resources, []string{"a", "b"}) || st.Token != 7 || st.Table != fence.DefaultTable {
				t.Errorf("start data %+v", st)
			}
			if beginCtx == nil || beginCtx.Value(fenceKey{}) != "fence" {
				t.Errorf("the transaction did not begin with the tracer's context")
			}
			if !errors.Is(en.Err, tc.guardErr) || (tc.guardErr == nil) != (en.Err == nil) || en.Token != 7 || !rec.ctxOK {
				t.Errorf("end data %+v, ctx from start %v", en, rec.ctxOK)
			}
			if rec.releasesAtEnd != 1 {
				t.Errorf("end called with %d releases made, want 1", rec.releasesAtEnd)
			}
		})
	}
	// Without WithTracer, nothing changes (covered by TestRun); an
	// invalid plan is never traced.
	rec := &recFence{tk: fencetest.NewTicket("k", 7)}
	err := core.Run(t.Context(), core.Driver[*fakeTx]{Pkg: "test"}, rec.tk, func(*fakeTx) error { return nil },
		[]fence.Option{fence.WithResource(""), fence.WithTracer(rec)})
	if !errors.Is(err, fence.ErrInvalidResource) || len(rec.starts)+len(rec.ends) != 0 {
		t.Errorf("invalid plan: %v, %d starts, %d ends", err, len(rec.starts), len(rec.ends))
	}
}
