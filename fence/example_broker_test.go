package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"time"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/server"
)

// startLockServer starts an in-process Ticketing server on 127.0.0.1 with a
// fresh token store (its tokens start at 1), and returns its address and a
// function that stops it.
func startLockServer() (addr string, stop func() error, err error) {
	dir, err := os.MkdirTemp("", "fence-example-server")
	if err != nil {
		return "", nil, err
	}
	srv, err := server.New(server.Config{DataDir: dir})
	if err != nil {
		return "", nil, errors.Join(err, os.RemoveAll(dir))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, errors.Join(err, srv.Close(), os.RemoveAll(dir))
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	return ln.Addr().String(), func() error {
		err := srv.Shutdown(context.Background())
		if serr := <-served; !errors.Is(serr, server.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return errors.Join(err, os.RemoveAll(dir))
	}, nil
}

// A lock from a Ticketing server fences a write: worker A takes the lock
// with a 1 s lease and pauses past it; worker B gets the lock when A's
// lease ends and deposits; A wakes up and deposits too, and is refused,
// because B's newer token has already written.
func Example_withBroker() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, stopServer, err := startLockServer()
	if err != nil {
		log.Fatal(err)
	}
	defer func() {
		if err := stopServer(); err != nil {
			log.Print(err)
		}
	}()
	db, cleanup, err := openExampleDB(ctx) // SQLite, fence table, account 1 with balance 100
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()

	b, err := broker.Connect(addr) // one broker per application
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	if err := b.WaitReady(ctx); err != nil {
		log.Fatal(err)
	}

	deposit := func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + 10 WHERE id = 1")
		return err
	}

	// A: no waiting, a 1 s lease, no minimum work budget.
	a, err := b.Acquire(ctx, "account/1", broker.AcquireOptions{Lease: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("A holds token", a.Token())

	// A pauses. B waits for the lock (up to 5 s); the server grants it
	// when A's lease ends.
	bt, err := b.Acquire(ctx, "account/1", broker.AcquireOptions{Lease: 10 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("B holds token", bt.Token())
	err = sqlfence.Run(ctx, db, fence.SQLite, bt, deposit) // commits, then releases
	fmt.Println("B's deposit committed:", err == nil)

	// A wakes up, unaware that its lease has ended, and deposits.
	err = sqlfence.Run(ctx, db, fence.SQLite, a, deposit)
	var stale *fence.StaleError
	if errors.As(err, &stale) {
		fmt.Printf("A's deposit rejected: token %d, high-water %d\n", stale.Token, stale.HighWater)
	}
	// Run releases A's ticket too. The server answers that it was no
	// longer A's (broker.ErrNotHeld), which is what a stale holder
	// expects, so Run returns the *fence.StaleError alone, not a
	// *fence.ReleaseError.
	fmt.Println("A's error is the stale error alone:", err == error(stale) && !errors.Is(err, fence.ErrRelease))

	var balance int
	if err := db.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = 1").Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", balance)
	// Output:
	// A holds token 1
	// B holds token 2
	// B's deposit committed: true
	// A's deposit rejected: token 1, high-water 2
	// A's error is the stale error alone: true
	// balance: 110
}
