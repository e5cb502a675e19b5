package server_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// releaseCluster is slowCommits with ClusterConfig.CommittedRelease set to
// committed on every node; the function sets the delay of every Raft RPC.
func releaseCluster(t *testing.T, committed bool) (*tcluster, func(time.Duration)) {
	t.Helper()
	var delay atomic.Int64
	tc := newTestClusterOpts(t, 3, func(_ int, cfg *server.Config) {
		cfg.Cluster.CommittedRelease = committed
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

// By default the leader answers a RELEASE as soon as it has decided it:
// the R arrives while the Free cannot have committed yet (every Raft RPC
// takes 100 ms), and the release still commits behind it. The next
// holder's grant commits only after the Free: an ACQUIRE sent after the R
// is granted a higher token.
func TestClusterReleaseAnsweredOnDecision(t *testing.T) {
	tc, delay := releaseCluster(t, false)
	l := tc.leader()
	c := tc.leaderSession(l)
	tok := c.acquireOK(2, owner(1), 0, 60, "k")
	tc.waitApplied(tok)
	before := tc.applied(l)
	delay(100 * time.Millisecond)
	c.send(rel(3, tok, "k"))
	c.expect(wire.TypeReleased, 3)
	if a := tc.applied(l); a != before {
		t.Fatalf("applied index %d when R arrived, want %d: the R waited for the commit", a, before)
	}
	c2 := tc.leaderSession(l)
	if t2 := c2.acquireOK(2, owner(2), 0, 60, "k"); t2 <= tok {
		t.Fatalf("next grant token %d, want > %d", t2, tok)
	}
	if a := tc.applied(l); a < before+2 {
		t.Fatalf("applied index %d after the next grant, want at least %d (the Free, then the Grant)", a, before+2)
	}
	delay(0)
}

// With CommittedRelease the R comes only once the Free is applied.
func TestClusterCommittedRelease(t *testing.T) {
	tc, delay := releaseCluster(t, true)
	l := tc.leader()
	c := tc.leaderSession(l)
	tok := c.acquireOK(2, owner(1), 0, 60, "k")
	tc.waitApplied(tok)
	before := tc.applied(l)
	delay(100 * time.Millisecond)
	c.send(rel(3, tok, "k"))
	c.expect(wire.TypeReleased, 3)
	delay(0)
	if a := tc.applied(l); a <= before {
		t.Fatalf("applied index %d when R arrived, want > %d: R before the commit", a, before)
	}
}
