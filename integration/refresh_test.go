package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/internal/testdb"
	"github.com/ticketing-dev/ticketing/migrations"
)

// keepAliveLease is the default lease of TestClusterKeepAliveAcrossFailover's
// KeepAlive (TICKETING_LONGJOB_LEASE sets another) and the lease of
// TestClusterKeepAliveStopped. KeepAlive gives up (cancels its context)
// when the conservative deadline comes within a third of the lease without
// a confirmed refresh, which is at most 0.99·L − L/3 after the last one:
// about 1.3 s for a 2 s lease, less than a leader kill -9 can take (README:
// failover p50 1.09 s, max 1.96 s, to which the broker's reconnect and the
// refresh's commit on the new leader add). With 6 s the failover fits in
// the margin (about 4 s after a refresh), so the promise "the lock is held
// through the failover" is testable; the acquire itself uses a short lease
// (2 s).
const keepAliveLease = 6 * time.Second

// keepAliveLeases is the default number of leases
// TestClusterKeepAliveAcrossFailover holds its key for
// (TICKETING_LONGJOB_LEASES sets another): 20, as the issue asks, 120 s
// with the default lease.
const keepAliveLeases = 20

// longJob returns the keep-alive lease and the number of leases of
// TestClusterKeepAliveAcrossFailover: keepAliveLease and keepAliveLeases,
// or TICKETING_LONGJOB_LEASE (a duration, whole seconds, 6..250 s: below
// 6 s a leader failover does not fit in KeepAlive's margin) and
// TICKETING_LONGJOB_LEASES (at least 6: the kill is 3 leases in, the
// restart 2 leases later). The "done when" job, ten minutes with
// a 30 s lease, is
//
//	TICKETING_LONGJOB_LEASE=30s TICKETING_LONGJOB_LEASES=20 \
//	go test ./integration -run '^TestClusterKeepAliveAcrossFailover$' -v -timeout 30m
func longJob(t *testing.T) (lease time.Duration, leases int) {
	t.Helper()
	lease, leases = keepAliveLease, keepAliveLeases
	if s := os.Getenv("TICKETING_LONGJOB_LEASE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 6*time.Second || d > 250*time.Second || d%time.Second != 0 {
			t.Fatalf("TICKETING_LONGJOB_LEASE=%q: want a duration of whole seconds, 6s..250s", s)
		}
		lease = d
	}
	if s := os.Getenv("TICKETING_LONGJOB_LEASES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 6 {
			t.Fatalf("TICKETING_LONGJOB_LEASES=%q: want a number, at least 6", s)
		}
		leases = n
	}
	return lease, leases
}

// TestClusterKeepAliveAcrossFailover: a job holds one key through a leader
// kill -9 with Ticket.KeepAlive, on a 3-node cluster with peer TLS and a
// broker given every address.
//
// Job 1 acquires K with a 2 s lease and keeps it alive (lease L, 6 s) for
// N leases (20: 120 s; see longJob for other values); three leases in,
// right after a confirmed refresh, the leader is killed with SIGKILL, and
// restarted two leases later. Throughout, job 2 (a broker of its own)
// tries K with wait 0 every 100 ms. Pass:
//
//   - job 2 is never granted K while job 1 holds it, and is answered
//     "timed out" (held) by the new leader too;
//   - job 1's keep-alive context is not cancelled by the failover, and
//     refreshes are confirmed after the kill (by the new leader), at least
//     one per lease held after it;
//   - at the end job 1 writes through the fence (SQLite, sqlfence.Run) with
//     its one token; the write commits and the release is confirmed, which
//     cancels the keep-alive context with ErrNotHeld;
//   - job 2 then gets K, with a higher token;
//   - the history, where job 1's grant carries its refreshed conservative
//     deadline (Ticket.Deadline, read every 20 ms and at the end), passes
//     CheckTokensUnique, CheckNoTicketAfterIndeterminate,
//     CheckTokensFollowRealTime, CheckLeaseExclusion and
//     CheckReleasedIntervals; and CheckLeaseExclusion fails the same history
//     with job 2's final grant moved to the kill (inside job 1's refreshed
//     holding, long after its unrefreshed deadline), which it would pass
//     with job 1's unrefreshed deadline: the exclusion checked is the
//     refreshed one.
//
// No assertion is timed: the waits are the hold itself and hang guards.
func TestClusterKeepAliveAcrossFailover(t *testing.T) {
	const (
		key          = "keepalive-k"
		acquireLease = 2 * time.Second
		killAt       = 3 // leases into the hold
		restartAfter = 2 // leases after the kill
	)
	lease, leases := longJob(t)
	t.Logf("job 1 keeps %s alive with a %v lease for %d leases (%v)", key, lease, leases, time.Duration(leases)*lease)
	r := startClusterRun(t, harness.ClusterOptions{PeerTLS: true})
	checkPeerTLS(t, r.c.Servers())
	h := r.h
	db := openKeepAliveDB(t)

	b2, err := broker.New(loadBroker(r.c.Addrs(), "keepalive-job2"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b2.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard+time.Duration(leases)*lease+hangGuard)
	defer cancel()
	{
		rctx, rcancel := context.WithTimeout(ctx, hangGuard)
		err := b2.WaitReady(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("job 2's broker: WaitReady: %v", err)
		}
	}

	// Job 1: acquire K (recorded by hand, to keep the op's index for its
	// deadline) and keep it alive.
	gi := h.Invoke("job1", harness.KindAcquire, key)
	tk, err := r.b.Acquire(ctx, key, broker.AcquireOptions{Lease: acquireLease})
	var token uint64
	if tk != nil {
		token = tk.Token()
	}
	h.Complete(gi, token, err, "")
	if err != nil {
		t.Fatalf("job 1: acquire %s: %v", key, err)
	}
	dl0 := tk.Deadline()
	h.SetDeadline(gi, dl0)
	kctx, err := tk.KeepAlive(ctx, lease)
	if err != nil {
		t.Fatalf("job 1: KeepAlive: %v", err)
	}
	h.SetDeadline(gi, tk.Deadline())
	holdStart := time.Now()

	// The deadline tracker: every confirmed refresh moves tk.Deadline();
	// the grant's recorded deadline follows it (it is never ahead of a
	// confirmed one), and each move is counted and signalled.
	var refreshes atomic.Int64
	refreshed := make(chan struct{}, 1)
	stopTrack := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(1)
	last := tk.Deadline() // the tracker's; read after bg.Wait
	go func() {
		defer bg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopTrack:
				return
			case <-tick.C:
			}
			if dl := tk.Deadline(); dl.After(last) {
				last = dl
				h.SetDeadline(gi, dl)
				refreshes.Add(1)
				select {
				case refreshed <- struct{}{}:
				default:
				}
			}
		}
	}()

	// Job 2: K with wait 0, every 100 ms, until the hold ends.
	stopJob2 := make(chan struct{})
	var job2Granted atomic.Int64
	bg.Add(1)
	go func() {
		defer bg.Done()
		for {
			select {
			case <-stopJob2:
				return
			default:
			}
			actx, acancel := context.WithTimeout(ctx, hangGuard)
			tk2, err := harness.Acquire(actx, h, "job2", b2, key, broker.AcquireOptions{Lease: acquireLease})
			acancel()
			if err == nil {
				job2Granted.Add(1)
				t.Errorf("job 2 was granted %s (token %d) while job 1 held it (token %d; keep-alive context: %v)",
					key, tk2.Token(), token, context.Cause(kctx))
				_ = harness.Release(context.WithoutCancel(ctx), h, "job2", tk2)
			}
			select {
			case <-stopJob2:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	var job2Once, trackOnce sync.Once
	endJob2 := func() { job2Once.Do(func() { close(stopJob2) }) }
	endTrack := func() { trackOnce.Do(func() { close(stopTrack) }) }
	defer func() {
		endJob2()
		endTrack()
		bg.Wait()
	}()

	// holdUntil waits until at, failing if job 1's keep-alive context is
	// cancelled first.
	holdUntil := func(at time.Time, what string) {
		t.Helper()
		select {
		case <-kctx.Done():
			t.Fatalf("job 1's keep-alive context was cancelled %s (%v into the hold, %d refreshes seen): %v",
				what, time.Since(holdStart).Round(time.Millisecond), refreshes.Load(), context.Cause(kctx))
		case <-time.After(time.Until(at)):
		}
	}

	holdUntil(holdStart.Add(killAt*lease), "before the kill")
	l := r.c.WaitConverged(t, hangGuard)
	// Kill right after a confirmed refresh, so that the failover has the
	// whole margin.
	select {
	case <-refreshed:
	default:
	}
	select {
	case <-refreshed:
	case <-kctx.Done():
		t.Fatalf("job 1's keep-alive context was cancelled before the kill: %v", context.Cause(kctx))
	case <-time.After(hangGuard):
		t.Fatalf("no refresh confirmed within %v before the kill", hangGuard)
	}
	beforeKill := refreshes.Load()
	h.Event("test", "kill9", l.ID)
	l.Kill9()
	killed := h.Event("test", "killed", l.ID)
	killedAt := time.Now()
	holdUntil(killedAt.Add(restartAfter*lease), "by the failover")
	l.Restart(t)
	restarted := h.Event("test", "restarted", l.ID)
	holdUntil(holdStart.Add(time.Duration(leases)*lease), "after the restart")
	afterKill := refreshes.Load() - beforeKill
	endJob2()

	// Job 1's fenced write, under its keep-alive context, with its one
	// token; sqlfence.Run releases the ticket.
	if err := kctx.Err(); err != nil {
		t.Fatalf("job 1's keep-alive context was cancelled at the end of the hold: %v", context.Cause(kctx))
	}
	op, err := fencedWrite(kctx, h, db, "job1", tk)
	if op.Outcome != harness.OutcomeOK {
		t.Errorf("job 1's fenced write (token %d) after the hold: %v, want committed", token, err)
	}
	if op.Release != harness.OutcomeOK {
		t.Errorf("job 1's release after its fenced write: %s (%v), want confirmed (R)", op.Release, err)
	}
	if cause := context.Cause(kctx); !errors.Is(cause, broker.ErrNotHeld) {
		t.Errorf("job 1's keep-alive context after the release: cause %v, want ErrNotHeld (Release ran)", cause)
	}
	endTrack()
	endJob2()
	bg.Wait()
	// The last confirmed deadline: a refresh confirmed after the
	// tracker's last look moved it; the release does not (a broker may
	// put the deadline back once a RELEASE is sent: the holding ended
	// then, which CheckLeaseExclusion takes from the fenced op's start).
	if dl := tk.Deadline(); dl.After(last) {
		last = dl
		h.SetDeadline(gi, dl)
	}
	var wrote int64
	if err := db.QueryRowContext(ctx, "SELECT token FROM kept_write WHERE key = ?", key).Scan(&wrote); err != nil || uint64(wrote) != token {
		t.Errorf("the fenced write's row: token %d, %v; want %d", wrote, err, token)
	}

	// Job 2 now gets K, with a higher token.
	tk2 := job2TakesOver(ctx, t, h, b2, key, token, acquireLease)

	// What the hold showed.
	ops := h.Ops()
	var heldAfterKill, tries int
	for _, o := range ops {
		if o.Process == "job2" && o.Kind == harness.KindAcquire && o.Token != tk2.Token() {
			tries++
			if o.Invoke > killed && o.Outcome == harness.OutcomeTimedOut {
				heldAfterKill++
			}
		}
	}
	var granted2 time.Duration
	for _, o := range ops {
		if o.Kind == harness.KindAcquire && o.Outcome == harness.OutcomeOK && o.Token == tk2.Token() {
			granted2 = o.Complete
		}
	}
	hold0 := h.At(holdStart)
	t.Logf("job 1 held %s (token %d) for %v with %d confirmed refreshes (%d before the kill, %d after it); %s killed %v into the hold, restarted %v into it; job 2 tried it %d times (%d answered held after the kill); deadline at acquire %v, the last confirmed one %v after it",
		key, token, time.Since(holdStart).Round(time.Millisecond), refreshes.Load(), beforeKill, afterKill, l.ID,
		(killed - hold0).Round(time.Millisecond), (restarted - hold0).Round(time.Millisecond), tries, heldAfterKill,
		dl0.Sub(holdStart).Round(time.Millisecond), last.Sub(dl0).Round(time.Millisecond))
	t.Logf("job 1's fenced write (token %d) committed %v into the hold, its release confirmed; job 2 then granted token %d, %v after the release began",
		token, (op.Complete - hold0).Round(time.Millisecond), tk2.Token(), (granted2 - op.Invoke).Round(time.Millisecond))
	if want := int64(leases - killAt - 1); afterKill < want {
		t.Errorf("%d refreshes confirmed after the leader's kill, want at least %d (one per lease held after it)", afterKill, want)
	}
	if heldAfterKill == 0 {
		t.Error("job 2 was never answered 'timed out' (held) after the kill: the new leader's view of K is untested")
	}
	if job2Granted.Load() != 0 {
		t.Errorf("job 2 was granted %s %d times during job 1's hold", key, job2Granted.Load())
	}
	t.Logf("outcomes: %v", h.Counts())

	checkRefreshHistory(t, h, false, gi, tk2.Token(), killed, dl0)
}

// checkRefreshHistory runs the history checkers on a refresh scenario's
// History (with fenced, the fenced writes' order too) and, if they pass,
// shows that the lease-exclusion checker would catch the second job's
// grant (token late) moved to at, inside the first job's lease (its
// acquire gi, deadline dl0).
func checkRefreshHistory(t *testing.T, h *harness.History, fenced bool, gi int, late uint64, at time.Duration, dl0 time.Time) {
	t.Helper()
	errs := []error{
		harness.CheckTokensUnique(h),
		harness.CheckNoTicketAfterIndeterminate(h),
		harness.CheckTokensFollowRealTime(h),
		harness.CheckLeaseExclusion(h),
		harness.CheckReleasedIntervals(h),
		harness.CheckOutcomes(h, harness.OfKind(harness.KindAcquire),
			harness.OutcomeOK, harness.OutcomeTimedOut, harness.OutcomeIndeterminate,
			harness.OutcomeUnsent, harness.OutcomeNotActive, harness.OutcomeBusy),
	}
	if fenced {
		errs = append(errs, harness.CheckFencedIncreasing(h))
	}
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if !t.Failed() {
		refreshedExclusionCatches(t, h, gi, late, at, dl0)
	}
}

// refreshedExclusionCatches shows that CheckLeaseExclusion judged the
// history with job 1's refreshed deadline: with the grant of token late
// moved to at (the kill, inside job 1's refreshed holding, after its
// unrefreshed deadline dl0) it must fail, and with job 1's deadline put
// back to dl0 the same moved grant would pass.
func refreshedExclusionCatches(t *testing.T, h *harness.History, gi int, late uint64, at time.Duration, dl0 time.Time) {
	t.Helper()
	rebuild := func(mut func(ops []harness.Op)) *harness.History {
		ops := slices.Clone(h.Ops())
		mut(ops)
		out := harness.NewHistory()
		for _, op := range ops {
			out.Record(op)
		}
		return out
	}
	moveLate := func(ops []harness.Op) {
		for i := range ops {
			if ops[i].Kind == harness.KindAcquire && ops[i].Outcome == harness.OutcomeOK && ops[i].Token == late {
				ops[i].Invoke, ops[i].Complete = at, at
			}
		}
	}
	if h.At(dl0) >= at {
		t.Fatalf("refreshedExclusionCatches: the kill (%v) is not after job 1's unrefreshed deadline (%v)", at, h.At(dl0))
	}
	if err := harness.CheckLeaseExclusion(rebuild(moveLate)); err == nil {
		t.Error("CheckLeaseExclusion passed the run's history with job 2 granted at the kill, inside job 1's refreshed holding")
	}
	unrefreshed := rebuild(func(ops []harness.Op) {
		moveLate(ops)
		ops[gi].Deadline = h.At(dl0)
	})
	if err := harness.CheckLeaseExclusion(unrefreshed); err != nil {
		t.Errorf("CheckLeaseExclusion with job 1's unrefreshed deadline should not see the moved grant: %v", err)
	}
}

// openKeepAliveDB is a migrated SQLite database (the fence's high-water
// table) with a table for the fenced write of
// TestClusterKeepAliveAcrossFailover.
func openKeepAliveDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", testdb.SQLite(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := migrations.Up(t.Context(), db, fence.SQLite); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), "CREATE TABLE kept_write (key TEXT PRIMARY KEY, token INTEGER NOT NULL)"); err != nil {
		t.Fatal(fmt.Errorf("create kept_write: %w", err))
	}
	return db
}
