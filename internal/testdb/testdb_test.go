package testdb_test

import (
	"database/sql"
	"fmt"
	"runtime"
	"strings"
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

// fakeTB records how a helper gave up; Skipf and Fatalf end the goroutine
// like the real ones.
type fakeTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func runFake(t *testing.T, f func(testing.TB)) *fakeTB {
	fake := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(fake)
	}()
	<-done
	return fake
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
		if f := runFake(t, tc.f); !f.skipped || f.failed {
			t.Errorf("%s, CI unset: skipped=%v failed=%v (%s), want a skip", tc.name, f.skipped, f.failed, f.msg)
		}
		t.Setenv("CI", "true")
		if f := runFake(t, tc.f); !f.failed {
			t.Errorf("%s, CI=true: skipped=%v failed=%v (%s), want a failure", tc.name, f.skipped, f.failed, f.msg)
		} else {
			t.Logf("%s, CI=true: %s", tc.name, f.msg)
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
		if f := runFake(t, tc.f); !f.skipped || f.failed || !strings.Contains(f.msg, tc.want) {
			t.Errorf("%s, CI unset: skipped=%v failed=%v (%s), want a skip saying %q", tc.name, f.skipped, f.failed, f.msg, tc.want)
		}
		t.Setenv("CI", "true")
		if f := runFake(t, tc.f); !f.failed {
			t.Errorf("%s, CI=true: skipped=%v failed=%v (%s), want a failure", tc.name, f.skipped, f.failed, f.msg)
		}
	}
}
