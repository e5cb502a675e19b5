package server_test

import (
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// guessFlood sends plain RELEASEs of key with the n tokens around (from
// around-n/2 on: the holder's token among them) on c, pipelined, and
// returns how many were answered R.
func guessFlood(t *testing.T, c *client, key string, around uint64, n int) int {
	t.Helper()
	from := around - uint64(n/2)
	for i := 1; i <= n; i++ {
		c.send(rel(uint32(i), from+uint64(i-1), key))
	}
	freed := 0
	for tok := 1; tok <= n; tok++ {
		switch r := c.recv(); {
		case r.ReqID != uint32(tok):
			t.Fatalf("guess %d: %s", tok, show(r))
		case r.Type == wire.TypeReleased:
			freed++
		case r.Type != wire.TypeNotHeld:
			t.Fatalf("guess %d: %s", tok, show(r))
		}
	}
	return freed
}

// heldBy checks that key is held: another owner's ACQUIRE with wait 0 gets T.
func heldBy(t *testing.T, c *client, key string) {
	t.Helper()
	c.send(acq(9999, owner(9999), 0, 30, key))
	c.expect(wire.TypeTimedOut, 9999)
}

// TestOwnedReleaseOnly: with Config.OwnedReleaseOnly, a lock granted on a
// version-2 session (at once, or handed to a waiter) survives a flood of
// plain RELEASEs guessing 1000 tokens around its own, from version-1 and version-2
// sessions, and even its holder's own U with the right token gets N; its
// holder's RELEASE_OWNED still gives R. A lock granted on a version-1
// session is freed by U with its token as before.
func TestOwnedReleaseOnly(t *testing.T) {
	s, addr := startServer(t, server.Config{OwnedReleaseOnly: true})
	v1 := session(t, addr)
	v2 := sessionV2(t, addr)
	atk1 := session(t, addr)
	atk2 := sessionV2(t, addr)
	other := session(t, addr)

	tok := v2.acquireOK(1, owner(1), 0, 30, "v2")
	if n := guessFlood(t, atk1, "v2", tok, 1000); n != 0 {
		t.Fatalf("v1 attacker freed the v2 holder's lock (%d R)", n)
	}
	if n := guessFlood(t, atk2, "v2", tok, 1000); n != 0 {
		t.Fatalf("v2 attacker freed the v2 holder's lock (%d R)", n)
	}
	v2.send(rel(2, tok, "v2")) // the right token, but U: N, still held
	v2.expect(wire.TypeNotHeld, 2)
	heldBy(t, other, "v2")
	v2.send(relOwned(3, tok, owner(2), "v2")) // the wrong owner
	v2.expect(wire.TypeNotHeld, 3)
	heldBy(t, other, "v2")

	// A v2 waiter handed the lock by that V is protected too.
	v2b := sessionV2(t, addr)
	v2b.send(acq(10, owner(10), 30, 30, "v2"))
	v2b.send(ping(11))
	v2b.expect(wire.TypePong, 11)
	v2.send(relOwned(4, tok, owner(1), "v2"))
	v2.expect(wire.TypeReleased, 4)
	g := v2b.expect(wire.TypeGranted, 10)
	if n := guessFlood(t, atk1, "v2", g.Token, 1000); n != 0 {
		t.Fatalf("attacker freed the v2 waiter's lock (%d R)", n)
	}
	heldBy(t, other, "v2")

	// A v1 waiter handed the lock by a V is released by U, as in version 1.
	v1.send(acq(20, owner(20), 30, 30, "v2"))
	v1.send(ping(21))
	v1.expect(wire.TypePong, 21)
	v2b.send(relOwned(12, g.Token, owner(10), "v2"))
	v2b.expect(wire.TypeReleased, 12)
	g = v1.expect(wire.TypeGranted, 20)
	v1.send(rel(22, g.Token, "v2"))
	v1.expect(wire.TypeReleased, 22)

	// A v1 holder: U with its token frees it, and so does a guess.
	tok1 := v1.acquireOK(30, owner(30), 0, 30, "v1")
	v1.send(rel(31, tok1, "v1"))
	v1.expect(wire.TypeReleased, 31)
	tok1 = v1.acquireOK(32, owner(30), 0, 30, "v1")
	if n := guessFlood(t, atk2, "v1", tok1, 1000); n != 1 {
		t.Fatalf("guesses freed a v1 holder's lock %d times, want 1 (protocol behaviour)", n)
	}
	if st := s.Stats(); st.HeldLocks != 0 || st.Waiters != 0 {
		t.Fatalf("held %d waiters %d, want 0 0", st.HeldLocks, st.Waiters)
	}
}

// TestOwnedReleaseOffByDefault: without Config.OwnedReleaseOnly the
// protocol's rule holds for every session: a plain RELEASE with the current
// token frees a lock granted on a version-2 session.
func TestOwnedReleaseOffByDefault(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	v2 := sessionV2(t, addr)
	atk := session(t, addr)
	tok := v2.acquireOK(1, owner(1), 0, 30, "v2")
	if n := guessFlood(t, atk, "v2", tok, 1000); n != 1 {
		t.Fatalf("guesses freed the v2 holder's lock %d times, want 1 (the protocol: U frees on the current token)", n)
	}
	tok = v2.acquireOK(2, owner(1), 0, 30, "v2")
	v2.send(rel(3, tok, "v2"))
	v2.expect(wire.TypeReleased, 3)
}
