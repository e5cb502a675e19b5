package server_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestStalledReaderDoesNotStallOthers: a peer that floods requests and never
// reads its replies is dropped when its output buffer overflows; other
// sessions, including ones whose grants are pushed by that peer's releases,
// keep their latency.
func TestStalledReaderDoesNotStallOthers(t *testing.T) {
	s, addr := startServer(t, server.Config{OutputBuffer: 64 << 10, WriteTimeout: 500 * time.Millisecond})
	flood := session(t, addr)
	good := session(t, addr)

	// The flooder holds a key the good session waits for.
	tok := flood.acquireOK(1, owner(1), 0, 30, "shared")
	good.send(acq(100, owner(2), 30, 30, "shared"))
	eventually(t, "waiter", func() bool { return s.Stats().Waiters == 1 })

	var stop atomic.Bool
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		var batch []byte
		for i := uint32(0); i < 512; i++ {
			r := ping(1000 + i)
			batch, _ = wire.AppendRequest(batch, &r)
		}
		relFrame, _ := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeRelease, ReqID: 2, Token: tok, Key: []byte("shared")})
		flood.nc.Write(relFrame) // pushes a grant to the good session
		for !stop.Load() {
			flood.nc.SetWriteDeadline(time.Now().Add(2 * time.Second))
			if _, err := flood.nc.Write(batch); err != nil {
				return // dropped by the server
			}
		}
	}()
	defer func() { stop.Store(true); <-floodDone }()

	g := good.expect(wire.TypeGranted, 100)
	for i := uint32(0); i < 200; i++ {
		start := time.Now()
		good.send(ping(i))
		good.expect(wire.TypePong, i)
		if el := time.Since(start); el > time.Second {
			t.Fatalf("ping took %v while another session stalls", el)
		}
	}
	good.send(rel(101, g.Token, "shared"))
	good.expect(wire.TypeReleased, 101)
	select {
	case <-floodDone:
	case <-time.After(10 * time.Second):
		t.Fatal("flooding session was not dropped")
	}
	eventually(t, "flooder gone", func() bool { return s.Stats().Sessions == 1 })
}

// TestOutputBufferOverflowDropsSession: replies beyond OutputBuffer that
// have not been written drop the session (here: a pipeline whose replies
// are queued faster than they are flushed, with a tiny buffer).
func TestOutputBufferOverflowDropsSession(t *testing.T) {
	s, addr := startServer(t, server.Config{OutputBuffer: 40})
	c := session(t, addr)
	var batch []byte
	for i := uint32(0); i < 20; i++ {
		r := ping(10 + i)
		batch, _ = wire.AppendRequest(batch, &r)
	}
	c.sendRaw(batch)
	got := 0
	for {
		r, err := c.recvErr(5 * time.Second)
		if err != nil {
			break
		}
		if r.Type != wire.TypePong {
			t.Fatalf("got %s", show(r))
		}
		got++
	}
	if got >= 20 {
		t.Fatal("all replies delivered despite the overflow")
	}
	eventually(t, "session dropped", func() bool { return s.Stats().Sessions == 0 })
	// Other sessions are unaffected.
	d := session(t, addr)
	d.send(ping(1))
	d.expect(wire.TypePong, 1)
}
