package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/internal/dbkind"
)

// ErrDialectMismatch is fence.ErrDialectMismatch, returned by Up and Down
// when the dialect passed does not match the database behind db (its
// database/sql driver, or what the server answers). Nothing was run: no
// table was created. Pass the dialect the error names. errors.Is matches
// either name; sqlfence.Run returns the same sentinel.
var ErrDialectMismatch = fence.ErrDialectMismatch

// checkDialect returns nil if d is a valid dialect that matches db (or db
// cannot be identified), and otherwise an error, before anything is run,
// that names d and what db is: one matching fence.ErrDialect for an
// invalid d, ErrDialectMismatch for a valid d that does not match.
func checkDialect(ctx context.Context, db *sql.DB, d fence.Dialect) error {
	if db == nil {
		return errors.New("migrations: nil db")
	}
	_, derr := gooseDialect(d)
	b := dbkind.Detect(ctx, db)
	if derr != nil {
		hint := ""
		if b.Dialect != 0 {
			hint = "; pass " + dbkind.ConstName(b.Dialect)
		}
		return fmt.Errorf("migrations: %w (want fence.Postgres, fence.MySQL or fence.SQLite); the database: %s%s", derr, b.What, hint)
	}
	if b.Dialect != 0 && b.Dialect != d {
		return fmt.Errorf("migrations: %w: dialect %s (%s, for %s) was passed, but %s; pass %s. Nothing was run",
			ErrDialectMismatch, d, dbkind.ConstName(d), dbkind.Name(d), b.What, dbkind.ConstName(b.Dialect))
	}
	return nil
}
