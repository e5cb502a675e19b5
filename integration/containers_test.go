// Scenario 6: the adapters in containers. The fence's rule-19 load and the
// migrations run on PostgreSQL and MySQL/MariaDB servers that
// testcontainers-go starts from the images named by
// TICKETING_TEST_POSTGRES_IMAGE / TICKETING_TEST_MYSQL_IMAGE (source 2 of
// internal/testdb), even when a DSN is set. Without the image variables or
// a Docker engine the tests skip; with CI=true they fail. See
// integration/images/README.md for the offline images and the environment.
package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/migrations"
)

// postgres and mysql start a container from the image named by the env
// variable and log how long it took to become ready.
func postgres(t *testing.T) string {
	t.Helper()
	db := testdb.PostgresContainer(t)
	t.Logf("container %s ready in %v", db.Image, db.Ready.Round(time.Millisecond))
	return db.DSN
}

func mysql(t *testing.T) string {
	t.Helper()
	db := testdb.MySQLContainer(t)
	t.Logf("container %s ready in %v", db.Image, db.Ready.Round(time.Millisecond))
	return db.DSN
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

func TestContainers_Postgres_Rule19(t *testing.T) {
	t.Parallel()
	dsn := postgres(t)
	db := openDB(t, "pgx", dsn)
	if err := migrations.Up(t.Context(), db, migrations.Postgres); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	t.Run("sqlfence", func(t *testing.T) {
		mustExec(t, db, "CREATE TABLE log_sql (id BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL)")
		rule19(t, db, "sql", "$1", "log_sql", func(ctx context.Context, tk fence.Ticket, insert func(execer) error) error {
			return sqlfence.Run(ctx, db, sqlfence.Postgres, tk, func(tx *sql.Tx) error { return insert(tx) })
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
		rule19(t, db, "pgx", "$1", "log_pgx", func(ctx context.Context, tk fence.Ticket, insert func(execer) error) error {
			return pgxfence.Run(ctx, pool, tk, func(tx pgx.Tx) error { return insert(pgxExec{tx}) })
		})
	})
}

func TestContainers_MySQL_Rule19(t *testing.T) {
	t.Parallel()
	db := openDB(t, "mysql", mysql(t))
	if err := migrations.Up(t.Context(), db, migrations.MySQL); err != nil {
		t.Fatalf("migrations: %v", err)
	}
	mustExec(t, db, "CREATE TABLE log_sql (id BIGINT AUTO_INCREMENT PRIMARY KEY, token BIGINT NOT NULL) ENGINE=InnoDB")
	rule19(t, db, "sql", "?", "log_sql", func(ctx context.Context, tk fence.Ticket, insert func(execer) error) error {
		return sqlfence.Run(ctx, db, sqlfence.MySQL, tk, func(tx *sql.Tx) error { return insert(tx) })
	})
}

// execer is the part of a transaction the load uses.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

type pgxExec struct{ tx pgx.Tx }

func (p pgxExec) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	_, err := p.tx.Exec(ctx, query, args...)
	return nil, err
}

// rule19 is a compact version of the rule-19 load in
// adapters/internal/conformance (SEMANTICS.md rule 19): 16 goroutines × 200
// fenced transactions on one resource. Tokens come from an increasing
// counter, four at a time, presented in shuffled order; each accepted
// transaction sleeps 0–2 ms while holding the fence and appends its token
// to logTable in the same transaction. Because the fence holds the
// resource's row lock until the transaction ends, the log's id order is
// the commit order, so it must be strictly increasing. Every rejection
// must be a *fence.StaleError with HighWater >= Token; nothing else may
// fail (a MySQL deadlock is a failure, never retried).
func rule19(t *testing.T, admin *sql.DB, resource, placeholder, logTable string,
	run func(ctx context.Context, tk fence.Ticket, insert func(execer) error) error) {
	t.Helper()
	const workers, perWorker, batch = 16, 200, 4
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	insertLog := "INSERT INTO " + logTable + " (token) VALUES (" + placeholder + ")"
	var (
		counter         atomic.Uint64
		accepted, stale atomic.Int64
		mu              sync.Mutex
		failures        []error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for range perWorker / batch {
				first := counter.Add(batch) - batch + 1
				tokens := make([]uint64, batch)
				for i := range tokens {
					tokens[i] = first + uint64(i)
				}
				rng.Shuffle(len(tokens), func(i, j int) { tokens[i], tokens[j] = tokens[j], tokens[i] })
				for _, tok := range tokens {
					sleep := time.Duration(rng.IntN(2001)) * time.Microsecond
					tk := fencetest.NewTicket(resource, tok)
					err := run(ctx, tk, func(tx execer) error {
						time.Sleep(sleep / 2)
						if _, err := tx.ExecContext(ctx, insertLog, int64(tok)); err != nil {
							return err
						}
						time.Sleep(sleep - sleep/2)
						return nil
					})
					var se *fence.StaleError
					switch {
					case err == nil:
						accepted.Add(1)
					case errors.As(err, &se) && se.Resource == resource && se.Token == tok && se.HighWater >= tok:
						stale.Add(1)
					default:
						fail(fmt.Errorf("token %d: %w", tok, err))
					}
					if n := tk.Releases(); n != 1 {
						fail(fmt.Errorf("token %d: released %d times", tok, n))
					}
				}
			}
		})
	}
	wg.Wait()
	for i, err := range failures {
		if i == 10 {
			t.Errorf("... and %d more failures", len(failures)-10)
			break
		}
		t.Errorf("unexpected outcome: %v", err)
	}
	t.Logf("rule19 %s: accepted=%d stale=%d failed=%d total=%d in %v", resource,
		accepted.Load(), stale.Load(), len(failures), workers*perWorker, time.Since(start).Round(time.Millisecond))
	if accepted.Load() == 0 || stale.Load() == 0 {
		t.Errorf("the load did not exercise both outcomes")
	}

	rows, err := admin.QueryContext(t.Context(), "SELECT token FROM "+logTable+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var logged []int64
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		logged = append(logged, tok)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if int64(len(logged)) != accepted.Load() {
		t.Errorf("log has %d rows, accepted %d", len(logged), accepted.Load())
	}
	violations := 0
	for i := 1; i < len(logged); i++ {
		if logged[i] <= logged[i-1] {
			if violations++; violations <= 10 {
				t.Errorf("rule 19 violated: commit #%d has token %d after token %d", i, logged[i], logged[i-1])
			}
		}
	}
	if violations > 10 {
		t.Errorf("... and %d more violations", violations-10)
	}
	if len(logged) > 0 {
		var hw int64
		q := "SELECT high_water FROM " + fence.DefaultTable + " WHERE resource = " + placeholder
		if err := admin.QueryRowContext(t.Context(), q, []byte(resource)).Scan(&hw); err != nil {
			t.Fatalf("read high-water: %v", err)
		}
		if last := logged[len(logged)-1]; hw != last {
			t.Errorf("high-water %d, last accepted token %d", hw, last)
		}
	}
}

// TestContainers_Migrations applies, re-applies, reverts and concurrently
// applies the migrations on a PostgreSQL and a MySQL/MariaDB container.
func TestContainers_Migrations(t *testing.T) {
	t.Parallel()
	for _, d := range []struct {
		name, driver string
		dsn          func(*testing.T) string
		dialect      migrations.Dialect
		insert       string
	}{
		{"postgres", "pgx", postgres, migrations.Postgres,
			"INSERT INTO ticketing_fence (resource, high_water) VALUES ($1, $2)"},
		{"mysql", "mysql", mysql, migrations.MySQL,
			"INSERT INTO ticketing_fence (resource, high_water) VALUES (?, ?)"},
	} {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			dsn := d.dsn(t)
			db := openDB(t, d.driver, dsn)
			versions := func() int {
				t.Helper()
				var n int
				q := "SELECT COUNT(*) FROM " + migrations.VersionTable + " WHERE version_id > 0 AND is_applied"
				if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
					t.Fatalf("read version table: %v", err)
				}
				return n
			}

			// Four pools at once, like separate processes: exactly one applies.
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				wg.Go(func() {
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
			if got := versions(); got != 1 {
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
