package server_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// stalledDisk is a ceiling writer that blocks every reservation after the
// first (the one New makes) until unfreeze is called: a frozen data dir.
type stalledDisk struct {
	calls    atomic.Int32
	entered  chan struct{} // closed when a reservation is stuck
	thaw     chan struct{}
	thawOnce sync.Once
	thawed   atomic.Bool
}

func freezeDisk(t *testing.T) *stalledDisk {
	d := &stalledDisk{entered: make(chan struct{}), thaw: make(chan struct{})}
	restore := server.SetCeilingWriter(func(dir string, v uint64) error {
		if d.calls.Add(1) == 2 {
			close(d.entered)
		}
		if d.calls.Load() > 1 {
			<-d.thaw
		}
		return server.WriteCeiling(dir, v)
	})
	t.Cleanup(restore)
	return d
}

func (d *stalledDisk) unfreeze() {
	d.thawOnce.Do(func() {
		d.thawed.Store(true)
		close(d.thaw)
	})
}

// TestTokenStallDoesNotStallLockTable: while the disk stalls a ceiling
// reservation past the reserved block, no shard mutex is held waiting for
// it. RELEASEs on the very keys whose ACQUIREs are waiting for a token, the
// holder's retry, PING and a release with a waiter are answered while the
// disk is still frozen; the waiting ACQUIREs get B after the bound (their
// sessions stay open), the hand-off to a waiter gets B instead of blocking,
// the store reports itself stalled, and once the disk thaws grants resume
// above every earlier token.
func TestTokenStallDoesNotStallLockTable(t *testing.T) {
	disk := freezeDisk(t)
	s, addr := startServer(t, server.Config{TokenBlock: 4})
	t.Cleanup(disk.unfreeze) // before the server's Close (cleanups run last first)
	a := session(t, addr)
	var first uint64
	for i := range 4 { // tokens first..first+3; the reservation of the next four sticks
		tok := a.acquireOK(uint32(10+i), owner(1), 0, 30, string(rune('a'+i)))
		if i == 0 {
			first = tok
		}
		if tok != first+uint64(i) {
			t.Fatalf("token %d, want %d", tok, first+uint64(i))
		}
	}
	<-disk.entered

	// A waiter on "a", whose hand-off will find no token.
	w := session(t, addr)
	w.send(acq(2, owner(2), 30, 30, "a"))
	eventually(t, "waiter", func() bool { return s.Stats().Waiters == 1 })

	// ACQUIREs of free keys, each on its own session, now wait for a token.
	const n = 8
	keys := make([]string, n)
	bs := make([]*client, n)
	for i := range bs {
		keys[i] = "free-" + string(rune('a'+i))
		bs[i] = session(t, addr)
		bs[i].send(acq(5, owner(100+i), 0, 30, keys[i]))
	}

	// Meanwhile, on another session: wrong-token RELEASEs of those very
	// keys (their shards), the holder's retry, PING, and the release of a
	// key with a waiter.
	c := session(t, addr)
	for i, k := range keys {
		c.send(rel(uint32(100+i), 12345, k))
		c.expect(wire.TypeNotHeld, uint32(100+i))
	}
	a.send(acq(20, owner(1), 0, 30, "b"))
	if g := a.expect(wire.TypeGranted, 20); g.Token != first+1 {
		t.Fatalf("holder retry: %s", show(g))
	}
	a.send(ping(21))
	a.expect(wire.TypePong, 21)
	a.send(rel(22, first, "a"))
	a.expect(wire.TypeReleased, 22)
	w.expect(wire.TypeBusy, 2) // the hand-off did not wait for the disk
	if disk.thawed.Load() {
		t.Fatal("answers came only after the disk thawed")
	}

	// The waiting ACQUIREs get B (definitely not granted) after the bound;
	// their sessions stay open.
	for _, b := range bs {
		b.expect(wire.TypeBusy, 5)
		b.send(ping(6))
		b.expect(wire.TypePong, 6)
	}
	st := s.Stats()
	if st.TokenUnavailable < n+1 || st.Busy < st.TokenUnavailable {
		t.Fatalf("token_unavailable %d busy %d, want >= %d", st.TokenUnavailable, st.Busy, n+1)
	}
	if err := s.TokenStoreErr(); err == nil || st.TokenStoreError == "" {
		t.Fatalf("TokenStoreErr %v / %q while a reservation is stuck past the bound", err, st.TokenStoreError)
	}
	if st.LastToken > st.TokenCeiling {
		t.Fatalf("last_token %d above token_ceiling %d", st.LastToken, st.TokenCeiling)
	}
	if disk.thawed.Load() {
		t.Fatal("disk thawed early")
	}

	disk.unfreeze()
	eventually(t, "store healthy", func() bool { return s.TokenStoreErr() == nil })
	if tok := c.acquireOK(200, owner(9), 0, 30, keys[0]); tok <= first+3 {
		t.Fatalf("token %d after the stall, want above %d", tok, first+3)
	}
	if errors.Is(s.TokenStoreErr(), server.ErrTokensExhausted) {
		t.Fatal("exhausted")
	}
}

// TestCloseWithStalledDisk: Close returns although a ceiling reservation is
// stuck on the disk, and the data dir stays locked until that write ends (a
// new server on it could otherwise see its ceiling overwritten later).
func TestCloseWithStalledDisk(t *testing.T) {
	disk := freezeDisk(t)
	dir := t.TempDir()
	s, addr := startServer(t, server.Config{DataDir: dir, TokenBlock: 4})
	t.Cleanup(disk.unfreeze)
	a := session(t, addr)
	for i := range 3 { // token 3 starts the reservation of the next block
		a.acquireOK(uint32(10+i), owner(1), 0, 30, string(rune('a'+i)))
	}
	<-disk.entered
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(20 * time.Second): // a hang guard, not a speed assertion
		t.Fatal("Close hangs on a stalled disk")
	}
	if disk.thawed.Load() {
		t.Fatal("disk thawed before Close returned")
	}
	if _, err := server.New(server.Config{DataDir: dir}); err == nil {
		t.Fatal("data dir reopened while a ceiling write of the closed server is pending")
	}
	disk.unfreeze()
	eventually(t, "data dir unlocked", func() bool {
		s2, err := server.New(server.Config{DataDir: dir})
		if err == nil {
			s2.Close()
		}
		return err == nil
	})
}

// TestTokenWaitOffReader: an ACQUIRE whose free key finds no token waits
// for the reservation off the session's reader, so a PING, a RELEASE and a
// holder's retry sent after it on the SAME session are answered first,
// while it still waits; it then gets B. Its req_id stays in flight: reusing
// it meanwhile is E(1). A session that closes while an ACQUIRE of it waits
// for a token ends that wait (goleak and Close would see it otherwise).
func TestTokenWaitOffReader(t *testing.T) {
	disk := freezeDisk(t)
	s, addr := startServer(t, server.Config{TokenBlock: 4})
	t.Cleanup(disk.unfreeze)
	a := session(t, addr)
	var first uint64
	for i := range 4 { // tokens first..first+3; the reservation of the next four sticks
		tok := a.acquireOK(uint32(10+i), owner(1), 0, 30, string(rune('a'+i)))
		if i == 0 {
			first = tok
		}
	}
	<-disk.entered

	a.send(acq(30, owner(2), 0, 30, "free"))
	a.send(ping(31))
	a.send(rel(32, first, "a"))
	a.send(acq(33, owner(1), 0, 30, "b"))
	a.expect(wire.TypePong, 31)
	a.expect(wire.TypeReleased, 32)
	if g := a.expect(wire.TypeGranted, 33); g.Token != first+1 {
		t.Fatalf("holder retry: %s", show(g))
	}
	if disk.thawed.Load() {
		t.Fatal("disk thawed early")
	}
	a.expect(wire.TypeBusy, 30)
	a.send(ping(34))
	a.expect(wire.TypePong, 34)

	// The req_id of an ACQUIRE waiting for a token is still awaited.
	b := session(t, addr)
	b.send(acq(40, owner(3), 0, 30, "free-2"))
	b.send(acq(40, owner(3), 0, 30, "free-3"))
	b.expectError(wire.CodeMalformed, 40)

	// A session closing during the wait.
	c := session(t, addr)
	c.send(acq(50, owner(4), 0, 30, "free-4"))
	c.send(ping(51))
	c.expect(wire.TypePong, 51)
	c.nc.Close()
	eventually(t, "session closed", func() bool { return s.Stats().Sessions == 1 })
}

// TestTokenWaitersBounded: ACQUIREs of free keys waiting for a token count
// against MaxWaiters, so a session pipelining them on a stalled disk cannot
// start goroutines without bound: beyond the limit they get B at once (the
// session lives on), and the waiters count goes back to 0 afterwards.
func TestTokenWaitersBounded(t *testing.T) {
	disk := freezeDisk(t)
	s, addr := startServer(t, server.Config{TokenBlock: 4, MaxWaiters: 5})
	t.Cleanup(disk.unfreeze)
	a := session(t, addr)
	for i := range 4 { // the first block's four tokens; the reservation of the next four sticks
		a.acquireOK(uint32(10+i), owner(1), 0, 30, string(rune('a'+i)))
	}
	<-disk.entered
	for i := range 20 {
		a.send(acq(uint32(100+i), owner(10+i), 0, 30, "free-"+string(rune('a'+i))))
	}
	// The first five wait for a token; the other fifteen are refused at
	// once, while the five are still waiting.
	for i := 5; i < 20; i++ {
		a.expect(wire.TypeBusy, uint32(100+i))
	}
	if w := s.Stats().Waiters; w != 5 {
		t.Fatalf("%d waiters while five ACQUIREs wait for a token, want 5", w)
	}
	got := map[uint32]bool{} // after tokenWait, still no token: B, in any order
	for range 5 {
		r := a.recv()
		if r.Type != wire.TypeBusy || r.ReqID < 100 || r.ReqID >= 105 || got[r.ReqID] {
			t.Fatalf("got %s, want B for one of the five waiting ACQUIREs", show(r))
		}
		got[r.ReqID] = true
	}
	a.send(ping(200))
	a.expect(wire.TypePong, 200)
	if w := s.Stats().Waiters; w != 0 {
		t.Fatalf("%d waiters after the token waits ended", w)
	}
}
