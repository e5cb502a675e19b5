package server

import (
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// BenchmarkTableCycle is the lock table's share of an uncontended cycle,
// without the network: ACQUIRE of a free key (G), then RELEASE (R), as a
// session's reader hands them to the scheduler, replies appended to the
// session's output. It compares scheduler versions (bench/ab.sh runs
// two builds against each other).
func BenchmarkTableCycle(b *testing.B) {
	s, err := New(Config{DataDir: b.TempDir(), TokenBlock: MaxTokenBlock}) // no reservation during the run
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if err := s.mode.(*standalone).tokens.await(tokenWait, nil); err != nil { // the first reservation
		b.Fatal(err)
	}
	a, p := net.Pipe()
	defer a.Close()
	defer p.Close()
	c := s.newConn(a, peerOf(a.RemoteAddr()))
	keys := make([][]byte, 64)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("bench-key-%d", i))
	}
	owner := [wire.OwnerLen]byte{1}
	// One request value for the whole run, as a session's reader has.
	var acq, rel wire.Request
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := keys[i%len(keys)]
		i++
		acq = wire.Request{Type: wire.TypeAcquire, ReqID: 1, Owner: owner, LeaseS: 30, Key: k}
		s.acquire(c, &acq, s.now())
		c.mu.Lock()
		for len(c.out) == 0 { // deferred: the next token block is being written
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
		if len(c.out) < 17 || c.out[4] != wire.TypeGranted {
			c.mu.Unlock()
			b.Fatalf("no G: %x", c.out)
		}
		tok := binary.BigEndian.Uint64(c.out[9:])
		c.out = c.out[:0]
		c.mu.Unlock()
		rel = wire.Request{Type: wire.TypeRelease, ReqID: 2, Owner: owner, Token: tok, Key: k}
		s.release(c, &rel, false)
		c.mu.Lock()
		if len(c.out) < 9 || c.out[4] != wire.TypeReleased {
			c.mu.Unlock()
			b.Fatalf("no R: %x", c.out)
		}
		c.out = c.out[:0]
		c.mu.Unlock()
	}
}
