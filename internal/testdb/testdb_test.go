package testdb_test

import (
	"database/sql"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/internal/testdb/faketb"
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

// TestUnavailable: a forced source that is not configured skips the test
// locally and fails it when CI=true, whatever the other sources.
func TestUnavailable(t *testing.T) {
	t.Setenv(testdb.EnvPostgres, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	t.Setenv(testdb.EnvPostgresImage, "")
	t.Setenv(testdb.EnvMySQL, "")
	for _, tc := range []struct {
		name string
		f    func(testing.TB)
	}{
		{"mysql dsn", func(tb testing.TB) { testdb.MySQLFrom(tb, testdb.Options{Source: testdb.FromDSN}) }},
	} {
		t.Setenv("CI", "")
		if f := faketb.Run(t, tc.f); !f.WasSkipped || f.WasFailed {
			t.Errorf("%s, CI unset: skipped=%v failed=%v (%s), want a skip", tc.name, f.WasSkipped, f.WasFailed, f.Msg)
		}
		t.Setenv("CI", "true")
		if f := faketb.Run(t, tc.f); !f.WasFailed {
			t.Errorf("%s, CI=true: skipped=%v failed=%v (%s), want a failure", tc.name, f.WasSkipped, f.WasFailed, f.Msg)
		} else {
			t.Logf("%s, CI=true: %s", tc.name, f.Msg)
		}
	}
}

// TestNoContainerSource: in a test binary that does not import
// internal/testdb/containerdb (this one), the container sources are
// unavailable, whatever the environment says: a forced one, and Auto
// without a DSN, skip saying what to set, or fail when CI=true.
func TestNoContainerSource(t *testing.T) {
	t.Setenv(testdb.EnvPostgres, "")
	t.Setenv(testdb.EnvPostgresImage, "ticketing-test/postgres:15")
	for _, tc := range []struct {
		name, want string
		f          func(testing.TB)
	}{
		{"image", "internal/testdb/containerdb", func(tb testing.TB) { testdb.PostgresFrom(tb, testdb.Options{Source: testdb.FromImage}) }},
		{"auto", "set " + testdb.EnvPostgres, func(tb testing.TB) { testdb.Postgres(tb) }},
	} {
		t.Setenv("CI", "")
		if f := faketb.Run(t, tc.f); !f.WasSkipped || f.WasFailed || !strings.Contains(f.Msg, tc.want) {
			t.Errorf("%s, CI unset: skipped=%v failed=%v (%s), want a skip saying %q", tc.name, f.WasSkipped, f.WasFailed, f.Msg, tc.want)
		}
		t.Setenv("CI", "true")
		if f := faketb.Run(t, tc.f); !f.WasFailed {
			t.Errorf("%s, CI=true: skipped=%v failed=%v (%s), want a failure", tc.name, f.WasSkipped, f.WasFailed, f.Msg)
		}
	}
}
