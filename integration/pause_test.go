package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ticketing-dev/ticketing/adapters/pgxfence"
	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/migrations"
)

// The pause story (release only after commit, fence/doc.go): worker A holds a
// lock with a 1 s lease and pauses for 2.5 s; its lease ends; worker B
// acquires the lock and commits a fenced write; A wakes and tries its
// fenced write. The fence must refuse A, and the row must hold B's data.
const (
	storyLease = time.Second
	storyPause = 2500 * time.Millisecond
)

// storyDB is one database of the story: the high-water table, and a
// business table "story" with one row (id 1) that A and B both update.
type storyDB struct {
	key     string // the lock key and fenced resource: the test's name
	kind    string // "postgres" or "mysql"
	dsn     string
	sql     *sql.DB       // setup, reads, and sqlfence
	pool    *pgxpool.Pool // pgxfence (postgres only)
	dialect fence.Dialect
}

func openStoryDB(t *testing.T, kind string) *storyDB {
	t.Helper()
	ctx := t.Context()
	d := &storyDB{kind: kind, key: t.Name()}
	var (
		driver string
		mig    fence.Dialect
		ddl    string
	)
	switch kind {
	case "postgres":
		d.dsn, driver, mig, d.dialect = testdb.Postgres(t), "pgx", fence.Postgres, fence.Postgres
		ddl = "CREATE TABLE story (id INT PRIMARY KEY, writer TEXT NOT NULL, token BIGINT NOT NULL)"
	case "mysql":
		d.dsn, driver, mig, d.dialect = testdb.MySQL(t), "mysql", fence.MySQL, fence.MySQL
		ddl = "CREATE TABLE story (id INT PRIMARY KEY, writer VARCHAR(16) NOT NULL, token BIGINT NOT NULL) ENGINE=InnoDB"
	default:
		t.Fatalf("unknown database %q", kind)
	}
	db, err := sql.Open(driver, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	d.sql = db
	if err := migrations.Up(ctx, db, mig); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{ddl, "INSERT INTO story (id, writer, token) VALUES (1, 'init', 0)"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if kind == "postgres" {
		pool, err := pgxpool.New(ctx, d.dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		d.pool = pool
	}
	return d
}

func (d *storyDB) update() string {
	if d.kind == "postgres" {
		return "UPDATE story SET writer = $1, token = $2 WHERE id = 1"
	}
	return "UPDATE story SET writer = ?, token = ? WHERE id = 1"
}

// run is the adapter's Run: pgxfence on PostgreSQL, sqlfence on MySQL.
// inside runs in the transaction after the check-and-bump, before the
// business write.
func (d *storyDB) run(ctx context.Context, tk fence.Ticket, writer string, inside func() error) error {
	if d.pool != nil {
		return pgxfence.Run(ctx, d.pool, tk, func(tx pgx.Tx) error {
			if err := inside(); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, d.update(), writer, int64(tk.Token()))
			return err
		})
	}
	return sqlfence.Run(ctx, d.sql, d.dialect, tk, func(tx *sql.Tx) error {
		if err := inside(); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, d.update(), writer, int64(tk.Token()))
		return err
	})
}

// guarded is a transaction the caller manages: BEGIN, pause, Guard, the
// write, CheckLease, COMMIT (rolled back on any error). It does not
// release the ticket.
func (d *storyDB) guarded(ctx context.Context, tk fence.Ticket, writer string, pause func()) error {
	if d.pool != nil {
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		pause()
		if err := pgxfence.Guard(ctx, tx, tk); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, d.update(), writer, int64(tk.Token())); err != nil {
			return err
		}
		if err := fence.CheckLease(tk); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	tx, err := d.sql.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	pause()
	if err := sqlfence.Guard(ctx, tx, d.dialect, tk); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, d.update(), writer, int64(tk.Token())); err != nil {
		return err
	}
	if err := fence.CheckLease(tk); err != nil {
		return err
	}
	return tx.Commit()
}

// checkRow asserts that the business row and the high-water hold B's
// write.
func (d *storyDB) checkRow(t *testing.T, wantWriter string, wantToken uint64) {
	t.Helper()
	var (
		writer string
		token  int64
		hw     int64
	)
	if err := d.sql.QueryRowContext(t.Context(), "SELECT writer, token FROM story WHERE id = 1").Scan(&writer, &token); err != nil {
		t.Fatal(err)
	}
	if writer != wantWriter || uint64(token) != wantToken {
		t.Errorf("story row: writer %q token %d, want %q token %d", writer, token, wantWriter, wantToken)
	}
	if err := d.sql.QueryRowContext(t.Context(), "SELECT high_water FROM "+fence.DefaultTable).Scan(&hw); err != nil {
		t.Fatal(err)
	}
	if uint64(hw) != wantToken {
		t.Errorf("high-water %d, want %d", hw, wantToken)
	}
}

func newBroker(t *testing.T, cfg broker.Config) *broker.Broker {
	t.Helper()
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// acquireB is worker B: it waits for the lock (A's lease must end first)
// and returns its ticket, whose token must be above A's.
func acquireB(t *testing.T, b *broker.Broker, key string, tokenA uint64) *broker.Ticket {
	t.Helper()
	tB, err := b.Acquire(t.Context(), key, broker.AcquireOptions{Lease: 10 * time.Second, Wait: 10 * time.Second, Work: time.Second})
	if err != nil {
		t.Fatalf("B: acquire: %v", err)
	}
	if tB.Token() <= tokenA {
		t.Fatalf("B's token %d not above A's %d", tB.Token(), tokenA)
	}
	return tB
}

// checkStale asserts that err is A's stale rejection: a *fence.StaleError
// for A's token with B's token as the high-water. Run's own release of
// A's ticket answers N (the lock is no longer A's), so Run may wrap it in
// a *fence.ReleaseError; the stale outcome stays visible.
func checkStale(t *testing.T, err error, key string, tokenA, tokenB uint64) {
	t.Helper()
	var stale *fence.StaleError
	if !errors.As(err, &stale) {
		t.Fatalf("A: got %v, want a *fence.StaleError", err)
	}
	if stale.Token != tokenA || stale.HighWater != tokenB || stale.Resource != key {
		t.Errorf("A: stale error %+v, want token %d high-water %d resource %q", *stale, tokenA, tokenB, key)
	}
	if fence.Committed(err) {
		t.Errorf("A: fence.Committed(%v) is true", err)
	}
	t.Logf("A refused as expected: %v", err)
}

var storyDBs = []string{"postgres", "mysql"}

// TestPauseStory_InProcess runs the story with two brokers in this process
// (A and B, as two applications would have), on PostgreSQL through
// pgxfence and on MariaDB through sqlfence, with A pausing at three
// points:
//
//   - before-run: A acquired, pauses, then calls Run: the check-and-bump
//     refuses its token (stale; B's token is the high-water);
//   - in-tx-before-guard: A began its own transaction, pauses, then calls
//     Guard: stale, as above (BEGIN takes no lock on the high-water row);
//   - after-bump: A paused inside Run after its check-and-bump: B's bump
//     waits on A's row lock; A wakes, its lease check refuses the commit
//     (ErrLeaseExpired, rolled back), and B's write then commits.
//
// Pass: A's error is as above, B's write commits, and the row and the
// high-water hold B's data and token.
func TestPauseStory_InProcess(t *testing.T) {
	srv := harness.StartServer(t, harness.Ticketingd(t), harness.ServerOptions{})
	for _, kind := range storyDBs {
		for _, variant := range []string{"before-run", "in-tx-before-guard", "after-bump"} {
			t.Run(kind+"/"+variant, func(t *testing.T) {
				t.Parallel()
				db := openStoryDB(t, kind)
				bA := newBroker(t, broker.Config{Addrs: []string{srv.Addr()}, Name: "A"})
				bB := newBroker(t, broker.Config{Addrs: []string{srv.Addr()}, Name: "B"})
				if variant == "after-bump" {
					pauseAfterBump(t, db, bA, bB)
				} else {
					pauseBeforeBump(t, db, bA, bB, variant)
				}
			})
		}
	}
}

// pauseBeforeBump: A pauses before its check-and-bump, for storyPause and
// until B has committed (so the order is certain), then writes.
func pauseBeforeBump(t *testing.T, db *storyDB, bA, bB *broker.Broker, variant string) {
	ctx := t.Context()
	tA, err := bA.Acquire(ctx, db.key, broker.AcquireOptions{Lease: storyLease, Wait: time.Second})
	if err != nil {
		t.Fatalf("A: acquire: %v", err)
	}
	bCommitted := make(chan struct{})
	pause := func() {
		time.Sleep(storyPause)
		select {
		case <-bCommitted:
		case <-time.After(30 * time.Second): // hang guard
		}
	}
	aErr := make(chan error, 1)
	go func() {
		if variant == "before-run" {
			pause()
			aErr <- db.run(ctx, tA, "A", func() error { return nil })
			return
		}
		err := db.guarded(ctx, tA, "A", pause)
		rerr := tA.Release(context.WithoutCancel(ctx))
		if !errors.Is(rerr, broker.ErrNotHeld) {
			t.Errorf("A: release after the refusal: %v, want ErrNotHeld", rerr)
		}
		aErr <- err
	}()

	tB := acquireB(t, bB, db.key, tA.Token())
	if err := db.run(ctx, tB, "B", func() error { return nil }); err != nil {
		t.Fatalf("B: fenced write: %v", err)
	}
	close(bCommitted)
	checkStale(t, <-aErr, db.key, tA.Token(), tB.Token())
	db.checkRow(t, "B", tB.Token())
}

// pauseAfterBump: A pauses inside Run after its check-and-bump.
func pauseAfterBump(t *testing.T, db *storyDB, bA, bB *broker.Broker) {
	ctx := t.Context()
	tA, err := bA.Acquire(ctx, db.key, broker.AcquireOptions{Lease: storyLease, Wait: time.Second})
	if err != nil {
		t.Fatalf("A: acquire: %v", err)
	}
	var aWoke atomic.Bool
	bumped := make(chan struct{})
	aErr := make(chan error, 1)
	go func() {
		aErr <- db.run(ctx, tA, "A", func() error {
			close(bumped)
			time.Sleep(storyPause)
			aWoke.Store(true)
			return nil
		})
	}()
	<-bumped
	tB := acquireB(t, bB, db.key, tA.Token())
	bErr := make(chan error, 1)
	go func() {
		bErr <- db.run(ctx, tB, "B", func() error {
			// B's check-and-bump waited on the row A locked with its
			// own; it can only have passed once A's transaction ended.
			if !aWoke.Load() {
				return fmt.Errorf("B passed its check-and-bump while A's transaction held the row")
			}
			return nil
		})
	}()
	err = <-aErr
	if !errors.Is(err, fence.ErrLeaseExpired) || fence.Committed(err) {
		t.Fatalf("A: got %v, want fence.ErrLeaseExpired (rolled back)", err)
	}
	t.Logf("A refused as expected: %v", err)
	if err := <-bErr; err != nil {
		t.Fatalf("B: fenced write: %v", err)
	}
	db.checkRow(t, "B", tB.Token())
}

// TestPauseStory_SIGSTOP runs A as a real process (integration/cmd/
// pauseworker, sqlfence) frozen with SIGSTOP for storyPause and continued
// with SIGCONT, on PostgreSQL and MariaDB, pausing before Run (stale) and
// after the check-and-bump (lease expired; B waits on A's row lock while A
// is frozen). B is this process.
//
// Pass: the worker reports "stale" with its token and B's token as the
// high-water (or "lease_expired"), B's write commits, the row and the
// high-water hold B's data and token, and the worker exits 0.
func TestPauseStory_SIGSTOP(t *testing.T) {
	srv := harness.StartServer(t, harness.Ticketingd(t), harness.ServerOptions{})
	worker := harness.Binary(t, "./integration/cmd/pauseworker")
	type report struct {
		Event     string `json:"event"`
		Outcome   string `json:"outcome"`
		Token     uint64 `json:"token"`
		HighWater uint64 `json:"high_water"`
		Resource  string `json:"resource"`
		Error     string `json:"error"`
	}
	for _, kind := range storyDBs {
		for _, pause := range []string{"before-run", "after-bump"} {
			t.Run(kind+"/"+pause, func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				db := openStoryDB(t, kind)
				bB := newBroker(t, broker.Config{Addrs: []string{srv.Addr()}, Name: "B"})

				a := harness.StartProcess(t, "pauseworker", worker, "-addr", srv.Addr(), "-db", kind, "-dsn", db.dsn,
					"-key", db.key, "-lease", storyLease.String(), "-pause", pause)
				var r report
				if err := a.ReadJSON(&r, 30*time.Second); err != nil || r.Event != "acquired" {
					t.Fatalf("worker: %+v, %v; want the acquired report", r, err)
				}
				tokenA := r.Token
				if pause == "after-bump" {
					if err := a.ReadJSON(&r, 30*time.Second); err != nil || r.Event != "bumped" {
						t.Fatalf("worker: %+v, %v; want the bumped report", r, err)
					}
				}
				if err := a.Stop(); err != nil {
					t.Fatal(err)
				}
				stopped := time.Now()

				tB := acquireB(t, bB, db.key, tokenA)
				bErr := make(chan error, 1)
				go func() { bErr <- db.run(ctx, tB, "B", func() error { return nil }) }()
				if pause == "before-run" {
					if err := <-bErr; err != nil {
						t.Fatalf("B: fenced write: %v", err)
					}
				}
				time.Sleep(time.Until(stopped.Add(storyPause)))
				if err := a.Cont(); err != nil {
					t.Fatal(err)
				}
				if err := a.ReadJSON(&r, 30*time.Second); err != nil || r.Event != "result" {
					t.Fatalf("worker: %+v, %v; want the result report", r, err)
				}
				t.Logf("worker A reported: %+v", r)
				switch pause {
				case "before-run":
					if r.Outcome != "stale" || r.Token != tokenA || r.HighWater != tB.Token() || r.Resource != db.key {
						t.Errorf("worker: %+v, want stale with token %d high-water %d resource %q", r, tokenA, tB.Token(), db.key)
					}
				case "after-bump":
					if r.Outcome != "lease_expired" {
						t.Errorf("worker: %+v, want lease_expired", r)
					}
					if err := <-bErr; err != nil {
						t.Fatalf("B: fenced write: %v", err)
					}
				}
				if code, err := a.Wait(30 * time.Second); code != 0 {
					t.Errorf("worker exit code %d (%v)", code, err)
				}
				db.checkRow(t, "B", tB.Token())
			})
		}
	}
}
