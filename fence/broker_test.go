package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
	"github.com/ticketing-dev/ticketing/server"
)

// With a real server: a zombie's stale Run releases a ticket whose lease
// is over, and the server answers N (broker.ErrNotHeld). That answer is
// what a stale holder expects, so Run returns the *fence.StaleError alone.
// Before the fix it came wrapped in a *fence.ReleaseError (ErrRelease
// matched), as if something had gone wrong with the release. (Other
// release failures are still reported: TestRunReleaseAfterStale in
// adapters/internal/core.)
func TestStaleReleaseNotHeld(t *testing.T) {
	ctx, db, b := realSetup(t)
	deposit := depositer(ctx)
	// zombie returns a ticket that lost its lock to a newer holder, who
	// has written.
	zombie := func(key string) *broker.Ticket {
		t.Helper()
		old, err := b.Acquire(ctx, key, broker.AcquireOptions{Lease: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		newer, err := b.Acquire(ctx, key, broker.AcquireOptions{Lease: 10 * time.Second, Wait: 5 * time.Second}) // granted when old's lease ends
		if err != nil {
			t.Fatal(err)
		}
		if err := sqlfence.Run(ctx, db, fence.SQLite, newer, deposit); err != nil {
			t.Fatalf("newer holder: %v", err)
		}
		return old
	}

	old := zombie("account/1")
	err := sqlfence.Run(ctx, db, fence.SQLite, old, deposit)
	var stale *fence.StaleError
	if !errors.As(err, &stale) || err != error(stale) || errors.Is(err, fence.ErrRelease) {
		t.Fatalf("stale Run: %v (%T), want the *fence.StaleError alone", err, err)
	}
	if rerr := old.Release(ctx); !errors.Is(rerr, broker.ErrNotHeld) {
		t.Fatalf("the release was answered %v, want broker.ErrNotHeld", rerr)
	}

}

// With a real server: a holder whose lease runs out inside fn (a newer
// holder is granted the lock meanwhile) gets fence.ErrLeaseExpired, and
// the release that follows is answered N (broker.ErrNotHeld), as expected
// once the lease is over: Run returns the ErrLeaseExpired alone. Before
// the fix it came in a *fence.ReleaseError that also matched
// broker.ErrNotHeld, unlike the stale case.
func TestLeaseExpiredReleaseNotHeld(t *testing.T) {
	ctx, db, b := realSetup(t)
	old, err := b.Acquire(ctx, "account/1", broker.AcquireOptions{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = sqlfence.Run(ctx, db, fence.SQLite, old, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + 10 WHERE id = 1"); err != nil {
			return err
		}
		// Granted only once old's lease has ended on the server.
		newer, err := b.Acquire(ctx, "account/1", broker.AcquireOptions{Lease: 10 * time.Second, Wait: 5 * time.Second})
		if err != nil {
			return err
		}
		return newer.Release(ctx)
	})
	if !errors.Is(err, fence.ErrLeaseExpired) || errors.Is(err, fence.ErrRelease) || errors.Is(err, broker.ErrNotHeld) {
		t.Fatalf("Run after the lease ran out: %v, want fence.ErrLeaseExpired alone", err)
	}
	if rerr := old.Release(ctx); !errors.Is(rerr, broker.ErrNotHeld) {
		t.Fatalf("the release was answered %v, want broker.ErrNotHeld", rerr)
	}
}

// With a real server: a ticket used for a second Run after its first one
// committed (a retry loop that keeps the old ticket, say) is stale with
// its own token as the high-water, and the error says that this ticket
// already wrote. Before, it said only "stale token N ... (high-water N)".
func TestTicketReusedAfterCommit(t *testing.T) {
	ctx, db, b := realSetup(t)
	deposit := depositer(ctx)
	tk, err := b.Acquire(ctx, "account/1", broker.AcquireOptions{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := sqlfence.Run(ctx, db, fence.SQLite, tk, deposit); err != nil {
		t.Fatal(err)
	}
	err = sqlfence.Run(ctx, db, fence.SQLite, tk, deposit)
	var stale *fence.StaleError
	if !errors.As(err, &stale) || stale.HighWater != tk.Token() {
		t.Fatalf("second Run with the same ticket: %v, want a *fence.StaleError with its own token %d as the high-water", err, tk.Token())
	}
	if !strings.Contains(err.Error(), "this ticket already wrote") {
		t.Errorf("second Run with the same ticket: %v, want it to say that this ticket already wrote", err)
	}
}

// With a real server: the fence reads the ticket's current deadline at
// commit. Three tickets with a 1 s lease, two of them refreshed to 10 s;
// once the original deadlines have passed, the unrefreshed one is refused
// (fence.ErrLeaseExpired), a refreshed one commits, and the commit margin
// applies to the refreshed deadline (a margin above what is left of it
// is refused, one below it commits, though the original deadline would
// have refused it).
func TestRefreshedTicketCommits(t *testing.T) {
	ctx, db, b := realSetup(t)
	deposit := depositer(ctx)
	acquire := func(key string) *broker.Ticket {
		t.Helper()
		tk, err := b.Acquire(ctx, key, broker.AcquireOptions{Lease: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	plain, overMargin, refreshed := acquire("account/1"), acquire("account/2"), acquire("account/3")
	original := refreshed.Deadline()
	for _, tk := range []*broker.Ticket{overMargin, refreshed} {
		if err := tk.Refresh(ctx, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Until(plain.Deadline().Add(100 * time.Millisecond)))
	if plain.Remaining() > 0 || !time.Now().After(original) {
		t.Fatal("the original deadlines have not passed")
	}

	if err := sqlfence.Run(ctx, db, fence.SQLite, plain, deposit); !errors.Is(err, fence.ErrLeaseExpired) {
		t.Fatalf("unrefreshed ticket: %v, want fence.ErrLeaseExpired", err)
	}
	margin := overMargin.Remaining() + time.Second // more than is left of the refreshed lease
	if err := sqlfence.Run(ctx, db, fence.SQLite, overMargin, deposit, fence.WithCommitMargin(margin)); !errors.Is(err, fence.ErrLeaseExpired) {
		t.Fatalf("refreshed ticket, margin %v: %v, want fence.ErrLeaseExpired", margin, err)
	}
	if err := sqlfence.Run(ctx, db, fence.SQLite, refreshed, deposit, fence.WithCommitMargin(5*time.Second)); err != nil {
		t.Fatalf("refreshed ticket, margin 5s: %v, want a commit", err)
	}
	var balance int
	if err := db.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = 1").Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance != 110 {
		t.Fatalf("balance %d, want 110 (one deposit committed)", balance)
	}
}

// With a real server: a ticket released before its fenced write (an
// explicit Release, then Run with it) is refused with an error that says
// it was released (fence.ErrReleased, which also matches
// fence.ErrLeaseExpired as before), and nothing is written. Before, the
// error said only "lease expired before commit: -60ms remaining", as if
// the lease had run out.
func TestReleasedTicketSaysReleased(t *testing.T) {
	ctx, db, b := realSetup(t)
	tk, err := b.Acquire(ctx, "account/1", broker.AcquireOptions{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if tk.Released() {
		t.Fatal("a fresh ticket reports itself released")
	}
	if err := tk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !tk.Released() {
		t.Fatal("a ticket whose Release returned nil does not report itself released")
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, fence.ErrReleased) || !errors.Is(err, fence.ErrLeaseExpired) {
			t.Fatalf("%s: %v, want fence.ErrReleased and fence.ErrLeaseExpired", what, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "released") || strings.Contains(msg, "remaining") {
			t.Fatalf("%s: %q, want it to say released, not the remaining time", what, msg)
		}
		if fence.Committed(err) {
			t.Fatalf("%s: Committed(%v) is true", what, err)
		}
	}
	check("CheckLease", fence.CheckLease(tk))
	check("Run", sqlfence.Run(ctx, db, fence.SQLite, tk, depositer(ctx)))
	var balance int
	if err := db.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = 1").Scan(&balance); err != nil {
		t.Fatal(err)
	}
	if balance != 100 {
		t.Fatalf("balance %d, want 100 (nothing written with a released ticket)", balance)
	}
}

// A nil *broker.Ticket, what an ignored Acquire error leaves, inside the
// fence.Ticket interface is not a nil interface: before the fix NewPlan
// called its Key method and panicked.
func TestNilBrokerTicket(t *testing.T) {
	var tk *broker.Ticket
	if !fence.NilTicket(tk) || !fence.NilTicket(nil) || fence.NilTicket(fencetest.NewTicket("k", 1)) {
		t.Fatal("NilTicket")
	}
	if _, err := fence.NewPlan(tk); !errors.Is(err, fence.ErrNilTicket) {
		t.Errorf("NewPlan: %v", err)
	}
	if err := fence.CheckLease(tk); !errors.Is(err, fence.ErrNilTicket) {
		t.Errorf("CheckLease: %v", err)
	}
	// The message says what to pass, not only what was wrong.
	if msg := fence.ErrNilTicket.Error(); !strings.Contains(msg, "pass the *broker.Ticket") || !strings.Contains(msg, "Acquire") {
		t.Errorf("ErrNilTicket %q does not say what to pass", msg)
	}
}

// realSetup starts a lock server and opens the example database, with a
// ready broker connected to the server; everything is closed at the
// test's end.
func realSetup(t *testing.T) (context.Context, *sql.DB, *broker.Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	addr, stop, err := startLockServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	db, cleanup, err := openExampleDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	b, err := broker.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return ctx, db, b
}

// depositer returns a fenced write that adds 10 to account 1.
func depositer(ctx context.Context) func(tx *sql.Tx) error {
	return func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + 10 WHERE id = 1")
		return err
	}
}

// With a real server: an operator's expire now does not make the fence
// refuse the old holder at once. The fence compares tokens with the stored
// high-water and knows nothing of the expire, so the old holder's fenced
// write is accepted until the new holder (granted a higher token) has
// written the resource, and refused from then on, as docs/operations.md
// says.
func TestExpiredHolderRefusedOnceNewHolderWrote(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	srv, err := server.New(server.Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		if err := <-served; !errors.Is(err, server.ErrServerClosed) {
			t.Error(err)
		}
	}()
	db, cleanup, err := openExampleDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	b, err := broker.Connect(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	deposit := depositer(ctx)

	// expired acquires key, has the operator expire it, and returns the
	// old holder's ticket (its lease still running on its side) and the
	// ticket of the next holder, granted with a higher token.
	expired := func(key string) (old, newer *broker.Ticket) {
		t.Helper()
		old, err := b.Acquire(ctx, key, broker.AcquireOptions{Lease: 60 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.ExpireLock(ctx, key, old.Token(), "test"); err != nil {
			t.Fatalf("expire now: %v", err)
		}
		newer, err = b.Acquire(ctx, key, broker.AcquireOptions{Lease: 60 * time.Second})
		if err != nil {
			t.Fatalf("acquire after the expire: %v", err)
		}
		if newer.Token() <= old.Token() || old.Remaining() <= 0 {
			t.Fatalf("tokens %d then %d, old remaining %v", old.Token(), newer.Token(), old.Remaining())
		}
		return old, newer
	}

	// Before the new holder writes, the old holder's write is accepted
	// (its release is answered N: the write is committed all the same).
	old, newer := expired("account/early")
	if err := sqlfence.Run(ctx, db, fence.SQLite, old, deposit); !fence.Committed(err) {
		t.Fatalf("the expired holder's write before the new holder's: %v, want it accepted", err)
	}
	if err := sqlfence.Run(ctx, db, fence.SQLite, newer, deposit); err != nil {
		t.Fatalf("the new holder's write after it: %v", err)
	}

	// Once the new holder has written, the old holder is refused.
	old, newer = expired("account/late")
	if err := sqlfence.Run(ctx, db, fence.SQLite, newer, deposit); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}
	var stale *fence.StaleError
	if err := sqlfence.Run(ctx, db, fence.SQLite, old, deposit); !errors.As(err, &stale) || stale.Token != old.Token() || stale.HighWater != newer.Token() {
		t.Fatalf("the expired holder's write after the new holder's: %v, want a *fence.StaleError below %d", err, newer.Token())
	}
}
