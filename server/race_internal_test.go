package server

// White-box tests for races and clock edges that a black-box test cannot
// hit on demand (the black-box suite is cmd/ticketingd/conformance_test.go).

import (
	"bytes"
	"math"
	"net"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

func newTestServer(t *testing.T) *Server {
	t.Helper()
	s, err := New(Config{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func pipeConn(t *testing.T, s *Server) *conn {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return s.newConn(a, peerOf(a.RemoteAddr()))
}

func (c *conn) queued() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.out...)
}

// TestHelloAfterShutdownE5 is the race of a HELLO read just before Shutdown
// queues E(5) on the connection and handled just after: the session must
// not open, and no HELLO_OK may follow the session-fatal E(5).
func TestHelloAfterShutdownE5(t *testing.T) {
	s := newTestServer(t)
	c := pipeConn(t, s)
	e5 := wire.AppendError(nil, 0, wire.CodeShuttingDown, "shutting down")
	c.closeWith(e5) // Shutdown got there first
	body := []byte{wire.TypeHello, 0, 0, 0, 1, 1, 0, 0}
	var req wire.Request
	if c.hello(body, &req) {
		t.Fatal("HELLO opened a session on a closing connection")
	}
	if got := c.queued(); !bytes.Equal(got, e5) {
		t.Fatalf("queued %x, want only E(5) %x", got, e5)
	}
	if n := s.sessions.Load(); n != 0 {
		t.Fatalf("sessions = %d after a refused HELLO", n)
	}
}

// TestWaitCountsFromArrival: wait_s runs from when the ACQUIRE was read,
// not from when it got into the queue (a capacity sweep or a contended
// shard may lie in between).
func TestWaitCountsFromArrival(t *testing.T) {
	s := newTestServer(t)
	holder, waiter := pipeConn(t, s), pipeConn(t, s)
	s.acquire(holder, &wire.Request{Type: wire.TypeAcquire, ReqID: 1, Owner: [16]byte{1}, LeaseS: 30, Key: []byte("k")}, s.now())
	if q := holder.queued(); len(q) == 0 || q[4] != wire.TypeGranted {
		t.Fatalf("holder got %x", q)
	}
	arrived := s.now() - int64(900*time.Millisecond) // read 900 ms ago
	s.acquire(waiter, &wire.Request{Type: wire.TypeAcquire, ReqID: 2, Owner: [16]byte{2}, WaitS: 1, LeaseS: 30, Key: []byte("k")}, arrived)
	want := wire.AppendSimple(nil, wire.TypeTimedOut, 2)
	deadline := time.Now().Add(600 * time.Millisecond)
	for !bytes.Equal(waiter.queued(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no T 700 ms after a 1 s wait began (queued %x)", waiter.queued())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWaitedMSSaturates: waited_ms is a u32; a (pathological) wait past
// 49.7 days must not wrap to a small number.
func TestWaitedMSSaturates(t *testing.T) {
	day := int64(24 * time.Hour)
	for _, tc := range []struct {
		now, arrived int64
		want         uint32
	}{
		{0, 5, 0},
		{int64(1999999 * time.Microsecond), 0, 1999}, // rounded down
		{50 * day, 0, math.MaxUint32},
		{math.MaxInt64, 0, math.MaxUint32},
	} {
		if got := lockcore.WaitedMS(tc.now, tc.arrived); got != tc.want {
			t.Errorf("waitedMS(%d, %d) = %d, want %d", tc.now, tc.arrived, got, tc.want)
		}
	}
}
