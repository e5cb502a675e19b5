package broker_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/migrations"
	"github.com/ticketing-dev/ticketing/server"
)

// exampleServer starts an in-process server on 127.0.0.1 and returns its
// address and a function that stops it.
func exampleServer() (string, func()) {
	dir, err := os.MkdirTemp("", "ticketing-example")
	if err != nil {
		panic(err)
	}
	srv, err := server.New(server.Config{DataDir: dir})
	if err != nil {
		panic(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	return ln.Addr().String(), func() {
		srv.Close()
		<-done
		os.RemoveAll(dir)
	}
}

func Example() {
	addr, stop := exampleServer()
	defer stop()

	// One broker per application, shared by all goroutines.
	b, err := broker.Connect(addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil { // optional, at start-up
		fmt.Println(err)
		return
	}

	// Wait up to 5 s for the lock, lease 30 s, need at least 2 s of work.
	ticket, err := b.Acquire(ctx, "order-42", broker.AcquireOptions{Lease: 30 * time.Second, Wait: 5 * time.Second, Work: 2 * time.Second})
	if err != nil {
		fmt.Println("not acquired:", err)
		return
	}
	// In one database transaction: reject ticket.Token() if it is not above
	// the stored high-water for "order-42", store it, do the write, commit.
	fmt.Println("key:", ticket.Key())
	fmt.Println("token issued:", ticket.Token() > 0)
	fmt.Println("lease covers the work:", ticket.Remaining() >= 2*time.Second)

	if err := ticket.Release(ctx); err != nil {
		fmt.Println("release:", err)
		return
	}
	fmt.Println("released")
	// Output:
	// key: order-42
	// token issued: true
	// lease covers the work: true
	// released
}

func ExampleBroker_Acquire_outcomes() {
	addr, stop := exampleServer()
	defer stop()
	b, err := broker.New(broker.Config{Addrs: []string{addr}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		fmt.Println(err)
		return
	}
	holder, err := b.Acquire(ctx, "report", broker.AcquireOptions{Lease: 30 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer holder.Release(ctx)

	// The key is held: wait 0 is one immediate try.
	_, err = b.Acquire(ctx, "report", broker.AcquireOptions{Lease: 30 * time.Second})
	switch {
	case err == nil:
		fmt.Println("granted")
	case errors.Is(err, broker.ErrTimedOut), errors.Is(err, broker.ErrBusy):
		fmt.Println("definitely not granted; try again later")
	case errors.Is(err, broker.ErrIndeterminate):
		fmt.Println("unknown: do not enter the critical section")
	case errors.Is(err, broker.ErrUnsent):
		fmt.Println("not sent: safe to retry")
	case errors.Is(err, broker.ErrInvalidArgument):
		fmt.Println("bug in the caller")
	default:
		fmt.Println("other:", err)
	}

	// Out of range arguments are refused before anything is sent.
	_, err = b.Acquire(ctx, "report", broker.AcquireOptions{Lease: 251 * time.Second})
	fmt.Println(errors.Is(err, broker.ErrInvalidArgument))
	// Output:
	// definitely not granted; try again later
	// true
}

func ExampleParseURL() {
	cfg, err := broker.ParseURL("ticketing://s3cret@10.0.0.1:5225,10.0.0.2?tls=ca&ca=/etc/ticketing/ca.pem")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.Addrs, cfg.TLS.Mode, cfg.TLS.CAFile, cfg.Token != "")
	// Output: [10.0.0.1:5225 10.0.0.2] ca-file /etc/ticketing/ca.pem true
}

// A hot-standby pair: the primary listed first (the broker tries it
// first at start), and a settle delay matching the pair's heartbeat (two
// heartbeats of 1.5 s here). While the active serves, the broker never
// dials the other node; see "Hot-standby pairs" in the package
// documentation.
func ExampleParseURL_pair() {
	cfg, err := broker.ParseURL("ticketing://s3cret@primary.example:5225,backup.example:5225?ca=/etc/ticketing/ca.pem&pair_settle=3s")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.Addrs, cfg.PairSettle)
	// Output: [primary.example:5225 backup.example:5225] 3s
}

// A cluster's TICKETING_URL, as ticketingd init --cluster prints it:
// every node's address and the cluster's identity. A node whose HELLO_OK
// names another cluster (a node started with a wrong peer list forms one
// of its own) is never used.
func ExampleParseURL_cluster() {
	cfg, err := broker.ParseURL("ticketing://s3cret@10.0.0.1:5225,10.0.0.2:5225,10.0.0.3:5225?ca=/etc/ticketing/ca.pem&cluster=4f1c9e0b2a7d4c35b8e6a91d0f2c7b3e")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(cfg.Addrs), cfg.Cluster)
	// Output: 3 4f1c9e0b2a7d4c35b8e6a91d0f2c7b3e
}

// exampleDB opens a new SQLite database in a temporary directory with
// the fence's high-water table and a reports table.
func exampleDB(ctx context.Context) (*sql.DB, func(), error) {
	dir, err := os.MkdirTemp("", "ticketing-example-db")
	if err != nil {
		return nil, nil, err
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_txlock=immediate&_pragma=busy_timeout(5000)")
	if err == nil {
		err = migrations.Up(ctx, db, fence.SQLite)
	}
	if err == nil {
		_, err = db.ExecContext(ctx, "CREATE TABLE reports (name TEXT PRIMARY KEY, total INTEGER NOT NULL)")
	}
	cleanup := func() {
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

// A long job holding one lock with KeepAlive, writing its result through
// the fence at the end. In production: a ten-minute job and a 30 s lease;
// KeepAlive then refreshes every 10 s, and if the refreshes stop being
// confirmed (the lock service unreachable), its context is cancelled 10 s
// before the conservative deadline, which is itself before the server's
// lease end: the job stops before anyone else can be granted the key.
// Scaled down here to run in a test: a 2 s lease (refreshed every 667 ms)
// and a job of twelve 250 ms steps, three seconds, longer than a lease.
func ExampleTicket_KeepAlive() {
	addr, stop := exampleServer()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, cleanup, err := exampleDB(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cleanup()
	b, err := broker.Connect(addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	if err := b.WaitReady(ctx); err != nil {
		fmt.Println(err)
		return
	}

	const (
		lease = 2 * time.Second        // in production: 30 * time.Second
		step  = 250 * time.Millisecond // twelve steps; in production: ten minutes of work
	)
	ticket, err := b.Acquire(ctx, "report/2024", broker.AcquireOptions{Lease: lease})
	if err != nil {
		fmt.Println("not acquired:", err)
		return
	}
	firstDeadline := ticket.Deadline()
	// held is cancelled as soon as the ticket can no longer be sure that
	// it holds the lock: do the work under it.
	held, err := ticket.KeepAlive(ctx, lease)
	if err != nil { // ErrUnsupported: a server older than protocol version 3
		fmt.Println("keep-alive:", err)
		ticket.Release(ctx)
		return
	}
	total := 0
	for i := range 12 {
		select {
		case <-held.Done():
			// Stop at once: the lock may soon be someone else's.
			fmt.Println("lock lost, job stopped:", context.Cause(held))
			ticket.Release(ctx)
			return
		case <-time.After(step):
			total += i
		}
	}
	fmt.Println("job ran past its first lease:", time.Now().After(firstDeadline))

	// Meanwhile another worker finds the key held.
	_, err = b.Acquire(ctx, "report/2024", broker.AcquireOptions{Lease: lease})
	fmt.Println("another worker not granted:", errors.Is(err, broker.ErrTimedOut))

	// The result, fenced with the token: it commits only while the
	// (refreshed) deadline is ahead, then the ticket is released, which
	// ends the keep-alive.
	err = sqlfence.Run(held, db, fence.SQLite, ticket, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(held, "INSERT INTO reports (name, total) VALUES (?, ?)", "2024", total)
		return err
	})
	fmt.Println("result committed:", err == nil)
	<-held.Done()
	fmt.Println("keep-alive ended by the release:", errors.Is(context.Cause(held), broker.ErrNotHeld))
	// Output:
	// job ran past its first lease: true
	// another worker not granted: true
	// result committed: true
	// keep-alive ended by the release: true
}
