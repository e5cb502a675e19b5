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
//	TICKETING_ADDR   lock server address(es), comma-separated (default 127.0.0.1:5225)
//	TICKETING_TOKEN  client token, if the server requires one (optional)
//	LISTEN_ADDR      HTTP listen address (default 127.0.0.1:8080)
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/broker"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log); err != nil {
		log.Error("httpapi stopped", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger) (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dbURL := os.Getenv("DATABASE_URL")
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

	// One broker for the whole process. New never dials: if the lock
	// server is down, requests get 503 until it is back.
	locks, err := broker.New(broker.Config{
		Addrs:  strings.Split(env("TICKETING_ADDR", "127.0.0.1:5225"), ","),
		Token:  os.Getenv("TICKETING_TOKEN"),
		Name:   "httpapi",
		Logger: log,
	})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, locks.Close()) }() // after the HTTP server; releases any lock still held

	api := &API{DB: pool, Locks: locks, Log: log}
	srv := &http.Server{
		Addr:              env("LISTEN_ADDR", "127.0.0.1:8080"),
		Handler:           api.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.ListenAndServe() }()
	log.Info("listening", "addr", srv.Addr)

	select {
	case err := <-served:
		return err // could not listen
	case <-ctx.Done():
	}
	stop() // a second signal kills the process
	log.Info("shutting down: finishing requests in flight")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	err = srv.Shutdown(shutdownCtx) // in-flight payments finish and release their locks
	if serveErr := <-served; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	return err // then the deferred locks.Close and pool.Close
}

func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
