package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/migrations"
)

// openExampleDB opens a new SQLite database in a temporary directory, with
// the fence table and an accounts table.
func openExampleDB(ctx context.Context) (db *sql.DB, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "fence-example")
	if err != nil {
		return nil, nil, err
	}
	dsn := "file:" + filepath.Join(dir, "app.db") + "?_txlock=immediate&_pragma=busy_timeout(5000)"
	db, err = sql.Open("sqlite", dsn)
	if err == nil {
		err = migrations.Up(ctx, db, fence.SQLite)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL); INSERT INTO accounts VALUES (1, 100)")
	}
	cleanup = func() {
		if db != nil {
			db.Close()
		}
		os.RemoveAll(dir)
	}
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return db, cleanup, nil
}

// A write fenced with sqlfence.Run, then a late writer holding an older
// token, which is rejected. In a program the tickets come from
// broker.Acquire; here they are fakes.
func Example() {
	ctx := context.Background()
	db, cleanup, err := openExampleDB(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()

	deposit := func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + 10 WHERE id = 1")
		return err
	}

	// The current holder: token 42.
	ticket := fencetest.NewTicket("account/1", 42)
	if err := sqlfence.Run(ctx, db, fence.SQLite, ticket, deposit); err != nil {
		log.Fatal(err)
	}
	fmt.Println("token 42 committed; released:", ticket.Releases() == 1)

	// A paused former holder wakes up with token 41.
	late := fencetest.NewTicket("account/1", 41)
	err = sqlfence.Run(ctx, db, fence.SQLite, late, deposit)
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		fmt.Printf("token %d rejected: high-water of %s is %d\n", stale.Token, stale.Resource, stale.HighWater)
	}

	var balance int
	if err := db.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = 1").Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", balance)
	// Output:
	// token 42 committed; released: true
	// token 41 rejected: high-water of account/1 is 42
	// balance: 110
}

// Guard fences a transaction the caller manages: check-and-bump first,
// the write, CheckLease right before commit, and the release after.
func Example_guard() {
	ctx := context.Background()
	db, cleanup, err := openExampleDB(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()

	ticket := fencetest.NewTicket("account/1", 7)
	write := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() // no-op after Commit
		if err := sqlfence.Guard(ctx, tx, fence.SQLite, ticket); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = 0 WHERE id = 1"); err != nil {
			return err
		}
		if err := sqlfence.CheckTx(ctx, tx, fence.SQLite); err != nil {
			return err // fence.ErrTxEnded: something committed or rolled back tx
		}
		if err := fence.CheckLease(ticket); err != nil {
			return err
		}
		return tx.Commit()
	}
	err = write()
	if rerr := ticket.Release(ctx); rerr != nil {
		log.Print(rerr)
	}
	fmt.Println("committed:", err == nil)
	// Output:
	// committed: true
}

// The lease ran out while the transaction was working: Run rolls back
// instead of committing, and still releases the ticket.
func Example_leaseExpired() {
	ctx := context.Background()
	db, cleanup, err := openExampleDB(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()

	ticket := fencetest.NewTicket("account/1", 9)
	err = sqlfence.Run(ctx, db, fence.SQLite, ticket, func(tx *sql.Tx) error {
		ticket.SetRemaining(0) // a long pause
		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = 0 WHERE id = 1")
		return err
	})
	fmt.Println(errors.Is(err, fence.ErrLeaseExpired), ticket.Releases())
	// Output:
	// true 1
}
