package server_test

import (
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestClusterReleaseRMeansReleased: a leader cut off from its followers
// (still serving until its leader lease runs out) is sent a RELEASE of a
// held lock. By default it answers R at once, though its Free can never
// commit; the new leader still has the holding, restarted at lease_s +
// election timeout, and hands the same token again to the same owner's
// next ACQUIRE (G, waited 0, the lease not restarted): a token the client
// was told is released is "granted" to it again, with a lease that ends
// before the lease_s the client counts from that G (two holders once the
// server expires it). With CommittedRelease the cut-off leader cannot
// answer R (the session gets M), and the client knows the release is
// unconfirmed. The docs say the early R costs liveness only ("no token is
// reused"), and only when "the leader dies within that commit". Also the
// R is not counted in Stats().Released / ticketing_released_total ("R
// replies"), which counts Frees applied.
func TestClusterReleaseRMeansReleased(t *testing.T) {
	for _, committed := range []bool{false, true} {
		name := "early"
		if committed {
			name = "committed"
		}
		t.Run(name, func(t *testing.T) {
			tc := newTestCluster(t, 3, func(_ int, cfg *server.Config) { cfg.Cluster.CommittedRelease = committed })
			l := tc.leader()
			c := tc.leaderSession(l)
			tok := c.acquireOK(2, owner(1), 0, 60, "k")
			tc.waitApplied(tok)
			tc.isolate(l)
			c.send(rel(3, tok, "k"))
			r := c.recv()
			if r.Type != wire.TypeReleased {
				if !committed {
					t.Skipf("the cut-off leader answered %s before R (stepped down first)", show(r))
				}
				return // not told R: the client knows nothing was confirmed
			}
			// Stats.Released (ticketing_released_total, "RELEASEs answered
			// R") counts at the Free's apply, which never comes here.
			if got := tc.nodes[l].s.Stats().Released; got != 1 {
				t.Errorf("R sent, but the leader's Stats().Released = %d, want 1", got)
			}
			nl := tc.leader(tc.others(l)...)
			c2 := tc.leaderSession(nl)
			c2.send(acq(2, owner(1), 0, 60, "k"))
			r2 := c2.recv()
			if r2.Type == wire.TypeGranted && r2.Token <= tok {
				t.Fatalf("RELEASE of token %d answered R, then the same owner's ACQUIRE on the new leader got G with token %d (waited %d ms): the released holding is still there and its token is handed out again",
					tok, r2.Token, r2.WaitedMS)
			}
		})
	}
}
