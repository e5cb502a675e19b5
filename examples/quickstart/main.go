// Command quickstart shows in two seconds, with nothing to install, what a
// fencing token adds to a lock.
//
// It starts a Ticketing lock server in this process and opens a SQLite
// database in a temporary directory. Two workers, A and B, both want to
// ship order 42. A gets the lock first, then stalls for longer than its
// lease (as in a long GC pause). B gets the lock when A's lease runs out,
// and ships the order. Then A wakes up, still believing it holds the lock,
// and writes too. The database rejects A's write: its fencing token is
// older than the one B already wrote with.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
)

const (
	key   = "order-42"
	lease = 1 * time.Second // short, so that the story fits in two seconds
	stall = 2 * time.Second // A's pause: longer than its lease
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err := run(ctx, os.Stdout, stall)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart: FAILED:", err)
		os.Exit(1)
	}
}

// outcome is how the story ended.
type outcome struct {
	TokenA, TokenB uint64
	Stale          *fence.StaleError // why A's write was rejected
	Order          order             // the row at the end
}

// run tells the story on out. It returns an error if the story did not end
// as it must: B's write committed, A's rejected as stale, the row B's.
func run(ctx context.Context, out io.Writer, stall time.Duration) (res outcome, err error) {
	d, err := startDemo(ctx) // lock server, broker, SQLite database: see demo.go
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, d.close()) }()
	say := d.narrator(out)
	say("Two workers, one lock (%q, lease %v), one order row in SQLite.", key, lease)

	aHasLock := make(chan struct{})
	bDone := make(chan struct{})
	errA := make(chan error, 1)
	go func() {
		// A stalls between getting the lock and writing. (It also waits for
		// B to finish, only so that this demo always prints the same story.)
		errA <- d.worker(ctx, say, "A", &res.TokenA, func() {
			say("A: stalls for %v (think: a long GC pause); its lease runs out meanwhile", stall)
			close(aHasLock)
			time.Sleep(stall)
			<-bDone
			say("A: wakes up, still believes it holds the lock, and writes")
		})
	}()

	select {
	case <-aHasLock:
	case err := <-errA:
		return res, fmt.Errorf("worker A: %w", err)
	}
	say("B: asks for the same lock; the server queues B until A's lease runs out")
	errB := d.worker(ctx, say, "B", &res.TokenB, func() {})
	close(bDone)
	errAOut := <-errA
	if errB != nil {
		return res, fmt.Errorf("worker B should have committed: %w", errB)
	}

	// The fence must have rejected A: its token is older than B's.
	if !errors.As(errAOut, &res.Stale) {
		return res, fmt.Errorf("worker A should have been rejected as stale, got: %v", errAOut)
	}
	say("A: REJECTED by the database: token %d is stale, the high-water of %q is %d. Nothing written.",
		res.Stale.Token, res.Stale.Resource, res.Stale.HighWater)

	if res.Order, err = d.readOrder(ctx); err != nil {
		return res, err
	}
	say("Final row: %v", res.Order)
	if err := res.check(); err != nil {
		return res, err
	}
	say("OK: the lock could not stop A from writing after its lease ran out; the fencing token did.")
	return res, nil
}

// check verifies the end of the story: B, with the newer token, wrote the
// row; A's older token was rejected against B's.
func (o outcome) check() error {
	switch {
	case o.TokenB <= o.TokenA:
		return fmt.Errorf("token B %d is not above token A %d", o.TokenB, o.TokenA)
	case o.Stale == nil || o.Stale.Token != o.TokenA || o.Stale.HighWater != o.TokenB:
		return fmt.Errorf("A's write was not rejected with token %d against high-water %d: %v", o.TokenA, o.TokenB, o.Stale)
	case o.Order.Status != "shipped" || o.Order.ShippedBy != "B" || o.Order.Token != o.TokenB:
		return fmt.Errorf("final row %v is not B's write with token %d", o.Order, o.TokenB)
	}
	return nil
}

// worker is what both workers run: take the lock, (pause), then ship the
// order in a fenced transaction. sqlfence.Run checks the ticket's token
// against the order's high-water and raises it, in the same transaction as
// the UPDATE, commits, and only then releases the lock.
func (d *demo) worker(ctx context.Context, say sayFunc, name string, token *uint64, pause func()) error {
	// Wait up to 5 s for the lock, hold it for a 1 s lease, no minimum work budget.
	ticket, err := d.broker.Acquire(ctx, key, broker.AcquireOptions{Lease: lease, Wait: 5 * time.Second})
	for errors.Is(err, broker.ErrUnsent) && d.broker.WaitReady(ctx) == nil {
		// Nothing was sent (no session was ready, say the server was
		// restarting): always safe to retry, as soon as a session is.
		ticket, err = d.broker.Acquire(ctx, key, broker.AcquireOptions{Lease: lease, Wait: 5 * time.Second})
	}
	if err != nil {
		return err
	}
	*token = ticket.Token()
	say("%s: got the lock, fencing token %d", name, ticket.Token())
	pause()

	err = sqlfence.Run(ctx, d.db, fence.SQLite, ticket, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx,
			"UPDATE orders SET status = 'shipped', shipped_by = ?, token = ? WHERE id = 42",
			name, int64(ticket.Token()))
		return err
	})
	if err == nil {
		say("%s: shipped order 42 and committed (high-water of %q is now %d); lock released", name, key, ticket.Token())
	}
	return err
}
