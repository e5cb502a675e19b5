package server_test

import (
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestClusterEarlyReleaseOnCutOffLeader: a leader cut off from its
// followers (still serving until its leader lease runs out) is sent a
// RELEASE of a held lock. With EarlyRelease it answers R at once, although its
// Free can never commit, and counts it in Stats().Released. The new leader
// still has the holding, its lease restarted: a new owner's ACQUIRE with
// wait 0 gets T (the documented cost: the key stays held until that lease
// ends), and the old owner's ACQUIRE gets G with the same token and
// waited 0, a repeated token that docs/protocol.md says starts no new lease.
// By default (the committed release) the cut-off leader never answers R: the session
// gets M. With --early-release a cut-off leader's R can come without its
// death, and Released counts R replies, not Frees applied.
func TestClusterEarlyReleaseOnCutOffLeader(t *testing.T) {
	for _, committed := range []bool{false, true} {
		name := "early"
		if committed {
			name = "committed"
		}
		t.Run(name, func(t *testing.T) {
			tc := newTestCluster(t, 3, func(_ int, cfg *server.Config) { cfg.Cluster.EarlyRelease = !committed })
			l := tc.leader()
			c := tc.leaderSession(l)
			tok := c.acquireOK(2, owner(1), 0, 60, "k")
			tc.waitApplied(tok)
			tc.isolate(l)
			c.send(rel(3, tok, "k"))
			r := c.recv()
			if committed {
				if r.Type == wire.TypeReleased {
					t.Fatalf("a cut-off leader answered R with the committed release (the default)")
				}
				return
			}
			if r.Type != wire.TypeReleased {
				t.Fatalf("the cut-off leader answered %s, want R at once", show(r))
			}
			if got := tc.nodes[l].s.Stats().Released; got != 1 {
				t.Errorf("R sent, but the leader's Stats().Released = %d, want 1", got)
			}
			nl := tc.leader(tc.others(l)...)
			c2 := tc.leaderSession(nl)
			c2.send(acq(2, owner(2), 0, 60, "k"))
			c2.expect(wire.TypeTimedOut, 2)
			c2.send(acq(3, owner(1), 0, 60, "k"))
			g := c2.expect(wire.TypeGranted, 3)
			if g.Token != tok || g.WaitedMS != 0 {
				t.Errorf("the old owner's ACQUIRE on the new leader: token %d waited %d ms, want the repeated token %d, waited 0", g.Token, g.WaitedMS, tok)
			}
		})
	}
}
