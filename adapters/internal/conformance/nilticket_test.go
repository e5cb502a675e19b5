package conformance_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
)

// A nil *broker.Ticket (what ignoring an Acquire error gives) is a
// non-nil fence.Ticket holding a nil pointer. Every entry point returns
// fence.ErrNilTicket for it, sends nothing and calls nothing. Before the
// fix Run called its Key method, panicked, and its deferred release
// panicked a second time; Guard panicked too.
func TestNilBrokerTicket(t *testing.T) {
	var tk *broker.Ticket
	forEach(t, func(t *testing.T, tg *target) {
		called := false
		fn := func(querier) error { called = true; return nil }
		if err := tg.run(t.Context(), tk, fn); !errors.Is(err, fence.ErrNilTicket) {
			t.Errorf("Run: %v, want ErrNilTicket", err)
		}
		if err := tg.guarded(t.Context(), tk, fn); !errors.Is(err, fence.ErrNilTicket) {
			t.Errorf("Guard: %v, want ErrNilTicket", err)
		}
		if called {
			t.Error("fn called")
		}
		if n := tg.queryInt(t, "SELECT COUNT(*) FROM ticketing_fence"); n != 0 {
			t.Errorf("%d high-water rows written", n)
		}
	})
	// Without a database: nil checks come first.
	if err := pgxfence.Run(t.Context(), nil, tk, func(pgx.Tx) error { return nil }); !errors.Is(err, fence.ErrNilTicket) {
		t.Errorf("pgxfence.Run: %v", err)
	}
	if err := sqlfence.Run(t.Context(), nil, fence.SQLite, tk, func(*sql.Tx) error { return nil }); !errors.Is(err, fence.ErrNilTicket) {
		t.Errorf("sqlfence.Run: %v", err)
	}
}
