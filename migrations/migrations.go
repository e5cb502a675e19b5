package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/ticketing-dev/ticketing/fence"
)

// VersionTable is goose's version table for these migrations, separate
// from the application's own goose_db_version.
const VersionTable = "ticketing_goose_version"

// Dialect is fence.Dialect, the module's one dialect type: pass
// fence.Postgres, fence.MySQL or fence.SQLite. Its String is the name of
// the dialect's directory of files and goose's dialect name ("postgres",
// "mysql", "sqlite3"). The alias and the constants below keep code
// written against migrations' names compiling.
type Dialect = fence.Dialect

// The dialects, the same values as fence's: PostgreSQL 11+ (files in
// postgres/), MySQL 8 or MariaDB 10.5+ (mysql/), SQLite 3.35+ (sqlite3/).
//
// Deprecated: use fence.Postgres, fence.MySQL and fence.SQLite.
const (
	Postgres = fence.Postgres
	MySQL    = fence.MySQL
	SQLite   = fence.SQLite
)

// ErrDialect is fence.ErrDialect: errors.Is matches either name.
//
// Deprecated: use fence.ErrDialect.
var ErrDialect = fence.ErrDialect

//go:embed postgres/*.sql mysql/*.sql sqlite3/*.sql
var files embed.FS

// Files returns the goose SQL files of dialect d, for use with a goose
// Provider of your own.
func Files(d fence.Dialect) (fs.FS, error) {
	if _, err := gooseDialect(d); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(files, d.String())
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return sub, nil
}

func gooseDialect(d fence.Dialect) (goose.Dialect, error) {
	switch d {
	case fence.Postgres:
		return goose.DialectPostgres, nil
	case fence.MySQL:
		return goose.DialectMySQL, nil
	case fence.SQLite:
		return goose.DialectSQLite3, nil
	}
	return "", fmt.Errorf("%w: %v", fence.ErrDialect, d)
}

func provider(ctx context.Context, db *sql.DB, d fence.Dialect) (*goose.Provider, error) {
	if err := checkDialect(ctx, db, d); err != nil {
		return nil, err
	}
	gd, err := gooseDialect(d)
	if err != nil {
		return nil, err
	}
	fsys, err := Files(d)
	if err != nil {
		return nil, err
	}
	p, err := goose.NewProvider(gd, db, fsys,
		goose.WithTableName(VersionTable),
		goose.WithDisableGlobalRegistry(true),
		goose.WithSessionLocker(newLocker(d)),
	)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// Up applies every pending migration of dialect d to db and creates the
// table fence.DefaultTable. Applied versions are recorded in VersionTable;
// running Up again is a no-op. Concurrent Up/Down calls, from any number
// of processes, are serialised by a database lock (see the package
// documentation).
//
// Before anything is run, Up and Down check d against db: an invalid d
// returns an error matching fence.ErrDialect, and a d that does not match
// the database (known from db's database/sql driver, or for a driver this
// package does not know, from the server's answer to sqlite_version() or
// version()) returns ErrDialectMismatch; both name d and the database.
func Up(ctx context.Context, db *sql.DB, d fence.Dialect) error {
	p, err := provider(ctx, db, d)
	if err != nil {
		return err
	}
	if err := initVersionTable(ctx, db, d); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// Down rolls back every migration of dialect d, dropping the table
// fence.DefaultTable and all its high-water marks. The version table and,
// on SQLite, the lock table stay. Down is a no-op if nothing is applied.
func Down(ctx context.Context, db *sql.DB, d fence.Dialect) error {
	p, err := provider(ctx, db, d)
	if err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrations: down: %w", err)
	}
	return nil
}

// initVersionTable creates goose's version table and its version-0 row,
// if missing, under the migration lock. goose's Up first checks for
// pending migrations without its session locker, creating the version
// table there when it is missing, so concurrent first runs raced: on
// MySQL, where DDL commits at once, one run could see the table another
// had just created before its version-0 row ("missing zero version
// migration"); on SQLite the concurrent creations could fail with
// SQLITE_BUSY. With the table made here, goose's unlocked check only
// reads, and its migrations still run under its own lock.
func initVersionTable(ctx context.Context, db *sql.DB, d fence.Dialect) (err error) {
	gd, err := gooseDialect(d)
	if err != nil {
		return err
	}
	store, err := database.NewStore(gd, VersionTable)
	if err != nil {
		return err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	l := newLocker(d)
	if err := l.SessionLock(ctx, conn); err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, l.SessionUnlock(context.WithoutCancel(ctx), conn))
	}()
	_, err = store.GetLatestVersion(ctx, conn)
	switch {
	case err == nil:
		return nil // initialised
	case errors.Is(err, database.ErrVersionNotFound):
		// The table without its version-0 row (a run that died between
		// the two on MySQL): add the row.
		return store.Insert(ctx, conn, database.InsertRequest{Version: 0})
	}
	// No table (or it cannot be read, which creating it will report).
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := store.CreateVersionTable(ctx, tx); err != nil {
		return errors.Join(fmt.Errorf("create version table: %w", err), tx.Rollback())
	}
	if err := store.Insert(ctx, tx, database.InsertRequest{Version: 0}); err != nil {
		return errors.Join(fmt.Errorf("insert version 0: %w", err), tx.Rollback())
	}
	return tx.Commit()
}
