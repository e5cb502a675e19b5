// Package migrations creates the fence high-water table (fence.DefaultTable,
// "ticketing_fence") with goose v3 SQL migrations, embedded in the binary,
// one directory per dialect: postgres/, mysql/, sqlite3/.
//
//	if err := migrations.Up(ctx, db, fence.Postgres); err != nil { ... } // or fence.MySQL, fence.SQLite
//
// The dialect is fence.Dialect, the same type and values that package
// sqlfence takes (Dialect and the constants here are aliases of fence's).
// Up and Down check it against the database before running anything: a
// dialect that does not match (known from db's database/sql driver —
// pgx, lib/pq, go-sql-driver/mysql, modernc.org/sqlite, mattn/go-sqlite3
// and a few others — or, for a driver they do not know, from the server's
// answer to sqlite_version() or version()) fails at once with
// ErrDialectMismatch (which is fence.ErrDialectMismatch, the error
// sqlfence.Run returns for the same mistake), and an invalid one with fence.ErrDialect; both
// errors name the dialect passed, the database found and the dialect to
// pass.
// With pgx, without database/sql, use package
// github.com/ticketing-dev/ticketing/migrations/pgxmigrations:
//
//	if err := pgxmigrations.Up(ctx, pool); err != nil { ... } // pool is a *pgxpool.Pool; it stays open
//
// The table has one row per resource:
//
//	resource    BYTEA / VARBINARY(255) / BLOB, primary key, 1–255 bytes
//	high_water  BIGINT, the highest accepted fencing token
//	updated_at  when high_water last rose
//
// # Goose Provider, version table, locking
//
// Up and Down run a goose Provider (goose.NewProvider), never goose's
// global state, with its own version table, VersionTable
// ("ticketing_goose_version"), so these migrations do not mix with the
// application's own goose_db_version. Running Up from several processes at
// once is safe: each run holds a database lock while it works —
// pg_advisory_lock on PostgreSQL, GET_LOCK on MySQL/MariaDB (both tied to
// the session, so they vanish with a crashed process), and a row in the
// table ticketing_goose_lock on SQLite (taken over after five minutes if
// its holder crashed). Waiting honours ctx. (goose itself checks for the
// version table before taking the lock; when several processes create it
// at the same moment, goose retries the losers, up to 3 times 1 s apart.)
//
// # The goose CLI
//
// The same files work with the goose command. Write them into a
// directory of your module with the command ticketing-migrations (it
// writes the files of the module version in your go.mod), then pass that
// directory and the version table to goose, so that the CLI and Up agree
// on what is applied. From your module's directory:
//
//	go run github.com/ticketing-dev/ticketing/migrations/cmd/ticketing-migrations postgres db/ticketing
//	go run github.com/pressly/goose/v3/cmd/goose@v3.30.1 -dir db/ticketing -table ticketing_goose_version postgres "postgres://user@host/db" up
//
// For MySQL/MariaDB, write mysql for postgres in both commands and give
// goose a DSN such as "user@tcp(host:3306)/db?parseTime=true"; for SQLite,
// sqlite3 and a file name such as ./app.db. With goose installed, "goose"
// does for the second command (v3.30.1 is the version this module uses). If go
// reports a missing go.sum entry for goose, run the "go get" it names.
// This was run from a scratch module against PostgreSQL, MariaDB and
// SQLite: after the CLI's up, Up found version 1 applied and did
// nothing; after Down, the CLI's status showed it pending. (The CLI uses
// its own locking, or none: run it from one place.) To embed the files in
// your own goose Provider, use Files.
//
// # Custom tables
//
// fence.WithTable points the fence at another table; migrations does not
// create it. Copy the dialect's CREATE TABLE with your name.
package migrations
