package testdb_test

import (
	"database/sql"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDatabases(t *testing.T) {
	for _, tc := range []struct {
		name, driver string
		dsn          func(testing.TB) string
	}{
		{"postgres", "pgx", testdb.Postgres},
		{"mysql", "mysql", testdb.MySQL},
		{"sqlite", "sqlite", testdb.SQLite},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := tc.dsn(t)
			db, err := sql.Open(tc.driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.ExecContext(t.Context(), "CREATE TABLE t (id INTEGER PRIMARY KEY)"); err != nil {
				t.Fatalf("fresh database not usable: %v", err)
			}
			// A second database is a different, empty one.
			db2, err := sql.Open(tc.driver, tc.dsn(t))
			if err != nil {
				t.Fatal(err)
			}
			defer db2.Close()
			if _, err := db2.ExecContext(t.Context(), "CREATE TABLE t (id INTEGER PRIMARY KEY)"); err != nil {
				t.Fatalf("second database not fresh: %v", err)
			}
		})
	}
}
