package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Real-process cluster tests: three ticketingd --cluster nodes on
// 127.0.0.1 (harness.StartCluster), every Raft link through a fault proxy,
// one broker given the three client addresses, and a load of goroutines
// that acquire and release a few keys while a fault is injected. Every
// call is recorded in a harness.History, and after each test the history
// must pass the checkers (their ability to fail is shown by
// harness.TestCheckersFail and harness.TestRealTimeCheckersFail, and on a
// real cluster history by checkersCatch, load_test.go):
//
//   - CheckTokensUnique: no token granted twice;
//   - CheckNoTicketAfterIndeterminate: no ticket beside an error, no
//     release of a token not granted;
//   - CheckTokensFollowRealTime: a grant that completed before another was
//     invoked has the smaller token, across failovers;
//   - CheckLeaseExclusion: per key, no grant completed before the previous
//     holder's conservative deadline (t0 + lease*0.99) or the start of its
//     release: no lease ended before lease_s after its grant, no two
//     holders;
//   - CheckReleasedIntervals: per key, confirmed-released holdings are
//     disjoint and in token order;
//
// and every key used must be acquirable again once the faults healed.
// Besides the load, "pinned" keys are acquired on the leader right before
// the fault and not released: re-acquiring them after the failover shows
// the new leader kept the lock until its (restarted) lease ended, which
// CheckLeaseExclusion judges.
//
// No assertion is timed; the waits are hang guards. The failover figures of
// TestClusterKill9Leader are logged and written to its artifact directory
// (harness.ArtifactDir) as failover.json.
//
// The load, the broker and the checks are the load run's (load_test.go),
// shared with the pair tests.

// clusterRun is a load run on a cluster.
type clusterRun struct {
	*loadRun
	c *harness.Cluster
}

func startClusterRun(t *testing.T, opts harness.ClusterOptions) *clusterRun {
	t.Helper()
	c := harness.StartCluster(t, harness.Ticketingd(t), opts)
	c.WaitLeader(t, hangGuard)
	return &clusterRun{loadRun: startLoadRun(t, clusterNodes{c}, "cluster-test"), c: c}
}

// checkFollowersHint: a HELLO to every node but the leader is answered M
// with the leader's client address (waiting, at most 10 s, for a node that
// has not learnt it yet).
func checkFollowersHint(t *testing.T, c *harness.Cluster, leader *harness.ClusterNode) {
	t.Helper()
	for _, n := range c.Nodes {
		if n == leader {
			continue
		}
		if err := harness.WaitHint(n.Addr(), leader.Addr(), 10*time.Second); err != nil {
			t.Errorf("follower %s: %v", n.ID, err)
		}
	}
	if r, err := harness.Hello(leader.Addr(), 5*time.Second); err != nil || r.Type != wire.TypeHelloOK {
		t.Errorf("leader %s: HELLO answered %+v, %v; want HELLO_OK", leader.ID, r, err)
	}
}

// TestClusterKill9Leader kills the leader with SIGKILL under load ten
// times in a row, restarting the killed node each time (it rejoins from its
// data directory), with mutual TLS between the nodes. Failover time is
// SIGKILL sent -> first grant (to an ACQUIRE invoked after the kill, so on
// the new leader) completed; its p50 and max are logged and written to
// failover.json in the test's artifact directory, not asserted. Each round
// pins two keys on the leader before the kill: one (lease 2 s) is
// re-acquired after it, which CheckLeaseExclusion judges; the other (lease
// 30 s) must still be held (an immediate acquire times out, its Release
// is confirmed). Pass: the checkers, every key acquirable, and the
// followers' HELLO answered M with the leader's address in every round.
func TestClusterKill9Leader(t *testing.T) {
	const rounds = 10
	r := startClusterRun(t, harness.ClusterOptions{PeerTLS: true})
	checkPeerTLS(t, r.c.Servers())
	r.startLoad(8, 6)
	var failovers, elections, leading []time.Duration
	for round := range rounds {
		l := r.c.WaitConverged(t, hangGuard)
		checkFollowersHint(t, r.c, l)
		r.waitGrants(r.h.Now(), 20, fmt.Sprintf("round %d before the kill", round))
		pins := r.pin(fmt.Sprintf("kill-pin-%d", round), 1, loadLease)
		kept := r.pin(fmt.Sprintf("kill-keep-%d", round), 1, 30*time.Second)
		sent := r.h.Event("test", "kill9", fmt.Sprintf("round %d: %s", round, l.ID))
		l.Kill9()
		killed := r.h.Event("test", "killed", l.ID)
		first := r.waitGrants(killed, 1, fmt.Sprintf("round %d after killing %s", round, l.ID))
		failovers = append(failovers, first-sent)
		if at, ok := logLineAfter(r.c.Servers(), "election won", r.h.Start().Add(sent)); ok {
			elections = append(elections, r.h.At(at)-sent)
		}
		if at, ok := logLineAfter(r.c.Servers(), "cluster: leading", r.h.Start().Add(sent)); ok {
			leading = append(leading, r.h.At(at)-sent)
		}
		repinned := r.reacquireAsync(pins, fmt.Sprintf("repin-%d", round))
		r.checkKept(kept, "the kill")
		l.Restart(t)
		r.h.Event("test", "restarted", l.ID)
		repinned()
	}
	r.finish()
	reportFailover(t, "SIGKILL of the leader -> first grant on the new leader",
		"SIGKILL of the leader to the first grant on the new leader (3 nodes, peer TLS, --raft-heartbeat/--raft-election 500ms defaults, broker backoff 10-200 ms, 8 load goroutines)",
		failovers,
		failoverMark{key: "election_won", label: `SIGKILL -> raft's "election won" on the new leader`,
			what: "SIGKILL to raft's 'election won' log line on the new leader", d: elections},
		failoverMark{key: "leading", label: `SIGKILL -> its "cluster: leading" line (after Barrier and takeover entry)`,
			what: "SIGKILL to the new leader's 'cluster: leading' log line (written just after it serves)", d: leading})
	if !t.Failed() {
		checkersCatch(t, r.h)
	}
}

// TestClusterSIGSTOPLeader freezes the leader with SIGSTOP for longer
// than two leases (lease_s 2 s), with three pinned keys held through it.
// The others elect a new leader, which serves the load and grants the
// pinned keys only once their restarted leases ended; after SIGCONT the
// old leader steps down (its /status no longer serving, HELLO answered M
// with the new leader's address) and catches up. Pass: the checkers (no
// lease ended early, no two holders) and every key acquirable.
func TestClusterSIGSTOPLeader(t *testing.T) {
	r := startClusterRun(t, harness.ClusterOptions{})
	r.startLoad(8, 6)
	l := r.c.WaitConverged(t, hangGuard)
	r.waitGrants(r.h.Now(), 30, "before SIGSTOP")
	pins := r.pin("stop-pin", 3, loadLease)
	stopAt := r.h.Event("test", "sigstop", l.ID)
	if err := l.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = l.Resume() // let the cleanup's SIGKILL end it normally
		}
	}()
	nl := r.c.WaitLeader(t, hangGuard)
	if nl == l {
		t.Fatalf("the stopped node %s is still the leader a majority knows", l.ID)
	}
	r.waitGrants(stopAt, 20, "on the new leader while the old one is stopped")
	r.reacquire(pins, "repin")
	if d := stopAt + 2*loadLease + time.Second - r.h.Now(); d > 0 {
		time.Sleep(d) // past two leases
	}
	r.h.Event("test", "sigcont", l.ID)
	if err := l.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	waitNotServing(t, l)
	if nl = r.c.WaitLeader(t, hangGuard); nl != l {
		if err := harness.WaitHint(l.Addr(), nl.Addr(), 10*time.Second); err != nil {
			t.Errorf("resumed old leader: %v", err)
		}
	} else {
		// It stepped down (above), then won a later election: Raft allows
		// that; the hint check does not apply.
		t.Logf("the resumed node %s stepped down and was elected again later", l.ID)
	}
	r.waitGrants(r.h.Now(), 20, "after SIGCONT")
	r.finish()
}

// waitNotServing waits (hang guard) until node n reports it does not
// serve and is not the Raft leader.
func waitNotServing(t *testing.T, n *harness.ClusterNode) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		st, err := n.Status()
		if err == nil && !st.Serving && st.State != "Leader" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still serving or leading after %v: %+v, %v", n.ID, hangGuard, st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestClusterPartitions cuts Raft links with the fault proxies (blackholes:
// the sockets stay open, nothing gets through). First the leader is
// isolated: it must step down (no quorum), the other two elect a leader
// that serves the load and grants the keys pinned on the old leader once
// their restarted leases ended. Healed, the cluster converges. Then a
// follower is isolated: the majority keeps serving the load; healed, the
// follower catches up. Pass: the checkers and every key acquirable.
func TestClusterPartitions(t *testing.T) {
	r := startClusterRun(t, harness.ClusterOptions{})
	r.startLoad(8, 6)

	// The leader, isolated.
	l := r.c.WaitConverged(t, hangGuard)
	r.waitGrants(r.h.Now(), 30, "before isolating the leader")
	pins := r.pin("cut-pin", 3, loadLease)
	cutAt := r.h.Event("test", "isolate leader", l.ID)
	r.c.Isolate(l.Index)
	waitNotServing(t, l)
	nl := r.c.WaitLeader(t, hangGuard)
	if nl == l {
		t.Fatalf("the isolated node %s is the leader a majority knows", l.ID)
	}
	r.waitGrants(cutAt, 20, "on the majority side with the leader isolated")
	r.reacquire(pins, "repin")
	r.h.Event("test", "heal", "")
	r.c.Heal(t)
	nl = r.c.WaitConverged(t, hangGuard)
	checkFollowersHint(t, r.c, nl)
	r.waitGrants(r.h.Now(), 20, "after healing the leader's links")

	// A follower, isolated.
	f := r.c.Nodes[(nl.Index+1)%len(r.c.Nodes)]
	cutAt = r.h.Event("test", "isolate follower", f.ID)
	r.c.Isolate(f.Index)
	r.waitGrants(cutAt, 50, "with a follower isolated")
	time.Sleep(2 * time.Second) // several election timeouts of the isolated follower
	r.waitGrants(r.h.Now(), 20, "with a follower isolated, later")
	// The cut holds: the follower serves nothing and has applied none of
	// the entries the leader committed since.
	lst, lerr := nl.Status()
	fst, ferr := f.Status()
	if lerr != nil || ferr != nil {
		t.Fatalf("status with a follower isolated: leader %v, follower %v", lerr, ferr)
	}
	if fst.Serving || fst.AppliedIndex >= lst.CommitIndex {
		t.Errorf("isolated follower %s: serving %v, applied %d, the leader's commit index %d: not cut off", f.ID, fst.Serving, fst.AppliedIndex, lst.CommitIndex)
	}
	r.h.Event("test", "heal", "")
	r.c.Heal(t)
	after := r.c.WaitConverged(t, hangGuard)
	if after != nl {
		t.Logf("the leader changed from %s to %s when the isolated follower %s came back", nl.ID, after.ID, f.ID)
	}
	r.finish()
}

// TestClusterFullRestart stops all three nodes at once (under load, with
// mutual TLS) and starts them again on their data directories: with
// SIGTERM (each must exit 0), and with SIGKILL (a committed grant survives
// kill -9 of every node). Keys pinned before (lease 30 s) are still held
// afterwards: an immediate acquire of one times out, and its holder's
// Release, by token and owner, is confirmed (R). Every grant after the
// restart has a token above every grant before the stop. Pass: the
// checkers, and every key acquirable.
func TestClusterFullRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(n *harness.ClusterNode) error
	}{
		{"SIGTERM", func(n *harness.ClusterNode) error {
			code, err := n.Stop(hangGuard)
			if err == nil && code != 0 {
				err = fmt.Errorf("exit code %d", code)
			}
			return err
		}},
		{"SIGKILL", func(n *harness.ClusterNode) error { n.Kill9(); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startClusterRun(t, harness.ClusterOptions{PeerTLS: true})
			checkPeerTLS(t, r.c.Servers())
			r.startLoad(8, 6)
			r.c.WaitConverged(t, hangGuard)
			r.waitGrants(r.h.Now(), 50, "before the stop")
			pins := r.pin("restart-pin", 3, 30*time.Second)

			sig := r.h.Event("test", tc.name+" all", "")
			var wg sync.WaitGroup
			errs := make([]error, len(r.c.Nodes))
			for i, n := range r.c.Nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = tc.stop(n)
				}()
			}
			wg.Wait()
			for i, n := range r.c.Nodes {
				if errs[i] != nil {
					t.Errorf("%s on %s: %v", n.ID, tc.name, errs[i])
				}
			}
			stopped := r.h.Event("test", "all stopped", "")
			for _, n := range r.c.Nodes {
				n.Restart(t)
			}
			up := r.h.Event("test", "all listening", "")
			r.c.WaitConverged(t, hangGuard)
			ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
			defer cancel()
			if err := r.b.WaitReady(ctx); err != nil {
				t.Fatalf("WaitReady after the restart: %v", err)
			}
			first := r.waitGrants(up, 20, "after the restart")
			t.Logf("full restart: %s -> all exited %v, -> all listening %v, -> first grant %v",
				tc.name, stopped-sig, up-sig, first-sig)

			r.checkKept(pins, "the full restart")
			if err := harness.CheckTokensIncreaseAcross(r.h, stopped, up); err != nil {
				t.Error(err)
			}
			r.finish()
		})
	}
}

// TestClusterCancelUnderContention: goroutines queue on a few contended
// keys and cancel their waits (the broker sends CANCEL on a version-2
// session) after a random few milliseconds, while the holders release and
// the leader hands each key to its next waiter; some cancels therefore
// arrive while that hand-off is being committed. Every node must stay up
// (none exits), and the history must pass the checkers: a cancelled wait
// is Indeterminate or timed out, never a ticket, and every key is
// acquirable afterwards.
func TestClusterCancelUnderContention(t *testing.T) {
	r := startClusterRun(t, harness.ClusterOptions{})
	keys := []string{"cancel-0", "cancel-1"}
	r.keys = append(r.keys, keys...)
	for w := range 8 {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			proc := fmt.Sprintf("c%d", w)
			for {
				select {
				case <-r.stop:
					return
				default:
				}
				// Half the goroutines hold and release, half wait and
				// give up early.
				key := keys[rand.IntN(len(keys))]
				if w%2 == 0 {
					ctx, cancel := context.WithTimeout(r.t.Context(), hangGuard)
					tk, err := r.acquire(ctx, proc, key, 2*time.Second, loadLease)
					cancel()
					if err == nil {
						time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
						_ = harness.Release(context.WithoutCancel(r.t.Context()), r.h, proc, tk)
					} else {
						time.Sleep(5 * time.Millisecond)
					}
					continue
				}
				ctx, cancel := context.WithTimeout(r.t.Context(), time.Duration(1+rand.IntN(20))*time.Millisecond)
				tk, err := r.acquire(ctx, proc, key, 2*time.Second, loadLease)
				cancel()
				switch {
				case err == nil:
					_ = harness.Release(context.WithoutCancel(r.t.Context()), r.h, proc, tk)
				case errors.Is(err, broker.ErrUnsent):
					time.Sleep(5 * time.Millisecond) // no ready session: do not spin
				}
			}
		}()
	}
	w := r.watch(r.h.Now(), 300)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	guard := time.After(hangGuard)
	for done := false; !done; {
		select {
		case <-w.done:
			done = true
		case <-guard:
			t.Fatalf("fewer than 300 grants within %v; outcomes %v", hangGuard, r.h.Counts())
		case <-tick.C:
			for _, n := range r.c.Nodes {
				select {
				case <-n.Process().Done():
					r.stopLoad()
					t.Fatalf("node %s exited under cancellations (its stderr is logged below); outcomes %v", n.ID, r.h.Counts())
				default:
				}
			}
		}
	}
	r.finish()
}
