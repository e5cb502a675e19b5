package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/ticketing-dev/ticketing/fence"
)

// ErrDialectMismatch is returned by Up and Down when the dialect passed
// does not match the database behind db (its database/sql driver, or what
// the server answers). Nothing was run: no table was created. Pass the
// dialect the error names.
var ErrDialectMismatch = errors.New("migrations: the dialect does not match the database")

// backend is what detect found out about a *sql.DB.
type backend struct {
	dialect fence.Dialect // 0: not known
	what    string        // the driver or server, for errors
}

// driverDialects maps the package paths (prefixes) of well-known
// database/sql drivers to their dialect.
var driverDialects = []struct {
	pkg string
	d   fence.Dialect
}{
	{"github.com/jackc/pgx/", fence.Postgres},
	{"github.com/lib/pq", fence.Postgres},
	{"github.com/go-sql-driver/mysql", fence.MySQL},
	{"modernc.org/sqlite", fence.SQLite},
	{"github.com/mattn/go-sqlite3", fence.SQLite},
	{"github.com/ncruces/go-sqlite3", fence.SQLite},
	{"github.com/glebarez/go-sqlite", fence.SQLite},
}

// detect names the database behind db: from the type of its driver if it
// is a well-known one (no round trip), otherwise from at most two cheap
// queries (sqlite_version(), then version()), none of which changes
// anything. A database it cannot identify has dialect 0.
func detect(ctx context.Context, db *sql.DB) backend {
	t := reflect.TypeOf(db.Driver())
	name := "<nil>"
	if t != nil {
		name = t.String()
		pt := t
		if pt.Kind() == reflect.Pointer {
			pt = pt.Elem()
		}
		pkg := pt.PkgPath()
		for _, dd := range driverDialects {
			if strings.HasPrefix(pkg, dd.pkg) {
				return backend{dd.d, fmt.Sprintf("its database/sql driver is %s (%s, a %s driver)", name, pkg, dialectName(dd.d))}
			}
		}
		name = fmt.Sprintf("%s (%s)", name, pkg)
	}
	// A driver this package does not know (a wrapper, say): ask the server.
	conn, err := db.Conn(ctx)
	if err != nil {
		return backend{0, fmt.Sprintf("its database/sql driver %s is not one this package knows, and no connection could be made to ask the server (%v)", name, err)}
	}
	defer conn.Close()
	var v string
	if err := conn.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&v); err == nil {
		return backend{fence.SQLite, fmt.Sprintf("the server is SQLite %s (driver %s)", v, name)}
	}
	if err := conn.QueryRowContext(ctx, "SELECT version()").Scan(&v); err == nil {
		v, _, _ = strings.Cut(v, " on ") // PostgreSQL's build details
		if strings.HasPrefix(v, "PostgreSQL") {
			return backend{fence.Postgres, fmt.Sprintf("the server is %q (driver %s)", v, name)}
		}
		return backend{fence.MySQL, fmt.Sprintf("the server is MySQL/MariaDB %q (driver %s)", v, name)}
	}
	return backend{0, fmt.Sprintf("its database/sql driver %s is not one this package knows, and the server answered neither sqlite_version() nor version()", name)}
}

// dialectName is d's name for people.
func dialectName(d fence.Dialect) string {
	switch d {
	case fence.Postgres:
		return "PostgreSQL"
	case fence.MySQL:
		return "MySQL/MariaDB"
	case fence.SQLite:
		return "SQLite"
	}
	return d.String()
}

// constName is the Go name of d.
func constName(d fence.Dialect) string {
	switch d {
	case fence.Postgres:
		return "fence.Postgres"
	case fence.MySQL:
		return "fence.MySQL"
	case fence.SQLite:
		return "fence.SQLite"
	}
	return d.String()
}

// checkDialect returns nil if d is a valid dialect that matches db (or db
// cannot be identified), and otherwise an error, before anything is run,
// that names d and what db is: one matching fence.ErrDialect for an
// invalid d, ErrDialectMismatch for a valid d that does not match.
func checkDialect(ctx context.Context, db *sql.DB, d fence.Dialect) error {
	if db == nil {
		return errors.New("migrations: nil db")
	}
	_, derr := gooseDialect(d)
	b := detect(ctx, db)
	if derr != nil {
		hint := ""
		if b.dialect != 0 {
			hint = "; pass " + constName(b.dialect)
		}
		return fmt.Errorf("migrations: %w (want fence.Postgres, fence.MySQL or fence.SQLite); the database: %s%s", derr, b.what, hint)
	}
	if b.dialect != 0 && b.dialect != d {
		return fmt.Errorf("%w: dialect %s (%s, for %s) was passed, but %s; pass %s. Nothing was run",
			ErrDialectMismatch, d, constName(d), dialectName(d), b.what, constName(b.dialect))
	}
	return nil
}
