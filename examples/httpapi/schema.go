package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/migrations/pgxmigrations"
)

// The example's own tables. Their names carry the prefix
// ticketing_example_, so that they cannot be confused with an
// application's own orders or payments in the same database.
// ticketing_example_payments.order_id is UNIQUE: a last line of defence,
// so that a bug could only ever fail a payment, never charge twice.
const schema = `
CREATE TABLE IF NOT EXISTS ticketing_example_orders (
	id           BIGINT PRIMARY KEY,
	amount_cents BIGINT NOT NULL CHECK (amount_cents > 0),
	status       TEXT   NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'paid'))
);
CREATE TABLE IF NOT EXISTS ticketing_example_payments (
	id           BIGSERIAL   PRIMARY KEY,
	order_id     BIGINT      NOT NULL UNIQUE REFERENCES ticketing_example_orders (id),
	amount_cents BIGINT      NOT NULL,
	token        BIGINT      NOT NULL,
	created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
`

// seed is the demo orders, so that there is something to pay.
const seed = `
INSERT INTO ticketing_example_orders (id, amount_cents) VALUES (1, 1999), (2, 4500), (3, 120)
ON CONFLICT (id) DO NOTHING`

// tableColumns are the columns the example uses, per table: a table of
// that name without them is not the example's (CREATE TABLE IF NOT EXISTS
// keeps whatever table exists).
var tableColumns = map[string][]string{
	"ticketing_example_orders":   {"id", "amount_cents", "status"},
	"ticketing_example_payments": {"id", "order_id", "amount_cents", "token", "created_at"},
}

// setUp creates the fence's high-water table (pgxmigrations.Up, on the
// pool; the pool stays open) and the example's tables, checks that tables
// of those names that already existed are the example's, and adds the
// demo orders. A real application runs its migrations with its own tool;
// see package migrations for using the fence migrations with goose.
func setUp(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pgxmigrations.Up(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		return err
	}
	for _, table := range []string{"ticketing_example_orders", "ticketing_example_payments"} {
		if err := checkColumns(ctx, pool, table, tableColumns[table]); err != nil {
			return err
		}
	}
	_, err := pool.Exec(ctx, seed)
	return err
}

// checkColumns fails, naming what is missing, if table (in the current
// schema) lacks one of the columns in want.
func checkColumns(ctx context.Context, pool *pgxpool.Pool, table string, want []string) error {
	rows, err := pool.Query(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = $1`, table)
	if err != nil {
		return err
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	var missing []string
	for _, c := range want {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("a table %s already exists without the column(s) %s that this example needs (it has %s): it is not this example's; drop or rename it, or point DATABASE_URL at another database",
			table, strings.Join(missing, ", "), strings.Join(have, ", "))
	}
	return nil
}
