package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/harness"
)

// The load run shared by the cluster tests (cluster_test.go) and the
// hot-standby pair tests (pair_test.go): a service of real ticketingd
// processes (serviceNodes), one broker given all its client addresses, a
// load of goroutines that acquire and release a few keys while a fault is
// injected, every call recorded in a harness.History, and the checks run
// after the faults (finish): every key used acquirable again, and the
// history through the checkers listed in cluster_test.go.

const (
	loadLease = 2 * time.Second // lease_s of the load and of most pins
	loadWait  = time.Second     // wait of the load's ACQUIREs
	hangGuard = 30 * time.Second
)

// serviceNodes is what a load run needs of the servers under test, a
// harness.Cluster (clusterNodes) or a harness.Pair (pairNodes): the client
// addresses a broker is given, the server processes (for their log
// lines), and a wait, at most hangGuard, until the service is steady after
// the faults: a cluster converged, a pair settled (an active replicating
// to a passive in sync).
type serviceNodes interface {
	Addrs() []string
	Servers() []*harness.Server
	waitSteady(t *testing.T)
}

// clusterNodes is a Raft cluster as serviceNodes.
type clusterNodes struct{ *harness.Cluster }

func (c clusterNodes) waitSteady(t *testing.T) { c.WaitConverged(t, hangGuard) }

// pairNodes is a hot-standby pair as serviceNodes. Its wait sends no
// HELLO (harness.Pair.WaitSettled reads /status only).
type pairNodes struct{ *harness.Pair }

func (p pairNodes) waitSteady(t *testing.T) { p.WaitSettled(t, hangGuard) }

// loadRun is a service (a cluster or a pair), one broker given all its
// client addresses, a history and a load of goroutines acquiring and
// releasing through the broker.
type loadRun struct {
	t     *testing.T
	nodes serviceNodes
	b     *broker.Broker
	h     *harness.History
	keys  []string // every key used, for the final acquirability check

	mu      sync.Mutex
	watches []*grantWatch

	stop    chan struct{}
	wg      sync.WaitGroup
	stopped bool
}

// grantWatch waits for n grants invoked at or after after.
type grantWatch struct {
	after time.Duration
	n     int
	got   int
	first time.Duration // completion of the first
	done  chan struct{}
}

// loadBroker is the broker configuration of a load run on addrs: short
// backoffs and keepalives, so that a fault is seen and left quickly. A
// pair's settle delay is the default (broker.DefaultPairSettle).
func loadBroker(addrs []string, name string) broker.Config {
	return broker.Config{
		Addrs:            addrs,
		Name:             name,
		DialTimeout:      time.Second,
		BackoffMin:       10 * time.Millisecond,
		BackoffMax:       200 * time.Millisecond,
		KeepAlive:        500 * time.Millisecond,
		KeepAliveTimeout: time.Second,
		ReplyGrace:       2 * time.Second,
	}
}

// startLoadRun makes the broker (loadBroker on nodes.Addrs()) and waits
// until it is ready; the load starts with startLoad. The caller has waited
// for the service to serve (a leader, a settled pair).
func startLoadRun(t *testing.T, nodes serviceNodes, name string) *loadRun {
	t.Helper()
	return startLoadRunWith(t, nodes, loadBroker(nodes.Addrs(), name))
}

// startLoadRunWith is startLoadRun with the broker's configuration cfg.
func startLoadRunWith(t *testing.T, nodes serviceNodes, cfg broker.Config) *loadRun {
	t.Helper()
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &loadRun{t: t, nodes: nodes, b: b, h: harness.NewHistory(), stop: make(chan struct{})}
	t.Cleanup(func() {
		r.stopLoad()
		b.Close()
	})
	r.h.WriteArtifactOnFailure(t, "history")
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	return r
}

// acquire is harness.Acquire that also feeds the grant watches.
func (r *loadRun) acquire(ctx context.Context, proc, key string, wait, lease time.Duration) (*broker.Ticket, error) {
	inv := r.h.Now()
	tk, err := harness.Acquire(ctx, r.h, proc, r.b, key, broker.AcquireOptions{Lease: lease, Wait: wait})
	if err == nil {
		done := r.h.Now()
		r.mu.Lock()
		kept := r.watches[:0]
		for _, w := range r.watches {
			if inv >= w.after {
				w.got++
				if w.got == 1 {
					w.first = done
				}
				if w.got >= w.n {
					close(w.done)
					continue
				}
			}
			kept = append(kept, w)
		}
		r.watches = kept
		r.mu.Unlock()
	}
	return tk, err
}

// acquireRetry is acquire, repeated (after 20 ms) while the outcome says
// nothing about the lock: no ready session (ErrUnsent), the node stopped
// serving (ErrNotActive), or the reply was lost (ErrIndeterminate, also
// when a leader change interrupts it) and indeterminate is in retry. It
// returns the last outcome, or the first that is none of those.
func (r *loadRun) acquireRetry(ctx context.Context, proc, key string, wait, lease time.Duration, indeterminate bool) (*broker.Ticket, error) {
	for {
		tk, err := r.acquire(ctx, proc, key, wait, lease)
		again := errors.Is(err, broker.ErrUnsent) || errors.Is(err, broker.ErrNotActive) ||
			indeterminate && errors.Is(err, broker.ErrIndeterminate)
		if !again || ctx.Err() != nil {
			return tk, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// watch returns a watch of the next n grants invoked at or after after.
func (r *loadRun) watch(after time.Duration, n int) *grantWatch {
	w := &grantWatch{after: after, n: n, done: make(chan struct{})}
	r.mu.Lock()
	r.watches = append(r.watches, w)
	r.mu.Unlock()
	return w
}

// waitGrants waits (hang guard) for n grants invoked at or after after.
func (r *loadRun) waitGrants(after time.Duration, n int, what string) time.Duration {
	r.t.Helper()
	w := r.watch(after, n)
	select {
	case <-w.done:
		return w.first
	case <-time.After(hangGuard):
		r.t.Fatalf("%s: fewer than %d grants invoked after %v within %v; outcomes %v", what, n, after, hangGuard, r.h.Counts())
		return 0
	}
}

// startLoad starts workers that acquire one of nkeys keys (wait 1 s,
// lease 2 s), hold it a few milliseconds and release it, until stopLoad.
func (r *loadRun) startLoad(workers, nkeys int) {
	var keys []string
	for k := range nkeys {
		keys = append(keys, fmt.Sprintf("load-%d", k))
	}
	r.keys = append(r.keys, keys...)
	for w := range workers {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			proc := fmt.Sprintf("w%d", w)
			for {
				select {
				case <-r.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(r.t.Context(), hangGuard)
				tk, err := r.acquire(ctx, proc, keys[rand.IntN(len(keys))], loadWait, loadLease)
				cancel()
				if err != nil {
					// No ready session (failover in progress): do not spin.
					time.Sleep(5 * time.Millisecond)
					continue
				}
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				_ = harness.Release(context.WithoutCancel(r.t.Context()), r.h, proc, tk)
				time.Sleep(time.Millisecond)
			}
		}()
	}
}

func (r *loadRun) stopLoad() {
	if !r.stopped {
		r.stopped = true
		close(r.stop)
		r.wg.Wait()
	}
}

// pin acquires n keys named prefix-i at once (wait 0) with lease and keeps
// them: the tickets are returned, never released by the load.
func (r *loadRun) pin(prefix string, n int, lease time.Duration) []*broker.Ticket {
	r.t.Helper()
	var out []*broker.Ticket
	for i := range n {
		key := fmt.Sprintf("%s-%d", prefix, i)
		r.keys = append(r.keys, key)
		ctx, cancel := context.WithTimeout(r.t.Context(), hangGuard)
		tk, err := r.acquireRetry(ctx, "pin", key, 0, lease, false)
		cancel()
		if err != nil {
			r.t.Fatalf("pin %s: %v", key, err)
		}
		out = append(out, tk)
	}
	return out
}

// reacquire takes every pinned key again (wait up to 10 s, which covers
// a restarted lease of lease_s plus an election timeout) and releases it;
// each must be granted. When it is, CheckLeaseExclusion judges whether it
// came too early.
func (r *loadRun) reacquire(pins []*broker.Ticket, proc string) {
	r.t.Helper()
	r.reacquireAsync(pins, proc)()
}

// reacquireAsync is reacquire in the background: the returned func waits
// for it and reports.
func (r *loadRun) reacquireAsync(pins []*broker.Ticket, proc string) (wait func()) {
	var wg sync.WaitGroup
	errs := make([]error, len(pins))
	for i, p := range pins {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(r.t.Context(), hangGuard)
			defer cancel()
			tk, err := r.acquireRetry(ctx, proc, p.Key(), 10*time.Second, loadLease, true)
			if err != nil {
				errs[i] = fmt.Errorf("re-acquire pinned %s: %w", p.Key(), err)
				return
			}
			if err := harness.Release(ctx, r.h, proc, tk); err != nil {
				errs[i] = fmt.Errorf("release re-acquired %s: %w", p.Key(), err)
			}
		}()
	}
	return func() {
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				r.t.Error(err)
			}
		}
	}
}

// checkKept: the pinned locks, held through a fault, are still held: an
// immediate acquire of each times out, and its holder's Release (by token
// and owner) is confirmed (R).
func (r *loadRun) checkKept(pins []*broker.Ticket, fault string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), hangGuard)
	defer cancel()
	for _, p := range pins {
		_, err := r.acquireRetry(ctx, "probe", p.Key(), 0, loadLease, true)
		if !errors.Is(err, broker.ErrTimedOut) {
			r.t.Errorf("acquire of pinned %s (held through %s) at once: %v, want timed out", p.Key(), fault, err)
		}
		err = harness.Release(ctx, r.h, "pin", p)
		for errors.Is(err, broker.ErrUnsent) && ctx.Err() == nil {
			err = harness.Release(ctx, r.h, "pin", p) // nothing was sent: still held, may be released again
		}
		switch {
		case errors.Is(err, broker.ErrReleaseUnconfirmed):
			// A leader change during the release: no evidence either way.
			r.t.Logf("release of pinned %s after %s unconfirmed: %v", p.Key(), fault, err)
		case err != nil:
			r.t.Errorf("release of pinned %s (token %d) after %s: %v, want R (the lock was kept)", p.Key(), p.Token(), fault, err)
		}
	}
}

// finish stops the load, waits for the service to be steady (a cluster
// converged, a pair settled), checks that every key used is acquirable,
// and runs the checkers.
func (r *loadRun) finish() {
	r.t.Helper()
	r.stopLoad()
	r.nodes.waitSteady(r.t)
	var wg sync.WaitGroup
	errs := make([]error, len(r.keys))
	for i, key := range r.keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			proc := "final-" + key
			ctx, cancel := context.WithTimeout(r.t.Context(), hangGuard)
			defer cancel()
			// Up to 10 s: an indeterminate acquire's lock lives until its
			// lease (restarted on a failover) ends.
			tk, err := r.acquireRetry(ctx, proc, key, 10*time.Second, loadLease, true)
			if err != nil {
				errs[i] = fmt.Errorf("key %s not acquirable after the faults healed: %w", key, err)
				return
			}
			if err := harness.Release(ctx, r.h, proc, tk); err != nil {
				errs[i] = fmt.Errorf("key %s: release after the faults healed: %w", key, err)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			r.t.Error(err)
		}
	}
	r.t.Logf("outcomes: %v", r.h.Counts())
	if n := r.h.Count(harness.KindAcquire, harness.OutcomeOK); n < 50 {
		r.t.Errorf("only %d grants in the whole run", n)
	}
	for _, err := range []error{
		harness.CheckTokensUnique(r.h),
		harness.CheckNoTicketAfterIndeterminate(r.h),
		harness.CheckTokensFollowRealTime(r.h),
		harness.CheckLeaseExclusion(r.h),
		harness.CheckReleasedIntervals(r.h),
		harness.CheckOutcomes(r.h, harness.OfKind(harness.KindAcquire),
			harness.OutcomeOK, harness.OutcomeTimedOut, harness.OutcomeIndeterminate,
			harness.OutcomeUnsent, harness.OutcomeNotActive,
			// A grant whose commit took longer than raft-election (the
			// leader lost and regained its quorum around a cut) is
			// answered B, not granted (docs/operations.md), as the chaos
			// run allows.
			harness.OutcomeBusy),
		harness.CheckOutcomes(r.h, harness.OfKind(harness.KindRelease),
			harness.OutcomeOK, harness.OutcomeNotHeld, harness.OutcomeReleaseUnconfirmed),
	} {
		if err != nil {
			r.t.Error(err)
		}
	}
}

// checkPeerTLS: every server says it runs with peer TLS (its "listening"
// line) and none warns of a plain TCP peer link (a cluster's Raft
// transport, a pair's link).
func checkPeerTLS(t *testing.T, servers []*harness.Server) {
	t.Helper()
	for _, n := range servers {
		log := n.Log()
		if !strings.Contains(log, `"peer_tls":true`) || strings.Contains(log, "raft peer transport without TLS") ||
			strings.Contains(log, "pair: the peer link is plain TCP") {
			t.Errorf("%s does not run with peer TLS:\n%s", n.Addr(), log)
		}
	}
}

// logLineAfter returns the time of the first log line with message msg
// of any of servers after since.
func logLineAfter(servers []*harness.Server, msg string, since time.Time) (time.Time, bool) {
	var first time.Time
	for _, n := range servers {
		for _, line := range harness.Lines(n.Log()) {
			var rec struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != msg || !rec.Time.After(since) {
				continue
			}
			if first.IsZero() || rec.Time.Before(first) {
				first = rec.Time
			}
		}
	}
	return first, !first.IsZero()
}

// durStats are the p50, max and min of d, in milliseconds, and d in order.
func durStats(d []time.Duration) (p50, maxv, minv float64, samples []float64) {
	if len(d) == 0 {
		return 0, 0, 0, nil
	}
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	s := slices.Clone(d)
	slices.Sort(s)
	m := s[(len(s)-1)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	for _, x := range d {
		samples = append(samples, ms(x))
	}
	return ms(m), ms(s[len(s)-1]), ms(s[0]), samples
}

// failoverMark is a mark within the failovers, taken from the servers'
// logs: key names it in failover.json, label in the log, what describes
// it in failover.json; d are its times, one per kill that logged it.
type failoverMark struct {
	key, label, what string
	d                []time.Duration
}

// reportFailover logs the failover times (what: from which event to
// which) and the marks within them, and writes them to
// ArtifactDir/failover.json, described by setup.
func reportFailover(t *testing.T, what, setup string, failovers []time.Duration, marks ...failoverMark) {
	t.Helper()
	p50, maxv, minv, samples := durStats(failovers)
	t.Logf("failover (%s), %d kills: p50 %.0f ms, max %.0f ms, min %.0f ms; samples (ms, in order) %v",
		what, len(failovers), p50, maxv, minv, samples)
	out := map[string]any{
		"what":       setup,
		"kills":      len(failovers),
		"p50_ms":     p50,
		"max_ms":     maxv,
		"min_ms":     minv,
		"samples_ms": samples,
	}
	for _, m := range marks {
		mp50, mmax, mmin, msamples := durStats(m.d)
		t.Logf("  %s: p50 %.0f ms, max %.0f ms, min %.0f ms; samples %v", m.label, mp50, mmax, mmin, msamples)
		out[m.key] = map[string]any{
			"what":       m.what,
			"p50_ms":     mp50,
			"max_ms":     mmax,
			"min_ms":     mmin,
			"samples_ms": msamples,
		}
	}
	out["at"] = time.Now().UTC().Format(time.RFC3339)
	dir := harness.ArtifactDir(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("artifact dir: %v", err)
		return
	}
	b, _ := json.MarshalIndent(out, "", "  ")
	path := filepath.Join(dir, "failover.json")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		t.Logf("failover artifact: %v", err)
		return
	}
	t.Logf("failover figures written to %s", path)
}

// checkersCatch shows, on the real history of a load run, that the
// checkers would have failed it had the service misbehaved: the same
// history with a token granted twice, with two grants' tokens swapped
// against real time, and with a grant moved before the previous holder's
// deadline must each be reported.
func checkersCatch(t *testing.T, h *harness.History) {
	t.Helper()
	ops := h.Ops()
	var grants []int // indexes of successful acquires
	for i, op := range ops {
		if op.Kind == harness.KindAcquire && op.Outcome == harness.OutcomeOK && !op.Pending() {
			grants = append(grants, i)
		}
	}
	if len(grants) < 3 {
		t.Fatalf("checkersCatch: %d grants, too few", len(grants))
	}
	rebuild := func(mut func(ops []harness.Op)) *harness.History {
		c := slices.Clone(ops)
		mut(c)
		out := harness.NewHistory()
		for _, op := range c {
			out.Record(op)
		}
		return out
	}
	// A token twice: the last grant carries the first grant's token.
	dup := rebuild(func(c []harness.Op) { c[grants[len(grants)-1]].Token = c[grants[0]].Token })
	if err := harness.CheckTokensUnique(dup); err == nil {
		t.Error("CheckTokensUnique passed the run's history with a token granted twice")
	}
	// Order inversion: two grants, one completed before the other was
	// invoked, with their tokens swapped.
	var a, b = -1, -1
	byComplete := slices.Clone(grants)
	sort.Slice(byComplete, func(i, j int) bool { return ops[byComplete[i]].Complete < ops[byComplete[j]].Complete })
	for _, j := range grants {
		if ops[j].Invoke > ops[byComplete[0]].Complete {
			a, b = byComplete[0], j
			break
		}
	}
	if a < 0 {
		t.Fatal("checkersCatch: no two grants ordered in real time")
	}
	inv := rebuild(func(c []harness.Op) { c[a].Token, c[b].Token = c[b].Token, c[a].Token })
	if err := harness.CheckTokensFollowRealTime(inv); err == nil {
		t.Error("CheckTokensFollowRealTime passed the run's history with two tokens swapped against real time")
	}
	// Two holders: a grant of a key completing while the previous holder
	// (by token) still held it, i.e. before its deadline and release.
	byKey := map[string][]int{}
	for _, i := range grants {
		byKey[ops[i].Key] = append(byKey[ops[i].Key], i)
	}
	found := false
	for _, g := range byKey {
		if len(g) < 2 {
			continue
		}
		sort.Slice(g, func(i, j int) bool { return ops[g[i]].Token < ops[g[j]].Token })
		p, n := g[0], g[1]
		early := ops[p].Complete + time.Microsecond // right after the previous grant, before its release began
		two := rebuild(func(c []harness.Op) { c[n].Invoke, c[n].Complete = early, early })
		if err := harness.CheckLeaseExclusion(two); err == nil {
			t.Error("CheckLeaseExclusion passed the run's history with a grant moved inside the previous holding")
		}
		found = true
		break
	}
	if !found {
		t.Fatal("checkersCatch: no key granted twice")
	}
}
