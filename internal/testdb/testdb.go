// Package testdb gives tests a fresh, empty database of their own.
//
// PostgreSQL and MySQL/MariaDB come from a server named by an environment
// variable (EnvPostgres, EnvMySQL): each call creates a randomly named
// database there, drops it when the test ends, and returns its DSN. When the
// variable is unset the test is skipped, or fails if CI=true, so CI cannot
// silently skip database tests. SQLite needs no server: a file in
// t.TempDir().
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
)

const (
	// EnvPostgres names a PostgreSQL server, as a URL, e.g.
	// postgres://postgres@127.0.0.1:5432/test?sslmode=disable. The user
	// must be allowed to create databases.
	EnvPostgres = "TICKETING_TEST_POSTGRES_DSN"
	// EnvMySQL names a MySQL or MariaDB server as a go-sql-driver/mysql
	// DSN, e.g. root@tcp(127.0.0.1:3306)/test.
	EnvMySQL = "TICKETING_TEST_MYSQL_DSN"
)

// Postgres creates a fresh database on the server named by EnvPostgres,
// drops it (with FORCE) in tb.Cleanup, and returns a URL DSN for it, usable
// with pgx and with the "pgx" database/sql driver.
func Postgres(tb testing.TB) string {
	tb.Helper()
	base := env(tb, EnvPostgres)
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		tb.Fatalf("testdb: %s must be a postgres:// URL", EnvPostgres)
	}
	name := randomName()
	admin := open(tb, "pgx", base)
	defer admin.Close()
	exec(tb, admin, "CREATE DATABASE "+name)
	tb.Cleanup(func() {
		db := open(tb, "pgx", base)
		defer db.Close()
		exec(tb, db, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	u.Path = "/" + name
	return u.String()
}

// MySQL creates a fresh database on the server named by EnvMySQL, drops it
// in tb.Cleanup, and returns a go-sql-driver/mysql DSN for it (with the
// base DSN's parameters).
func MySQL(tb testing.TB) string {
	tb.Helper()
	cfg, err := mysql.ParseDSN(env(tb, EnvMySQL))
	if err != nil {
		tb.Fatalf("testdb: %s is not a valid go-sql-driver/mysql DSN", EnvMySQL)
	}
	cfg.DBName = ""
	base := cfg.FormatDSN()
	name := randomName()
	admin := open(tb, "mysql", base)
	defer admin.Close()
	exec(tb, admin, "CREATE DATABASE "+name)
	tb.Cleanup(func() {
		db := open(tb, "mysql", base)
		defer db.Close()
		exec(tb, db, "DROP DATABASE IF EXISTS "+name)
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// SQLite returns a modernc.org/sqlite DSN (driver "sqlite") for a new
// database file in tb.TempDir(), in WAL mode, with a 10 s busy timeout and
// _txlock=immediate, so transactions take the writer lock at BEGIN.
func SQLite(tb testing.TB) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "test.db")
	return "file:" + path + "?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
}

func env(tb testing.TB, key string) string {
	tb.Helper()
	v := strings.TrimSpace(os.Getenv(key))
	if v == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("testdb: %s is not set (required when CI=true)", key)
		}
		tb.Skipf("testdb: %s is not set; skipping", key)
	}
	return v
}

func randomName() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "ticketing_test_" + hex.EncodeToString(b)
}

func open(tb testing.TB, driver, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		tb.Fatalf("testdb: open %s: %v", driver, err)
	}
	return db
}

func exec(tb testing.TB, db *sql.DB, query string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, query); err != nil {
		tb.Fatalf("testdb: %s: %v", query, err)
	}
}
