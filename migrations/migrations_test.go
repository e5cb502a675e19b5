package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/migrations"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type dialect struct {
	name    string
	driver  string
	dsn     func(testing.TB) string
	dialect migrations.Dialect
	insert  string
}

var dialects = []dialect{
	{"postgres", "pgx", testdb.Postgres, migrations.Postgres,
		"INSERT INTO ticketing_fence (resource, high_water) VALUES ($1, $2)"},
	{"mysql", "mysql", testdb.MySQL, migrations.MySQL,
		"INSERT INTO ticketing_fence (resource, high_water) VALUES (?, ?)"},
	{"sqlite", "sqlite", testdb.SQLite, migrations.SQLite,
		"INSERT INTO ticketing_fence (resource, high_water, updated_at) VALUES (?, ?, 'now')"},
}

func open(t *testing.T, d dialect) *sql.DB {
	t.Helper()
	db, err := sql.Open(d.driver, d.dsn(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func versions(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM "+migrations.VersionTable+" WHERE version_id > 0 AND is_applied").Scan(&n); err != nil {
		t.Fatalf("read version table: %v", err)
	}
	return n
}

func TestUpDown(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			ctx := t.Context()
			db := open(t, d)
			if err := migrations.Up(ctx, db, d.dialect); err != nil {
				t.Fatalf("Up: %v", err)
			}
			if _, err := db.ExecContext(ctx, d.insert, []byte("k\xff"), 7); err != nil {
				t.Fatalf("insert into the new table: %v", err)
			}
			// Re-applying is a no-op and keeps the data.
			if err := migrations.Up(ctx, db, d.dialect); err != nil {
				t.Fatalf("second Up: %v", err)
			}
			var n int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM ticketing_fence").Scan(&n); err != nil || n != 1 {
				t.Fatalf("after second Up: rows=%d err=%v, want 1 row", n, err)
			}
			if got := versions(t, db); got != 1 {
				t.Fatalf("applied versions = %d, want 1", got)
			}
			if err := migrations.Down(ctx, db, d.dialect); err != nil {
				t.Fatalf("Down: %v", err)
			}
			if _, err := db.ExecContext(ctx, "SELECT 1 FROM ticketing_fence"); err == nil {
				t.Fatal("ticketing_fence still exists after Down")
			}
			if err := migrations.Down(ctx, db, d.dialect); err != nil {
				t.Fatalf("second Down (no-op): %v", err)
			}
			if err := migrations.Up(ctx, db, d.dialect); err != nil {
				t.Fatalf("Up after Down: %v", err)
			}
			if _, err := db.ExecContext(ctx, d.insert, []byte("k"), 1); err != nil {
				t.Fatalf("insert after Up/Down/Up: %v", err)
			}
		})
	}
}

func TestConcurrentUp(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			ctx := t.Context()
			dsn := d.dsn(t)
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				wg.Go(func() {
					// One *sql.DB per goroutine, like separate processes.
					db, err := sql.Open(d.driver, dsn)
					if err != nil {
						errs[i] = err
						return
					}
					defer db.Close()
					errs[i] = migrations.Up(ctx, db, d.dialect)
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("concurrent Up: %v", err)
			}
			db := open2(t, d.driver, dsn)
			if got := versions(t, db); got != 1 {
				t.Fatalf("applied versions = %d, want exactly 1", got)
			}
		})
	}
}

func open2(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestInvalidDialect(t *testing.T) {
	db, err := sql.Open("sqlite", testdb.SQLite(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(context.Background(), db, 0); !errors.Is(err, migrations.ErrDialect) {
		t.Fatalf("Up with dialect 0: %v, want ErrDialect", err)
	}
	if _, err := migrations.Files(migrations.Dialect(9)); !errors.Is(err, migrations.ErrDialect) {
		t.Fatalf("Files with dialect 9: %v, want ErrDialect", err)
	}
}
