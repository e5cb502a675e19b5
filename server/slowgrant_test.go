package server_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestSlowGrantAnswersBusyInBothModes: an ACQUIRE of a free key that the
// server cannot decide in time because its durable write is slow is
// answered B ("capacity rejection; definitely not granted") in both modes:
// standalone, when the disk does not reserve a token within a second; in
// a cluster, when the grant's commit takes longer than an election
// timeout (it is freed again: a G then could outlast a new leader's
// restarted lease). The cluster answered T, which says "the wait ran out"
// The key is free again afterwards in both.
func TestSlowGrantAnswersBusyInBothModes(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		disk := freezeDisk(t)
		_, addr := startServer(t, server.Config{TokenBlock: 4})
		t.Cleanup(disk.unfreeze)
		c := session(t, addr)
		for i := range 4 { // tokens 1..4; the reservation of 5..8 sticks
			c.acquireOK(uint32(10+i), owner(1), 0, 30, string(rune('a'+i)))
		}
		<-disk.entered
		c.send(acq(2, owner(2), 0, 30, "k"))
		if r, err := c.recvErr(5 * time.Second); err != nil || r.Type != wire.TypeBusy {
			t.Fatalf("ACQUIRE of a free key on a stalled disk: %s, %v; want B", show(r), err)
		}
		disk.unfreeze()
		c.acquireOK(3, owner(2), 0, 30, "k")
	})
	t.Run("cluster", func(t *testing.T) {
		clk := server.NewFakeClock()
		var delay atomic.Int64
		tc := newTestClusterOpts(t, 3, func(_ int, cfg *server.Config) { server.SetClock(cfg, clk) }, func() bool {
			if d := time.Duration(delay.Load()); d > 0 {
				time.Sleep(d)
			}
			return false
		})
		t.Cleanup(func() { delay.Store(0) })
		l := tc.leader()
		c := tc.leaderSession(l)
		tok := c.acquireOK(2, owner(1), 0, 30, "warm")
		tc.waitApplied(tok)
		// Every Raft RPC takes 100 ms: the grant's entry commits about
		// 200 ms after it is proposed; meanwhile the leader's clock (the
		// scheduler's) moves past an election timeout.
		delay.Store(int64(100 * time.Millisecond))
		c.send(acq(3, owner(2), 0, 30, "k"))
		time.Sleep(40 * time.Millisecond) // proposed, not committed
		clk.Advance(testElection + time.Millisecond)
		r, err := c.recvErr(5 * time.Second)
		if err != nil || r.Type != wire.TypeBusy {
			t.Fatalf("ACQUIRE of a free key committed after more than an election timeout: %s, %v; want B", show(r), err)
		}
		delay.Store(0)
		eventually(t, "the key to be freed again", func() bool { return tc.nodes[l].s.Stats().HeldLocks == 1 })
		if got := c.acquireOK(4, owner(2), 0, 30, "k"); got <= tok+1 {
			t.Fatalf("token %d after the slow grant's %d: want a new one", got, tok+1)
		}
	})
}
