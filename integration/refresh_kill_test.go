package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/adapters/sqlfence"
	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/integration/harness"
)

// Helpers of the refresh tests (refresh_test.go, this file): a second
// job's broker, a job that keeps trying a key, a fenced write recorded in
// the history.

// newJobBroker is a broker of its own (loadBroker on addrs) for a second
// job, ready; it is closed at the end of the test.
func newJobBroker(t *testing.T, addrs []string, name string) *broker.Broker {
	t.Helper()
	b, err := broker.New(loadBroker(addrs, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatalf("%s's broker: WaitReady: %v", name, err)
	}
	return b
}

// prober is a job that tries a key with wait 0 every 100 ms, each try
// recorded in a History, until it is granted or stopped.
type prober struct {
	granted chan *broker.Ticket // the granted ticket, if any (buffered)
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// startProber starts process proc trying key with b (lease lease) under
// ctx. Stop it with Stop (a Cleanup does too).
func startProber(t *testing.T, ctx context.Context, h *harness.History, proc string, b *broker.Broker, key string, lease time.Duration) *prober {
	p := &prober{granted: make(chan *broker.Ticket, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			actx, acancel := context.WithTimeout(ctx, hangGuard)
			tk, err := harness.Acquire(actx, h, proc, b, key, broker.AcquireOptions{Lease: lease})
			acancel()
			if err == nil {
				p.granted <- tk
				return
			}
			select {
			case <-p.stop:
				return
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(p.Stop)
	return p
}

// Stop stops the prober and waits for its last try to return.
func (p *prober) Stop() {
	p.once.Do(func() { close(p.stop) })
	<-p.done
}

// grant returns the ticket the prober was granted, or nil.
func (p *prober) grant() *broker.Ticket {
	select {
	case tk := <-p.granted:
		p.granted <- tk
		return tk
	default:
		return nil
	}
}

// acquireRetry acquires key with wait, recorded in h, trying again while
// the answer is "unsent" or "not active" (a failover, a reconnect), until
// ctx ends.
func acquireRetry(ctx context.Context, h *harness.History, proc string, b *broker.Broker, key string, wait, lease time.Duration) (*broker.Ticket, error) {
	for {
		actx, acancel := context.WithTimeout(ctx, hangGuard)
		tk, err := harness.Acquire(actx, h, proc, b, key, broker.AcquireOptions{Lease: lease, Wait: wait})
		acancel()
		if !errors.Is(err, broker.ErrUnsent) && !errors.Is(err, broker.ErrNotActive) || ctx.Err() != nil {
			return tk, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// job2TakesOver is the end of the refresh scenarios: once job 1 has
// released key (its token token), job 2 acquires it (retrying while the
// cluster has no leader) with lease, must get a higher token, and releases it. It
// returns job 2's ticket (nil after a failure that ends the test).
func job2TakesOver(ctx context.Context, t *testing.T, h *harness.History, b2 *broker.Broker, key string, token uint64, lease time.Duration) *broker.Ticket {
	t.Helper()
	tk2, err := acquireRetry(ctx, h, "job2", b2, key, 10*time.Second, lease)
	if err != nil {
		t.Fatalf("job 2: acquire %s after job 1 released it: %v", key, err)
	}
	if tk2.Token() <= token {
		t.Errorf("job 2's token %d after job 1's release is not above job 1's %d", tk2.Token(), token)
	}
	if err := harness.Release(ctx, h, "job2", tk2); err != nil {
		t.Errorf("job 2: release: %v", err)
	}
	return tk2
}

// fencedWrite writes (key, tk's token) to kept_write through the fence
// (SQLite, sqlfence.Run, which releases tk) under ctx, and records it in
// h as a KindFence op of proc with the release's outcome. It returns the
// op and Run's error.
func fencedWrite(ctx context.Context, h *harness.History, db *sql.DB, proc string, tk *broker.Ticket) (harness.Op, error) {
	key, token := tk.Key(), tk.Token()
	op := harness.Op{Process: proc, Kind: harness.KindFence, Key: key, Token: token, Invoke: h.Now()}
	err := sqlfence.Run(ctx, db, fence.SQLite, tk, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO kept_write (key, token) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET token = excluded.token", key, int64(token))
		return err
	})
	op.Release = harness.OutcomeOK
	var re *fence.ReleaseError
	if errors.As(err, &re) {
		op.Release = harness.Outcome(re.Err)
	} else if errors.Is(err, fence.ErrStale) {
		op.Release = harness.OutcomeNotHeld // Run's release after a stale token: "not held", not reported
	}
	outcome := err
	if re != nil {
		outcome = re.Primary
	}
	op.Complete, op.Outcome = h.Now(), harness.Outcome(outcome)
	if outcome != nil {
		op.Err = outcome.Error()
	}
	op.Seq = h.Record(op)
	return op, err
}

// TestClusterRefreshSurvivesLeaderKill: one Ticket.Refresh is a command of
// the log, so a new leader restarts the lease from the refreshed lease_s,
// never from the acquire's.
//
// On a 3-node cluster, job 1 acquires K with a 3 s lease and refreshes it
// once to 30 s (no KeepAlive); right after the confirmed refresh the
// leader is killed with SIGKILL. Job 2 (a broker of its own) tries K with
// wait 0 every 100 ms from before the kill, through the failover, until
// the new leader has answered it "timed out" (held) at least ten times
// after takeover + 3 s + the election margin (+1 s): after the instant
// where a new leader that restarted the lease at the acquire's lease_s
// would have freed K. Job 1 then releases K (confirmed), and job 2 gets
// it, with a higher token. Pass: job 2 is never granted K during job 1's
// hold, and the history, where job 1's grant carries its refreshed
// conservative deadline, passes CheckTokensUnique,
// CheckNoTicketAfterIndeterminate, CheckTokensFollowRealTime,
// CheckLeaseExclusion and CheckReleasedIntervals; and CheckLeaseExclusion
// fails the same history with job 2's final grant moved to its last "held"
// answer (after job 1's unrefreshed deadline), which it would pass with
// the unrefreshed deadline. No assertion is timed: the hold after the kill
// is waited for by job 2's answers, with hang guards.
func TestClusterRefreshSurvivesLeaderKill(t *testing.T) {
	const (
		key          = "refreshed-k"
		acquireLease = 3 * time.Second
		refreshLease = 30 * time.Second
		// heldAnswers is how many "held" answers job 2 must get after the
		// instant an unrefreshed restart would have freed K.
		heldAnswers = 10
	)
	r := startClusterRun(t, harness.ClusterOptions{})
	h := r.h
	b2 := newJobBroker(t, r.c.Addrs(), "refresh-job2")
	ctx, cancel := context.WithTimeout(t.Context(), refreshLease+3*hangGuard)
	defer cancel()
	l := r.c.WaitConverged(t, hangGuard)

	tk, gi := job1Acquire(ctx, t, h, r.b, key, acquireLease)
	token, dl0 := tk.Token(), tk.Deadline()
	if err := harness.Refresh(ctx, h, "job1", tk, refreshLease); err != nil {
		t.Fatalf("job 1: refresh %s (token %d) to %v: %v", key, token, refreshLease, err)
	}
	dl1 := tk.Deadline()
	h.SetDeadline(gi, dl1)
	if !dl1.After(dl0.Add(refreshLease - 2*acquireLease)) {
		t.Fatalf("job 1's deadline after the refresh is %v after the acquire's, want about %v", dl1.Sub(dl0), refreshLease-acquireLease)
	}

	job2 := startProber(t, ctx, h, "job2", b2, key, acquireLease)
	h.Event("test", "kill9", l.ID)
	l.Kill9()
	killed := h.Event("test", "killed", l.ID)
	nl := r.c.WaitLeader(t, hangGuard)
	tookOver := h.Event("test", "leader", nl.ID)
	// A new leader that restarted K's lease at the acquire's lease_s
	// would have freed it by takeover + 3 s + the election margin: the
	// takeover was before tookOver.
	unrefreshedEnd := tookOver + acquireLease + 500*time.Millisecond + time.Second
	heldAfter := func() (n int, last time.Duration) {
		for _, o := range h.Ops() {
			if o.Process == "job2" && o.Kind == harness.KindAcquire && o.Outcome == harness.OutcomeTimedOut && o.Invoke > unrefreshedEnd {
				n, last = n+1, max(last, o.Complete)
			}
		}
		return n, last
	}
	for {
		if n, _ := heldAfter(); n >= heldAnswers {
			break
		}
		if tk2 := job2.grant(); tk2 != nil {
			t.Errorf("job 2 was granted %s (token %d) %v after the kill of %s, while job 1 held it (token %d, refreshed deadline %v after the kill)",
				key, tk2.Token(), h.Now()-killed, l.ID, token, h.At(dl1)-killed)
			_ = harness.Release(context.WithoutCancel(ctx), h, "job2", tk2)
			break
		}
		if time.Until(dl1) < 3*time.Second {
			n, _ := heldAfter()
			t.Fatalf("job 2 got only %d 'held' answers after the failover (%v after the kill) before job 1's refreshed deadline came near: the machine is too slow for this test", n, h.Now()-killed)
		}
		time.Sleep(50 * time.Millisecond)
	}
	job2.Stop()
	nHeld, lastHeld := heldAfter()

	// Job 1 releases K; job 2 then gets it, with a higher token.
	if err := r.b.WaitReady(ctx); err != nil {
		t.Fatalf("job 1's broker after the failover: %v", err)
	}
	relAt := time.Now()
	if err := harness.Release(ctx, h, "job1", tk); err != nil {
		t.Errorf("job 1: release %s (token %d, %v before its refreshed deadline): %v, want confirmed", key, token, dl1.Sub(relAt).Round(time.Millisecond), err)
	}
	tk2 := job2TakesOver(ctx, t, h, b2, key, token, acquireLease)

	t.Logf("job 1 held %s (token %d) from a %v lease refreshed once to %v; %s killed at %v, %s serving by %v; job 2 answered 'held' %d times after %v (the end an unrefreshed restart would give), the last at %v; job 1 released at %v (%v before its refreshed deadline); job 2 then granted token %d",
		key, token, acquireLease, refreshLease, l.ID, killed, nl.ID, tookOver, nHeld, unrefreshedEnd, lastHeld,
		h.At(relAt), dl1.Sub(relAt).Round(time.Millisecond), tk2.Token())
	t.Logf("outcomes: %v", h.Counts())
	checkRefreshHistory(t, h, false, gi, tk2.Token(), lastHeld, dl0)
}

// TestClusterKeepAliveStopped: the other half of the "done when":
// a job that stops refreshing, its KeepAlive's context cancelled and no
// Release, keeps the lock until its refreshed lease ends, and then loses
// it to the job that waited, whose fenced write makes the first job's
// late write stale.
//
// On a 3-node cluster, job 1 acquires K with a 2 s lease and keeps it
// alive (lease 6 s) for two leases, then cancels the context it gave
// KeepAlive (the refreshes stop; the ticket is not released). Job 2 (a
// broker of its own) tries K with wait 0 every 100 ms from the start until
// it is granted. Pass:
//
//   - job 1's keep-alive context is cancelled by the stop only, with
//     context.Canceled (not a lost lock);
//   - job 2 is granted K, with a token above job 1's, only after job 1's
//     last conservative deadline (Ticket.Deadline once job 2 has it: the
//     refreshed one, at least a lease past the acquire's): checked in the
//     history by CheckLeaseExclusion (job 1's grant carries that deadline)
//     and for job 2's grant directly;
//   - a Refresh of job 1's ticket is then answered ErrNotHeld; job 2's
//     fenced write (SQLite) commits; job 1's late fenced write is refused
//     (fence.ErrStale, or fence.ErrLeaseExpired), and the row holds job 2's
//     token;
//   - the history passes CheckTokensUnique, CheckNoTicketAfterIndeterminate,
//     CheckTokensFollowRealTime, CheckLeaseExclusion,
//     CheckReleasedIntervals and CheckFencedIncreasing; and
//     CheckLeaseExclusion fails it with job 2's grant moved to the stop
//     (inside job 1's refreshed lease, after its unrefreshed deadline),
//     which it would pass with the unrefreshed deadline.
//
// No assertion is timed: the waits are the hold and hang guards.
func TestClusterKeepAliveStopped(t *testing.T) {
	const (
		key          = "stopped-k"
		acquireLease = 2 * time.Second
		lease        = keepAliveLease
		holdLeases   = 2
	)
	r := startClusterRun(t, harness.ClusterOptions{})
	h := r.h
	db := openKeepAliveDB(t)
	b2 := newJobBroker(t, r.c.Addrs(), "stopped-job2")
	ctx, cancel := context.WithTimeout(t.Context(), 3*hangGuard+(holdLeases+1)*lease)
	defer cancel()

	tk, gi := job1Acquire(ctx, t, h, r.b, key, acquireLease)
	token, dl0 := tk.Token(), tk.Deadline()
	jobCtx, stopJob := context.WithCancel(ctx)
	defer stopJob()
	kctx, err := tk.KeepAlive(jobCtx, lease)
	if err != nil {
		t.Fatalf("job 1: KeepAlive: %v", err)
	}
	h.SetDeadline(gi, tk.Deadline())
	job2 := startProber(t, ctx, h, "job2", b2, key, acquireLease)

	select {
	case <-kctx.Done():
		t.Fatalf("job 1's keep-alive context was cancelled during the hold: %v", context.Cause(kctx))
	case <-job2.done:
		if tk2 := job2.grant(); tk2 != nil {
			t.Fatalf("job 2 was granted %s (token %d) while job 1 kept it alive (token %d)", key, tk2.Token(), token)
		}
		t.Fatalf("job 2 stopped trying during the hold: %v", ctx.Err())
	case <-time.After(holdLeases * lease):
	}
	dlStop := tk.Deadline()
	h.SetDeadline(gi, dlStop)
	stopped := h.Event("test", "stop refreshing", "job1")
	stopJob()
	select {
	case <-kctx.Done():
	case <-time.After(hangGuard):
		t.Fatal("job 1's keep-alive context was not cancelled by its parent's cancel")
	}
	if cause := context.Cause(kctx); !errors.Is(cause, context.Canceled) || errors.Is(cause, broker.ErrLeaseEnding) || errors.Is(cause, broker.ErrNotHeld) {
		t.Errorf("job 1's keep-alive context after the stop: cause %v, want context.Canceled", cause)
	}

	// Job 2 gets K once the refreshed lease has ended.
	select {
	case <-job2.done:
	case <-time.After(hangGuard + lease):
		t.Fatalf("job 2 was not granted %s within %v of job 1's stop (job 1's deadline %v after the stop)",
			key, hangGuard+lease, h.At(tk.Deadline())-stopped)
	}
	tk2 := job2.grant()
	if tk2 == nil {
		t.Fatalf("job 2 stopped trying %s without a grant: %v", key, ctx.Err())
	}
	dlLast := tk.Deadline()
	h.SetDeadline(gi, dlLast)
	var g2 harness.Op
	for _, o := range h.Ops() {
		if o.Kind == harness.KindAcquire && o.Outcome == harness.OutcomeOK && o.Token == tk2.Token() {
			g2 = o
		}
	}
	if g2.Complete < h.At(dlLast) {
		t.Errorf("job 2 was granted %s (token %d) at %v, before job 1's last conservative deadline %v", key, tk2.Token(), g2.Complete, h.At(dlLast))
	}
	if !dlLast.After(dl0.Add(lease)) {
		t.Errorf("job 1's last deadline is %v after the acquire's: not refreshed by a lease", dlLast.Sub(dl0))
	}
	if tk2.Token() <= token {
		t.Errorf("job 2's token %d is not above job 1's %d", tk2.Token(), token)
	}

	// The lock is job 2's: job 1's refresh is refused, job 2's fenced
	// write commits, job 1's late one is refused.
	if err := harness.Refresh(ctx, h, "job1", tk, lease); !errors.Is(err, broker.ErrNotHeld) {
		t.Errorf("job 1: refresh after job 2's grant: %v, want ErrNotHeld", err)
	}
	if _, err := fencedWrite(ctx, h, db, "job2", tk2); err != nil {
		t.Errorf("job 2's fenced write (token %d): %v, want committed", tk2.Token(), err)
	}
	late, err := fencedWrite(ctx, h, db, "job1", tk)
	if !errors.Is(err, fence.ErrStale) && !errors.Is(err, fence.ErrLeaseExpired) {
		t.Errorf("job 1's late fenced write (token %d): %v, want refused as stale or lease expired", token, err)
	}
	var wrote int64
	if err := db.QueryRowContext(ctx, "SELECT token FROM kept_write WHERE key = ?", key).Scan(&wrote); err != nil || uint64(wrote) != tk2.Token() {
		t.Errorf("the fenced write's row: token %d, %v; want job 2's %d", wrote, err, tk2.Token())
	}

	t.Logf("job 1 kept %s (token %d) alive for %v, its deadline moved %v past the acquire's; it stopped at %v with its deadline %v ahead; job 2 granted token %d at %v (%v after job 1's last deadline, after %d tries); job 1's late write: %s",
		key, token, holdLeases*lease, dlLast.Sub(dl0).Round(time.Millisecond), stopped, (h.At(dlLast) - stopped).Round(time.Millisecond),
		tk2.Token(), g2.Complete, (g2.Complete - h.At(dlLast)).Round(time.Millisecond), len(h.Filter(func(o harness.Op) bool { return o.Process == "job2" && o.Kind == harness.KindAcquire })),
		late.Outcome)
	t.Logf("outcomes: %v", h.Counts())
	checkRefreshHistory(t, h, true, gi, tk2.Token(), stopped, dl0)
}

// job1Acquire takes key for job 1 with lease (no wait), recorded in h
// with its deadline, and returns the ticket and its op's index; it fails
// the test if the key is not granted.
func job1Acquire(ctx context.Context, t *testing.T, h *harness.History, b *broker.Broker, key string, lease time.Duration) (*broker.Ticket, int) {
	t.Helper()
	gi := h.Invoke("job1", harness.KindAcquire, key)
	tk, err := b.Acquire(ctx, key, broker.AcquireOptions{Lease: lease})
	var token uint64
	if tk != nil {
		token = tk.Token()
	}
	h.Complete(gi, token, err, "")
	if err != nil {
		t.Fatalf("job 1: acquire %s: %v", key, err)
	}
	h.SetDeadline(gi, tk.Deadline())
	return tk, gi
}
