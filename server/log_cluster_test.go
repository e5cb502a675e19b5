package server_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/raft"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// In-process clusters on hashicorp/raft's in-memory transport: the Raft
// nodes talk through InmemTransport (which a test can disconnect), the
// clients through real loopback sockets.

const (
	testHeartbeat = 250 * time.Millisecond
	testElection  = 250 * time.Millisecond
)

type tnode struct {
	in   *server.InmemNode
	cfg  server.Config
	s    *server.Server
	addr string
	done chan error
}

type tcluster struct {
	t     *testing.T
	nodes []*tnode
	clock *server.FakeClock // nil: real clocks
}

// newTestCluster starts n nodes bootstrapped as one cluster. tweak, if
// non-nil, adjusts each node's Config before it starts.
func newTestCluster(t *testing.T, n int, tweak func(i int, cfg *server.Config)) *tcluster {
	t.Helper()
	return newTestClusterOpts(t, n, tweak, nil)
}

// newTestClusterLossy is newTestCluster with every node's outgoing RPCs
// lost when drop says so.
func newTestClusterLossy(t *testing.T, n int, drop func() bool) *tcluster {
	t.Helper()
	return newTestClusterOpts(t, n, nil, drop)
}

func newTestClusterOpts(t *testing.T, n int, tweak func(i int, cfg *server.Config), drop func() bool) *tcluster {
	t.Helper()
	tc := &tcluster{t: t}
	var peers []server.Peer
	for i := range n {
		id := string(rune('a' + i))
		nd := &tnode{in: server.NewInmemNode(id)}
		ln := listen(t)
		nd.addr = ln.Addr().String()
		ln.Close()
		tc.nodes = append(tc.nodes, nd)
		peers = append(peers, server.Peer{ID: id, Address: nd.in.Addr})
	}
	for _, a := range tc.nodes {
		for _, b := range tc.nodes {
			if a != b {
				a.in.Trans.Connect(raft.ServerAddress(b.in.Addr), b.in.Trans)
			}
		}
	}
	for i, nd := range tc.nodes {
		cc := &server.ClusterConfig{NodeID: nd.in.ID, Advertise: nd.addr, Peers: peers,
			HeartbeatTimeout: testHeartbeat, ElectionTimeout: testElection}
		if drop != nil {
			nd.in.UseLossy(cc, drop)
		} else {
			nd.in.Use(cc)
		}
		nd.cfg = server.Config{DataDir: t.TempDir(), Cluster: cc, NodeName: "node-" + nd.in.ID}
		if tweak != nil {
			tweak(i, &nd.cfg)
		}
		tc.start(i)
	}
	t.Cleanup(func() {
		for i := range tc.nodes {
			tc.stop(i)
		}
	})
	return tc
}

// start runs node i (again) on its address.
func (tc *tcluster) start(i int) {
	tc.t.Helper()
	nd := tc.nodes[i]
	s, err := server.New(nd.cfg)
	if err != nil {
		tc.t.Fatalf("New(node %s): %v", nd.in.ID, err)
	}
	var ln net.Listener
	deadline := time.Now().Add(5 * time.Second)
	for {
		if ln, err = net.Listen("tcp", nd.addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.Close()
		tc.t.Fatal(err)
	}
	nd.s, nd.done = s, make(chan error, 1)
	go func() { nd.done <- s.Serve(ln) }()
	// Raft's shutdown of an earlier run disconnected the transport.
	tc.heal()
}

// stop closes node i (a crash, as far as its clients and peers can tell:
// its Raft state stays in its in-memory stores).
func (tc *tcluster) stop(i int) {
	nd := tc.nodes[i]
	if nd.s == nil {
		return
	}
	nd.s.Close()
	if err := <-nd.done; !errors.Is(err, server.ErrServerClosed) {
		tc.t.Errorf("Serve returned %v", err)
	}
	nd.s = nil
}

// leader waits for a node that serves as leader, of those given (all if
// none), and returns its index.
func (tc *tcluster) leader(among ...int) int {
	tc.t.Helper()
	if len(among) == 0 {
		for i := range tc.nodes {
			among = append(among, i)
		}
	}
	found := -1
	deadline := time.Now().Add(10 * time.Second)
	for found < 0 {
		for _, i := range among {
			if nd := tc.nodes[i]; nd.s != nil && nd.s.Stats().Role == "leader" {
				found = i
			}
		}
		if found < 0 {
			if time.Now().After(deadline) {
				tc.t.Fatal("no leader serving within 10 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return found
}

// waitApplied waits until every running node has applied token tok.
func (tc *tcluster) waitApplied(tok uint64) {
	tc.t.Helper()
	for _, nd := range tc.nodes {
		if nd.s != nil {
			eventually(tc.t, "every node to apply token "+fmt.Sprint(tok), func() bool { return nd.s.Stats().LastToken == tok })
		}
	}
}

// others returns the indexes of every node but i.
func (tc *tcluster) others(i int) []int {
	var o []int
	for j := range tc.nodes {
		if j != i {
			o = append(o, j)
		}
	}
	return o
}

// isolate cuts node i's Raft links to every other node (both ways); heal
// restores them.
func (tc *tcluster) isolate(i int) {
	for j, nd := range tc.nodes {
		if j != i {
			nd.in.Trans.Disconnect(raft.ServerAddress(tc.nodes[i].in.Addr))
			tc.nodes[i].in.Trans.Disconnect(raft.ServerAddress(nd.in.Addr))
		}
	}
}

func (tc *tcluster) heal() {
	for _, a := range tc.nodes {
		for _, b := range tc.nodes {
			if a != b {
				a.in.Trans.Connect(raft.ServerAddress(b.in.Addr), b.in.Trans)
			}
		}
	}
}

// leaderSession opens a session on the serving leader (version 2).
func (tc *tcluster) leaderSession(i int) *client {
	tc.t.Helper()
	c := dial(tc.t, tc.nodes[i].addr)
	c.send(wire.Request{Type: wire.TypeHello, ReqID: 1, Version: wire.Version2, Name: []byte("test")})
	r := c.expect(wire.TypeHelloOK, 1)
	if r.Role != wire.RoleLeader {
		tc.t.Fatalf("HELLO_OK role %d, want leader (%d)", r.Role, wire.RoleLeader)
	}
	return c
}

// expectHint dials node i and expects HELLO to get M with hint.
func (tc *tcluster) expectHint(i int, hint string) {
	tc.t.Helper()
	c := dial(tc.t, tc.nodes[i].addr)
	c.send(helloReq(1, ""))
	r := c.expect(wire.TypeNotActive, 1)
	if string(r.Hint) != hint {
		tc.t.Fatalf("node %s: M hint %q, want %q", tc.nodes[i].in.ID, r.Hint, hint)
	}
	c.expectClosed()
}

func TestClusterServesOnlyOnLeader(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	c := tc.leaderSession(l)
	tok := c.acquireOK(2, owner(1), 0, 10, "k")
	if tok == 0 {
		t.Fatal("token 0")
	}
	for i := range tc.nodes {
		if i == l {
			continue
		}
		// Followers learn the leader's client address through the log.
		eventually(t, "the follower's hint", func() bool { _, h := tc.nodes[i].s.Role(); return h == tc.nodes[l].addr })
		tc.expectHint(i, tc.nodes[l].addr)
		if st := tc.nodes[i].s.Stats(); st.Role != "standby" {
			t.Fatalf("follower role %q", st.Role)
		}
		eventually(t, "the follower to apply the grant", func() bool { return tc.nodes[i].s.Stats().LastToken == tok })
	}
	st, err := tc.nodes[l].s.ClusterStatus()
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "Leader" || !st.Serving || st.Leader != tc.nodes[l].in.ID || st.LeaderAdvertise != tc.nodes[l].addr || len(st.Servers) != 3 || st.Term == 0 || st.AppliedIndex == 0 {
		t.Fatalf("leader's ClusterStatus %+v", st)
	}
}

func TestClusterHandoffIsOneEntry(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	holder, waiter := tc.leaderSession(l), tc.leaderSession(l)
	tok := holder.acquireOK(2, owner(1), 0, 10, "k")
	waiter.send(acq(2, owner(2), 10, 10, "k"))
	waiter.expectNothing(100 * time.Millisecond)
	st, _ := tc.nodes[l].s.ClusterStatus()
	before := st.AppliedIndex
	holder.send(rel(3, tok, "k"))
	holder.expect(wire.TypeReleased, 3)
	g := waiter.expect(wire.TypeGranted, 2)
	if g.Token <= tok {
		t.Fatalf("hand-off token %d after %d", g.Token, tok)
	}
	st, _ = tc.nodes[l].s.ClusterStatus()
	if st.AppliedIndex != before+1 {
		t.Fatalf("release and hand-off took %d log entries, want 1", st.AppliedIndex-before)
	}
	// The old token no longer frees the key; the new one does.
	holder.send(rel(4, tok, "k"))
	holder.expect(wire.TypeNotHeld, 4)
	waiter.send(rel(3, g.Token, "k"))
	waiter.expect(wire.TypeReleased, 3)
}

func TestClusterGroupCommit(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	c := tc.leaderSession(l)
	st, _ := tc.nodes[l].s.ClusterStatus()
	before := st.AppliedIndex
	const n = 200
	for i := range n {
		c.send(acq(uint32(10+i), owner(i), 0, 10, "key-"+string(rune('A'+i%26))+string(rune('a'+i/26))))
	}
	seen := map[uint64]bool{}
	for range n {
		r := c.recv()
		if r.Type != wire.TypeGranted || seen[r.Token] {
			t.Fatalf("reply %s", show(r))
		}
		seen[r.Token] = true
	}
	st, _ = tc.nodes[l].s.ClusterStatus()
	if entries := st.AppliedIndex - before; entries >= n/2 {
		t.Fatalf("%d pipelined grants took %d log entries: no group commit", n, entries)
	}
}

func TestClusterFailoverKeepsLocksAndRestartsLeases(t *testing.T) {
	clk := server.NewFakeClock()
	tc := newTestCluster(t, 3, func(_ int, cfg *server.Config) { server.SetClock(cfg, clk) })
	l := tc.leader()
	c := tc.leaderSession(l)
	tok := c.acquireOK(2, owner(1), 0, 5, "held")
	other := tc.leaderSession(l)
	other.send(acq(7, owner(2), 30, 5, "held")) // a waiter: dropped by the failover
	other.expectNothing(50 * time.Millisecond)
	tc.waitApplied(tok)
	tc.stop(l)
	// The old leader's sessions end (Close: no M, the socket closes).
	c.expectClosed()
	other.expectClosed()
	nl := tc.leader(tc.others(l)...)
	c2 := tc.leaderSession(nl)
	// The holder's retry gets its token: the lock survived.
	if got := c2.acquireOK(2, owner(1), 0, 5, "held"); got != tok {
		t.Fatalf("holder's retry after failover: token %d, want %d", got, tok)
	}
	// The lease restarted at lease_s + election timeout on the new leader.
	clk.Advance(5 * time.Second)
	c2.send(acq(3, owner(3), 0, 5, "held"))
	c2.expect(wire.TypeTimedOut, 3)
	clk.Advance(testElection + time.Millisecond)
	eventually(t, "the restarted lease to end", func() bool { return tc.nodes[nl].s.Stats().HeldLocks == 0 })
	if got := c2.acquireOK(4, owner(3), 0, 5, "held"); got <= tok {
		t.Fatalf("token after failover %d, not above %d", got, tok)
	}
}

func TestClusterPartitionedLeaderStepsDown(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	c := tc.leaderSession(l)
	tok := c.acquireOK(2, owner(1), 0, 10, "k")
	tc.isolate(l)
	// Whatever the old leader is asked now cannot commit: no grant.
	c.send(acq(3, owner(2), 0, 10, "other"))
	// It steps down (leader lease) and closes its sessions with M.
	r := c.recv()
	if r.Type != wire.TypeNotActive {
		t.Fatalf("old leader's session got %s, want M", show(r))
	}
	nl := tc.leader(tc.others(l)...)
	c2 := tc.leaderSession(nl)
	if got := c2.acquireOK(2, owner(1), 0, 10, "k"); got != tok {
		t.Fatalf("lock lost in the partition: token %d, want %d", got, tok)
	}
	t2 := c2.acquireOK(3, owner(2), 0, 10, "other")
	if t2 <= tok {
		t.Fatalf("new leader's token %d not above %d", t2, tok)
	}
	tc.heal()
	eventually(t, "the old leader to follow the new one", func() bool {
		_, h := tc.nodes[l].s.Role()
		return h == tc.nodes[nl].addr && tc.nodes[l].s.Stats().LastToken == t2
	})
	tc.expectHint(l, tc.nodes[nl].addr)
}

func TestClusterMinorityCannotGrant(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	f := (l + 1) % 3
	tc.isolate(f)
	c := tc.leaderSession(l)
	tc.isolate((l + 2) % 3) // now the leader is alone too
	c.send(acq(2, owner(1), 0, 10, "k"))
	r := c.recv()
	if r.Type == wire.TypeGranted {
		t.Fatalf("a leader without a majority granted: %s", show(r))
	}
	if r.Type != wire.TypeNotActive {
		t.Fatalf("got %s, want M", show(r))
	}
	// No node serves while no majority can form.
	time.Sleep(5 * testElection)
	for i, nd := range tc.nodes {
		if nd.s.Stats().Role == "leader" {
			t.Fatalf("node %d serves without a majority", i)
		}
	}
	tc.heal()
	nl := tc.leader()
	c2 := tc.leaderSession(nl)
	c2.acquireOK(2, owner(1), 0, 10, "k")
}

func TestClusterSnapshotInstallOnLaggingFollower(t *testing.T) {
	tc := newTestCluster(t, 3, func(_ int, cfg *server.Config) {
		server.SetRaftTuning(cfg.Cluster, func(rc *raft.Config) {
			rc.TrailingLogs = 5
			rc.SnapshotThreshold = 1 << 30 // only when asked
		})
	})
	l := tc.leader()
	f := (l + 1) % 3
	tc.isolate(f)
	c := tc.leaderSession(l)
	var last uint64
	for i := range 40 {
		last = c.acquireOK(uint32(10+i), owner(i), 0, 60, "key-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
	}
	if err := tc.nodes[l].s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	tc.heal()
	eventually(t, "the lagging follower to catch up from the snapshot", func() bool {
		st := tc.nodes[f].s.Stats()
		return st.LastToken == last && st.HeldLocks == 40
	})
	// The follower can lead with that state.
	tc.stop(l)
	nl := tc.leader(f, (l+2)%3)
	c2 := tc.leaderSession(nl)
	if got := c2.acquireOK(2, owner(7), 0, 60, "key-ha"); got == 0 {
		t.Fatal("token 0")
	}
	if got := c2.acquireOK(3, owner(99), 0, 60, "fresh"); got <= last {
		t.Fatalf("token %d after a snapshot install, not above %d", got, last)
	}
}

func TestClusterRestartsInEveryOrder(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	// Every start order (each after stopping all three in another).
	orders := [][]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	var last uint64
	c := tc.leaderSession(tc.leader())
	last = c.acquireOK(2, owner(1), 0, 60, "kept")
	kept := last
	c.nc.Close()
	for n, order := range orders {
		for _, i := range orders[(n+1)%len(orders)] {
			tc.stop(i)
		}
		for _, i := range order {
			tc.start(i)
		}
		c := tc.leaderSession(tc.leader())
		if got := c.acquireOK(2, owner(1), 0, 60, "kept"); got != kept {
			t.Fatalf("round %d: held lock's token %d, want %d", n, got, kept)
		}
		tok := c.acquireOK(3, owner(2), 0, 1, "fresh-"+string(rune('a'+n)))
		if tok <= last {
			t.Fatalf("round %d: token %d after a full restart, not above %d", n, tok, last)
		}
		last = tok
		c.nc.Close()
	}
}

// TestClusterInitialTokenFloor: a new cluster's tokens continue above
// InitialToken.
func TestClusterInitialTokenFloor(t *testing.T) {
	tc := newTestCluster(t, 3, func(_ int, cfg *server.Config) { cfg.InitialToken = 1_000_000 })
	c := tc.leaderSession(tc.leader())
	if got := c.acquireOK(2, owner(1), 0, 10, "k"); got != 1_000_001 {
		t.Fatalf("first token %d, want 1000001", got)
	}
}

func TestClusterConfigErrors(t *testing.T) {
	for name, cc := range map[string]server.ClusterConfig{
		"no node id":                  {RaftListen: "127.0.0.1:0", Advertise: "127.0.0.1:1"},
		"bad node id":                 {NodeID: "a b", RaftListen: "127.0.0.1:0", Advertise: "127.0.0.1:1"},
		"dot-dot node id":             {NodeID: "..", RaftListen: "127.0.0.1:0", Advertise: "127.0.0.1:1"},
		"no raft listen":              {NodeID: "a", Advertise: "127.0.0.1:1"},
		"no advertise":                {NodeID: "a", RaftListen: "127.0.0.1:7000"},
		"unspecified":                 {NodeID: "a", RaftListen: "0.0.0.0:7000", Advertise: "127.0.0.1:1"},
		"self missing":                {NodeID: "a", RaftListen: "127.0.0.1:7000", Advertise: "127.0.0.1:1", Peers: []server.Peer{{ID: "b", Address: "127.0.0.1:7001"}}},
		"peer twice":                  {NodeID: "a", RaftListen: "127.0.0.1:7000", Advertise: "127.0.0.1:1", Peers: []server.Peer{{ID: "a", Address: "127.0.0.1:7000"}, {ID: "a", Address: "127.0.0.1:7000"}}},
		"self elsewhere":              {NodeID: "a", RaftListen: "127.0.0.1:7000", Advertise: "127.0.0.1:1", Peers: []server.Peer{{ID: "a", Address: "127.0.0.1:7009"}}},
		"early and committed release": {NodeID: "a", RaftListen: "127.0.0.1:7000", Advertise: "127.0.0.1:1", EarlyRelease: true, CommittedRelease: true},
		"negative max proposals":      {NodeID: "a", RaftListen: "127.0.0.1:7000", Advertise: "127.0.0.1:1", MaxProposals: -1},
	} {
		cc := cc
		if _, err := server.New(server.Config{DataDir: t.TempDir(), Cluster: &cc}); err == nil {
			t.Errorf("%s: New accepted %+v", name, cc)
		}
	}
	if _, err := server.New(server.Config{DataDir: t.TempDir(), Standby: true,
		Cluster: &server.ClusterConfig{NodeID: "a", RaftListen: "127.0.0.1:0", Advertise: "127.0.0.1:1"}}); err == nil {
		t.Error("New accepted Standby with Cluster")
	}
}

// TestClusterMessageLoss runs acquire/release cycles while two fifths of
// all Raft RPCs are lost: the leader may change and requests in flight may go
// unanswered (their session then closes with M, or stalls and the client
// gives up on it), but every grant has a new token, above every token
// granted before it was asked for.
func TestClusterMessageLoss(t *testing.T) {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	drop := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return rng.IntN(5) < 2
	}
	tc := newTestClusterLossy(t, 3, drop)
	var last uint64
	grants, busy := 0, 0
	deadline := time.Now().Add(4 * time.Second)
	var c *client
	for n := 0; time.Now().Before(deadline); n++ {
		if c == nil {
			l := tc.leader()
			c = tc.leaderSession(l)
		}
		// A key of its own: one whose grant went unanswered stays held.
		key := fmt.Sprintf("k%d", n)
		c.send(acq(uint32(2+n), owner(n), 0, 10, key))
		r, err := c.recvErr(2 * time.Second)
		if err != nil || r.Type == wire.TypeNotActive {
			c.nc.Close()
			c = nil // unanswered (Indeterminate): try again on the leader
			continue
		}
		if r.Type == wire.TypeBusy {
			// Committed too slowly to be trusted (longer than an election
			// timeout): not granted, and freed again.
			busy++
			continue
		}
		if r.Type != wire.TypeGranted {
			t.Fatalf("ACQUIRE of a free key: %s", show(r))
		}
		if r.Token <= last {
			t.Fatalf("token %d after %d", r.Token, last)
		}
		last = r.Token
		grants++
		c.send(wire.Request{Type: wire.TypeReleaseOwned, ReqID: uint32(1 << 30), Token: r.Token, Owner: owner(n), Key: []byte(key)})
		if r, err := c.recvErr(2 * time.Second); err != nil || r.Type != wire.TypeReleased {
			c.nc.Close()
			c = nil
		}
	}
	if grants < 10 {
		t.Fatalf("only %d grants in 4 s with 40%% message loss", grants)
	}
	t.Logf("%d grants (and %d B for a commit slower than an election timeout) with 40%% of Raft RPCs lost; last token %d", grants, busy, last)
}

// TestClusterReleaseAfterLeaseEndIsCommitted: a RELEASE that finds its
// lease ended on the leader's clock gets N only once the expiry is
// committed: an isolated (deposed) leader cannot commit it, so it never
// tells a holder "not held" about a lock its successor still holds (the
// successor restarted the lease).
func TestClusterReleaseAfterLeaseEndIsCommitted(t *testing.T) {
	clk := server.NewFakeClock()
	tc := newTestCluster(t, 3, func(_ int, cfg *server.Config) { server.SetClock(cfg, clk) })
	l := tc.leader()
	c := tc.leaderSession(l)
	tok := c.acquireOK(2, owner(1), 0, 5, "k")
	tc.waitApplied(tok)
	// On a healthy leader: N, after the committed expiry.
	c2 := tc.leaderSession(l)
	t2 := c2.acquireOK(2, owner(2), 0, 5, "k2")
	clk.Advance(5 * time.Second) // both leases end (the timers may fire first: N either way)
	c2.send(rel(3, t2, "k2"))
	c2.expect(wire.TypeNotHeld, 3)
	// A second key, then the leader is cut off before its lease ends.
	tok3 := c.acquireOK(3, owner(3), 0, 5, "k3")
	tc.isolate(l)
	clk.Advance(5 * time.Second)
	c.send(rel(4, tok3, "k3"))
	if r, err := c.recvErr(3 * time.Second); err == nil && r.Type == wire.TypeNotHeld {
		t.Fatalf("an isolated leader answered N without a commit: %s", show(r))
	}
}

// TestClusterMetrics: the Raft metrics (docs/operations.md) on the
// leader and on a follower, gathered by a pedantic registry.
func TestClusterMetrics(t *testing.T) {
	regs := make([]*prometheus.Registry, 3)
	tc := newTestCluster(t, 3, func(i int, cfg *server.Config) {
		regs[i] = prometheus.NewPedanticRegistry()
		cfg.Registerer = regs[i]
	})
	l := tc.leader()
	c := tc.leaderSession(l)
	c.acquireOK(4, owner(2), 0, 60, "kept")
	tok := c.acquireOK(2, owner(1), 0, 10, "k")
	c.send(rel(3, tok, "k"))
	c.expect(wire.TypeReleased, 3)
	gather := func(i int) map[string]float64 {
		t.Helper()
		mfs, err := regs[i].Gather()
		if err != nil {
			t.Fatal(err)
		}
		v := map[string]float64{}
		for _, mf := range mfs {
			m := mf.GetMetric()[0]
			switch {
			case m.GetHistogram() != nil:
				v[mf.GetName()] = float64(m.GetHistogram().GetSampleCount())
			case m.GetCounter() != nil:
				v[mf.GetName()] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				v[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
		return v
	}
	// R comes once the release is applied on the leader; the gauge is
	// read through the FSM's count, which the apply updates before it
	// answers, but wait for it anyway.
	eventually(t, "the leader to apply the release", func() bool { return gather(l)["ticketing_held_locks"] == 1 })
	lv := gather(l)
	if lv["ticketing_raft_commit_seconds"] < 2 || lv["ticketing_raft_entry_commands"] != lv["ticketing_raft_commit_seconds"] || lv["ticketing_raft_leader"] != 1 || lv["ticketing_role"] != float64(server.RoleLeader) ||
		lv["ticketing_raft_applied_index"] < 3 || lv["ticketing_raft_commit_index"] < lv["ticketing_raft_applied_index"] ||
		lv["ticketing_raft_leader_changes_total"] < 1 || lv["ticketing_token_last"] != float64(tok) || lv["ticketing_token_store_ok"] != 1 || lv["ticketing_held_locks"] != 1 {
		t.Fatalf("leader's metrics: %v", lv)
	}
	f := (l + 1) % 3
	eventually(t, "the follower to apply the release", func() bool { return gather(f)["ticketing_raft_applied_index"] >= lv["ticketing_raft_applied_index"] })
	fv := gather(f)
	if fv["ticketing_raft_leader"] != 0 || fv["ticketing_role"] != float64(server.RoleStandby) || fv["ticketing_raft_commit_seconds"] != 0 || fv["ticketing_raft_entry_commands"] != 0 || fv["ticketing_token_last"] != float64(tok) || fv["ticketing_held_locks"] != 1 {
		t.Fatalf("follower's metrics: %v", fv)
	}
}

// TestClusterRemovedNodeUnhealthy: a node removed from the configuration
// shuts its raft down and reports it (TokenStoreErr: ticketingd's /healthz
// answers 503); the others go on.
func TestClusterRemovedNodeUnhealthy(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	f := (l + 1) % 3
	if err := tc.nodes[f].s.TokenStoreErr(); err != nil {
		t.Fatalf("a follower's health: %v", err)
	}
	if err := tc.nodes[f].s.RemoveServer(t.Context(), tc.nodes[l].in.ID); !errors.Is(err, server.ErrNotLeader) {
		t.Fatalf("RemoveServer on a follower: %v, want ErrNotLeader", err)
	}
	if err := tc.nodes[l].s.RemoveServer(t.Context(), tc.nodes[f].in.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the removed node to report its raft shut down", func() bool { return tc.nodes[f].s.TokenStoreErr() != nil })
	if err := tc.nodes[l].s.TokenStoreErr(); err != nil {
		t.Fatalf("the leader's health: %v", err)
	}
	c := tc.leaderSession(l)
	c.acquireOK(2, owner(1), 0, 10, "k")
}
