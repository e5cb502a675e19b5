// Command counterworker is the worker process of the integration chaos test
// (integration/chaos_test.go). It loops, until --duration has passed or it
// gets SIGTERM:
//
//	acquire --key (lease --lease) -> print "holding" -> think --think ->
//	in one transaction: read the counter, wait --work, write counter+1 and
//	append a row (worker, token, read value, written value) to write_log
//
// The transaction is fenced with sqlfence.Run (check-and-bump of the token
// on resource --key, lease check before commit, release after), unless
// --no-fence: then it is the same lock and the same read-modify-write, in a
// plain transaction, followed by Release. The control run of the chaos
// test uses --no-fence to show that its checker detects lost updates.
//
// Every event is one JSON object per line on stdout (unbuffered, so the
// test's nemesis sees "holding" at once). Times are nanoseconds on this
// process's monotonic clock since its start; the first line ("start")
// carries the wall clock (UnixNano) of that origin, so the test can place
// every event of every worker on one time line.
//
//	{"ev":"start","w":1,"wall":1700000000000000000,"pid":123}
//	{"ev":"acquire","w":1,"op":7,"t0":..,"t1":..,"outcome":"ok","token":42,"deadline":..}
//	{"ev":"holding","w":1,"op":7,"t":..,"token":42}
//	{"ev":"write","w":1,"op":7,"t0":..,"t1":..,"token":42,"outcome":"ok","release":"ok","read":9,"wrote":10}
//	{"ev":"done","w":1,"t":..}
//
// Outcomes are harness.Outcome's names: "ok", "stale", "not_held", ...
//
// The tables (counter with the row id 1, write_log, and the fence table of
// package migrations) are created by the test.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/integration/harness"
)

// Event is one line of output. Exported field names are the JSON contract
// with the test (which has its own copy of this struct).
type Event struct {
	Ev       string `json:"ev"`
	W        int    `json:"w"`
	Op       int    `json:"op,omitempty"`
	Wall     int64  `json:"wall,omitempty"`
	Pid      int    `json:"pid,omitempty"`
	T        int64  `json:"t,omitempty"`
	T0       int64  `json:"t0,omitempty"`
	T1       int64  `json:"t1,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
	Release  string `json:"release,omitempty"`
	Token    uint64 `json:"token,omitempty"`
	Deadline int64  `json:"deadline,omitempty"`
	Read     *int64 `json:"read,omitempty"`
	Wrote    *int64 `json:"wrote,omitempty"`
	Err      string `json:"err,omitempty"`
}

var (
	start = time.Now()
	outMu sync.Mutex
	enc   = json.NewEncoder(os.Stdout)
)

func mono() int64 { return int64(time.Since(start)) }

func emit(e Event) {
	outMu.Lock()
	defer outMu.Unlock()
	_ = enc.Encode(e) // os.Stdout is unbuffered: one write per line
}

type options struct {
	id       int
	addr     string
	driver   string
	dsn      string
	key      string
	duration time.Duration
	lease    time.Duration
	wait     time.Duration
	think    time.Duration
	work     time.Duration
	noFence  bool
}

func main() {
	var o options
	flag.IntVar(&o.id, "id", 0, "worker id, written to the log rows")
	flag.StringVar(&o.addr, "addr", "", "ticketingd address host:port")
	flag.StringVar(&o.driver, "driver", "postgres", "database: postgres or mysql")
	flag.StringVar(&o.dsn, "dsn", "", "database DSN (pgx URL or go-sql-driver/mysql DSN)")
	flag.StringVar(&o.key, "key", "counter", "lock key and fenced resource")
	flag.DurationVar(&o.duration, "duration", 8*time.Second, "how long to run")
	flag.DurationVar(&o.lease, "lease", time.Second, "lease of every acquire")
	flag.DurationVar(&o.wait, "wait", 3*time.Second, "wait of every acquire")
	flag.DurationVar(&o.think, "think", 20*time.Millisecond, "pause between holding and the transaction")
	flag.DurationVar(&o.work, "work", 20*time.Millisecond, "pause between reading and writing the counter")
	flag.BoolVar(&o.noFence, "no-fence", false, "control mode: no fence and no lease check (lost updates expected)")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "counterworker:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	if o.addr == "" || o.dsn == "" {
		return errors.New("--addr and --dsn are required")
	}
	var (
		dialect    fence.Dialect
		driverName string
		q          queries
	)
	switch o.driver {
	case "postgres":
		dialect, driverName = fence.Postgres, "pgx"
		q = queries{
			read:   "SELECT value FROM counter WHERE id = 1",
			update: "UPDATE counter SET value = $1 WHERE id = 1",
			log:    "INSERT INTO write_log (worker, token, read_value, wrote_value, fenced) VALUES ($1, $2, $3, $4, $5)",
		}
	case "mysql":
		dialect, driverName = fence.MySQL, "mysql"
		q = queries{
			read:   "SELECT value FROM counter WHERE id = 1",
			update: "UPDATE counter SET value = ? WHERE id = 1",
			log:    "INSERT INTO write_log (worker, token, read_value, wrote_value, fenced) VALUES (?, ?, ?, ?, ?)",
		}
	default:
		return fmt.Errorf("unknown --driver %q", o.driver)
	}
	db, err := sql.Open(driverName, o.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(2)

	b, err := broker.New(broker.Config{
		Addrs:            []string{o.addr},
		Name:             fmt.Sprintf("counterworker-%d", o.id),
		DialTimeout:      time.Second,
		BackoffMin:       20 * time.Millisecond,
		BackoffMax:       300 * time.Millisecond,
		KeepAlive:        500 * time.Millisecond,
		KeepAliveTimeout: 500 * time.Millisecond,
		ReplyGrace:       time.Second,
	})
	if err != nil {
		return err
	}
	defer b.Close()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()

	// A start-up convenience: the first acquires would otherwise be
	// "unsent" until the sessions are up. Not ready in time is no error.
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	_ = b.WaitReady(rctx)
	rcancel()
	emit(Event{Ev: "start", W: o.id, Wall: start.UnixNano(), Pid: os.Getpid()})
	for op := 1; ctx.Err() == nil; op++ {
		one(ctx, o, b, db, dialect, q, op)
	}
	emit(Event{Ev: "done", W: o.id, T: mono()})
	return nil
}

type queries struct{ read, update, log string }

// one is one operation: acquire, and if granted the transaction.
func one(ctx context.Context, o options, b *broker.Broker, db *sql.DB, d fence.Dialect, q queries, op int) {
	// The acquire and the transaction are not cut short by the end of the
	// run (ctx): a half-done operation would only blur the history.
	bg := context.WithoutCancel(ctx)
	actx, cancel := context.WithTimeout(bg, o.wait+5*time.Second)
	t0 := mono()
	t, err := b.Acquire(actx, o.key, broker.AcquireOptions{Lease: o.lease, Wait: o.wait})
	t1 := mono()
	cancel()
	ev := Event{Ev: "acquire", W: o.id, Op: op, T0: t0, T1: t1, Outcome: harness.Outcome(err)}
	if err != nil {
		ev.Err = err.Error()
		if t != nil {
			ev.Token = t.Token() // a ticket with an error: the checker flags it
		}
		emit(ev)
		// Not granted: back off a little (the server may be down).
		sleep(ctx, time.Duration(10+rand.IntN(40))*time.Millisecond)
		return
	}
	ev.Token = t.Token()
	ev.Deadline = int64(t.Deadline().Sub(start))
	emit(ev)
	emit(Event{Ev: "holding", W: o.id, Op: op, T: mono(), Token: t.Token()})
	time.Sleep(o.think)

	w := Event{Ev: "write", W: o.id, Op: op, Token: t.Token(), T0: mono()}
	var read, wrote int64
	body := func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(bg, q.read).Scan(&read); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		w.Read = &read
		time.Sleep(o.work)
		wrote = read + 1
		if _, err := tx.ExecContext(bg, q.update, wrote); err != nil {
			return fmt.Errorf("update: %w", err)
		}
		if _, err := tx.ExecContext(bg, q.log, o.id, int64(t.Token()), read, wrote, !o.noFence); err != nil {
			return fmt.Errorf("log: %w", err)
		}
		w.Wrote = &wrote
		return nil
	}
	if o.noFence {
		err = plainTx(bg, db, body)
		w.Outcome = harness.Outcome(err)
		w.Release = harness.Outcome(t.Release(bg))
	} else {
		err = sqlfence.Run(bg, db, d, t, body)
		var re *fence.ReleaseError
		if errors.As(err, &re) {
			w.Release = harness.Outcome(re.Err)
			err = re.Primary
		} else {
			w.Release = harness.OutcomeOK
		}
		w.Outcome = harness.Outcome(err)
	}
	w.T1 = mono()
	if err != nil {
		w.Err = err.Error()
	}
	emit(w)
}

func plainTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%w: %w", fence.ErrCommitUnknown, err)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
