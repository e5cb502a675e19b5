package server_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestCapacityMaxLocks: end to end, an ACQUIRE that would add a held lock
// beyond MaxLocks (counted over every shard) gets B; the holder's retry
// still gets G and wait_s 0 on a held key still T (the decisions:
// lockcore/testdata/capacity.txt).
func TestCapacityMaxLocks(t *testing.T) {
	s, addr := startServer(t, server.Config{MaxLocks: 2})
	c := session(t, addr)
	c.acquireOK(1, owner(1), 0, 30, "a")
	c.acquireOK(2, owner(2), 0, 30, "b")
	c.send(acq(3, owner(3), 5, 30, "c")) // would add a held lock
	c.expect(wire.TypeBusy, 3)
	c.acquireOK(4, owner(1), 0, 30, "a") // holder's retry: still G
	c.send(acq(5, owner(3), 0, 30, "a")) // wait 0 on a held key: still T
	c.expect(wire.TypeTimedOut, 5)
	// The retry is no new grant (Grants counts G with a new token).
	if st := s.Stats(); st.Busy != 1 || st.HeldLocks != 2 || st.Grants != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestCapacityMaxLocksCountsOnlyUnexpired: an expired lock frees capacity
// at once, even before the sweeper runs: at the bound, the driver sweeps
// every shard's core before the decision (a core alone counts an ended
// lease until something ends it: lockcore/testdata/capacity.txt). The fake
// clock moves past the lease without a sweep between.
func TestCapacityMaxLocksCountsOnlyUnexpired(t *testing.T) {
	clk := server.NewFakeClock()
	cfg := server.Config{MaxLocks: 1}
	server.SetClock(&cfg, clk)
	_, addr := startServer(t, cfg)
	c := session(t, addr)
	tok := c.acquireOK(1, owner(1), 0, 30, "a")
	c.send(rel(2, tok, "a"))
	c.expect(wire.TypeReleased, 2)
	c.acquireOK(3, owner(2), 0, 1, "b")
	clk.Advance(time.Second)
	c.acquireOK(4, owner(3), 0, 30, "c")
}

// TestCapacityMaxWaiters: MaxWaiters bounds the waiters of all keys
// together: the count is shared by every shard's core.
func TestCapacityMaxWaiters(t *testing.T) {
	_, addr := startServer(t, server.Config{MaxWaiters: 1})
	h := session(t, addr)
	h.acquireOK(1, owner(1), 0, 30, "k")
	h.acquireOK(2, owner(1), 0, 30, "j")
	c := session(t, addr)
	c.send(acq(3, owner(2), 30, 30, "k"))
	c.send(acq(4, owner(3), 30, 30, "j"))
	c.expect(wire.TypeBusy, 4)
	c.acquireOK(5, owner(1), 0, 30, "j")
	c.send(acq(6, owner(4), 0, 30, "j"))
	c.expect(wire.TypeTimedOut, 6)
}

func TestTooManySessions(t *testing.T) {
	_, addr := startServer(t, server.Config{MaxSessions: 2})
	a := session(t, addr)
	session(t, addr)
	c := dial(t, addr)
	c.send(helloReq(1, ""))
	c.expectError(wire.CodeTooManySession, 1)
	a.nc.Close()
	eventually(t, "a slot", func() bool {
		d := dial(t, addr)
		d.send(helloReq(1, ""))
		r, err := d.recvErr(5e9)
		return err == nil && r.Type == wire.TypeHelloOK
	})
}

// TestInvalidArgument: well-formed requests with out-of-range fields get
// E(4) with their req_id, and the session closes.
func TestInvalidArgument(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	for name, r := range map[string]wire.Request{
		"acquire key_len 0": acq(21, owner(1), 0, 30, ""),
		"acquire lease 0":   acq(21, owner(1), 0, 0, "k"),
		"acquire lease 251": acq(21, owner(1), 0, 251, "k"),
		"acquire lease 255": acq(21, owner(1), 0, 255, "k"),
		"release key_len 0": rel(21, 1, ""),
	} {
		t.Run(name, func(t *testing.T) {
			c := session(t, addr)
			c.send(r)
			c.expectError(wire.CodeInvalidArg, 21)
		})
	}
	// Boundaries that are fine.
	c := session(t, addr)
	c.acquireOK(1, owner(1), 255, 250, string(make([]byte, 255)))
	c.acquireOK(2, owner(1), 0, 1, "x")
}

// TestInvalidArgumentMessage: the E(4) text names the protocol's limits
// (the codec's MinKeyLen..MaxKeyLen and MinLeaseS..MaxLeaseS), on version 1
// and on version 2's RELEASE_OWNED.
func TestInvalidArgumentMessage(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	for _, tc := range []struct {
		name string
		v2   bool
		req  wire.Request
		want string
	}{
		{"acquire", false, acq(21, owner(1), 0, wire.MaxLeaseS+1, "k"), "key_len must be 1..255 and lease_s 1..250"},
		{"release", false, rel(21, 1, ""), "key_len must be 1..255"},
		{"release_owned", true, relOwned(21, 1, owner(1), ""), "key_len must be 1..255"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := session(t, addr)
			if tc.v2 {
				c = sessionV2(t, addr)
			}
			c.send(tc.req)
			r := c.recv()
			if r.Type != wire.TypeError || r.Code != wire.CodeInvalidArg || string(r.Msg) != tc.want {
				t.Fatalf("got %s, want E(4) %q", show(r), tc.want)
			}
		})
	}
}

// TestMalformed: structurally broken frames get E(1) (with the req_id when
// the body had at least 5 bytes), and the session closes.
func TestMalformed(t *testing.T) {
	_, addr := startServer(t, server.Config{})
	good, _ := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeAcquire, ReqID: 33, Owner: owner(1), WaitS: 0, LeaseS: 30, Key: []byte("key")})
	goodBody := good[4:]
	tests := []struct {
		name  string
		raw   []byte
		reqID uint32
	}{
		{"length 0", []byte{0, 0, 0, 0}, 0},
		{"length 1025", append(binary.BigEndian.AppendUint32(nil, 1025), make([]byte, 1025)...), 0},
		{"length 2^32-1", []byte{0xff, 0xff, 0xff, 0xff}, 0},
		{"body shorter than req_id", frame([]byte{'P', 0, 0, 0}), 0},
		{"type only", frame([]byte{'A'}), 0},
		{"unknown type", frame([]byte{'Z', 0, 0, 0, 33}), 33},
		{"server type from client", frame([]byte{'G', 0, 0, 0, 33}), 33},
		{"acquire truncated", frame(goodBody[:len(goodBody)-1]), 33},
		{"acquire too long", frame(append(append([]byte(nil), goodBody...), 0)), 33},
		{"acquire key past end", frame(append(append([]byte(nil), goodBody[:5+18]...), 200, 'k')), 33},
		{"ping with payload", frame([]byte{'P', 0, 0, 0, 33, 1}), 33},
		{"release short", frame([]byte{'U', 0, 0, 0, 33, 0, 0, 0}), 33},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := session(t, addr)
			c.sendRaw(tt.raw)
			c.expectError(wire.CodeMalformed, tt.reqID)
		})
	}
	t.Run("oversized before HELLO", func(t *testing.T) {
		c := dial(t, addr)
		c.sendRaw([]byte{0, 0, 4, 1})
		c.expectError(wire.CodeMalformed, 0)
	})
	t.Run("malformed HELLO", func(t *testing.T) {
		c := dial(t, addr)
		c.sendRaw(helloFrame(8, 1, "tok", []byte{9}))
		c.expectError(wire.CodeMalformed, 8)
	})
	t.Run("HELLO without version byte", func(t *testing.T) {
		c := dial(t, addr)
		c.sendRaw(frame([]byte{'H', 0, 0, 0, 8}))
		c.expectError(wire.CodeMalformed, 8)
	})
}
