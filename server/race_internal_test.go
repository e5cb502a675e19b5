package server

// White-box tests for races that a black-box test cannot hit on demand
// (the black-box suite is cmd/ticketingd/conformance_test.go; the clock
// edges of lock decisions are lockcore's scripts, with a fake now).

import (
	"bytes"
	"net"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
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
