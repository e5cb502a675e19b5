// Package pgxmigrations creates the fence's high-water table through a
// pgx v5 pool, for applications that use pgx directly (and
// adapters/pgxfence) rather than database/sql:
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
//	...
//	if err := pgxmigrations.Up(ctx, pool); err != nil { ... }
//
// Up and Down are migrations.Up and migrations.Down with fence.Postgres,
// run through a *sql.DB that borrows the pool's connections
// (stdlib.OpenDBFromPool) and is closed before they return. The pool
// stays open and keeps its settings; every connection borrowed is handed
// back, with the migration lock (a session advisory lock) released. The
// migrations use one of the pool's connections at a time, so a pool of
// one connection works too (when it is free).
//
// It is a package of its own so that migrations, used with MySQL or
// SQLite, does not link pgx and register its database/sql driver.
package pgxmigrations

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/migrations"
)

// Up applies every pending migration to the database of pool, creating
// the table fence.DefaultTable; see migrations.Up (locking, the version
// table, running it from many processes at once). pool is not closed.
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	return withDB(pool, func(db *sql.DB) error { return migrations.Up(ctx, db, fence.Postgres) })
}

// Down rolls back every migration, dropping fence.DefaultTable and all its
// high-water marks; see migrations.Down. pool is not closed.
func Down(ctx context.Context, pool *pgxpool.Pool) error {
	return withDB(pool, func(db *sql.DB) error { return migrations.Down(ctx, db, fence.Postgres) })
}

// withDB runs f with a *sql.DB on pool's connections and closes it.
// Closing it hands every connection back to pool and leaves pool open.
func withDB(pool *pgxpool.Pool, f func(*sql.DB) error) error {
	if pool == nil {
		return errors.New("pgxmigrations: nil pool")
	}
	db := stdlib.OpenDBFromPool(pool)
	return errors.Join(f(db), db.Close())
}
