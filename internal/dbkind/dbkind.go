// Package dbkind tells which SQL database (fence.Dialect) is behind a
// database/sql handle: from the Go type of its driver, with no round trip,
// or, for a driver it does not know, by asking the server. Package
// migrations checks the dialect it is given with Detect before running
// anything; package sqlfence checks it with FromDriver before each Run.
package dbkind

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"strings"

	"github.com/ticketing-dev/ticketing/fence"
)

// Backend is what was found out about a database.
type Backend struct {
	// Dialect is the database's dialect; 0 if it is not known.
	Dialect fence.Dialect
	// What describes the driver or server, for error messages: "its
	// database/sql driver is *mysql.MySQLDriver (github.com/..., a
	// MySQL/MariaDB driver)".
	What string
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

// FromDriver names the database behind v, a database/sql driver (what
// (*sql.DB).Driver returns) or a driver connection, from the package of
// its Go type alone: no round trip. A type of a package it does not know
// (a wrapper, say) gives Dialect 0, with What naming the type.
func FromDriver(v any) Backend {
	name, pkg, ok := typeOf(v)
	if !ok {
		return Backend{0, "its database/sql driver is <nil>"}
	}
	for _, dd := range driverDialects {
		if strings.HasPrefix(pkg, dd.pkg) {
			return Backend{dd.d, fmt.Sprintf("its database/sql driver is %s (%s, a %s driver)", name, pkg, Name(dd.d))}
		}
	}
	return Backend{0, fmt.Sprintf("its database/sql driver %s (%s) is not one this module knows", name, pkg)}
}

// typeOf returns the name of v's Go type and the package that defines it
// (for a pointer type, its element's); ok is false for a nil v.
func typeOf(v any) (name, pkg string, ok bool) {
	t := reflect.TypeOf(v)
	if t == nil {
		return "", "", false
	}
	pt := t
	if pt.Kind() == reflect.Pointer {
		pt = pt.Elem()
	}
	return t.String(), pt.PkgPath(), true
}

// Detect names the database behind db: from the type of its driver if it
// is a well-known one (no round trip), otherwise from at most two cheap
// queries (sqlite_version(), then version()), none of which changes
// anything. A database it cannot identify has Dialect 0.
func Detect(ctx context.Context, db *sql.DB) Backend {
	drv := db.Driver()
	b := FromDriver(drv)
	if b.Dialect != 0 {
		return b
	}
	name := "<nil>"
	if t, pkg, ok := typeOf(drv); ok {
		name = t + " (" + pkg + ")"
	}
	// A driver this package does not know (a wrapper, say): ask the server.
	conn, err := db.Conn(ctx)
	if err != nil {
		return Backend{0, fmt.Sprintf("its database/sql driver %s is not one this package knows, and no connection could be made to ask the server (%v)", name, err)}
	}
	defer conn.Close()
	var v string
	if err := conn.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&v); err == nil {
		return Backend{fence.SQLite, fmt.Sprintf("the server is SQLite %s (driver %s)", v, name)}
	}
	if err := conn.QueryRowContext(ctx, "SELECT version()").Scan(&v); err == nil {
		v, _, _ = strings.Cut(v, " on ") // PostgreSQL's build details
		if strings.HasPrefix(v, "PostgreSQL") {
			return Backend{fence.Postgres, fmt.Sprintf("the server is %q (driver %s)", v, name)}
		}
		return Backend{fence.MySQL, fmt.Sprintf("the server is MySQL/MariaDB %q (driver %s)", v, name)}
	}
	return Backend{0, fmt.Sprintf("its database/sql driver %s is not one this package knows, and the server answered neither sqlite_version() nor version()", name)}
}

// Name is d's name for people: "PostgreSQL", "MySQL/MariaDB", "SQLite".
func Name(d fence.Dialect) string {
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

// ConstName is the Go name of d: "fence.Postgres", "fence.MySQL",
// "fence.SQLite".
func ConstName(d fence.Dialect) string {
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
