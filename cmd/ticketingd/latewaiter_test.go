package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// TestStalledServerLateWaitersGetT: a server process that stalls (SIGSTOP
// here; a long GC pause or an overloaded host in production) past both its
// waiters' waits and the holder's lease answers every waiter T once it runs
// again, never G: those clients gave up at the end of their wait, and a
// grant to one of them would leave the key held by nobody for a whole lease.
// The real binary, raw frames (the in-process counterpart
// is server.TestLateWaiterGetsT).
func TestStalledServerLateWaitersGetT(t *testing.T) {
	t.Parallel()
	// Several keys, so that the old behaviour shows on each (a key's first
	// late waiter got G and held it; the ones behind it then got T), and
	// two waiters per key, so that a late waiter behind a late waiter is
	// covered too.
	const (
		keys   = 5
		perKey = 2
		stall  = 2500 * time.Millisecond // past the 1 s waits and the 2 s lease
	)
	key := func(k int) string { return fmt.Sprintf("late-%d", k) }
	s := startConf(t)
	var ws []*raw
	owner := byte(1)
	for k := range keys {
		h := openConf(t, s.addr)
		h.send(acqF(t, 2, owner, 0, 2, key(k))) // holder: lease 2 s
		h.expectG(2)
		owner++
		for range perKey {
			w := openConf(t, s.addr)
			w.send(acqF(t, 2, owner, 1, 2, key(k))) // wait 1 s, lease 2 s
			w.sync(3)                               // the ACQUIRE is queued
			ws = append(ws, w)
			owner++
		}
	}

	proc := s.sp.cmd.Process
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(stall)
	if err := proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}

	granted := 0
	for i, w := range ws {
		f := w.next()
		switch {
		case bytes.Equal(f, x(t, simpleHex('T', 2))):
		case len(f) == 21 && f[4] == 'G':
			granted++
			t.Logf("waiter %d: G token %d waited_ms %d", i, binary.BigEndian.Uint64(f[9:17]), binary.BigEndian.Uint32(f[17:21]))
		default:
			t.Fatalf("waiter %d: got frame %x, want T for req 2", i, f)
		}
	}
	t.Logf("after a %v stall: %d of %d waiters with a 1 s wait got G", stall, granted, len(ws))
	if granted != 0 {
		t.Errorf("%d of %d waiters whose wait had run out got G, want T for all", granted, len(ws))
	}
	// Nobody holds the keys: a fresh ACQUIRE that does not wait gets each.
	n := openConf(t, s.addr)
	for k := range keys {
		n.send(acqF(t, uint32(2+k), 0xff, 0, 2, key(k)))
		if f := n.next(); len(f) != 21 || f[4] != 'G' {
			t.Errorf("fresh ACQUIRE wait 0 of %s after the stall: got frame %x, want G (the key should be free)", key(k), f)
		}
	}
}
