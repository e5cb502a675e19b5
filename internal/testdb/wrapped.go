package testdb

import (
	"database/sql"
	"database/sql/driver"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
)

// wrapped is a database/sql driver of a type of its own around a known
// one, as an instrumenting wrapper would be: code that recognises a
// database by its driver's Go type does not know it and must ask the
// server.
type wrapped struct{ driver.Driver }

// The wrapped drivers: "wrapped-" followed by the name the wrapped driver
// registers (pgx, mysql, sqlite), for sql.Open.
func init() {
	sql.Register("wrapped-pgx", wrapped{&stdlib.Driver{}})
	sql.Register("wrapped-mysql", wrapped{&mysql.MySQLDriver{}})
	sql.Register("wrapped-sqlite", wrapped{&sqlite.Driver{}})
}
