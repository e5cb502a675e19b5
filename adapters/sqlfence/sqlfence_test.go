package sqlfence_test

import (
	"database/sql"
	"errors"
	"testing"

	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDialect: sqlfence's dialect names are fence's, the one dialect type
// of the module (a fence.Dialect passed to migrations.Up is the same value
// here, and sqlfence.ErrDialect is fence.ErrDialect).
func TestDialect(t *testing.T) {
	var d fence.Dialect = sqlfence.SQLite // compiles only if the types are one
	if d != fence.SQLite || sqlfence.Postgres != fence.Postgres || sqlfence.MySQL != fence.MySQL {
		t.Errorf("sqlfence's dialects differ from fence's")
	}
	if sqlfence.ErrDialect != fence.ErrDialect {
		t.Errorf("sqlfence.ErrDialect is not fence.ErrDialect")
	}
}

func TestInvalidArguments(t *testing.T) {
	ctx := t.Context()
	db, err := sql.Open("sqlite", "file:"+t.TempDir()+"/x.db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	noop := func(*sql.Tx) error { return nil }

	tk := fencetest.NewTicket("k", 1)
	if err := sqlfence.Run(ctx, db, 0, tk, noop); !errors.Is(err, fence.ErrDialect) {
		t.Errorf("dialect 0: %v", err)
	}
	if tk.Releases() != 1 {
		t.Errorf("ticket not released after a refused dialect")
	}
	tk = fencetest.NewTicket("k", 1)
	if err := sqlfence.Run(ctx, nil, fence.SQLite, tk, noop); err == nil || tk.Releases() != 1 {
		t.Errorf("nil db: %v, releases %d", err, tk.Releases())
	}
	if err := sqlfence.Guard(ctx, nil, fence.SQLite, tk); err == nil {
		t.Error("nil tx accepted")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := sqlfence.Guard(ctx, tx, 7, tk); !errors.Is(err, fence.ErrDialect) {
		t.Errorf("Guard with dialect 7: %v", err)
	}
}
