package server_test

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// Flooding sessions: each pipelines bursts of ACQUIREs
// of fresh keys (wait 0, lease 1 s) without waiting for the replies.
const (
	floodSessions = 4
	floodBurst    = 20_000
	floodEvery    = 200 * time.Millisecond
)

// honestWindows runs acquire+release cycles of key on a session of its
// own against addr, one at a time, for n windows of d each, and returns how
// many completed in each, and what ended the session early if anything
// did (a reply that does not come within what is left of the last window
// just ends the count).
func honestWindows(t *testing.T, addr, key string, n int, d time.Duration) ([]int, string) {
	t.Helper()
	c := dial(t, addr)
	defer c.nc.Close()
	c.send(wire.Request{Type: wire.TypeHello, ReqID: 1, Version: wire.Version2, Name: []byte("honest")})
	if r, err := c.recvErr(5 * time.Second); err != nil || r.Type != wire.TypeHelloOK {
		return nil, fmt.Sprintf("HELLO: %s, %v", show(r), err)
	}
	counts := make([]int, n)
	start := time.Now()
	end := start.Add(time.Duration(n) * d)
	for id := uint32(2); time.Now().Before(end); id += 2 {
		c.send(acq(id, owner(int(id)), 0, 10, key))
		r, err := c.recvErr(time.Until(end))
		if err != nil {
			return counts, ""
		}
		if r.Type != wire.TypeGranted || r.ReqID != id {
			return counts, "ACQUIRE answered " + show(r)
		}
		c.send(rel(id+1, r.Token, key))
		r, err = c.recvErr(time.Until(end))
		if err != nil {
			return counts, ""
		}
		if r.Type != wire.TypeReleased || r.ReqID != id+1 {
			return counts, "RELEASE answered " + show(r)
		}
		if w := int(time.Since(start) / d); w < n {
			counts[w]++
		}
	}
	return counts, ""
}

func median(v []int) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return float64(s[len(s)/2])
	}
	return float64(s[len(s)/2-1]+s[len(s)/2]) / 2
}

// flood starts floodSessions sessions on addr, each sending a burst of
// floodBurst ACQUIREs of fresh keys every floodEvery and reading (and
// dropping) whatever comes back; the returned func stops them and returns
// the replies they read.
func flood(t *testing.T, addr string) (stop func() int64) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	var replies atomic.Int64
	var conns []*client
	for i := range floodSessions {
		c := dial(t, addr)
		c.send(wire.Request{Type: wire.TypeHello, ReqID: 1, Version: wire.Version2, Name: []byte("flood")})
		c.expect(wire.TypeHelloOK, 1)
		conns = append(conns, c)
		wg.Add(2)
		go func() {
			defer wg.Done()
			c.nc.SetReadDeadline(time.Time{})
			for {
				if _, err := c.fr.Next(); err != nil {
					return
				}
				replies.Add(1)
			}
		}()
		go func() {
			defer wg.Done()
			id := uint32(2)
			var buf []byte
			tick := time.NewTicker(floodEvery)
			defer tick.Stop()
			for n := 0; ; n++ {
				buf = buf[:0]
				for range floodBurst {
					r := acq(id, owner(i), 0, 1, fmt.Sprintf("f%d-%d", i, id))
					buf, _ = wire.AppendRequest(buf, &r)
					id++
				}
				if _, err := c.nc.Write(buf); err != nil {
					return
				}
				select {
				case <-done:
					return
				case <-tick.C:
				}
			}
		}()
	}
	return func() int64 {
		close(done)
		for _, c := range conns {
			c.nc.Close()
		}
		wg.Wait()
		return replies.Load()
	}
}

// TestClusterFloodDoesNotStarveOthers: four sessions pipelining bursts of
// 20,000 fresh-key ACQUIREs every 0.2 s (more than the cluster can commit)
// must not starve an honest session doing acquire+release cycles, nor
// queue proposals on the leader without bound.
//
// The leader turned every such ACQUIRE into a proposal at once and put the
// whole queue into one ever larger entry: the honest session's requests
// waited behind all of it (0 cycles, B for commits slower than the
// election timeout, or M when the leader stepped down, with 23,000 to
// 135,000 proposals pending). A first bound (MaxSessionProposals per
// session, entries of 128 commands filled in turns, two in flight, the
// leader's expiries first) left it 0 to 19% of its rate alone: its
// requests still waited for two full entries in flight and the one
// after, and the flood's expiries (its 1 s leases ending) went first,
// on the leader's own queue (3,000 to 109,000 of them pending). Now the
// expiries are charged to the session that got the lock; a session with
// nothing in an entry in flight gets an express entry at once; and while
// a session is held back at its bound and another sends a request at a
// time, entries are small and one at a time. That left it 40 to 56%: the
// held-back sessions took the express entry too, most of the time (their
// queues have nothing in flight after each apply), and its request still
// found a flood entry ahead of it. Now, while contended, the express entry
// is only for the sessions not held back, and the held-back sessions'
// entries are paced, leaving the log idle about half the time.
//
// The honest session's rate is measured in windows alone (before the
// flood, and again after it, once the leader has applied everything) and
// under the flood; the ratio of the medians must be at least
// minFloodFraction. The machine's two cores are shared by the three nodes,
// the flood, and other tests, whose load changes the ratio from run to
// run: the bound is well under what the code gives (62 to 79% in
// runs) and well above what the code before the first changes gave (0 to
// 7%), and a measurement under it is made once more before the test fails. Under the
// race detector, which makes every CPU-bound step several times dearer,
// the fraction is only logged. The
// pending commands of requests must stay within the sessions' bounds, and
// the leader's own queue must hold none of the flood's expiries.
func TestClusterFloodDoesNotStarveOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of the cluster for several seconds")
	}
	// Nodes as deployed (durable stores, TCP between them), with a longer
	// election timeout than the tests' so that the load of a shared
	// machine does not depose the leader.
	nodes := startDiskCluster(t, func(cfg *server.Config) {
		cfg.Cluster.HeartbeatTimeout, cfg.Cluster.ElectionTimeout = time.Second, time.Second
	})
	l := diskLeader(t, nodes)
	addr, s := nodes[l].addr, nodes[l].s
	var fracs []string
	for attempt := 1; ; attempt++ {
		frac, ok := floodAttempt(t, addr, s)
		fracs = append(fracs, fmt.Sprintf("%.0f%%", 100*frac))
		if !ok || frac >= minFloodFraction {
			return
		}
		if raceEnabled {
			// The race detector makes the flood's CPU work (the
			// nodes' and its own) several times dearer on the same two
			// cores: the fraction is logged, not asserted.
			t.Logf("%.0f%% under the race detector: not asserted", 100*frac)
			return
		}
		if attempt == 2 {
			t.Errorf("the honest session kept %v of its rate alone under the flood, want at least %.0f%%", fracs, 100*minFloodFraction)
			return
		}
		t.Logf("%.0f%%, under %.0f%%: once more (the machine's load may have changed between the windows)", 100*frac, 100*minFloodFraction)
	}
}

// minFloodFraction is the part of its rate alone that the honest session
// must keep under the flood (see TestClusterFloodDoesNotStarveOthers).
const minFloodFraction = 0.40

// floodAttempt measures the honest session on the leader s (at addr)
// alone, under the flood, and alone again; it returns the fraction of its
// rate alone it kept under the flood, and false if it failed the test
// otherwise.
func floodAttempt(t *testing.T, addr string, s *server.Server) (float64, bool) {
	const (
		windows = 4
		window  = 500 * time.Millisecond
	)
	before, bad := honestWindows(t, addr, "alone", windows, window)
	if bad != "" {
		t.Errorf("the honest session alone: %s", bad)
		return 0, false
	}

	stop := flood(t, addr)
	// Sample the leader's pending proposals (and the heap) while it lasts.
	var reqPeak, expPeak, ownPeak, heap int64
	quit, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		for i := 0; ; i++ {
			req, exp, own := server.ProposalsPending(s)
			reqPeak, expPeak, ownPeak = max(reqPeak, int64(req)), max(expPeak, int64(exp)), max(ownPeak, int64(own))
			if i%20 == 0 {
				runtime.ReadMemStats(&ms)
				heap = max(heap, int64(ms.HeapInuse))
			}
			select {
			case <-quit:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	time.Sleep(500 * time.Millisecond) // the flood builds up
	loaded, bad := honestWindows(t, addr, "loaded", windows, window)
	replies := stop()
	close(quit)
	<-sampled
	ok := true
	if bad != "" {
		t.Errorf("the honest session under the flood: %s", bad)
		ok = false
	}
	if bound := int64(floodSessions*server.DefaultMaxSessionProposals + 1); reqPeak > bound {
		t.Errorf("the sessions' requests had %d commands pending on the leader, above %d (MaxSessionProposals each, and the honest one's)", reqPeak, bound)
		ok = false
	}
	if ownPeak > 0 {
		t.Errorf("the leader's own queue had %d commands pending: the flood's expiries must be charged to the flood's sessions", ownPeak)
		ok = false
	}

	// Alone again, once the flood's commands (and its locks' expiries)
	// are applied: the machine's load may have changed meanwhile.
	drain := time.Now()
	for {
		req, exp, own := server.ProposalsPending(s)
		if req+exp+own == 0 && s.Stats().HeldLocks == 0 {
			break
		}
		if time.Since(drain) > 60*time.Second {
			t.Fatalf("the leader still has %d+%d+%d commands pending 60 s after the flood", req, exp, own)
		}
		time.Sleep(50 * time.Millisecond)
	}
	drained := time.Since(drain)
	after, bad := honestWindows(t, addr, "after", windows, window)
	if bad != "" {
		t.Errorf("the honest session alone after the flood: %s", bad)
		return 0, false
	}

	alone := median(append(slices.Clone(before), after...))
	frac := median(loaded) / max(alone, 1)
	t.Logf("honest cycles per %v: alone %v then %v (median %.0f), under the flood %v (median %.0f): %.0f%%; flood replies %d; leader's pending commands of requests peak %d, expiries %d, on its own queue %d; heap in use peak %d MiB; drained in %v",
		window, before, after, alone, loaded, median(loaded), 100*frac, replies, reqPeak, expPeak, ownPeak, heap>>20, drained.Round(100*time.Millisecond))
	return frac, ok
}

// TestClusterProposalBounds: a session pipelining more ACQUIREs than
// MaxSessionProposals is held back, not refused: every one is granted, and
// the leader never has more than the bound of its commands pending. An
// ACQUIRE of a free key that would take the leader past MaxProposals gets
// B at once.
func TestClusterProposalBounds(t *testing.T) {
	tc, delay := newBoundedCluster(t, 4, 6)
	l := tc.leader()
	s := tc.nodes[l].s
	a, b := tc.leaderSession(l), tc.leaderSession(l)
	delay.Store(int64(50 * time.Millisecond)) // a commit takes about 100 ms

	var buf []byte
	for i := range 20 {
		r := acq(uint32(10+i), owner(1), 0, 30, fmt.Sprintf("a%d", i))
		buf, _ = wire.AppendRequest(buf, &r)
	}
	a.sendRaw(buf)
	eventually(t, "a's first commands to be pending", func() bool { n, _, _ := server.ProposalsPending(s); return n == 4 })
	// a holds 4 of the 6: b's first two are proposed, the rest refused.
	buf = buf[:0]
	for i := range 4 {
		r := acq(uint32(10+i), owner(2), 0, 30, fmt.Sprintf("b%d", i))
		buf, _ = wire.AppendRequest(buf, &r)
	}
	b.sendRaw(buf)
	got := map[byte]int{}
	for range 4 {
		got[b.recv().Type]++
	}
	if got[wire.TypeGranted] != 2 || got[wire.TypeBusy] != 2 {
		t.Errorf("b's 4 ACQUIREs with 4 of 6 proposals pending: %v, want 2 G and 2 B", got)
	}
	// b's grants are applied (answered): what is pending now is a's.
	peak := 0
	for range 20 {
		n, _, _ := server.ProposalsPending(s)
		peak = max(peak, n)
		if r := a.recv(); r.Type != wire.TypeGranted {
			t.Fatalf("a's pipelined ACQUIRE: %s, want G (held back, never refused)", show(r))
		}
	}
	if peak > 4 {
		t.Errorf("%d of a's commands pending, above its MaxSessionProposals (4)", peak)
	}
}

// TestClusterExpiriesOutsideMaxProposals: the ends of leases are charged
// to the session that got the locks and are not counted against
// MaxProposals, which bounds what the requests of all sessions have
// pending: a session whose locks expire faster than the log commits them
// does not get another session's ACQUIRE refused. (Counted, six expiries
// pending with MaxProposals 6 answered b's ACQUIRE of a free key B.)
func TestClusterExpiriesOutsideMaxProposals(t *testing.T) {
	tc, delay := newBoundedCluster(t, 8, 6)
	l := tc.leader()
	s := tc.nodes[l].s
	a, b := tc.leaderSession(l), tc.leaderSession(l)
	var buf []byte
	for i := range 6 {
		r := acq(uint32(10+i), owner(1), 0, 1, fmt.Sprintf("a%d", i))
		buf, _ = wire.AppendRequest(buf, &r)
	}
	a.sendRaw(buf)
	for range 6 {
		if r := a.recv(); r.Type != wire.TypeGranted {
			t.Fatalf("a's ACQUIRE: %s, want G", show(r))
		}
	}
	// Their leases end in 1 s; their expiries then take a while to commit.
	delay.Store(int64(200 * time.Millisecond))
	eventually(t, "a's six expiries to be pending", func() bool {
		req, exp, own := server.ProposalsPending(s)
		return req == 0 && exp == 6 && own == 0
	})
	b.send(acq(10, owner(2), 0, 30, "b"))
	if r := b.recv(); r.Type != wire.TypeGranted {
		t.Errorf("b's ACQUIRE of a free key with a's six expiries pending (MaxProposals 6): %s, want G", show(r))
	}
}

// newBoundedCluster starts a 3-node cluster whose leader has the given
// MaxSessionProposals and MaxProposals; each outgoing Raft RPC first
// sleeps for what delay holds (0 at first), to slow the commits.
func newBoundedCluster(t *testing.T, perSession, all int) (*tcluster, *atomic.Int64) {
	t.Helper()
	delay := new(atomic.Int64)
	tc := newTestClusterOpts(t, 3, func(_ int, cfg *server.Config) {
		cfg.Cluster.MaxSessionProposals, cfg.Cluster.MaxProposals = perSession, all
		// Slow RPCs on a loaded machine must not depose the leader.
		cfg.Cluster.HeartbeatTimeout, cfg.Cluster.ElectionTimeout = time.Second, time.Second
	}, func() bool {
		if d := time.Duration(delay.Load()); d > 0 {
			time.Sleep(d)
		}
		return false
	})
	t.Cleanup(func() { delay.Store(0) })
	return tc, delay
}
