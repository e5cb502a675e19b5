package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	_ "modernc.org/sqlite" // database/sql driver "sqlite", pure Go

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/migrations"
	"github.com/ticketing-dev/ticketing/server"
)

// demo is everything the job needs, on embedded defaults: a Ticketing
// server on 127.0.0.1 (random port), a broker connected to it, and a SQLite
// database with the fence table (migrations.Up) and a reports table. In a
// real deployment the server is cmd/ticketingd, and the database your own.
type demo struct {
	dir    string
	srv    *server.Server
	served chan error
	broker *broker.Broker
	db     *sql.DB
	start  time.Time
}

func startDemo(ctx context.Context) (d *demo, err error) {
	dir, err := os.MkdirTemp("", "ticketing-longjob-")
	if err != nil {
		return nil, err
	}
	d = &demo{dir: dir, served: make(chan error, 1)}
	defer func() {
		if err != nil {
			err = errors.Join(err, d.close())
		}
	}()

	// The lock server, with a fresh token store (tokens start at 1).
	if d.srv, err = server.New(server.Config{DataDir: filepath.Join(dir, "ticketing")}); err != nil {
		return d, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return d, err
	}
	go func() { d.served <- d.srv.Serve(ln) }()

	// One broker per application, shared by every goroutine. Connect
	// never dials: wait for the first ready session before the first
	// Acquire.
	if d.broker, err = broker.Connect(ln.Addr().String()); err != nil {
		return d, err
	}
	if err := d.broker.WaitReady(ctx); err != nil {
		return d, err
	}

	// SQLite: one writer at a time; BEGIN IMMEDIATE and a busy timeout, as
	// package sqlfence recommends.
	dsn := "file:" + filepath.Join(dir, "reports.db") + "?_txlock=immediate&_pragma=busy_timeout(5000)"
	if d.db, err = sql.Open("sqlite", dsn); err != nil {
		return d, err
	}
	if err := migrations.Up(ctx, d.db, fence.SQLite); err != nil { // the fence's high-water table
		return d, err
	}
	if _, err := d.db.ExecContext(ctx, `
		CREATE TABLE reports (
			name  TEXT PRIMARY KEY,
			steps INTEGER NOT NULL,
			token INTEGER NOT NULL
		)`); err != nil {
		return d, err
	}
	d.start = time.Now()
	return d, nil
}

// close stops everything startDemo started, in reverse order.
func (d *demo) close() error {
	var errs []error
	if d.db != nil {
		errs = append(errs, d.db.Close())
	}
	if d.broker != nil {
		errs = append(errs, d.broker.Close())
	}
	if d.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, d.srv.Shutdown(ctx))
		cancel()
		select {
		case err := <-d.served:
			if !errors.Is(err, server.ErrServerClosed) {
				errs = append(errs, err)
			}
		default: // Serve never started
		}
	}
	errs = append(errs, os.RemoveAll(d.dir))
	return errors.Join(errs...)
}

// report is the reports row.
type report struct {
	Name  string
	Steps int
	Token uint64
}

func (r report) String() string {
	return fmt.Sprintf("reports(name=%s, steps=%d, token=%d)", r.Name, r.Steps, r.Token)
}

func (d *demo) readReport(ctx context.Context) (report, error) {
	var r report
	var tok int64
	err := d.db.QueryRowContext(ctx, "SELECT name, steps, token FROM reports WHERE name = ?", key).Scan(&r.Name, &r.Steps, &tok)
	r.Token = uint64(tok)
	return r, err
}

// reports counts the rows of reports.
func (d *demo) reports(ctx context.Context) (int, error) {
	var n int
	err := d.db.QueryRowContext(ctx, "SELECT count(*) FROM reports").Scan(&n)
	return n, err
}

// sayFunc prints one line of the story.
type sayFunc func(format string, args ...any)

// narrator returns a sayFunc that prefixes each line with the time since
// the start; safe for concurrent use.
func (d *demo) narrator(out io.Writer) sayFunc {
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "[%5.1fs] %s\n", time.Since(d.start).Seconds(), fmt.Sprintf(format, args...))
	}
}
