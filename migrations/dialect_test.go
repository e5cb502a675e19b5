package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/migrations"
)

// leftTables returns the migration tables (lock, version, fence) that
// exist in db.
func leftTables(t *testing.T, db *sql.DB, d fence.Dialect) []string {
	t.Helper()
	var q string
	switch d {
	case fence.Postgres:
		q = "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_name LIKE 'ticketing%'"
	case fence.MySQL:
		q = "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE 'ticketing%'"
	default:
		q = "SELECT name FROM sqlite_master WHERE name LIKE 'ticketing%'"
	}
	rows, err := db.QueryContext(t.Context(), q)
	if err != nil {
		t.Fatalf("list tables: %v", err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return names
}

// TestWrongDialect: every (database, dialect) pair that does not match,
// and an invalid dialect, fails at once — not when the context ends —
// with an error naming the dialect passed and the database found, and
// leaves no table behind. Each database is reached through its usual
// driver (known by type) and through a wrapper driver (asked by query).
// Before the check, Up(MariaDB, fence.SQLite) retried MariaDB's syntax
// error until the context ended and left ticketing_goose_lock behind.
func TestWrongDialect(t *testing.T) {
	all := []fence.Dialect{fence.Postgres, fence.MySQL, fence.SQLite, fence.Dialect(0), fence.Dialect(9)}
	for _, d := range dialects {
		for _, wrap := range []bool{false, true} {
			drv, kind := d.driver, "driver"
			if wrap {
				drv, kind = "wrapped-"+d.driver, "server"
			}
			t.Run(d.name+"/"+kind, func(t *testing.T) {
				db := open2(t, drv, d.dsn(t))
				for _, pass := range all {
					if pass == d.dialect {
						continue
					}
					for _, op := range []struct {
						name string
						f    func(context.Context, *sql.DB, fence.Dialect) error
					}{{"Up", migrations.Up}, {"Down", migrations.Down}} {
						ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
						err := op.f(ctx, db, pass)
						cancel()
						switch {
						case err == nil:
							t.Fatalf("%s(%s db, %v): nil error", op.name, d.name, pass)
						case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
							t.Fatalf("%s(%s db, %v): %v: it waited for the context instead of failing at once", op.name, d.name, pass, err)
						}
						msg := err.Error()
						valid := pass >= fence.Postgres && pass <= fence.SQLite
						if valid && !errors.Is(err, migrations.ErrDialectMismatch) || !valid && !errors.Is(err, fence.ErrDialect) {
							t.Errorf("%s(%s db, %v): %v: want ErrDialectMismatch for a valid dialect, fence.ErrDialect for an invalid one", op.name, d.name, pass, err)
						}
						// It names the dialect passed, the database found,
						// and the dialect to pass instead.
						found := map[fence.Dialect]string{fence.Postgres: "PostgreSQL", fence.MySQL: "MariaDB", fence.SQLite: "SQLite"}[d.dialect]
						if !wrap {
							found = map[fence.Dialect]string{fence.Postgres: "pgx", fence.MySQL: "go-sql-driver/mysql", fence.SQLite: "modernc.org/sqlite"}[d.dialect]
						}
						want := map[fence.Dialect]string{fence.Postgres: "fence.Postgres", fence.MySQL: "fence.MySQL", fence.SQLite: "fence.SQLite"}[d.dialect]
						if !strings.Contains(msg, pass.String()) || !strings.Contains(msg, found) || !strings.Contains(msg, "pass "+want) {
							t.Errorf("%s(%s db, %v): %q does not name the dialect %q, the database (%q) and what to pass (%q)", op.name, d.name, pass, msg, pass.String(), found, want)
						}
						t.Logf("%s(%s db, %v): %v", op.name, d.name, pass, err)
					}
				}
				if left := leftTables(t, db, d.dialect); len(left) > 0 {
					t.Errorf("tables left behind: %v", left)
				}
				// The right dialect still works through the same db.
				if err := migrations.Up(t.Context(), db, d.dialect); err != nil {
					t.Fatalf("Up with the right dialect: %v", err)
				}
			})
		}
	}
}

// TestReadOnlySQLite: an SQLite database that cannot be written fails at
// once, with SQLite's error; only "busy" and "locked" are waited out.
// Before, the lock loop retried "attempt to write a readonly database"
// until the context ended.
func TestReadOnlySQLite(t *testing.T) {
	dsn := testdb.SQLite(t)
	rw := open2(t, "sqlite", dsn)
	if err := rw.PingContext(t.Context()); err != nil { // creates the file
		t.Fatal(err)
	}
	rw.Close()
	ro := open2(t, "sqlite", dsn+"&mode=ro")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := migrations.Up(ctx, ro, fence.SQLite)
	if err == nil || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "readonly") {
		t.Fatalf("Up on a read-only SQLite database: %v, want SQLite's read-only error at once", err)
	}
}
