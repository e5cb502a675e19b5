// Package migrations creates the fence high-water table (fence.DefaultTable,
// "ticketing_fence") with goose v3 SQL migrations, embedded in the binary,
// one directory per dialect: postgres/, mysql/, sqlite3/.
//
//	if err := migrations.Up(ctx, db, migrations.Postgres); err != nil { ... }
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
// The same files work with the goose command; pass the version table so
// that the CLI and Up agree on what is applied:
//
//	goose -dir migrations/postgres -table ticketing_goose_version postgres "postgres://user@host/db" up
//	goose -dir migrations/mysql    -table ticketing_goose_version mysql    "user@tcp(host:3306)/db?parseTime=true" up
//	goose -dir migrations/sqlite3  -table ticketing_goose_version sqlite3  ./app.db up
//
// Without goose installed, "go run github.com/pressly/goose/v3/cmd/goose@v3.30.1"
// in place of "goose" works (the version this module uses). The CLI and Up
// agree: after the CLI's up, Up finds version 1 applied; after Down, the
// CLI's status shows it pending. (The CLI uses its own locking, or none.)
// To embed the files in your own Provider, use Files.
//
// # Custom tables
//
// fence.WithTable points the fence at another table; migrations does not
// create it. Copy the dialect's CREATE TABLE with your name.
package migrations
