package fence

import (
	"errors"
	"fmt"
)

// Dialect names the SQL database that holds the high-water table. It is
// the one dialect type of the module: package sqlfence takes it to choose
// its statements, package migrations to choose its SQL files (pgxfence
// needs none: it is PostgreSQL only). The zero value is invalid.
type Dialect int

const (
	// Postgres is PostgreSQL 11+ (with sqlfence: through pgx's
	// database/sql driver, github.com/jackc/pgx/v5/stdlib, driver name
	// "pgx").
	Postgres Dialect = iota + 1
	// MySQL is MySQL 8 or MariaDB 10.5+ (with sqlfence: through
	// github.com/go-sql-driver/mysql).
	MySQL
	// SQLite is SQLite 3.35+ (with sqlfence: through modernc.org/sqlite,
	// driver name "sqlite", with _txlock=immediate in the DSN).
	SQLite
)

// ErrDialect is returned (by sqlfence and migrations) for a Dialect that
// is not Postgres, MySQL or SQLite, and by ParseDialect for an unknown
// name.
var ErrDialect = errors.New("fence: unknown dialect")

// String returns the dialect's name, which is also goose's dialect name
// and the name of the directory of its migrations: "postgres", "mysql",
// "sqlite3". An invalid dialect prints as "Dialect(n)".
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite3"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// ParseDialect returns the dialect named s: a name String returns, or
// "postgresql", "mariadb" or "sqlite". Any other name is an error
// matching ErrDialect.
func ParseDialect(s string) (Dialect, error) {
	switch s {
	case "postgres", "postgresql":
		return Postgres, nil
	case "mysql", "mariadb":
		return MySQL, nil
	case "sqlite3", "sqlite":
		return SQLite, nil
	}
	return 0, fmt.Errorf("%w: %q (want postgres, mysql or sqlite3)", ErrDialect, s)
}
