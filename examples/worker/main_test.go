package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

// TestMain runs the tests, says in one line how many skipped for want of
// a database and how to run them (go test ./... would otherwise print only
// "ok"), and checks that no goroutine outlived them.
func TestMain(m *testing.M) {
	code := m.Run()
	if n := skippedNoDSN.Load(); n > 0 {
		servertest.Notice(fmt.Sprintf("worker: %d test(s) skipped: %s is not set (%s); go test -v lists them", n, mysqlDSNEnv, "a MySQL/MariaDB DSN whose user may create databases, e.g. root@tcp(127.0.0.1:3306)/test"))
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// lockServer starts an in-process Ticketing server and returns its address.
func lockServer(t *testing.T) string {
	t.Helper()
	return servertest.Start(t, server.Config{}).Addr()
}

func newBroker(t *testing.T, addr string) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.Config{Addrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := b.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	return b
}

func newDB(t *testing.T) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testMySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.InterpolateParams = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	if err := setUp(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// counter counts Process calls per job.
type counter struct {
	mu    sync.Mutex
	calls map[int64]int
}

func (c *counter) process(ctx context.Context, job Job) (string, error) {
	c.mu.Lock()
	c.calls[job.ID]++
	c.mu.Unlock()
	return checksum(ctx, job)
}

// TestWorkersProcessEachJobOnce: three workers drain 100 jobs; every job is
// done, has exactly one result (the right one), and was processed once.
func TestWorkersProcessEachJobOnce(t *testing.T) {
	db := newDB(t)
	locks := newBroker(t, lockServer(t))
	const jobs = 100
	if err := enqueue(t.Context(), db, demoPayloads(jobs)...); err != nil {
		t.Fatal(err)
	}

	c := &counter{calls: map[int64]int{}}
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for i := range 3 {
		w := &Worker{DB: db, Locks: locks, Name: fmt.Sprintf("w%d", i), Process: c.process,
			Idle: 10 * time.Millisecond, Log: testLogger(t)}
		wg.Go(func() {
			if err := w.Run(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var pending int
		if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM ticketing_example_jobs WHERE status <> 'done'").Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d jobs still pending after 60 s", pending)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop() // graceful: Run returns once its job in progress is done
	wg.Wait()

	rows, err := db.QueryContext(t.Context(), `
		SELECT j.id, j.payload, j.status, r.result, r.worker
		FROM ticketing_example_jobs j LEFT JOIN ticketing_example_job_results r ON r.job_id = j.id ORDER BY j.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n, byWorker := 0, map[string]int{}
	for rows.Next() {
		var id int64
		var payload, status string
		var result, worker sql.NullString
		if err := rows.Scan(&id, &payload, &status, &result, &worker); err != nil {
			t.Fatal(err)
		}
		n++
		want, err := checksum(t.Context(), Job{ID: id, Payload: payload})
		if err != nil {
			t.Fatal(err)
		}
		if status != "done" || result.String != want {
			t.Errorf("job %d: status %s, result %q; want done, %q", id, status, result.String, want)
		}
		if c.calls[id] != 1 {
			t.Errorf("job %d processed %d times", id, c.calls[id])
		}
		byWorker[worker.String]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != jobs {
		t.Errorf("%d jobs (one result row each, job_id is the key), want %d", n, jobs)
	}
	t.Logf("jobs per worker: %v", byWorker)
}

// TestStalledWorker: worker A gets job 1's lock and stalls past its 1 s
// lease and its claim; worker B claims the job when A's claim expires,
// gets the lock, and finishes it. A wakes up: its write is refused as
// stale, and the job keeps B's one result.
func TestStalledWorker(t *testing.T) {
	db := newDB(t)
	addr := lockServer(t)
	if err := enqueue(t.Context(), db, "the job"); err != nil {
		t.Fatal(err)
	}
	aLocked, bDone := make(chan struct{}), make(chan struct{})
	a := &Worker{DB: db, Locks: newBroker(t, addr), Name: "A", Process: checksum, Lease: time.Second,
		afterLock: func(context.Context, Job) {
			close(aLocked)
			<-bDone // a long pause: past the lease, past the claim
		}}
	b := &Worker{DB: db, Locks: newBroker(t, addr), Name: "B", Process: checksum, Lease: time.Second}

	aErr := make(chan error, 1)
	go func() {
		did, err := a.RunOnce(t.Context())
		if did {
			err = errors.Join(err, errors.New("A reported the job done"))
		}
		aErr <- err
	}()
	select {
	case <-aLocked:
	case err := <-aErr:
		t.Fatalf("A ended before getting the lock: %v", err)
	}
	// B finds nothing to claim until A's claim (2 × lease) expires.
	start := time.Now()
	for {
		did, err := b.RunOnce(t.Context())
		if err != nil {
			t.Fatalf("B: %v", err)
		}
		if did {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("B never got the job")
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(bDone)

	err := <-aErr
	var stale *fence.StaleError
	if !errors.As(err, &stale) {
		t.Fatalf("A: %v, want a *fence.StaleError", err)
	}
	var worker, status string
	var results int
	if err := db.QueryRowContext(t.Context(),
		"SELECT j.status, (SELECT count(*) FROM ticketing_example_job_results), r.worker FROM ticketing_example_jobs j JOIN ticketing_example_job_results r ON r.job_id = j.id").
		Scan(&status, &results, &worker); err != nil {
		t.Fatal(err)
	}
	if status != "done" || results != 1 || worker != "B" {
		t.Errorf("job %s with %d results, by %s; want done, 1, B", status, results, worker)
	}
	if stale.Token >= stale.HighWater {
		t.Errorf("stale error %v", stale)
	}
}

// TestLockUnavailable: a worker whose broker has no session leaves the job
// claimed and undone (for another attempt after the claim expires).
func TestLockUnavailable(t *testing.T) {
	db := newDB(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	locks, err := broker.New(broker.Config{Addrs: []string{down}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := locks.Close(); err != nil {
			t.Error(err)
		}
	}()
	if err := enqueue(t.Context(), db, "the job"); err != nil {
		t.Fatal(err)
	}
	w := &Worker{DB: db, Locks: locks, Name: "W", Process: checksum}
	did, err := w.RunOnce(t.Context())
	if did || !errors.Is(err, broker.ErrUnsent) {
		t.Fatalf("RunOnce: %v, %v; want false, broker.ErrUnsent", did, err)
	}
	var status string
	var by sql.NullString
	if err := db.QueryRowContext(t.Context(), "SELECT status, claimed_by FROM ticketing_example_jobs").Scan(&status, &by); err != nil {
		t.Fatal(err)
	}
	if status != "pending" || by.Valid {
		t.Errorf("job %s claimed by %q; want pending and unclaimed (handed back, not left for ClaimTTL)", status, by.String)
	}
}

// startRun runs the program (run) with env in the background; stop ends
// it and returns its error.
func startRun(t *testing.T, log *slog.Logger, env map[string]string) (stop func() error) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, log, envOf(env)) }()
	return func() error {
		cancel()
		return <-done
	}
}

// waitDone waits until n jobs are done, for at most 20 s.
func waitDone(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var done int
		if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM ticketing_example_jobs WHERE status = 'done'").Scan(&done); err != nil {
			t.Fatal(err)
		}
		if done == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs done after 20 s", done, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dbURL is the test database's DSN, as the program reads DATABASE_URL.
func dbURL(t *testing.T, db *sql.DB) string {
	t.Helper()
	var name string
	if err := db.QueryRowContext(t.Context(), "SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	cfg := mysqlBase(t)
	cfg.DBName, cfg.InterpolateParams = name, true
	return cfg.FormatDSN()
}

// TestColdStart: the program and the lock server start together, the
// server a little later. No job is claimed before a session is ready
// (WaitReady), so none fails with broker.ErrUnsent and none is left
// claimed for ClaimTTL (60 s): the 3 jobs are done as soon as the server
// is up.
func TestColdStart(t *testing.T) {
	db := newDB(t)
	later := laterServer(t)
	addr := later.Addr()
	var logs logBuffer
	stop := startRun(t, slog.New(slog.NewTextHandler(&logs, nil)), map[string]string{
		"DATABASE_URL":  dbURL(t, db),
		"TICKETING_URL": "ticketing://" + addr,
		"ENQUEUE":       "3",
		"WORKERS":       "3",
	})
	time.Sleep(300 * time.Millisecond) // the program is up (and dialling) before the server
	later.Restart(t)
	waitDone(t, db, 3)
	if err := stop(); err != nil {
		t.Error(err)
	}
	t.Log(logs.String())
	if strings.Contains(logs.String(), "request not sent") {
		t.Error("an Acquire failed with ErrUnsent: a job was claimed before a session was ready")
	}
}

// TestRunTLS: the program reaches a server set up as ticketingd init --tls
// sets one up (TLS with a private CA, a client token) with nothing but
// TICKETING_URL, and does its jobs.
func TestRunTLS(t *testing.T) {
	db := newDB(t)
	_, url := tlsServer(t)
	stop := startRun(t, testLogger(t), map[string]string{
		"DATABASE_URL":  dbURL(t, db),
		"TICKETING_URL": url,
		"ENQUEUE":       "5",
		"WORKERS":       "2",
	})
	waitDone(t, db, 5)
	if err := stop(); err != nil {
		t.Error(err)
	}
	var results int
	if err := db.QueryRowContext(t.Context(), "SELECT count(*) FROM ticketing_example_job_results").Scan(&results); err != nil {
		t.Fatal(err)
	}
	if results != 5 {
		t.Errorf("%d results, want 5", results)
	}
}

// TestRunRefused: a wrong token in TICKETING_URL stops the program at
// start with broker.ErrUnauthorized (a refusal for good), instead of
// claiming jobs it cannot lock.
func TestRunRefused(t *testing.T) {
	db := newDB(t)
	for url, want := range refusedURLs(t) {
		t.Run(want.Error(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second) // fails, not hangs, if run does not stop
			defer cancel()
			err := run(ctx, testLogger(t), envOf(map[string]string{
				"DATABASE_URL": dbURL(t, db), "TICKETING_URL": url,
			}))
			if !errors.Is(err, want) {
				t.Errorf("run: %v, want %v", err, want)
			}
		})
	}
}

// TestLockConfig: TICKETING_URL is the one setting, the token included;
// a TICKETING_TOKEN in the environment (which earlier versions of init
// printed) is not read, beside a URL with a token or without one.
func TestLockConfig(t *testing.T) {
	cfg, err := lockConfig(envOf(nil), "worker")
	if err != nil || len(cfg.Addrs) != 1 || cfg.Addrs[0] != "127.0.0.1:5225" || cfg.Token != "" || cfg.TLS.Mode != broker.TLSOff || cfg.Name != "worker" {
		t.Errorf("default: %+v, %v", cfg, err)
	}
	cfg, err = lockConfig(envOf(map[string]string{
		"TICKETING_URL": "ticketing://tok@a:5225,b:5225?ca=/etc/ticketing/ca.pem&name=w1",
	}), "worker")
	if err != nil || len(cfg.Addrs) != 2 || cfg.Token != "tok" || cfg.TLS.Mode != broker.TLSCAFile || cfg.Name != "w1" {
		t.Errorf("URL with a token: %+v, %v", cfg, err)
	}
	cfg, err = lockConfig(envOf(map[string]string{"TICKETING_URL": "ticketing://tok@a", "TICKETING_TOKEN": "other"}), "worker")
	if err != nil || cfg.Token != "tok" {
		t.Errorf("URL with a token and TICKETING_TOKEN: token %q, %v; want the URL's, TICKETING_TOKEN unread", cfg.Token, err)
	}
	cfg, err = lockConfig(envOf(map[string]string{"TICKETING_URL": "ticketing://a", "TICKETING_TOKEN": "other"}), "worker")
	if err != nil || cfg.Token != "" {
		t.Errorf("URL without a token and TICKETING_TOKEN: token %q, %v; want none, TICKETING_TOKEN unread", cfg.Token, err)
	}
	if _, err := lockConfig(envOf(map[string]string{"TICKETING_URL": "127.0.0.1:5225"}), "worker"); !errors.Is(err, broker.ErrInvalidConfig) {
		t.Errorf("not a URL: %v, want ErrInvalidConfig", err)
	}
}

// TestSetUpIncompatibleTable: a table of the example's name that is not
// the example's (another application's, an older layout) makes setUp
// fail, naming the table and the missing columns, instead of being kept
// silently (CREATE TABLE IF NOT EXISTS) and failing later on a column.
func TestSetUpIncompatibleTable(t *testing.T) {
	db, err := sql.Open("mysql", testMySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), "CREATE TABLE ticketing_example_jobs (id BIGINT PRIMARY KEY, body TEXT)"); err != nil {
		t.Fatal(err)
	}
	err = setUp(t.Context(), db)
	if err == nil || !strings.Contains(err.Error(), "a table ticketing_example_jobs already exists without the column(s) payload, status, claimed_by, claimed_until") {
		t.Fatalf("setUp: %v, want a clear refusal of the existing table", err)
	}
}
