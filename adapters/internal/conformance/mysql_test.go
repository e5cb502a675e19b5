package conformance_test

import (
	"errors"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/internal/testdb"
)

// With clientFoundRows=true, MySQL reports 1 affected row both for an
// insert and for an unchanged row, so affected rows alone cannot tell an
// accepted fresh resource from a stale token. sqlfence also checks the
// LAST_INSERT_ID flag set by the rejecting branch; this test proves it.
func TestMySQLClientFoundRows(t *testing.T) {
	cfg, err := mysql.ParseDSN(testdb.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ClientFoundRows = true
	tg := openSQL(t, "sql/mysql", "mysql", cfg.FormatDSN(), fence.MySQL, fence.MySQL)
	ctx := t.Context()
	for _, tc := range []struct {
		token uint64
		stale bool
	}{{5, false}, {5, true}, {4, true}, {6, false}, {6, true}} {
		err := tg.run(ctx, fencetest.NewTicket("k", tc.token), nil2)
		if got := errors.Is(err, fence.ErrStale); got != tc.stale || (err != nil && !got) {
			t.Fatalf("token %d: err = %v, want stale=%v", tc.token, err, tc.stale)
		}
	}
	if hw := tg.highWater(t, "k"); hw != 6 {
		t.Errorf("high-water = %d, want 6", hw)
	}
}
