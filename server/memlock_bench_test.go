package server_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// Heap bytes per held lock, per mode: go test -run '^$' -bench
// BenchmarkHeldLockMemory -benchtime=1x ./server/ (TICKETING_BENCH_LOCKS
// sets how many locks, default 200,000). Reported metrics:
//
//	standalone-B/lock  heap growth of a standalone server holding N locks
//	leader-B/lock      a cluster leader's share: total growth minus two followers'
//	follower-B/lock    what closing one follower frees (its state machine and stores)
//
// All three are live heap after a GC (runtime.MemStats.HeapAlloc), not
// RSS: the Go runtime's RSS is about live heap plus GOGC slack (up to
// twice the live heap between collections with the default GOGC=100).
// Keys are "lock-key-<i>" (14–16 bytes), lease 250 s, one owner per session.
func BenchmarkHeldLockMemory(b *testing.B) {
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("TICKETING_BENCH_LOCKS")); err == nil && v > 0 {
		n = v
	}
	b.Run("standalone", func(b *testing.B) {
		for range b.N {
			h0 := liveHeap()
			s, addr := startServer(b, server.Config{DataDir: b.TempDir()})
			holdLocks(b, addr, n)
			if st := s.Stats(); st.HeldLocks != n {
				b.Fatalf("held %d, want %d", st.HeldLocks, n)
			}
			b.ReportMetric(float64(liveHeap()-h0)/float64(n), "standalone-B/lock")
			runtime.KeepAlive(s)
			s.Close()
		}
	})
	b.Run("cluster", func(b *testing.B) {
		for range b.N {
			h0 := liveHeap()
			nodes, leader := startBenchCluster(b)
			holdLocks(b, nodes[leader].addr, n)
			deadline := time.Now().Add(time.Minute)
			for i, nd := range nodes { // every node has applied every grant
				for st := nd.s.Stats(); st.HeldLocks != n; st = nd.s.Stats() {
					if time.Now().After(deadline) {
						b.Fatalf("node %d (%s) holds %d locks, want %d", i, st.Role, st.HeldLocks, n)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			h1 := liveHeap()
			if path := os.Getenv("TICKETING_BENCH_HEAPPROFILE"); path != "" {
				writeHeapProfile(b, path)
			}
			f := (leader + 1) % len(nodes)
			nodes[f].close()
			h2 := liveHeap()
			follower := h1 - h2
			b.ReportMetric(float64(follower)/float64(n), "follower-B/lock")
			b.ReportMetric(float64(h1-h0-2*follower)/float64(n), "leader-B/lock")
			for _, nd := range nodes {
				nd.close()
			}
		}
	})
}

// liveHeap is the live heap after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// holdLocks acquires n distinct keys (lease 250 s) on addr, pipelined over
// four sessions, and keeps them held.
func holdLocks(b testing.TB, addr string, n int) {
	b.Helper()
	const conns, window = 4, 512
	var wg sync.WaitGroup
	for ci := range conns {
		c := dial(b, addr)
		c.send(wire.Request{Type: wire.TypeHello, ReqID: 0, Version: wire.Version2})
		c.expect(wire.TypeHelloOK, 0)
		c.nc.SetReadDeadline(time.Time{})
		// At most window ACQUIREs in flight per session: a cluster leader
		// answers T to a grant whose commit took longer than an election
		// timeout, which an unbounded backlog would cause.
		sem := make(chan struct{}, window)
		wg.Add(2)
		go func() {
			defer wg.Done()
			w := bufio.NewWriterSize(c.nc, 64<<10)
			var f []byte
			for i := ci; i < n; i += conns {
				select {
				case sem <- struct{}{}:
				default:
					w.Flush()
					sem <- struct{}{}
				}
				r := wire.Request{Type: wire.TypeAcquire, ReqID: uint32(i + 1), Owner: owner(ci), LeaseS: 250, Key: []byte("lock-key-" + strconv.Itoa(i))}
				f, _ = wire.AppendRequest(f[:0], &r)
				w.Write(f)
			}
			w.Flush()
		}()
		go func() {
			defer wg.Done()
			var resp wire.Response
			for i := ci; i < n; i += conns {
				body, err := c.fr.Next()
				if err != nil || wire.DecodeResponse(body, &resp) != nil || resp.Type != wire.TypeGranted {
					b.Errorf("acquire %d: %v %s", i, err, show(resp))
					return
				}
				<-sem
			}
		}()
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

type benchNode struct {
	s    *server.Server
	addr string
	done chan error
}

func (nd *benchNode) close() {
	if nd.s != nil {
		nd.s.Close()
		<-nd.done
		nd.s = nil
	}
}

// startBenchCluster starts three nodes whose Raft log, stable store and
// snapshots are on disk (as in production), talking through in-memory
// transports, and returns them and the leader's index.
func startBenchCluster(b *testing.B) ([]*benchNode, int) {
	b.Helper()
	ins := make([]*server.InmemNode, 3)
	var peers []server.Peer
	for i := range ins {
		ins[i] = server.NewInmemNode(string(rune('a' + i)))
		peers = append(peers, server.Peer{ID: ins[i].ID, Address: ins[i].Addr})
	}
	for _, x := range ins {
		for _, y := range ins {
			if x != y {
				x.Trans.Connect(raft.ServerAddress(y.Addr), y.Trans)
			}
		}
	}
	nodes := make([]*benchNode, 3)
	for i, in := range ins {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		cc := &server.ClusterConfig{NodeID: in.ID, Advertise: ln.Addr().String(), Peers: peers}
		in.UseTransport(cc)
		s, err := server.New(server.Config{DataDir: b.TempDir(), Cluster: cc, MaxSessions: 100})
		if err != nil {
			b.Fatal(err)
		}
		nd := &benchNode{s: s, addr: ln.Addr().String(), done: make(chan error, 1)}
		go func() { nd.done <- s.Serve(ln) }()
		nodes[i] = nd
		b.Cleanup(nd.close)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for i, nd := range nodes {
			if nd.s.Stats().Role == "leader" {
				return nodes, i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Fatal(fmt.Errorf("no leader within 10 s"))
	return nil, 0
}

// writeHeapProfile writes the live heap's profile to path (for go tool
// pprof -sample_index=inuse_space).
func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}
