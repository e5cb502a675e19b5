// Package conformance_test runs one suite against every adapter and
// dialect: pgxfence on PostgreSQL, and sqlfence on PostgreSQL (pgx
// stdlib), MySQL/MariaDB and SQLite. Each test gets fresh databases from
// internal/testdb; PostgreSQL and MySQL tests skip when their DSN
// environment variable is unset (and fail when CI=true).
package conformance_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
