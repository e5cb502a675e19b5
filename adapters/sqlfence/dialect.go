package sqlfence

import (
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/go-sql-driver/mysql"

	"github.com/ticketing-dev/ticketing/adapters/internal/core"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/internal/dbkind"
)

// backends caches what the Go type of a driver (or driver connection)
// says about the database: reflect.Type -> dbkind.Backend. It is keyed by
// type, not by *sql.DB, so it stays as small as the number of drivers.
var backends sync.Map

func backendOfType(v any) dbkind.Backend {
	t := reflect.TypeOf(v)
	if b, ok := backends.Load(t); ok {
		return b.(dbkind.Backend)
	}
	b := dbkind.FromDriver(v)
	backends.Store(t, b)
	return b
}

// backendOf names the database behind db from the Go type of its driver,
// without a round trip: a *sql.DB's driver, a *sql.Conn's driver
// connection. Any other Beginner, or a driver this module does not know,
// gives Dialect 0 (not known: the check is left to the fence's own
// statements, see wrongDialect).
func backendOf(db Beginner) dbkind.Backend {
	switch c := db.(type) {
	case *sql.DB:
		if c != nil {
			return backendOfType(c.Driver())
		}
	case *sql.Conn:
		if c != nil {
			var b dbkind.Backend
			// Raw fails only for a closed Conn, which BeginTx reports.
			_ = c.Raw(func(dc any) error { b = backendOfType(dc); return nil })
			return b
		}
	}
	return dbkind.Backend{}
}

// checkDialect returns an error matching fence.ErrDialectMismatch if the
// Go type of db's driver says that the database is not d.
func checkDialect(db Beginner, d Dialect) error {
	b := backendOf(db)
	if b.Dialect == 0 || b.Dialect == d {
		return nil
	}
	return fmt.Errorf("sqlfence: %w: dialect %s (%s, for %s) was passed, but %s; pass %s. Nothing was sent",
		fence.ErrDialectMismatch, d, dbkind.ConstName(d), dbkind.Name(d), b.What, dbkind.ConstName(b.Dialect))
}

// fenceError maps the error of one of the fence's own statements (never
// one of the business function's) to what it means for the user, or
// returns nil: fence.ErrNotMigrated if the high-water table does not
// exist, fence.ErrDialectMismatch if the database rejected the statement
// as not its SQL (a database the driver's type did not tell). Both wrap
// err.
func fenceError(err error, d Dialect, table string) error {
	switch {
	case noTable(err):
		return core.NotMigrated("sqlfence", table,
			"migrations.Up(ctx, db, "+dbkind.ConstName(d)+") (package github.com/ticketing-dev/ticketing/migrations)",
			"migrations.Files("+dbkind.ConstName(d)+")", err)
	case notItsSQL(err):
		return fmt.Errorf("sqlfence: %w: the database rejected the fence's statement for dialect %s (%s, for %s) as not its SQL, so it is probably not %s (or older than the fence supports: PostgreSQL 11, MySQL 8, MariaDB 10.5, SQLite 3.35); pass the database's dialect: fence.Postgres, fence.MySQL or fence.SQLite. Nothing was written: %w",
			fence.ErrDialectMismatch, d, dbkind.ConstName(d), dbkind.Name(d), dbkind.Name(d), err)
	}
	return nil
}

// sqliteError is modernc.org/sqlite's *sqlite.Error (and its like).
type sqliteError interface{ Code() int }

// noTable reports whether err says that a table does not exist:
// PostgreSQL SQLSTATE 42P01 (undefined_table), MySQL/MariaDB error 1146
// (ER_NO_SUCH_TABLE), SQLite's "no such table".
func noTable(err error) bool {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		return pgErr.SQLState() == "42P01"
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		return myErr.Number == 1146
	}
	var liteErr sqliteError
	return errors.As(err, &liteErr) && strings.Contains(err.Error(), "no such table")
}

// notItsSQL reports whether err says that the database did not
// understand a statement: a syntax error (PostgreSQL 42601, MySQL 1064,
// SQLite "syntax error") or an unknown function (PostgreSQL 42883, MySQL
// 1305, SQLite "no such function"). The fence's statements are valid in
// their dialect, so either means another database.
func notItsSQL(err error) bool {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		c := pgErr.SQLState()
		return c == "42601" || c == "42883"
	}
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		return myErr.Number == 1064 || myErr.Number == 1305
	}
	var liteErr sqliteError
	if errors.As(err, &liteErr) {
		m := err.Error()
		return strings.Contains(m, "syntax error") || strings.Contains(m, "no such function")
	}
	return false
}
