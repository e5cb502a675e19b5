// Command httpapi is a net/http service that charges orders exactly once,
// under a Ticketing lock, with the payment fenced by the lock's token in the
// same PostgreSQL transaction (pgx + pgxfence).
//
//	POST /orders/{id}/pay   200 paid, 409 already paid or lost the lock,
//	                        503 + Retry-After when the lock service is unreachable
//	GET  /orders/{id}
//
// Environment:
//
//	DATABASE_URL     PostgreSQL URL, e.g. postgres://postgres@127.0.0.1:5432/shop (required)
//	TICKETING_URL    the lock service, as broker.ParseURL reads it (default
//	                 ticketing://127.0.0.1:5225), e.g. for a ticketingd init --tls
//	                 deployment: ticketing://TOKEN@locks.internal:5225?ca=/etc/ticketing/ca.pem;
//	                 the URL carries the client token (TICKETING_TOKEN is not read)
//	LISTEN_ADDR      HTTP listen address (default 127.0.0.1:8080)
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/broker"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop) // a second signal kills the process
	if err := run(ctx, log, os.Getenv, nil); err != nil {
		log.Error("httpapi stopped", "err", err)
		os.Exit(1)
	}
}

// run serves until ctx ends, configured by getenv (os.Getenv). listening,
// if not nil, is called with the HTTP address once it listens (tests).
func run(ctx context.Context, log *slog.Logger, getenv func(string) string, listening func(addr string)) (err error) {
	// One broker for the whole process. New never dials: its sessions open
	// in the background while the database is set up.
	cfg, err := lockConfig(getenv, "httpapi")
	if err != nil {
		return err
	}
	cfg.Logger = log
	locks, err := broker.New(cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, locks.Close()) }() // after the HTTP server; releases any lock still held

	dbURL := getenv("DATABASE_URL")
	if dbURL == "" {
		return errors.New("DATABASE_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/shop)")
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := setUp(ctx, pool); err != nil {
		return fmt.Errorf("database set-up: %w", err)
	}

	// Wait (a little) for the first session, so that the first requests do
	// not all get 503 while it opens. A refusal for good (the token refused,
	// the certificate not trusted) is a configuration error: stop. A lock
	// service that is only down is not: serve, and requests get 503 with
	// Retry-After until it is back.
	if err := waitReady(ctx, locks, 10*time.Second); err != nil {
		if !errors.Is(err, broker.ErrNotReady) {
			return err
		}
		log.WarnContext(ctx, "lock service not reachable yet; serving, payments get 503 until it is", "err", err)
	}

	api := &API{DB: pool, Locks: locks, Log: log}
	srv := &http.Server{
		Addr:              cmp.Or(getenv("LISTEN_ADDR"), "127.0.0.1:8080"),
		Handler:           api.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
	}
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String())
	if listening != nil {
		listening(ln.Addr().String())
	}

	select {
	case err := <-served:
		return err // Serve failed
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing requests in flight")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdownCtx) // in-flight payments finish and release their locks
	if serveErr := <-served; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return err // then the deferred pool.Close and locks.Close
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
	cfg, err := broker.ParseURL(cmp.Or(getenv("TICKETING_URL"), "ticketing://127.0.0.1:5225")) // its errors never contain the token
	if err != nil {
		return cfg, fmt.Errorf("TICKETING_URL: %w", err)
	}
	if cfg.Name == "" {
		cfg.Name = name
	}
	return cfg, nil
}

// waitReady waits up to timeout for the broker's first ready session.
func waitReady(ctx context.Context, locks *broker.Broker, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return locks.WaitReady(ctx)
}
