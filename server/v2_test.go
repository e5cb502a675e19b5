package server_test

import (
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// sessionV2 dials and completes a version-2 HELLO.
func sessionV2(t testing.TB, addr string) *client {
	t.Helper()
	c := dial(t, addr)
	h := helloReq(1, "")
	h.Version = wire.Version2
	c.send(h)
	if r := c.expect(wire.TypeHelloOK, 1); r.Version != wire.Version2 {
		t.Fatalf("HELLO_OK version %d, want 2", r.Version)
	}
	return c
}

func cancelReq(id uint32) wire.Request { return wire.Request{Type: wire.TypeCancel, ReqID: id} }

func relOwned(id uint32, tok uint64, own [16]byte, key string) wire.Request {
	return wire.Request{Type: wire.TypeReleaseOwned, ReqID: id, Token: tok, Owner: own, Key: []byte(key)}
}

// TestCancelEveryOtherOf100: 100 ACQUIREs of one key wait on one version-2
// session; every other one is CANCELled and answered T at once; the other
// 50 stay in the queue and are granted one after the other in FIFO order,
// each with a higher token, and the session lives on.
func TestCancelEveryOtherOf100(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	h := session(t, addr)
	tok := h.acquireOK(1, owner(1), 0, 30, "k")
	w := sessionV2(t, addr)
	const n = 100
	for i := range n {
		w.send(acq(uint32(100+i), owner(1000+i), 30, 30, "k"))
	}
	w.send(ping(1))
	w.expect(wire.TypePong, 1)
	if st := s.Stats(); st.Waiters != n {
		t.Fatalf("waiters %d, want %d", st.Waiters, n)
	}
	for i := 0; i < n; i += 2 {
		w.send(cancelReq(uint32(100 + i)))
	}
	for i := 0; i < n; i += 2 {
		w.expect(wire.TypeTimedOut, uint32(100+i))
	}
	w.send(ping(2))
	w.expect(wire.TypePong, 2)
	if st := s.Stats(); st.Waiters != n/2 || st.Cancelled != n/2 || st.HeldLocks != 1 {
		t.Fatalf("after the cancels: waiters %d cancelled %d held %d, want %d %d 1", st.Waiters, st.Cancelled, st.HeldLocks, n/2, n/2)
	}
	h.send(rel(2, tok, "k"))
	h.expect(wire.TypeReleased, 2)
	// Each release grants the next waiter (its G may come before the R).
	g := w.expect(wire.TypeGranted, 101)
	for i := 1; i < n; i += 2 {
		if g.Token <= tok {
			t.Fatalf("waiter %d: token %d after %d", i, g.Token, tok)
		}
		tok = g.Token
		w.send(relOwned(uint32(1000+i), tok, owner(1000+i), "k"))
		gotR := false
		for !gotR || (i+2 < n && g.Token == tok) {
			r := w.recv()
			switch {
			case r.Type == wire.TypeReleased && r.ReqID == uint32(1000+i) && !gotR:
				gotR = true
			case r.Type == wire.TypeGranted && r.ReqID == uint32(100+i+2) && g.Token == tok:
				g = r
			default:
				t.Fatalf("after releasing waiter %d: %s", i, show(r))
			}
		}
	}
	if st := s.Stats(); st.Waiters != 0 || st.HeldLocks != 0 || st.Grants != 1+n/2 {
		t.Fatalf("at the end: waiters %d held %d grants %d", st.Waiters, st.HeldLocks, st.Grants)
	}
}

// TestCancelRaces: CANCELs racing with grants and wait timeouts never
// answer an ACQUIRE twice, never free a granted lock, and leave no waiter
// behind.
func TestCancelRaces(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	h := session(t, addr)
	w := sessionV2(t, addr)
	var cancelled, granted int
	for round := range 200 {
		key := "race"
		tok := h.acquireOK(1, owner(1), 0, 30, key)
		id := uint32(10 + round%2) // reused after each reply
		w.send(acq(id, owner(2), 1, 30, key))
		w.send(ping(3))
		w.expect(wire.TypePong, 3)
		h.send(rel(2, tok, key))
		w.send(cancelReq(id)) // races with the grant
		h.expect(wire.TypeReleased, 2)
		r := w.recv()
		switch {
		case r.Type == wire.TypeTimedOut && r.ReqID == id:
			cancelled++
		case r.Type == wire.TypeGranted && r.ReqID == id:
			granted++
			// Granted first: the CANCEL did nothing, the lock is held.
			h.send(acq(4, owner(3), 0, 30, key))
			h.expect(wire.TypeTimedOut, 4)
			w.send(relOwned(5, r.Token, owner(2), key))
			w.expect(wire.TypeReleased, 5)
		default:
			t.Fatalf("round %d: %s", round, show(r))
		}
		w.send(ping(6)) // nothing else arrives for id
		w.expect(wire.TypePong, 6)
	}
	if st := s.Stats(); st.Waiters != 0 || st.HeldLocks != 0 || st.Cancelled != uint64(cancelled) {
		t.Fatalf("waiters %d held %d cancelled %d (T seen %d)", st.Waiters, st.HeldLocks, st.Cancelled, cancelled)
	}
	t.Logf("%d rounds cancelled, %d granted first", cancelled, granted)
}

// TestCancelTokenWaiter: an ACQUIRE waiting for a token (a stalled disk)
// is not yet decided: a CANCEL answers it T at once, and it is never
// answered again (no B after the bound).
func TestCancelTokenWaiter(t *testing.T) {
	disk := freezeDisk(t)
	s, addr := startServer(t, server.Config{TokenBlock: 4})
	t.Cleanup(disk.unfreeze)
	a := session(t, addr)
	for i := range 4 {
		a.acquireOK(uint32(10+i), owner(1), 0, 30, string(rune('a'+i)))
	}
	<-disk.entered
	w := sessionV2(t, addr)
	w.send(acq(20, owner(2), 5, 30, "free"))
	w.send(cancelReq(20))
	w.expect(wire.TypeTimedOut, 20)
	if disk.thawed.Load() {
		t.Fatal("disk thawed early")
	}
	// Answered, it no longer counts against MaxWaiters (its goroutine may
	// still be waiting for the disk).
	if n := s.Stats().Waiters; n != 0 {
		t.Fatalf("%d waiters after the token waiter was cancelled", n)
	}
	// Another waits the bound out and gets B; the cancelled one stays silent.
	b := session(t, addr)
	b.send(acq(30, owner(3), 0, 30, "free-2"))
	b.expect(wire.TypeBusy, 30)
	w.expectNothing(500 * time.Millisecond)
	if st := s.Stats(); st.Cancelled != 1 || st.TokenUnavailable != 1 {
		t.Fatalf("cancelled %d token_unavailable %d, want 1 1", st.Cancelled, st.TokenUnavailable)
	}
}
