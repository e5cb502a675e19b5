// Package containerdb is the container source of package testdb
// (testdb.FromImage, testdb.FromOfficialImage): PostgreSQL and
// MySQL/MariaDB servers started with testcontainers-go. A test binary that
// imports it (for PostgresContainer and MySQLContainer, or with a blank
// import for testdb's Auto source to fall back to containers) registers
// it with testdb; testdb itself does not import testcontainers, docker or
// otel, so that the tests of packages that only need a live server
// (migrations, say) do not make every module importing them list those
// modules in its go.sum.
package containerdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	tcmysql "github.com/testcontainers/testcontainers-go/modules/mysql"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/ticketing-dev/ticketing/internal/testdb"
)

func init() {
	testdb.RegisterContainers(testdb.Containers{
		Healthy:       dockerHealthy,
		EnsureImage:   ensureImage,
		StartPostgres: startPostgres,
		StartMySQL:    startMySQL,
	})
}

// PostgresContainer is testdb.PostgresFrom(tb, testdb.Options{Source:
// testdb.FromImage}): a container from the image named by
// testdb.EnvPostgresImage, even when testdb.EnvPostgres is set.
func PostgresContainer(tb testing.TB) testdb.Database {
	tb.Helper()
	return testdb.PostgresFrom(tb, testdb.Options{Source: testdb.FromImage})
}

// MySQLContainer is testdb.MySQLFrom(tb, testdb.Options{Source:
// testdb.FromImage}).
func MySQLContainer(tb testing.TB) testdb.Database {
	tb.Helper()
	return testdb.MySQLFrom(tb, testdb.Options{Source: testdb.FromImage})
}

// The container sources. Each call starts one container (a fresh server
// with one database) and terminates it in tb.Cleanup. Nothing here pulls
// an image on its own: a local image name is only inspected; a missing
// one is pulled by Docker as usual (the official images on a laptop).
//
// Pitfalls handled here (see integration/images/README.md):
//   - On the host network the modules' ConnectionString reports the
//     default port (MappedPort is the identity there), which is the host's
//     own server, so the DSN is built from the port we chose.
//   - Waits need an explicit port; the postgres module's default wait and
//     the mysql module's ("MySQL Community Server") are replaced.
//   - Postgres logs "ready to accept connections" twice (the init server
//     once); the port alone is not enough.

const (
	containerUser     = "app"
	containerPassword = "secret" // a throwaway server on 127.0.0.1 or a mapped port
	containerDB       = "app"
	startDeadline     = 2 * time.Minute
)

var docker struct {
	once sync.Once
	err  error
}

// dockerHealthy reports whether a Docker engine answers (checked once per
// process).
func dockerHealthy() error {
	docker.once.Do(func() {
		docker.err = func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("docker provider: %v", r)
				}
			}()
			p, err := testcontainers.ProviderDocker.GetProvider(testcontainers.WithLogger(tclog.NewNoopLogger()))
			if err != nil {
				return err
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return p.Health(ctx)
		}()
	})
	return docker.err
}

// freePort returns a port on 127.0.0.1 that was free a moment ago.
func freePort(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testdb: find a free port: %v", err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func hostNetwork() testcontainers.CustomizeRequestOption {
	return testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.NetworkMode = "host" })
}

func commonOptions(tb testing.TB) []testcontainers.ContainerCustomizer {
	return []testcontainers.ContainerCustomizer{
		testcontainers.WithLogger(tclog.TestLogger(tb)),
		testcontainers.WithLabels(map[string]string{"dev.ticketing.test": tb.Name()}),
	}
}

// startPostgres starts image and returns the DSN of its database and the
// time from start to ready (accepting queries).
func startPostgres(tb testing.TB, image string, hostNet bool) (string, time.Duration) {
	tb.Helper()
	ctx := context.Background()
	start := time.Now()
	opts := append(commonOptions(tb),
		tcpostgres.WithDatabase(containerDB),
		tcpostgres.WithUsername(containerUser),
		tcpostgres.WithPassword(containerPassword),
	)
	port := "5432"
	if hostNet {
		port = freePort(tb)
		opts = append(opts, hostNetwork(),
			testcontainers.WithEnv(map[string]string{"PGPORT": port}),
			testcontainers.WithCmdArgs("-c", "listen_addresses=127.0.0.1"))
	}
	opts = append(opts, testcontainers.WithWaitStrategyAndDeadline(startDeadline,
		wait.ForLog("database system is ready to accept connections").WithOccurrence(2),
		wait.ForListeningPort(port+"/tcp")))
	ctr, err := tcpostgres.Run(ctx, image, opts...)
	testcontainers.CleanupContainer(tb, ctr, testcontainers.StopTimeout(0))
	if err != nil {
		tb.Fatalf("testdb: start postgres container %s: %v", image, err)
	}
	hostPort := "127.0.0.1:" + port
	if !hostNet {
		if hostPort, err = endpoint(ctx, ctr, port); err != nil {
			tb.Fatalf("testdb: postgres container %s: %v", image, err)
		}
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(containerUser, containerPassword),
		Host: hostPort, Path: "/" + containerDB, RawQuery: "sslmode=disable"}
	dsn := u.String()
	if err := ping(ctx, "pgx", dsn); err != nil {
		tb.Fatalf("testdb: postgres container %s at %s: %v", image, hostPort, err)
	}
	return dsn, time.Since(start)
}

// startMySQL starts a MySQL or MariaDB image and returns a DSN (as root)
// for its database and the time from start to ready.
func startMySQL(tb testing.TB, image string, hostNet bool) (string, time.Duration) {
	tb.Helper()
	ctx := context.Background()
	start := time.Now()
	opts := append(commonOptions(tb),
		tcmysql.WithDatabase(containerDB),
		tcmysql.WithUsername("root"),
		tcmysql.WithPassword(containerPassword),
	)
	port := "3306"
	if hostNet {
		port = freePort(tb)
		// Arguments only: the official entrypoints (and ours) prepend the
		// server binary, mysqld or mariadbd.
		opts = append(opts, hostNetwork(),
			testcontainers.WithCmdArgs("--port="+port, "--bind-address=127.0.0.1"))
	}
	// The entrypoints open TCP only after the init, so a listening port
	// means ready.
	opts = append(opts, testcontainers.WithWaitStrategyAndDeadline(startDeadline,
		wait.ForListeningPort(port+"/tcp")))
	ctr, err := tcmysql.Run(ctx, image, opts...)
	testcontainers.CleanupContainer(tb, ctr, testcontainers.StopTimeout(0))
	if err != nil {
		tb.Fatalf("testdb: start mysql container %s: %v", image, err)
	}
	hostPort := "127.0.0.1:" + port
	if !hostNet {
		if hostPort, err = endpoint(ctx, ctr, port); err != nil {
			tb.Fatalf("testdb: mysql container %s: %v", image, err)
		}
	}
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = "root", containerPassword, "tcp", hostPort, containerDB
	dsn := cfg.FormatDSN()
	if err := ping(ctx, "mysql", dsn); err != nil {
		tb.Fatalf("testdb: mysql container %s at %s: %v", image, hostPort, err)
	}
	return dsn, time.Since(start)
}

// endpoint is the host:port a mapped container port is reachable at.
func endpoint(ctx context.Context, ctr testcontainers.Container, port string) (string, error) {
	host, err := ctr.Host(ctx)
	if err != nil {
		return "", err
	}
	p, err := ctr.MappedPort(ctx, port+"/tcp")
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, p.Port()), nil
}

// ping waits until dsn answers a query, for at most 30 s.
func ping(ctx context.Context, driver, dsn string) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = db.ExecContext(pctx, "SELECT 1")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(errors.New("not answering after 30 s"), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ensureImage pulls image unless it is present locally.
func ensureImage(tb testing.TB, image string) error {
	p, err := testcontainers.NewDockerProvider(testcontainers.WithLogger(tclog.TestLogger(tb)))
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if _, err := p.Client().ImageInspect(ctx, image); err == nil {
		return nil
	}
	return p.PullImage(ctx, image)
}
