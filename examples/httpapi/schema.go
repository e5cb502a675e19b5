package main

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/migrations/pgxmigrations"
)

// schema is the example's own tables. payments.order_id is UNIQUE: a last
// line of defence, so that a bug could only ever fail a payment, never
// charge twice.
const schema = `
CREATE TABLE IF NOT EXISTS orders (
	id           BIGINT PRIMARY KEY,
	amount_cents BIGINT NOT NULL CHECK (amount_cents > 0),
	status       TEXT   NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'paid'))
);
CREATE TABLE IF NOT EXISTS payments (
	id           BIGSERIAL   PRIMARY KEY,
	order_id     BIGINT      NOT NULL UNIQUE REFERENCES orders (id),
	amount_cents BIGINT      NOT NULL,
	token        BIGINT      NOT NULL,
	created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- Demo orders, so that there is something to pay.
INSERT INTO orders (id, amount_cents) VALUES (1, 1999), (2, 4500), (3, 120)
ON CONFLICT (id) DO NOTHING;
`

// setUp creates the fence's high-water table (pgxmigrations.Up, on the
// pool; the pool stays open) and the example's tables. A real application
// runs its migrations with its own tool; see package migrations for using
// the fence migrations with goose.
func setUp(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pgxmigrations.Up(ctx, pool); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, schema)
	return err
}
