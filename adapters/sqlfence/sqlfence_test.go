package sqlfence_test

import (
	"database/sql"
	"errors"
	"testing"

	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDialect(t *testing.T) {
	for d, want := range map[sqlfence.Dialect]string{
		sqlfence.Postgres: "postgres", sqlfence.MySQL: "mysql", sqlfence.SQLite: "sqlite", 0: "Dialect(0)",
	} {
		if got := d.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(d), got, want)
		}
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
	if err := sqlfence.Run(ctx, db, 0, tk, noop); !errors.Is(err, sqlfence.ErrDialect) {
		t.Errorf("dialect 0: %v", err)
	}
	if tk.Releases() != 1 {
		t.Errorf("ticket not released after a refused dialect")
	}
	tk = fencetest.NewTicket("k", 1)
	if err := sqlfence.Run(ctx, nil, sqlfence.SQLite, tk, noop); err == nil || tk.Releases() != 1 {
		t.Errorf("nil db: %v, releases %d", err, tk.Releases())
	}
	if err := sqlfence.Guard(ctx, nil, sqlfence.SQLite, tk); err == nil {
		t.Error("nil tx accepted")
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := sqlfence.Guard(ctx, tx, 7, tk); !errors.Is(err, sqlfence.ErrDialect) {
		t.Errorf("Guard with dialect 7: %v", err)
	}
}
