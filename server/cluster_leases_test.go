package server_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestClusterLeasesEndInOrder: the leader's one lease timer (a heap of
// lease ends) ends each lease exactly when it is due, whatever the order
// of the grants and lease lengths, and a released key leaves the schedule
// without disturbing the others.
func TestClusterLeasesEndInOrder(t *testing.T) {
	clk := server.NewFakeClock()
	tc := newTestCluster(t, 3, func(_ int, cfg *server.Config) { server.SetClock(cfg, clk) })
	l := tc.leader()
	c := tc.leaderSession(l)
	leases := map[string]uint8{"k3": 3, "k1": 1, "k5": 5, "k2": 2, "gone": 2, "k4": 4}
	order := []string{"k3", "k1", "k5", "k2", "gone", "k4"}
	toks := map[string]uint64{}
	for i, k := range order {
		toks[k] = c.acquireOK(uint32(10+i), owner(1), 0, leases[k], k)
	}
	c.send(rel(30, toks["gone"], "gone"))
	c.expect(wire.TypeReleased, 30)
	eventually(t, "5 held locks", func() bool { return tc.nodes[l].s.Stats().HeldLocks == 5 })
	probe := tc.leaderSession(l)
	id := uint32(100)
	held := func(k string) bool {
		id++
		probe.send(acq(id, owner(2), 0, 1, k))
		r := probe.recv()
		switch {
		case r.ReqID != id:
			t.Fatalf("reply %s to req %d", show(r), id)
		case r.Type == wire.TypeTimedOut:
			return true
		case r.Type == wire.TypeGranted:
			probe.send(rel(id+1000, r.Token, k))
			probe.expect(wire.TypeReleased, id+1000)
			return false
		}
		t.Fatalf("probe of %s: %s", k, show(r))
		return false
	}
	for s := 1; s <= 5; s++ {
		clk.Advance(time.Second - time.Millisecond)
		k := fmt.Sprintf("k%d", s)
		if !held(k) {
			t.Fatalf("%s free 1 ms before its lease of %d s ended", k, s)
		}
		clk.Advance(time.Millisecond)
		eventually(t, k+"'s lease to end", func() bool { return tc.nodes[l].s.Stats().HeldLocks == 5-s })
		for later := s + 1; later <= 5; later++ {
			if k := fmt.Sprintf("k%d", later); !held(k) {
				t.Fatalf("%s (lease %d s) free after %d s", k, later, s)
			}
		}
	}
}

// TestClusterLeaderOneLeaseTimer: a leader holding many locks keeps one
// timer for all their leases, not one per lock (a timer and its closure
// were about 180 B of the leader's heap per held lock).
func TestClusterLeaderOneLeaseTimer(t *testing.T) {
	clk := server.NewFakeClock()
	tc := newTestCluster(t, 3, func(_ int, cfg *server.Config) { server.SetClock(cfg, clk) })
	l := tc.leader()
	c := tc.leaderSession(l)
	before := clk.Pending()
	const n = 200
	for i := range n {
		c.acquireOK(uint32(10+i), owner(1), 0, uint8(1+i%50), fmt.Sprintf("key-%d", i))
	}
	if got := clk.Pending() - before; got > 1 {
		t.Fatalf("%d timers set for %d held locks, want at most 1", got, n)
	}
	clk.Advance(50 * time.Second)
	eventually(t, "every lease to end", func() bool { return tc.nodes[l].s.Stats().HeldLocks == 0 })
}
