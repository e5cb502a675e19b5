package migrations_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/pressly/goose/v3/database"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/migrations"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type dialect struct {
	name    string
	driver  string
	dsn     func(testing.TB) string
	dialect fence.Dialect
	insert  string
}

var dialects = []dialect{
	{"postgres", "pgx", testdb.Postgres, fence.Postgres,
		"INSERT INTO ticketing_fence (resource, high_water) VALUES ($1, $2)"},
	{"mysql", "mysql", testdb.MySQL, fence.MySQL,
		"INSERT INTO ticketing_fence (resource, high_water) VALUES (?, ?)"},
	{"sqlite", "sqlite", testdb.SQLite, fence.SQLite,
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
			if got := testdb.AppliedVersions(t, db); got != 1 {
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
			// The database exists before the processes start (for SQLite:
			// its file is created and switched to WAL; several connections
			// doing that to a new file at once can get SQLITE_BUSY from
			// SQLite itself, before any migration code runs).
			db := open2(t, d.driver, dsn)
			if err := db.PingContext(ctx); err != nil {
				t.Fatal(err)
			}
			// Four pools at once, like separate processes: exactly one applies.
			if err := testdb.ConcurrentUp(ctx, d.driver, dsn, d.dialect, 4); err != nil {
				t.Fatalf("concurrent Up: %v", err)
			}
			if got := testdb.AppliedVersions(t, db); got != 1 {
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
	if err := migrations.Up(context.Background(), db, 0); !errors.Is(err, fence.ErrDialect) {
		t.Fatalf("Up with dialect 0: %v, want ErrDialect", err)
	}
	if _, err := migrations.Files(fence.Dialect(9)); !errors.Is(err, fence.ErrDialect) {
		t.Fatalf("Files with dialect 9: %v, want ErrDialect", err)
	}
}

// TestUpAfterHalfInitialisedVersionTable: a run that died between creating
// the version table and inserting its version-0 row (possible on MySQL,
// where DDL commits at once) does not block later runs.
func TestUpAfterHalfInitialisedVersionTable(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			ctx := t.Context()
			dsn := d.dsn(t)
			db := open2(t, d.driver, dsn)
			gd := map[fence.Dialect]database.Dialect{
				fence.Postgres: database.DialectPostgres,
				fence.MySQL:    database.DialectMySQL,
				fence.SQLite:   database.DialectSQLite3,
			}[d.dialect]
			store, err := database.NewStore(gd, migrations.VersionTable)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.CreateVersionTable(ctx, db); err != nil {
				t.Fatal(err)
			}
			if err := migrations.Up(ctx, db, d.dialect); err != nil {
				t.Fatalf("Up over an empty version table: %v", err)
			}
			if got := testdb.AppliedVersions(t, db); got != 1 {
				t.Fatalf("applied versions = %d, want 1", got)
			}
		})
	}
}
