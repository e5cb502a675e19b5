package gormfence_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/jmoiron/sqlx"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

// sqlxBeginner lets sqlfence.Run begin the transaction through sqlx, so
// that fn gets the *sqlx.Tx (with sqlx's bind type and mapper) whose
// *sql.Tx the fence checks.
type sqlxBeginner struct {
	db *sqlx.DB
	tx *sqlx.Tx
}

func (b *sqlxBeginner) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	tx, err := b.db.BeginTxx(ctx, opts)
	if err != nil {
		return nil, err
	}
	b.tx = tx
	return tx.Tx, nil
}

// TestSqlx: sqlx needs no adapter; sqlfence.Run fences its transaction.
func TestSqlx(t *testing.T) {
	for _, tc := range envs() {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.open(t)
			ctx := t.Context()
			db := sqlx.NewDb(e.sqlDB, e.driver)

			b := &sqlxBeginner{db: db}
			tk := fencetest.NewTicket("sqlx", 10)
			err := sqlfence.Run(ctx, b, e.dialect, tk, func(*sql.Tx) error {
				if _, err := b.tx.NamedExecContext(ctx, "INSERT INTO items (id, val) VALUES (:id, :val)", Item{ID: 20, Val: "ten"}); err != nil {
					return err
				}
				var got Item
				return b.tx.GetContext(ctx, &got, b.tx.Rebind("SELECT id, val FROM items WHERE id = ?"), 20)
			})
			if err != nil {
				t.Fatalf("sqlfence.Run with sqlx: %v", err)
			}
			if v := e.itemVal(t, 20); v != "ten" || e.highWater(t, "sqlx") != 10 || tk.Releases() != 1 {
				t.Errorf("row 20 = %q, high-water %d, releases %d; want ten, 10, 1", v, e.highWater(t, "sqlx"), tk.Releases())
			}

			// A stale token: refused, nothing written.
			tk = fencetest.NewTicket("sqlx", 9)
			err = sqlfence.Run(ctx, b, e.dialect, tk, func(*sql.Tx) error {
				_, err := b.tx.ExecContext(ctx, b.tx.Rebind("INSERT INTO items (id, val) VALUES (?, ?)"), 21, "nine")
				return err
			})
			if !errors.Is(err, fence.ErrStale) {
				t.Fatalf("stale token: %v, want fence.ErrStale", err)
			}
			if v := e.itemVal(t, 21); v != "" {
				t.Errorf("row 21 = %q after a stale token, want nothing", v)
			}

			// Without a Beginner of its own: wrap the *sql.Tx (sqlx.Tx's
			// exported fields; write the placeholders of the database).
			tk = fencetest.NewTicket("sqlx-2", 1)
			boom := errors.New("boom")
			err = sqlfence.Run(ctx, e.sqlDB, e.dialect, tk, func(tx *sql.Tx) error {
				xtx := &sqlx.Tx{Tx: tx, Mapper: db.Mapper}
				if _, err := xtx.ExecContext(ctx, e.q("INSERT INTO items (id, val) VALUES (?, ?)"), 22, "one"); err != nil {
					return err
				}
				return boom
			})
			if err != boom {
				t.Fatalf("fn's error: %v, want it as is", err)
			}
			if v := e.itemVal(t, 22); v != "" || e.highWater(t, "sqlx-2") != 0 {
				t.Errorf("row 22 = %q, high-water %d after fn failed; want nothing", v, e.highWater(t, "sqlx-2"))
			}
		})
	}
}

// TestEnt: ent needs no adapter; its SQL driver runs on the *sql.Tx of
// sqlfence.Run. entsql.NewDriver(dialect, entsql.Conn{ExecQuerier: tx})
// is a dialect.Driver: a generated client takes it with
// ent.NewClient(ent.Driver(drv)); here ent's SQL builder drives it
// directly, without generated code.
func TestEnt(t *testing.T) {
	for _, tc := range envs() {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.open(t)
			ctx := t.Context()
			entDialect := map[fence.Dialect]string{fence.Postgres: dialect.Postgres, fence.MySQL: dialect.MySQL, fence.SQLite: dialect.SQLite}[e.dialect]

			insert := func(tx *sql.Tx, id int64, val string) error {
				drv := entsql.NewDriver(entDialect, entsql.Conn{ExecQuerier: tx})
				query, args := entsql.Dialect(entDialect).Insert("items").Columns("id", "val").Values(id, val).Query()
				var res sql.Result
				return drv.Exec(ctx, query, args, &res)
			}

			tk := fencetest.NewTicket("ent", 10)
			if err := sqlfence.Run(ctx, e.sqlDB, e.dialect, tk, func(tx *sql.Tx) error { return insert(tx, 30, "ten") }); err != nil {
				t.Fatalf("sqlfence.Run with ent: %v", err)
			}
			if v := e.itemVal(t, 30); v != "ten" || e.highWater(t, "ent") != 10 || tk.Releases() != 1 {
				t.Errorf("row 30 = %q, high-water %d, releases %d; want ten, 10, 1", v, e.highWater(t, "ent"), tk.Releases())
			}

			tk = fencetest.NewTicket("ent", 9)
			err := sqlfence.Run(ctx, e.sqlDB, e.dialect, tk, func(tx *sql.Tx) error { return insert(tx, 31, "nine") })
			if !errors.Is(err, fence.ErrStale) {
				t.Fatalf("stale token: %v, want fence.ErrStale", err)
			}
			if v := e.itemVal(t, 31); v != "" {
				t.Errorf("row 31 = %q after a stale token, want nothing", v)
			}

			boom := errors.New("boom")
			tk = fencetest.NewTicket("ent-2", 1)
			err = sqlfence.Run(ctx, e.sqlDB, e.dialect, tk, func(tx *sql.Tx) error {
				if err := insert(tx, 32, "one"); err != nil {
					return err
				}
				return boom
			})
			if err != boom {
				t.Fatalf("fn's error: %v, want it as is", err)
			}
			if v := e.itemVal(t, 32); v != "" {
				t.Errorf("row 32 = %q after fn failed, want nothing", v)
			}
		})
	}
}
