package testdb

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/migrations"
)

// ConcurrentUp runs migrations.Up from n *sql.DB pools at once, one per
// goroutine, as n processes starting together would, and returns their
// errors joined.
func ConcurrentUp(ctx context.Context, driver, dsn string, d fence.Dialect, n int) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range errs {
		wg.Go(func() {
			db, err := sql.Open(driver, dsn)
			if err != nil {
				errs[i] = err
				return
			}
			defer db.Close()
			errs[i] = migrations.Up(ctx, db, d)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// AppliedVersions returns how many migrations migrations.VersionTable
// records as applied; it fails t if the table cannot be read.
func AppliedVersions(t testing.TB, db *sql.DB) int {
	t.Helper()
	var n int
	q := "SELECT COUNT(*) FROM " + migrations.VersionTable + " WHERE version_id > 0 AND is_applied"
	if err := db.QueryRowContext(t.Context(), q).Scan(&n); err != nil {
		t.Fatalf("read version table: %v", err)
	}
	return n
}
