// Scenario 6: the adapters in containers. The fence's commit-order load and the
// migrations run on PostgreSQL and MySQL/MariaDB servers that
// testcontainers-go starts from the images named by
// TICKETING_TEST_POSTGRES_IMAGE / TICKETING_TEST_MYSQL_IMAGE (source 2 of
// internal/testdb), even when a DSN is set. Without the image variables or
// a Docker engine the tests skip; with CI=true they fail. See
// integration/images/README.md for the offline images and the environment.
package integration_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/internal/commitorder"
	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/internal/testdb/containerdb" // also Auto's container fallback for this package's tests
	"github.com/ticketing-dev/ticketing/migrations"
)

// postgres and mysql start a container from the image named by the env
// variable and log how long it took to become ready. A skip (no image
// variable, no Docker engine) is recorded for TestMain's notice.
func postgres(t *testing.T) string {
	t.Helper()
	db := containerdb.PostgresContainer(skipRecorder{t})
	t.Logf("container %s ready in %v", db.Image, db.Ready.Round(time.Millisecond))
	return db.DSN
}

func mysql(t *testing.T) string {
	t.Helper()
	db := containerdb.MySQLContainer(skipRecorder{t})
	t.Logf("container %s ready in %v", db.Image, db.Ready.Round(time.Millisecond))
	return db.DSN
}

// containerSkips are the container scenarios that skipped, and the first
// reason given, for the one line that TestMain prints: without -v, go test
// shows a skip of a package that passed as "ok" and nothing else.
var containerSkips struct {
	sync.Mutex
	tests  []string
	reason string
}

// skipRecorder is a testing.TB whose Skipf records the test and its reason
// in containerSkips before skipping.
type skipRecorder struct{ testing.TB }

func (r skipRecorder) Skipf(format string, args ...any) {
	r.Helper()
	containerSkips.Lock()
	containerSkips.tests = append(containerSkips.tests, r.Name())
	if containerSkips.reason == "" {
		containerSkips.reason = fmt.Sprintf(format, args...)
	}
	containerSkips.Unlock()
	r.TB.Skipf(format, args...)
}

// containerSkipNotice is the line TestMain prints to stderr when container
// scenarios skipped, or "" when none did.
func containerSkipNotice() string {
	containerSkips.Lock()
	defer containerSkips.Unlock()
	if len(containerSkips.tests) == 0 {
		return ""
	}
	return fmt.Sprintf("integration: %d container scenario(s) skipped (%s; first reason: %s); to run them, start Docker and build the images with 'sudo bash integration/images/setup-docker.sh', then set %s=ticketing-test/postgres:15 %s=ticketing-test/mariadb:10.11 %s=1 (see integration/images/README.md)\n",
		len(containerSkips.tests), strings.Join(containerSkips.tests, ", "), containerSkips.reason,
		testdb.EnvPostgresImage, testdb.EnvMySQLImage, testdb.EnvHostNetwork)
}

func openDB(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	t.Cleanup(func() { db.Close() })
	return db
}

func mustExec(t *testing.T, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(t.Context(), query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

func TestContainers_Postgres_CommitOrder(t *testing.T) {
	t.Parallel()
	dsn := postgres(t)
	db := openDB(t, "pgx", dsn)
	if err := migrations.Up(t.Context(), db, fence.Postgres); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	t.Run("sqlfence", func(t *testing.T) {
		mustExec(t, db, "CREATE TABLE log_sql (id BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL)")
		commitOrderTest(t, db, "sql", "$1", "log_sql", func(ctx context.Context, tk fence.Ticket, fn func(commitorder.Exec) error) error {
			return sqlfence.Run(ctx, db, fence.Postgres, tk, func(tx *sql.Tx) error { return fn(sqlExec(tx)) })
		})
	})
	t.Run("pgxfence", func(t *testing.T) {
		mustExec(t, db, "CREATE TABLE log_pgx (id BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL)")
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 32
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		commitOrderTest(t, db, "pgx", "$1", "log_pgx", func(ctx context.Context, tk fence.Ticket, fn func(commitorder.Exec) error) error {
			return pgxfence.Run(ctx, pool, tk, func(tx pgx.Tx) error {
				return fn(func(ctx context.Context, query string, args ...any) error {
					_, err := tx.Exec(ctx, query, args...)
					return err
				})
			})
		})
	})
}

func TestContainers_MySQL_CommitOrder(t *testing.T) {
	t.Parallel()
	db := openDB(t, "mysql", mysql(t))
	if err := migrations.Up(t.Context(), db, fence.MySQL); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	mustExec(t, db, "CREATE TABLE log_sql (id BIGINT AUTO_INCREMENT PRIMARY KEY, token BIGINT NOT NULL) ENGINE=InnoDB")
	commitOrderTest(t, db, "sql", "?", "log_sql", func(ctx context.Context, tk fence.Ticket, fn func(commitorder.Exec) error) error {
		return sqlfence.Run(ctx, db, fence.MySQL, tk, func(tx *sql.Tx) error { return fn(sqlExec(tx)) })
	})
}

func sqlExec(tx *sql.Tx) commitorder.Exec {
	return func(ctx context.Context, query string, args ...any) error {
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	}
}

// commitOrderTest is the commit-order load of the adapter conformance suite
// (internal/commitorder) on resource with run as the
// fence, logging to logTable: 16 goroutines × 200 fenced transactions with
// shuffled tokens; the log's id (= commit) order must have strictly
// increasing tokens, every rejection must be a *fence.StaleError with
// HighWater >= Token, and nothing else may fail (a MySQL deadlock is a
// failure, never retried).
func commitOrderTest(t *testing.T, admin *sql.DB, resource, placeholder, logTable string, run commitorder.Run) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	commitorder.Test(t, ctx, commitorder.Config{Name: resource, Resource: resource, Run: run,
		DB: admin, LogTable: logTable, Placeholder: placeholder})
}

// TestContainers_Migrations applies, re-applies, reverts and concurrently
// applies the migrations on a PostgreSQL and a MySQL/MariaDB container.
func TestContainers_Migrations(t *testing.T) {
	t.Parallel()
	for _, d := range []struct {
		name, driver string
		dsn          func(*testing.T) string
		dialect      fence.Dialect
		insert       string
	}{
		{"postgres", "pgx", postgres, fence.Postgres,
			"INSERT INTO ticketing_fence (resource, high_water) VALUES ($1, $2)"},
		{"mysql", "mysql", mysql, fence.MySQL,
			"INSERT INTO ticketing_fence (resource, high_water) VALUES (?, ?)"},
	} {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			dsn := d.dsn(t)
			db := openDB(t, d.driver, dsn)
			// Four pools at once, like separate processes: exactly one applies.
			if err := testdb.ConcurrentUp(ctx, d.driver, dsn, d.dialect, 4); err != nil {
				t.Fatalf("concurrent Up: %v", err)
			}
			if got := testdb.AppliedVersions(t, db); got != 1 {
				t.Fatalf("applied versions = %d, want 1", got)
			}
			if _, err := db.ExecContext(ctx, d.insert, []byte("k\xff"), 7); err != nil {
				t.Fatalf("insert into the new table: %v", err)
			}
			if err := migrations.Up(ctx, db, d.dialect); err != nil {
				t.Fatalf("second Up: %v", err)
			}
			var n int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM ticketing_fence").Scan(&n); err != nil || n != 1 {
				t.Fatalf("after second Up: rows=%d err=%v, want 1 row", n, err)
			}
			if err := migrations.Down(ctx, db, d.dialect); err != nil {
				t.Fatalf("Down: %v", err)
			}
			if _, err := db.ExecContext(ctx, "SELECT 1 FROM ticketing_fence"); err == nil {
				t.Fatal("ticketing_fence still exists after Down")
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

// TestContainersSkipNotice runs this test binary again on the container
// scenarios alone, without the image variables and without CI=true (so
// that they skip), and checks that the run says so on stderr in one line
// naming what skipped and how to run it, also without -v. Before the
// notice, such a run printed nothing but "PASS".
func TestContainersSkipNotice(t *testing.T) {
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run", "^TestContainers_", "-test.count", "1")
	// A session of its own: no controlling terminal, so that the notice
	// does not also go to the terminal of whoever runs this test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "CI", testdb.EnvPostgresImage, testdb.EnvMySQLImage:
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var lines []string
	for l := range strings.Lines(stderr.String()) {
		if strings.HasPrefix(l, "integration: ") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 {
		t.Fatalf("want one notice line on stderr, got %d:\n%s", len(lines), stderr.String())
	}
	for _, want := range []string{"4 container scenario(s) skipped", "TestContainers_Postgres_CommitOrder", "TestContainers_Migrations/mysql",
		"integration/images/setup-docker.sh", testdb.EnvMySQLImage + "="} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("notice lacks %q: %s", want, lines[0])
		}
	}
	// The first reason is whichever scenario skipped first.
	if !strings.Contains(lines[0], testdb.EnvPostgresImage+" is not set") && !strings.Contains(lines[0], testdb.EnvMySQLImage+" is not set") {
		t.Errorf("notice lacks the reason (an image variable not set): %s", lines[0])
	}
}
