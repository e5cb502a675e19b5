package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/harness"
)

// TestServerKill9UnderLoad kills a real ticketingd with SIGKILL while
// goroutines acquire and release through one broker, restarts it on the
// same port and data directory, three times.
//
// Pass:
//   - the broker reconnects by itself: after each restart WaitReady
//     succeeds and acquires are granted again, with no new Broker;
//   - every token granted by an acquire invoked after a restart is above
//     every token granted before the kill (the durable ceiling,
//     --token-block 64 so that kills land around reservations);
//   - no token is granted twice, a failed acquire never carries a ticket,
//     and no release uses a token its goroutine was not granted;
//   - operations invoked after the kill and finished before the new
//     server was started are only unsent, indeterminate, release unconfirmed
//     or not held; releases invoked after a kill for tickets granted before
//     it are never confirmed (not held or unconfirmed).
//
// The history is written as an artifact if the test fails.
func TestServerKill9UnderLoad(t *testing.T) {
	const (
		workers = 16
		keys    = 8
		rounds  = 3
		perLoad = 150 // grants in each round before the kill
	)
	srv := harness.StartServer(t, harness.Ticketingd(t), harness.ServerOptions{Args: []string{"--token-block", "64"}})
	b, err := broker.New(broker.Config{
		Addrs:       []string{srv.Addr()},
		Name:        "kill9-load",
		BackoffMin:  10 * time.Millisecond,
		BackoffMax:  200 * time.Millisecond,
		DialTimeout: time.Second,
		ReplyGrace:  2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := harness.NewHistory()
	h.WriteArtifactOnFailure(t, "history")
	ctx := t.Context()
	waitReady := func() {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := b.WaitReady(wctx); err != nil {
			t.Fatalf("WaitReady: %v", err)
		}
	}
	waitReady()

	var (
		grants  atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		stopped bool
	)
	stopLoad := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer func() {
		stopLoad()
		b.Close()
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			proc := fmt.Sprintf("w%d", w)
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("k%d", rand.IntN(keys))
				actx, cancel := context.WithTimeout(ctx, 10*time.Second) // hang guard
				tk, err := harness.Acquire(actx, h, proc, b, key, broker.AcquireOptions{Lease: 2 * time.Second, Wait: 500 * time.Millisecond})
				cancel()
				if err != nil {
					if errors.Is(err, broker.ErrUnsent) {
						time.Sleep(5 * time.Millisecond) // no session: do not spin
					}
					continue
				}
				grants.Add(1)
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				_ = harness.Release(context.WithoutCancel(ctx), h, proc, tk)
			}
		}()
	}

	waitGrants := func(after time.Duration, n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second) // hang guard
		for {
			got := len(h.Filter(func(op harness.Op) bool {
				return op.Kind == harness.KindAcquire && op.Outcome == harness.OutcomeOK && op.Invoke >= after
			}))
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d grants invoked after %v; want %d; counts %v", got, after, n, h.Counts())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// killed: the old server has exited; restarting: the new one is about
	// to start (it may accept connections before its "listening" line is
	// read); up: that line was read.
	type outage struct{ killed, restarting, up time.Duration }
	var outages []outage
	roundStart := h.Now()
	for r := range rounds {
		waitGrants(roundStart, perLoad)
		h.Event("test", "kill9", fmt.Sprintf("round %d", r))
		srv.Kill9()
		killed := h.Event("test", "killed", fmt.Sprintf("round %d", r))
		time.Sleep(300 * time.Millisecond) // an outage the broker must notice
		restarting := h.Event("test", "restarting", fmt.Sprintf("round %d", r))
		srv.Restart(t)
		up := h.Event("test", "listening", fmt.Sprintf("round %d, generation %d", r, srv.Generation()))
		outages = append(outages, outage{killed, restarting, up})
		waitReady() // the same broker reconnects on its own
		// Acquires succeed again: the load itself must get grants.
		waitGrants(up, 20)
		roundStart = up
	}
	waitGrants(roundStart, perLoad)
	stopLoad()
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	t.Logf("outcomes: %v", h.Counts())
	checks := []error{
		harness.CheckTokensUnique(h),
		harness.CheckNoTicketAfterIndeterminate(h),
	}
	for _, o := range outages {
		checks = append(checks,
			harness.CheckTokensIncreaseAcross(h, o.killed, o.up),
			harness.CheckOutcomes(h, harness.Within(o.killed, o.restarting),
				harness.OutcomeUnsent, harness.OutcomeIndeterminate,
				harness.OutcomeReleaseUnconfirmed, harness.OutcomeNotHeld),
			checkStaleReleases(h, o.killed),
		)
	}
	for _, err := range checks {
		if err != nil {
			t.Error(err)
		}
	}
}

// checkStaleReleases: a release invoked after the kill for a ticket
// granted (completed) before it can only be not held or unconfirmed: the
// lock died with the server.
func checkStaleReleases(h *harness.History, killed time.Duration) error {
	old := map[uint64]bool{}
	for _, op := range h.Ops() {
		if op.Kind == harness.KindAcquire && op.Outcome == harness.OutcomeOK && !op.Pending() && op.Complete <= killed {
			old[op.Token] = true
		}
	}
	return harness.CheckOutcomes(h, func(op harness.Op) bool {
		return op.Kind == harness.KindRelease && op.Invoke >= killed && old[op.Token]
	}, harness.OutcomeNotHeld, harness.OutcomeReleaseUnconfirmed)
}
