package server

import (
	"bytes"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// TestLateWaiterGetsT: when a key frees after a waiter's wait ran out but
// before its timer could answer it (a stalled process: SIGSTOP, a long GC
// pause, a contended shard), the waiter gets T, never G: its client has
// given up, and a grant would leave the key held by nobody for a lease.
// The shard mutex held by the test is the stall: the wait timer fires but
// cannot run.
func TestLateWaiterGetsT(t *testing.T) {
	s := newTestServer(t)
	holder, late, onTime := pipeConn(t, s), pipeConn(t, s), pipeConn(t, s)
	key := []byte("k")
	s.acquire(holder, &wire.Request{Type: wire.TypeAcquire, ReqID: 1, Owner: [16]byte{1}, LeaseS: 30, Key: key}, s.now())
	// Its 1 s wait began 950 ms ago: it ends in 50 ms.
	s.acquire(late, &wire.Request{Type: wire.TypeAcquire, ReqID: 2, Owner: [16]byte{2}, WaitS: 1, LeaseS: 30, Key: key}, s.now()-int64(950*time.Millisecond))
	s.acquire(onTime, &wire.Request{Type: wire.TypeAcquire, ReqID: 3, Owner: [16]byte{3}, WaitS: 30, LeaseS: 30, Key: key}, s.now())

	sh := s.shardFor(key)
	sh.mu.Lock()
	time.Sleep(150 * time.Millisecond)           // past the late waiter's deadline
	s.freeLocked(sh, sh.m[string(key)], s.now()) // the holder's release, handled late
	sh.mu.Unlock()

	if got, want := late.queued(), wire.AppendSimple(nil, wire.TypeTimedOut, 2); !bytes.Equal(got, want) {
		t.Fatalf("late waiter got %x, want T %x", got, want)
	}
	if got := onTime.queued(); len(got) < 5 || got[4] != wire.TypeGranted {
		t.Fatalf("next waiter got %x, want G", got)
	}
	time.Sleep(20 * time.Millisecond) // let the late waiter's timer run: no second answer
	if got, want := late.queued(), wire.AppendSimple(nil, wire.TypeTimedOut, 2); !bytes.Equal(got, want) {
		t.Fatalf("late waiter got %x after its timer ran, want only T", got)
	}
	if st := s.Stats(); st.TimedOut != 1 || st.Waiters != 0 || st.HeldLocks != 1 {
		t.Fatalf("stats %+v", st)
	}
}
