package server_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// BenchmarkPairCycle: the cost of the pair's synchronous replication.
// Uncontended ACQUIRE+RELEASE cycles, one key per client, 64 raw clients
// over loopback, against a standalone server and against the active node
// of a pair replicating to its passive (every reply waits for the
// passive's acknowledgement), in one run:
//
//	go test -run '^$' -bench BenchmarkPairCycle -count 6 ./server
//
// Compare the two sub-benchmarks' ns/op (pair/standalone is the ratio).
func BenchmarkPairCycle(b *testing.B) {
	b.Run("standalone", func(b *testing.B) {
		_, addr := startServer(b, server.Config{})
		benchCycles(b, addr, wire.RoleStandalone)
	})
	b.Run("pair", func(b *testing.B) {
		addr := benchPair(b)
		benchCycles(b, addr, wire.RoleActive)
	})
}

// benchPair starts a pair and returns the active's client address once it
// replicates.
func benchPair(b *testing.B) string {
	b.Helper()
	_, addr := benchPairServer(b)
	return addr
}

// benchPairServer is benchPair with the active's Server.
func benchPairServer(b *testing.B) (*server.Server, string) {
	b.Helper()
	pa, ba := pairAddrsTB(b)
	start := func(role server.PairRole, self, peer string) (*server.Server, string) {
		ln := listen(b)
		s, err := server.New(server.Config{DataDir: b.TempDir(), Pair: &server.PairConfig{Role: role, Peer: peer, Listen: self,
			Advertise: ln.Addr().String(), Heartbeat: pairHB}})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Serve(ln) }()
		b.Cleanup(func() { s.Close(); <-done })
		return s, ln.Addr().String()
	}
	p, addr := start(server.PairPrimary, pa, ba)
	q, _ := start(server.PairBackup, ba, pa)
	// The primary serves after its start guard; a HELLO makes it serve.
	eventually(b, "the primary serving", func() bool {
		c := dial(b, addr)
		defer c.nc.Close()
		c.send(helloReq(1, ""))
		return c.recv().Type == wire.TypeHelloOK
	})
	eventually(b, "the pair replicating", func() bool {
		ps, _ := p.PairStatus()
		qs, _ := q.PairStatus()
		return ps.Replicating && qs.HasState
	})
	return p, addr
}

// benchCycles runs the uncontended cycle loop of 64 clients against addr,
// whose HELLO_OK carries role.
func benchCycles(b *testing.B, addr string, role uint8) {
	const clients = 64
	b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
	var id atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := dial(b, addr)
		c.send(helloReq(1, ""))
		if r := c.recv(); r.Type != wire.TypeHelloOK || r.Role != role {
			b.Errorf("HELLO: %s, want HELLO_OK role %d", show(r), role)
			return
		}
		c.nc.SetReadDeadline(time.Time{})
		n := id.Add(1)
		key := []byte(fmt.Sprintf("bench-key-%d", n))
		acqF, _ := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeAcquire, ReqID: 2, Owner: owner(int(n)), LeaseS: 30, Key: key})
		relF := make([]byte, 0, 64)
		var resp wire.Response
		for pb.Next() {
			c.nc.Write(acqF)
			body, err := c.fr.Next()
			if err != nil || wire.DecodeResponse(body, &resp) != nil || resp.Type != wire.TypeGranted {
				b.Errorf("acquire: %v %c", err, resp.Type)
				return
			}
			relF, _ = wire.AppendRequest(relF[:0], &wire.Request{Type: wire.TypeRelease, ReqID: 3, Token: resp.Token, Key: key})
			c.nc.Write(relF)
			body, err = c.fr.Next()
			if err != nil || wire.DecodeResponse(body, &resp) != nil || resp.Type != wire.TypeReleased {
				b.Errorf("release: %v %c", err, resp.Type)
				return
			}
		}
	})
}
