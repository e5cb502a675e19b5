package server_test

// End-to-end tests of the lock semantics over TCP, one or a few per
// behaviour class, and what lies beyond the lock core (timers firing,
// sweeps, shards, counters). Every lock decision is lockcore's and is
// tested there, with a fake now, by the scripts in
// internal/lockcore/testdata (their README maps the tests that were here
// to the scripts that replaced them).

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestTokensStartAtOneAndIncrease: a fresh server (default TokenStart)
// issues token 1 first, as the protocol says; every grant, on any key, takes the
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

// TestFIFOOrder: end to end, each RELEASE hands the key to the oldest
// waiter, whichever session it waits on, and to no other. (The order
// itself is the core's: lockcore/testdata/handoff.txt.)
func TestFIFOOrder(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	h := session(t, addr)
	tok := h.acquireOK(1, owner(0), 0, 30, "k")
	const n = 4
	ws := make([]*client, n)
	for i := range ws {
		ws[i] = session(t, addr)
		ws[i].send(acq(100, owner(i+1), 30, 30, "k"))
		ws[i].send(ping(101))
		ws[i].expect(wire.TypePong, 101) // queued: its reader handled the ACQUIRE first
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

// TestWaitTimeoutIsT: the shard's timer, set at the waiter's deadline,
// answers T when wait_s has passed (on the fake clock: not 1 ns before,
// and by the time the clock has moved past it: before a PING sent then),
// leaves no waiter behind and the key with its holder. (When a wait ends
// is the core's: lockcore/testdata/handoff.txt.)
func TestWaitTimeoutIsT(t *testing.T) {
	clk := server.NewFakeClock()
	var cfg server.Config
	server.SetClock(&cfg, clk)
	s, addr := startServer(t, cfg)
	a := session(t, addr)
	tok := a.acquireOK(1, owner(1), 0, 30, "k")
	b := session(t, addr)
	b.send(acq(2, owner(2), 1, 30, "k"))
	b.send(ping(3))
	b.expect(wire.TypePong, 3) // queued

	clk.Advance(time.Second - 1)
	b.send(ping(4))
	b.expect(wire.TypePong, 4) // no T before the PONG
	clk.Advance(1)
	b.send(ping(5))
	b.expect(wire.TypeTimedOut, 2) // answered within Advance (the timer), not by a later sweep
	b.expect(wire.TypePong, 5)
	if st := s.Stats(); st.Waiters != 0 || st.TimedOut != 1 || st.HeldLocks != 1 {
		t.Fatalf("after the wait ended: %+v", st)
	}
	a.send(rel(2, tok, "k")) // still the holder's
	a.expect(wire.TypeReleased, 2)
}

// TestExpiredLocksAreSwept: expired locks nobody touches (no waiter, so no
// timer; no request) stop counting as held (the sweeper), so gauges and
// capacity stay right.
func TestExpiredLocksAreSwept(t *testing.T) {
	clk := server.NewFakeClock()
	var cfg server.Config
	server.SetClock(&cfg, clk)
	s, addr := startServer(t, cfg)
	a := session(t, addr)
	for i := uint32(0); i < 10; i++ {
		a.acquireOK(i, owner(1), 0, 1, fmt.Sprint("k", i))
	}
	if s.Stats().HeldLocks != 10 {
		t.Fatal("not held")
	}
	clk.Advance(time.Second)
	eventually(t, "swept", func() bool { return s.Stats().HeldLocks == 0 })
}

// TestReleaseWrongTokenIsNotHeld: end to end, RELEASE is N for any token
// or key but the holding's, and R for it (lockcore/testdata/release.txt).
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
