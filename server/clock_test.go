package server_test

import (
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestLeaseEndsExactlyAtLeaseSFakeClock shows the scheduler's clock is
// injected: with a fake clock, a waiter is not granted 1 ns before the
// holder's lease_s has passed, and is granted at exactly lease_s, having
// waited exactly 30000 ms.
func TestLeaseEndsExactlyAtLeaseSFakeClock(t *testing.T) {
	clk := server.NewFakeClock()
	var cfg server.Config
	server.SetClock(&cfg, clk)
	s, addr := startServer(t, cfg)
	a, b := session(t, addr), session(t, addr)
	tokA := a.acquireOK(2, owner(1), 0, 30, "k") // a real clock would take 30 s
	b.send(acq(2, owner(2), 60, 5, "k"))
	b.send(ping(3))
	b.expect(wire.TypePong, 3) // b's ACQUIRE is queued (the reader handled it first)

	clk.Advance(30*time.Second - 1)
	b.send(ping(4))
	b.expect(wire.TypePong, 4) // not granted: no G before the PONG
	if st := s.Stats(); st.HeldLocks != 1 || st.Waiters != 1 || st.Expired != 0 {
		t.Fatalf("1 ns before the lease end: %+v", st)
	}

	clk.Advance(1)
	g := b.expect(wire.TypeGranted, 2)
	if g.Token <= tokA || g.WaitedMS != 30000 {
		t.Fatalf("grant token %d (a's %d), waited %d ms; want a later token after exactly 30000 ms", g.Token, tokA, g.WaitedMS)
	}
	a.send(rel(3, tokA, "k"))
	a.expect(wire.TypeNotHeld, 3) // a's lease ended
	if st := s.Stats(); st.Expired != 1 || st.HeldLocks != 1 || st.Waiters != 0 {
		t.Fatalf("after the lease end: %+v", st)
	}
}
