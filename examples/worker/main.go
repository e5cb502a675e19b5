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
//	TICKETING_ADDR   lock server address(es), comma-separated (default 127.0.0.1:5225)
//	TICKETING_TOKEN  client token, if the server requires one (optional)
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
	"strings"
	"sync"
	"syscall"

	"github.com/go-sql-driver/mysql"

	"github.com/ticketing-dev/ticketing/broker"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("worker stopped", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// DATABASE_URL is a go-sql-driver DSN: user:password@tcp(host:port)/dbname?params.
	dsn := os.Getenv("DATABASE_URL")
	cfg, err := mysql.ParseDSN(dsn)
	if dsn == "" || err != nil {
		return errors.New("DATABASE_URL must be a go-sql-driver/mysql DSN, e.g. root@tcp(127.0.0.1:3306)/jobs")
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return err
	}
	db := sql.OpenDB(connector)
	defer func() { err = errors.Join(err, db.Close()) }()
	if err := setUp(ctx, db); err != nil {
		return fmt.Errorf("database set-up: %w", err)
	}
	if n, err := envInt("ENQUEUE", 0); err != nil {
		return err
	} else if err := enqueue(ctx, db, demoPayloads(n)...); err != nil {
		return err
	}

	locks, err := broker.New(broker.Config{
		Addrs:  strings.Split(envOr("TICKETING_ADDR", "127.0.0.1:5225"), ","),
		Token:  os.Getenv("TICKETING_TOKEN"),
		Name:   "worker",
		Logger: log,
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, locks.Close()) }()

	n, err := envInt("WORKERS", 3)
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

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func envInt(key string, def int) (int, error) {
	v := os.Getenv(key)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s must be a non-negative integer, not %q", key, v)
	}
	return n, nil
}
