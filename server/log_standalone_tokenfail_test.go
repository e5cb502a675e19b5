package server_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestTokenStoreFailureIsE6: when the durable ceiling cannot be raised, a
// grant that needs a new token gets E(6) with its req_id (direct or queued),
// the session closes, the key is left free rather than stuck, other sessions
// go on, and once the disk recovers grants resume with higher tokens.
func TestTokenStoreFailureIsE6(t *testing.T) {
	dir := t.TempDir()
	s, addr := startServer(t, server.Config{DataDir: dir, TokenBlock: 4})
	// A directory where the temporary ceiling file goes makes every
	// reservation fail, even for root.
	tmp := filepath.Join(dir, "tokens.ceiling.tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	a := session(t, addr)
	var first, last uint64
	for i := range 4 { // the first block: tokens first..first+3
		last = a.acquireOK(uint32(10+i), owner(1), 0, 30, string(rune('a'+i)))
		if i == 0 {
			first = last
		}
	}
	if last != first+3 {
		t.Fatalf("token %d, want %d", last, first+3)
	}

	// Queued grant: "a" is released, its waiter needs token first+4.
	w := session(t, addr)
	w.send(acq(2, owner(2), 30, 30, "a"))
	eventually(t, "waiter", func() bool { return s.Stats().Waiters == 1 })
	a.send(rel(20, first, "a"))
	a.expect(wire.TypeReleased, 20)
	w.expectError(wire.CodeInternal, 2)

	// Direct grant.
	b := session(t, addr)
	b.send(acq(3, owner(3), 0, 30, "a")) // "a" is free, not stuck
	b.expectError(wire.CodeInternal, 3)

	// The holder's retry needs no token and other sessions are unaffected.
	a.send(acq(21, owner(1), 0, 30, "b"))
	if g := a.expect(wire.TypeGranted, 21); g.Token != first+1 || g.WaitedMS != 0 {
		t.Fatalf("retry: %s", show(g))
	}
	a.send(ping(22))
	a.expect(wire.TypePong, 22)
	if st := s.Stats(); st.HeldLocks != 3 || st.Waiters != 0 {
		t.Fatalf("held %d waiters %d, want 3 and 0", st.HeldLocks, st.Waiters)
	}

	// The disk recovers.
	if err := os.Remove(tmp); err != nil {
		t.Fatal(err)
	}
	c := session(t, addr)
	if tok := c.acquireOK(2, owner(4), 0, 30, "a"); tok <= last {
		t.Fatalf("token %d after the failure, want above %d", tok, last)
	}
}
