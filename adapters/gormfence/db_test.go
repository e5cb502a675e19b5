package gormfence_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/glebarez/sqlite"
	gomysql "github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/migrations"
)

// GORM's PrepareStmt cache starts an expiry goroutine that it never stops
// (gorm v1.31: "done channel is never closed"); every other goroutine
// must end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("gorm.io/gorm/internal/lru.NewLRU[...].func1"))
}

// env is one database with the fence migrated and a table items, seen
// through GORM (db), the *sql.DB under it (sqlDB), and a separate pool
// for assertions (admin).
type env struct {
	name    string
	dialect fence.Dialect
	driver  string // database/sql driver name, for sqlx
	db      *gorm.DB
	sqlDB   *sql.DB
	admin   *sql.DB
}

// Item is the row the tests write.
type Item struct {
	ID  int64  `gorm:"primaryKey;autoIncrement:false" db:"id"`
	Val string `gorm:"size:64" db:"val"`
}

// unavailable skips the test, or fails it when CI=true, so CI cannot
// silently skip the database tests.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format+" (required when CI=true)", args...)
	}
	t.Skipf(format, args...)
}

func randomName() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "ticketing_gorm_" + hex.EncodeToString(b)
}

// freshPostgres returns the DSN of a new database on the server of
// TICKETING_TEST_POSTGRES_DSN, dropped when the test ends.
func freshPostgres(t *testing.T) string {
	t.Helper()
	dsn := strings.TrimSpace(os.Getenv("TICKETING_TEST_POSTGRES_DSN"))
	if dsn == "" {
		unavailable(t, "TICKETING_TEST_POSTGRES_DSN is not set")
	}
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := randomName()
	if _, err := admin.ExecContext(context.Background(), "CREATE DATABASE "+name); err != nil {
		admin.Close()
		unavailable(t, "PostgreSQL at TICKETING_TEST_POSTGRES_DSN: %v", err)
	}
	t.Cleanup(func() {
		_, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		admin.Close()
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

// freshMySQL returns the DSN of a new database on the server of
// TICKETING_TEST_MYSQL_DSN, dropped when the test ends.
func freshMySQL(t *testing.T) string {
	t.Helper()
	dsn := strings.TrimSpace(os.Getenv("TICKETING_TEST_MYSQL_DSN"))
	if dsn == "" {
		unavailable(t, "TICKETING_TEST_MYSQL_DSN is not set")
	}
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	name := randomName()
	if _, err := admin.ExecContext(context.Background(), "CREATE DATABASE "+name); err != nil {
		admin.Close()
		unavailable(t, "MySQL at TICKETING_TEST_MYSQL_DSN: %v", err)
	}
	t.Cleanup(func() {
		_, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name)
		admin.Close()
	})
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	cfg.ParseTime = true
	return cfg.FormatDSN()
}

// envs returns one env per dialect: PostgreSQL (gorm.io/driver/postgres,
// pgx), MySQL/MariaDB (gorm.io/driver/mysql) and SQLite
// (github.com/glebarez/sqlite).
func envs() []struct {
	name string
	open func(t *testing.T) *env
} {
	return []struct {
		name string
		open func(t *testing.T) *env
	}{
		{"postgres", func(t *testing.T) *env {
			dsn := freshPostgres(t)
			return newEnv(t, "postgres", fence.Postgres, "pgx", postgres.Open(dsn), dsn)
		}},
		{"mysql", func(t *testing.T) *env {
			dsn := freshMySQL(t)
			return newEnv(t, "mysql", fence.MySQL, "mysql", mysql.Open(dsn), dsn)
		}},
		{"sqlite", func(t *testing.T) *env {
			// _txlock=immediate: transactions take the writer lock at BEGIN.
			dsn := "file:" + filepath.Join(t.TempDir(), "test.db") + "?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)"
			return newEnv(t, "sqlite", fence.SQLite, "sqlite", sqlite.Open(dsn), dsn)
		}},
	}
}

func newEnv(t *testing.T, name string, d fence.Dialect, driver string, dial gorm.Dialector, dsn string) *env {
	t.Helper()
	ctx := context.Background()
	db, err := gorm.Open(dial, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("gorm.Open %s: %v", name, err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqlDB.Close() })
	if err := migrations.Up(ctx, sqlDB, d); err != nil {
		t.Fatalf("migrations.Up: %v", err)
	}
	if err := db.AutoMigrate(&Item{}); err != nil {
		t.Fatalf("AutoMigrate: %v", err)
	}
	admin, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	return &env{name: name, dialect: d, driver: driver, db: db, sqlDB: sqlDB, admin: admin}
}

// q rewrites ? placeholders for PostgreSQL.
func (e *env) q(query string) string {
	if e.dialect != fence.Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// highWater returns the stored high-water of resource, 0 if none.
func (e *env) highWater(t testing.TB, resource string) int64 {
	t.Helper()
	var hw int64
	err := e.admin.QueryRowContext(context.Background(), e.q("SELECT high_water FROM "+fence.DefaultTable+" WHERE resource = ?"), []byte(resource)).Scan(&hw)
	if err == sql.ErrNoRows {
		return 0
	}
	if err != nil {
		t.Fatalf("read high-water: %v", err)
	}
	return hw
}

// itemVal returns the val of item id as the admin pool sees it
// (committed data), "" if there is none.
func (e *env) itemVal(t testing.TB, id int64) string {
	t.Helper()
	var v string
	err := e.admin.QueryRowContext(context.Background(), e.q("SELECT val FROM items WHERE id = ?"), id).Scan(&v)
	if err == sql.ErrNoRows {
		return ""
	}
	if err != nil {
		t.Fatalf("read row %d: %v", id, err)
	}
	return v
}
