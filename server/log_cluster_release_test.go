package server_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// releaseCluster is slowCommits with ClusterConfig.EarlyRelease set to
// early on every node (false: the default); the function sets the delay
// of every Raft RPC.
func releaseCluster(t *testing.T, early bool) (*tcluster, func(time.Duration)) {
	t.Helper()
	var delay atomic.Int64
	tc := newTestClusterOpts(t, 3, func(_ int, cfg *server.Config) {
		cfg.Cluster.EarlyRelease = early
	}, func() bool {
		if d := time.Duration(delay.Load()); d > 0 {
			time.Sleep(d)
		}
		return false
	})
	return tc, func(d time.Duration) { delay.Store(int64(d)) }
}

// applied is node i's applied index.
func (tc *tcluster) applied(i int) uint64 {
	tc.t.Helper()
	st, err := tc.nodes[i].s.ClusterStatus()
	if err != nil {
		tc.t.Fatal(err)
	}
	return st.AppliedIndex
}

// releaseWithSlowCommits acquires a key on a cluster whose Raft RPCs then
// take 100 ms each, releases it and returns the leader's applied index
// before the RELEASE and when its R arrived, the token and the leader.
func releaseWithSlowCommits(t *testing.T, early bool) (tc *tcluster, l int, tok, before, atR uint64) {
	tc, delay := releaseCluster(t, early)
	t.Cleanup(func() { delay(0) })
	l = tc.leader()
	c := tc.leaderSession(l)
	tok = c.acquireOK(2, owner(1), 0, 60, "k")
	tc.waitApplied(tok)
	before = tc.applied(l)
	delay(100 * time.Millisecond)
	c.send(rel(3, tok, "k"))
	c.expect(wire.TypeReleased, 3)
	return tc, l, tok, before, tc.applied(l)
}

// With EarlyRelease the leader answers a RELEASE as soon as it has decided
// it: the R arrives while the Free cannot have committed yet (every Raft
// RPC takes 100 ms), and the release still commits behind it. The next
// holder's grant commits only after the Free: an ACQUIRE sent after the R
// is granted a higher token.
func TestClusterEarlyRelease(t *testing.T) {
	tc, l, tok, before, atR := releaseWithSlowCommits(t, true)
	if atR != before {
		t.Fatalf("applied index %d when R arrived, want %d: the R waited for the commit", atR, before)
	}
	c2 := tc.leaderSession(l)
	if t2 := c2.acquireOK(2, owner(2), 0, 60, "k"); t2 <= tok {
		t.Fatalf("next grant token %d, want > %d", t2, tok)
	}
	if a := tc.applied(l); a < before+1 {
		// (The Grant is queued behind the Free of the same key: in the
		// same entry or the next one.)
		t.Fatalf("applied index %d after the next grant, want at least %d (the Free, then the Grant)", a, before+1)
	}
}

// By default the R comes only once the Free is applied: R means "released"
// (docs/protocol.md), which an uncommitted Free is not yet (the early R is
// opt-in: --early-release).
func TestClusterReleaseCommittedByDefault(t *testing.T) {
	_, _, _, before, atR := releaseWithSlowCommits(t, false)
	if atR <= before {
		t.Fatalf("applied index %d when R arrived, want > %d: R before the commit", atR, before)
	}
}
