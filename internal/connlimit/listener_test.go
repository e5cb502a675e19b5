package connlimit

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestListener: over real sockets, a Listener admits connections up to the
// per-source limit, closes the next one at once (Accept never returns
// it), and admits again once an admitted connection is closed.
func TestListener(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGate(4, 2, 0)
	refused := make(chan Refusal, 10)
	ln := NewListener(raw, g, func(_ net.Conn, why Refusal) { refused <- why })
	defer ln.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	var server []net.Conn
	for range 2 {
		dial()
		server = append(server, <-accepted)
	}
	c := dial()
	if why := <-refused; why != SourceFull {
		t.Fatalf("third connection from one source: refusal %d, want SourceFull", why)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("refused connection: read error %v, want it closed", err)
	}
	if sh, _ := g.InUse(); sh != 2 {
		t.Fatalf("shared slots in use %d, want 2", sh)
	}
	server[0].Close()
	server[0].Close() // a second Close gives nothing back twice
	if sh, _ := g.InUse(); sh != 1 {
		t.Fatalf("after a close: shared slots in use %d, want 1", sh)
	}
	dial()
	server = append(server, <-accepted)
	g.SetMembers(map[netip.Addr]struct{}{})
	for _, s := range server[1:] {
		s.Close()
	}
	if sh, m := g.InUse(); sh != 0 || m != 0 {
		t.Fatalf("slots in use after every close: shared %d, member %d", sh, m)
	}
	ln.Close()
	for range accepted {
	}
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && !oe.Timeout()
}
