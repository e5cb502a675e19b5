package server_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestTokensStartAtOneAndIncrease: a fresh server (default TokenStart)
// issues 1 first, as the protocol says; every grant, on any key, takes the
// next one.
func TestTokensStartAtOneAndIncrease(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	c := session(t, addr)
	var last uint64
	for i := uint32(1); i <= 5; i++ {
		tok := c.acquireOK(10+i, owner(int(i)), 0, 30, fmt.Sprint("k", i))
		if tok != last+1 {
			t.Fatalf("token %d after %d", tok, last)
		}
		last = tok
	}
}

func TestFIFOOrder(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	h := session(t, addr)
	tok := h.acquireOK(1, owner(0), 0, 30, "k")
	const n = 4
	ws := make([]*client, n)
	for i := range ws {
		ws[i] = session(t, addr)
		ws[i].send(acq(100, owner(i+1), 30, 30, "k"))
		eventually(t, "queued", func() bool { return s.Stats().Waiters == i+1 })
	}
	cur, relc := tok, h
	for i := range ws {
		relc.send(rel(50, cur, "k"))
		relc.expect(wire.TypeReleased, 50)
		g := ws[i].expect(wire.TypeGranted, 100)
		if g.Token <= cur {
			t.Fatalf("waiter %d token %d after %d", i, g.Token, cur)
		}
		cur, relc = g.Token, ws[i]
		for _, later := range ws[i+1:] {
			later.expectNothing(10 * time.Millisecond)
		}
	}
}

func TestWaitZeroOnHeldKeyIsT(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	a := session(t, addr)
	a.acquireOK(1, owner(1), 0, 30, "k")
	b := session(t, addr)
	b.send(acq(2, owner(2), 0, 30, "k"))
	b.expect(wire.TypeTimedOut, 2)
	if st := s.Stats(); st.Waiters != 0 || st.TimedOut != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestWaitTimeoutIsT(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	a := session(t, addr)
	a.acquireOK(1, owner(1), 0, 30, "k")
	b := session(t, addr)
	start := time.Now()
	b.send(acq(2, owner(2), 1, 30, "k"))
	b.expect(wire.TypeTimedOut, 2)
	if el := time.Since(start); el < 900*time.Millisecond || el > 4*time.Second {
		t.Fatalf("T after %v, want about 1s", el)
	}
	if s.Stats().Waiters != 0 {
		t.Fatal("waiter left behind")
	}
	// The key is still the holder's; a later release works.
}

// TestLeaseExpiryGrantsNextWaiter: the waiter is granted at the holder's
// lease end, pushed by the server (no request from anyone).
func TestLeaseExpiryGrantsNextWaiter(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	a := session(t, addr)
	start := time.Now()
	tok := a.acquireOK(1, owner(1), 0, 1, "k")
	b := session(t, addr)
	b.send(acq(2, owner(2), 10, 30, "k"))
	g := b.expect(wire.TypeGranted, 2)
	el := time.Since(start)
	if el < 900*time.Millisecond || el > 3*time.Second {
		t.Fatalf("granted after %v, want about 1s", el)
	}
	if g.Token <= tok || g.WaitedMS > uint32(el.Milliseconds()) || g.WaitedMS < 800 {
		t.Fatalf("grant %s after %v", show(g), el)
	}
	a.send(rel(3, tok, "k"))
	a.expect(wire.TypeNotHeld, 3)
}

func TestReleaseAfterExpiryIsNotHeld(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	a := session(t, addr)
	tok := a.acquireOK(1, owner(1), 0, 1, "k")
	time.Sleep(1100 * time.Millisecond)
	a.send(rel(2, tok, "k"))
	a.expect(wire.TypeNotHeld, 2)
}

func TestAcquireAfterExpirySeesFreeKey(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	a := session(t, addr)
	a.acquireOK(1, owner(1), 0, 1, "k")
	time.Sleep(1100 * time.Millisecond)
	b := session(t, addr)
	b.acquireOK(2, owner(2), 0, 30, "k")
	if st := s.Stats(); st.HeldLocks != 1 || st.Expired != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestExpiredLocksAreSwept: expired locks nobody touches stop counting as
// held (the sweeper), so gauges and capacity stay right.
func TestExpiredLocksAreSwept(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	a := session(t, addr)
	for i := uint32(0); i < 10; i++ {
		a.acquireOK(i, owner(1), 0, 1, fmt.Sprint("k", i))
	}
	if s.Stats().HeldLocks != 10 {
		t.Fatal("not held")
	}
	eventually(t, "swept", func() bool { return s.Stats().HeldLocks == 0 })
}

func TestReleaseByExactTokenFromAnotherSession(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	a := session(t, addr)
	tok := a.acquireOK(1, owner(1), 0, 30, "k")
	b := session(t, addr)
	b.send(rel(2, tok, "k"))
	b.expect(wire.TypeReleased, 2)
	a.send(rel(3, tok, "k"))
	a.expect(wire.TypeNotHeld, 3)
}

func TestReleaseWrongTokenIsNotHeld(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	a := session(t, addr)
	tok := a.acquireOK(1, owner(1), 0, 30, "k")
	for i, tc := range []struct {
		tok uint64
		key string
	}{{tok + 1, "k"}, {tok - 1, "k"}, {0, "k"}, {tok, "other"}} {
		a.send(rel(uint32(10+i), tc.tok, tc.key))
		a.expect(wire.TypeNotHeld, uint32(10+i))
	}
	a.send(rel(20, tok, "k")) // still held by tok
	a.expect(wire.TypeReleased, 20)
}

// TestOwnerRetryIsIdempotent: the holder's retry gets the same token and
// waited_ms 0, and does not extend the lease.
func TestOwnerRetryIsIdempotent(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	a := session(t, addr)
	tok := a.acquireOK(1, owner(1), 0, 1, "k")
	time.Sleep(500 * time.Millisecond)
	b := session(t, addr) // a retry may come on another session
	b.send(acq(2, owner(1), 5, 1, "k"))
	g := b.expect(wire.TypeGranted, 2)
	if g.Token != tok || g.WaitedMS != 0 {
		t.Fatalf("retry got %s, want token %d waited 0", show(g), tok)
	}
	if s.Stats().Grants != 1 {
		t.Fatal("a retry counted as a grant")
	}
	// The lease ends 1s after the first grant, not after the retry.
	time.Sleep(600 * time.Millisecond)
	c := session(t, addr)
	if tok2 := c.acquireOK(3, owner(2), 0, 30, "k"); tok2 <= tok {
		t.Fatalf("token %d", tok2)
	}
}

// TestOwnerAlreadyWaitingTakesOverPlace: our documented choice for an
// ACQUIRE by an owner that already waits for the key: the new request takes
// the old one's place in the queue, and the old one is answered T.
func TestOwnerAlreadyWaitingTakesOverPlace(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	h := session(t, addr)
	tok := h.acquireOK(1, owner(0), 0, 30, "k")
	a := session(t, addr)
	a.send(acq(2, owner(1), 30, 30, "k"))
	eventually(t, "queued", func() bool { return s.Stats().Waiters == 1 })
	c := session(t, addr)
	c.send(acq(3, owner(2), 30, 30, "k"))
	eventually(t, "queued", func() bool { return s.Stats().Waiters == 2 })

	b := session(t, addr)
	b.send(acq(4, owner(1), 30, 30, "k")) // owner 1 again
	a.expect(wire.TypeTimedOut, 2)
	if s.Stats().Waiters != 2 {
		t.Fatalf("waiters %d", s.Stats().Waiters)
	}
	h.send(rel(5, tok, "k"))
	h.expect(wire.TypeReleased, 5)
	b.expect(wire.TypeGranted, 4) // first place kept
	c.expectNothing(20 * time.Millisecond)
}

// TestWaitedMSRoundedDown: waited_ms is whole milliseconds since the ACQUIRE
// was read, rounded down (never more than the client could have measured).
func TestWaitedMSRoundedDown(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	a := session(t, addr)
	tok := a.acquireOK(1, owner(1), 0, 30, "k")
	b := session(t, addr)
	sent := time.Now()
	b.send(acq(2, owner(2), 5, 30, "k"))
	time.Sleep(300 * time.Millisecond)
	a.send(rel(3, tok, "k"))
	g := b.expect(wire.TypeGranted, 2)
	if el := time.Since(sent); g.WaitedMS < 300 || g.WaitedMS > uint32(el.Milliseconds()) {
		t.Fatalf("waited_ms %d, client measured %v", g.WaitedMS, el)
	}
}

// TestConcurrentMutualExclusion: many sessions contend for a few keys; the
// tokens each key is granted with strictly increase and no two holders
// overlap.
func TestConcurrentMutualExclusion(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	const sessions, rounds, keys = 8, 40, 3
	var mu sync.Mutex
	holder := map[string]int{}
	lastTok := map[string]uint64{}
	var wg sync.WaitGroup
	for i := 0; i < sessions; i++ {
		c := session(t, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				key := fmt.Sprint("k", (i+r)%keys)
				c.send(acq(uint32(r*2+10), owner(i*1000+r), 10, 30, key))
				resp, err := c.recvErr(15 * time.Second)
				if err != nil || resp.Type != wire.TypeGranted {
					t.Errorf("session %d: %v %v", i, show(resp), err)
					return
				}
				mu.Lock()
				if h, ok := holder[key]; ok {
					t.Errorf("key %s held by %d and %d", key, h, i)
				}
				if resp.Token <= lastTok[key] {
					t.Errorf("key %s token %d after %d", key, resp.Token, lastTok[key])
				}
				holder[key], lastTok[key] = i, resp.Token
				mu.Unlock()
				time.Sleep(100 * time.Microsecond) // "work" while holding
				mu.Lock()
				delete(holder, key)
				mu.Unlock()
				c.send(rel(uint32(r*2+11), resp.Token, key))
				if resp, err := c.recvErr(5 * time.Second); err != nil || resp.Type != wire.TypeReleased {
					t.Errorf("release: %v %v", show(resp), err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
