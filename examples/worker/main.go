// Command worker runs job workers on a MySQL or MariaDB jobs table. Each
// worker claims a job (SELECT ... FOR UPDATE SKIP LOCKED), takes the job's
// Ticketing lock, does the work, and stores the result and marks the job
// done in one transaction fenced with the lock's token (sqlfence.Run). A
// job whose lock was lost (a stale token, an indeterminate acquire, a lease
// that ran out) is left for another attempt; it is never done twice.
//
// Environment:
//
//	DATABASE_URL     go-sql-driver/mysql DSN (required), e.g.
//	                 root@tcp(127.0.0.1:3306)/jobs?interpolateParams=true
//	TICKETING_URL    the lock service, as broker.ParseURL reads it (default
//	                 ticketing://127.0.0.1:5225), e.g. for a ticketingd init --tls
//	                 deployment: ticketing://TOKEN@locks.internal:5225?ca=/etc/ticketing/ca.pem;
//	                 the URL carries the client token (TICKETING_TOKEN is not read)
//	WORKERS          worker goroutines in this process (default 3)
//	ENQUEUE          demo jobs to add at start (default 0)
//
// SIGINT or SIGTERM stops gracefully: jobs in progress finish, no new ones
// are claimed.
package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/ticketing-dev/ticketing/broker"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop) // a second signal kills the process
	if err := run(ctx, log, os.Getenv); err != nil {
		log.Error("worker stopped", "err", err)
		os.Exit(1)
	}
}

// run runs the workers until ctx ends, configured by getenv (os.Getenv).
func run(ctx context.Context, log *slog.Logger, getenv func(string) string) (err error) {
	// The broker first: New never dials, so its sessions open in the
	// background while the database is set up.
	cfg, err := lockConfig(getenv, "worker")
	if err != nil {
		return err
	}
	cfg.Logger = log
	locks, err := broker.New(cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, locks.Close()) }()

	// DATABASE_URL is a go-sql-driver DSN: user:password@tcp(host:port)/dbname?params.
	dsn := getenv("DATABASE_URL")
	dbCfg, err := mysql.ParseDSN(dsn)
	if dsn == "" || err != nil {
		return errors.New("DATABASE_URL must be a go-sql-driver/mysql DSN, e.g. root@tcp(127.0.0.1:3306)/jobs")
	}
	connector, err := mysql.NewConnector(dbCfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(connector)
	defer func() { err = errors.Join(err, db.Close()) }()
	if err := setUp(ctx, db); err != nil {
		return fmt.Errorf("database set-up: %w", err)
	}
	if n, err := envInt(getenv, "ENQUEUE", 0); err != nil {
		return err
	} else if err := enqueue(ctx, db, demoPayloads(n)...); err != nil {
		return err
	}

	// Start claiming jobs only once a session is ready: a job claimed while
	// none is (a cold start, the lock service still starting) would fail
	// its Acquire with broker.ErrUnsent at once.
	if err := waitReady(ctx, locks, log); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting
		}
		return err
	}

	n, err := envInt(getenv, "WORKERS", 3)
	if err != nil {
		return err
	}
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		w := &Worker{
			DB:      db,
			Locks:   locks,
			Name:    fmt.Sprintf("%s-%d-%d", host, os.Getpid(), i),
			Process: checksum,
			Log:     log,
		}
		wg.Go(func() { errs[i] = w.Run(ctx) })
	}
	log.Info("workers started", "workers", n)
	wg.Wait() // until a signal, and the jobs in progress have finished
	log.Info("workers stopped")
	return errors.Join(errs...)
}

// checksum is the demo's work: the SHA-256 of the payload.
func checksum(_ context.Context, job Job) (string, error) {
	sum := sha256.Sum256([]byte(job.Payload))
	return hex.EncodeToString(sum[:]), nil
}

func demoPayloads(n int) []string {
	p := make([]string, n)
	for i := range p {
		p[i] = fmt.Sprintf("demo job %d", i+1)
	}
	return p
}

// lockConfig reads the lock service's settings from TICKETING_URL, in the
// form of broker.ParseURL: the addresses, the client token, TLS. Its
// default, ticketing://127.0.0.1:5225, is a ticketingd serve on this
// machine with no token and plain TCP; for a ticketingd init --tls
// deployment it is ticketing://TOKEN@HOST:5225?ca=/etc/ticketing/ca.pem
// (HOST one of the --host names, which the certificate covers), the URL
// that ticketingd init prints. The URL is the one setting: the token is in
// it, never in a variable of its own. name is the client name sent to the server, unless the URL has name=.
func lockConfig(getenv func(string) string, name string) (broker.Config, error) {
	u := getenv("TICKETING_URL")
	if u == "" {
		u = "ticketing://127.0.0.1:5225"
	}
	cfg, err := broker.ParseURL(u) // its errors never contain the token
	if err != nil {
		return cfg, fmt.Errorf("TICKETING_URL: %w", err)
	}
	if cfg.Name == "" {
		cfg.Name = name
	}
	return cfg, nil
}

// waitReady waits for the broker's first ready session, logging every 10 s
// while there is none. A refusal for good (the client token refused, the
// server's certificate not trusted) is a configuration error, returned at
// once; a lock service that is down or still starting is waited for.
func waitReady(ctx context.Context, locks *broker.Broker, log *slog.Logger) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := locks.WaitReady(wctx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, broker.ErrNotReady) {
			return err
		}
		log.WarnContext(ctx, "waiting for the lock service", "err", err)
	}
}

func envInt(getenv func(string) string, key string, def int) (int, error) {
	v := getenv(key)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s must be a non-negative integer, not %q", key, v)
	}
	return n, nil
}
