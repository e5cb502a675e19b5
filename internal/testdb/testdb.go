// Package testdb gives tests a fresh, empty database of their own.
//
// # Sources
//
// PostgreSQL and MySQL/MariaDB come from one of three sources. [Postgres]
// and [MySQL] (source [Auto]) take the first that is available, in this
// order:
//
//  1. [FromDSN]: a live server named by an environment variable
//     ([EnvPostgres], [EnvMySQL]). Each call creates a randomly named
//     database there and drops it when the test ends. CI uses the
//     machine's own PostgreSQL and MariaDB this way.
//  2. [FromImage]: a container started with testcontainers-go from the
//     image named by [EnvPostgresImage] / [EnvMySQLImage], e.g. an image
//     built offline by integration/images/build-image.sh. Set
//     [EnvHostNetwork]=1 (or [Options].HostNetwork) to run it on the host
//     network on a free 127.0.0.1 port instead of a mapped port.
//  3. [FromOfficialImage]: a container from the official image
//     ([OfficialPostgresImage], [OfficialMySQLImage]); the default on a
//     developer laptop with Docker and internet. Used only when a Docker
//     engine answers.
//
// Each container call starts a container of its own (a fresh server) and
// removes it when the test ends; expect a few seconds per call.
//
// When no source is available the test is skipped, or fails if CI=true,
// so CI cannot silently skip database tests. [PostgresFrom] and
// [MySQLFrom] take [Options] to force one source (the container tests
// use [FromImage] even when a DSN is set).
//
// The container sources live in package internal/testdb/containerdb,
// which registers them here ([RegisterContainers]) when a test binary
// imports it: this package does not import testcontainers, so that the
// tests of a package that imports only it (the migrations' tests) do not
// put testcontainers, docker and otel into the go.sum of every module
// that imports that package. In a test binary without containerdb the
// container sources are unavailable: [Auto] uses the live server or
// skips.
//
// For containers on a machine without Ryuk or with Docker inside a
// container, the usual testcontainers-go variables apply
// (TESTCONTAINERS_RYUK_DISABLED, TESTCONTAINERS_HOST_OVERRIDE); see
// integration/images/README.md.
//
// SQLite needs no server: a file in t.TempDir().
package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
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
	// EnvPostgresImage names a local (or pullable) PostgreSQL image for
	// the container source, e.g. ticketing-test/postgres:15. The image
	// must follow the official image's env contract (POSTGRES_USER,
	// POSTGRES_PASSWORD, POSTGRES_DB, PGPORT).
	EnvPostgresImage = "TICKETING_TEST_POSTGRES_IMAGE"
	// EnvMySQLImage names a MySQL or MariaDB image for the container
	// source, e.g. ticketing-test/mariadb:10.11, following the official
	// images' env contract (MYSQL_ROOT_PASSWORD, MYSQL_DATABASE).
	EnvMySQLImage = "TICKETING_TEST_MYSQL_IMAGE"
	// EnvHostNetwork=1 runs containers on the host network, listening on
	// a free port on 127.0.0.1 only, with no port mapping (needed where
	// the Docker bridge cannot route, as on this project's CI machines).
	EnvHostNetwork = "TICKETING_TEST_HOST_NETWORK"

	// OfficialPostgresImage and OfficialMySQLImage are the images of the
	// [FromOfficialImage] source.
	OfficialPostgresImage = "postgres:15"
	OfficialMySQLImage    = "mariadb:10.11"
)

// Source says where a database comes from.
type Source int

const (
	// Auto takes the first available of FromDSN, FromImage and
	// FromOfficialImage.
	Auto Source = iota
	// FromDSN uses the live server named by EnvPostgres / EnvMySQL.
	FromDSN
	// FromImage starts a container from the image named by
	// EnvPostgresImage / EnvMySQLImage.
	FromImage
	// FromOfficialImage starts a container from OfficialPostgresImage /
	// OfficialMySQLImage.
	FromOfficialImage
)

// String returns the source's name.
func (s Source) String() string {
	switch s {
	case Auto:
		return "auto"
	case FromDSN:
		return "dsn"
	case FromImage:
		return "image"
	case FromOfficialImage:
		return "official-image"
	}
	return "unknown"
}

// Options select the source of [PostgresFrom] and [MySQLFrom].
type Options struct {
	// Source forces one source; Auto (the zero value) picks as described
	// in the package documentation. A forced source that is unavailable
	// skips the test, or fails it when CI=true.
	Source Source
	// HostNetwork runs a container on the host network on a free
	// 127.0.0.1 port. It is also on when EnvHostNetwork=1.
	HostNetwork bool
}

// Database is a fresh database and where it came from.
type Database struct {
	// DSN is a URL (PostgreSQL, usable with pgx and the "pgx"
	// database/sql driver) or a go-sql-driver/mysql DSN.
	DSN string
	// Source is the source used: FromDSN, FromImage or FromOfficialImage.
	Source Source
	// Image is the container's image; empty for FromDSN.
	Image string
	// Ready is how long the container took from start to ready; zero for
	// FromDSN.
	Ready time.Duration
}

// Postgres returns the DSN of a fresh PostgreSQL database from the first
// available source (see the package documentation). It is
// PostgresFrom(tb, Options{}).DSN.
func Postgres(tb testing.TB) string {
	tb.Helper()
	return PostgresFrom(tb, Options{}).DSN
}

// MySQL returns the DSN of a fresh MySQL/MariaDB database from the first
// available source (see the package documentation). It is
// MySQLFrom(tb, Options{}).DSN.
func MySQL(tb testing.TB) string {
	tb.Helper()
	return MySQLFrom(tb, Options{}).DSN
}

// Containers starts database containers: the container sources, which
// package internal/testdb/containerdb registers.
type Containers struct {
	// Healthy reports whether a Docker engine answers.
	Healthy func() error
	// EnsureImage pulls image unless it is present locally.
	EnsureImage func(tb testing.TB, image string) error
	// StartPostgres and StartMySQL start a container of image, on the
	// host network if hostNetwork, and return the DSN of its database and
	// how long it took to become ready. They remove it when tb ends.
	StartPostgres, StartMySQL func(tb testing.TB, image string, hostNetwork bool) (dsn string, ready time.Duration)
}

// containers is the registered container source, or nil.
var containers *Containers

// RegisterContainers makes c the container source (of FromImage and
// FromOfficialImage, and Auto's fallback). Package containerdb calls it
// from its init.
func RegisterContainers(c Containers) { containers = &c }

// noContainers is why the container sources are unavailable in a test
// binary without package containerdb.
var noContainers = errors.New("this test binary has no container source (its package's tests do not import internal/testdb/containerdb)")

func dockerHealthy() error {
	if containers == nil {
		return noContainers
	}
	return containers.Healthy()
}

// PostgresFrom returns a fresh PostgreSQL database from the source opts
// select. Whatever the source, the database is removed when the test ends.
func PostgresFrom(tb testing.TB, opts Options) Database {
	tb.Helper()
	return from(tb, opts, postgresKind)
}

// MySQLFrom returns a fresh MySQL/MariaDB database from the source opts
// select. Whatever the source, the database is removed when the test ends.
func MySQLFrom(tb testing.TB, opts Options) Database {
	tb.Helper()
	return from(tb, opts, mysqlKind)
}

type kind struct {
	name     string
	envDSN   string
	envImage string
	official string
	fromDSN  func(tb testing.TB, base string) string
	// start is the container source's start function.
	start func(c *Containers) func(tb testing.TB, image string, hostNetwork bool) (dsn string, ready time.Duration)
}

var (
	postgresKind = kind{"postgres", EnvPostgres, EnvPostgresImage, OfficialPostgresImage, postgresFromDSN,
		func(c *Containers) func(testing.TB, string, bool) (string, time.Duration) { return c.StartPostgres }}
	mysqlKind = kind{"mysql", EnvMySQL, EnvMySQLImage, OfficialMySQLImage, mysqlFromDSN,
		func(c *Containers) func(testing.TB, string, bool) (string, time.Duration) { return c.StartMySQL }}
)

func from(tb testing.TB, opts Options, k kind) Database {
	tb.Helper()
	hostNet := opts.HostNetwork || os.Getenv(EnvHostNetwork) == "1"
	dsn, image := getenv(k.envDSN), getenv(k.envImage)
	container := func(src Source, image string) Database {
		tb.Helper()
		if err := dockerHealthy(); err != nil {
			unavailable(tb, "no Docker engine answers for the %s container source (%s): %v", k.name, image, err)
		}
		d, ready := k.start(containers)(tb, image, hostNet)
		return Database{DSN: d, Source: src, Image: image, Ready: ready}
	}
	// The official image is pulled if missing; where no registry can be
	// reached that is "unavailable" (a skip locally), not a broken test.
	official := func() Database {
		tb.Helper()
		if err := dockerHealthy(); err != nil {
			unavailable(tb, "no Docker engine answers for the %s container source (%s): %v", k.name, k.official, err)
		}
		if err := containers.EnsureImage(tb, k.official); err != nil {
			unavailable(tb, "no %s database: %s and %s are not set, and the official image %s cannot be pulled: %v",
				k.name, k.envDSN, k.envImage, k.official, err)
		}
		return container(FromOfficialImage, k.official)
	}
	switch opts.Source {
	case FromDSN:
		if dsn == "" {
			unavailable(tb, "%s is not set", k.envDSN)
		}
		return Database{DSN: k.fromDSN(tb, dsn), Source: FromDSN}
	case FromImage:
		if image == "" {
			unavailable(tb, "%s is not set (the test needs a %s container)", k.envImage, k.name)
		}
		return container(FromImage, image)
	case FromOfficialImage:
		return official()
	case Auto:
		switch {
		case dsn != "":
			return Database{DSN: k.fromDSN(tb, dsn), Source: FromDSN}
		case image != "" && containers != nil:
			return container(FromImage, image)
		case containers == nil:
			unavailable(tb, "no %s database: set %s (a live server; this package's tests use no containers)", k.name, k.envDSN)
		}
		if err := dockerHealthy(); err != nil {
			unavailable(tb, "no %s database: set %s (a live server) or %s (an image), or start a Docker engine (%v)",
				k.name, k.envDSN, k.envImage, err)
		}
		return official()
	}
	tb.Fatalf("testdb: unknown source %d", opts.Source)
	return Database{}
}

// unavailable skips the test, or fails it when CI=true.
func unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("testdb: "+format+" (required when CI=true)", args...)
	}
	tb.Skipf("testdb: "+format+"; skipping", args...)
}

func postgresFromDSN(tb testing.TB, base string) string {
	tb.Helper()
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

func mysqlFromDSN(tb testing.TB, base string) string {
	tb.Helper()
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		tb.Fatalf("testdb: %s is not a valid go-sql-driver/mysql DSN", EnvMySQL)
	}
	cfg.DBName = ""
	base = cfg.FormatDSN()
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

func getenv(key string) string { return strings.TrimSpace(os.Getenv(key)) }

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
