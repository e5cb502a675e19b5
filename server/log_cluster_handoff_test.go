package server_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// Edges of the Raft mode: a cancel or a session close during a hand-off,
// a restore's token floor, an imported ceiling. Each one shows a defect
// that was found and fixed (and fails without the fix).

// slowCommits returns a cluster whose Raft RPCs each take *delay (0: no
// delay) and nothing is lost: a test widens the window in which a
// proposed entry is not yet committed, without the leader losing its
// lease (heartbeats stay well within it).
func slowCommits(t *testing.T) (*tcluster, *atomic.Int64) {
	t.Helper()
	var delay atomic.Int64
	tc := newTestClusterOpts(t, 3, nil, func() bool {
		if d := time.Duration(delay.Load()); d > 0 {
			time.Sleep(d)
		}
		return false
	})
	return tc, &delay
}

// recvAll reads frames until none comes within d.
func (c *client) recvAll(d time.Duration) []wire.Response {
	var rs []wire.Response
	for {
		r, err := c.recvErr(d)
		if err != nil {
			return rs
		}
		rs = append(rs, r)
	}
}

// A CANCEL that names a waiter to which a RELEASE has just handed the key
// (the Free+grant command proposed, not yet committed) must leave it alone
// (the protocol, docs/protocol.md: "already granted or being answered:
// nothing"). The leader's scheduler before the lock core did not mark the
// hand-off's waiter as proposed, so cancel removed it from a queue it was
// no longer in: it answered T, and then the committed grant answered G for
// the same req_id, a reply the client no longer awaited, and the key was
// held by an owner told "not granted". The queue was corrupted on the
// way: the second waiter fell out of it (never granted) and the waiter
// count was decremented twice. (With no second waiter the same CANCEL
// dereferenced the nil queue and the process panicked.)
func TestClusterCancelDuringHandoff(t *testing.T) {
	tc, delay := slowCommits(t)
	l := tc.leader()
	holder, a, b := tc.leaderSession(l), tc.leaderSession(l), tc.leaderSession(l)
	tok := holder.acquireOK(2, owner(1), 0, 60, "k")
	a.send(acq(2, owner(2), 60, 60, "k"))
	a.expectNothing(100 * time.Millisecond) // queued first
	b.send(acq(2, owner(3), 60, 60, "k"))
	b.expectNothing(100 * time.Millisecond) // queued second
	if w := tc.nodes[l].s.Stats().Waiters; w != 2 {
		t.Fatalf("waiters %d, want 2", w)
	}

	delay.Store(int64(30 * time.Millisecond))
	// One write: the RELEASE hands the key to a's ACQUIRE (one command,
	// being committed), then a's CANCEL of that ACQUIRE.
	r1, _ := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeRelease, ReqID: 3, Token: tok, Key: []byte("k")})
	r2, _ := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeCancel, ReqID: 2})
	a.sendRaw(append(r1, r2...))
	rs := a.recvAll(2 * time.Second)
	delay.Store(0)

	var granted uint64
	for _, r := range rs {
		switch {
		case r.Type == wire.TypeReleased && r.ReqID == 3:
		case r.Type == wire.TypeGranted && r.ReqID == 2 && granted == 0:
			granted = r.Token
		default:
			t.Errorf("a's session got %s; want only R for req 3 and G for req 2 (replies: %v)", show(r), showAll(rs))
		}
	}
	if granted == 0 {
		t.Fatalf("a's ACQUIRE was not granted (replies: %v)", showAll(rs))
	}
	if w := tc.nodes[l].s.Stats().Waiters; w != 1 {
		t.Errorf("waiters %d after the hand-off, want 1 (b)", w)
	}
	// b is next in line: a's release hands it the key.
	a.send(rel(4, granted, "k"))
	a.expect(wire.TypeReleased, 4)
	if r, err := b.recvErr(5 * time.Second); err != nil || r.Type != wire.TypeGranted || r.ReqID != 2 {
		t.Errorf("b (the next waiter) after a released: %v %v, want G req 2", show(r), err)
	}
}

// A session that closes while the key is being handed to its waiter (the
// Free+grant command proposed) must not disturb the queue: the grant is
// freed again when it applies (its holder is gone) and the next waiter
// gets the key. closing drops the hand-off's waiter from a queue it is no
// longer in (dropWaiter: it is not marked proposed): the next waiter falls
// out of the queue and is never granted, although the key is free.
func TestClusterSessionCloseDuringHandoff(t *testing.T) {
	tc, delay := slowCommits(t)
	l := tc.leader()
	holder, a, b := tc.leaderSession(l), tc.leaderSession(l), tc.leaderSession(l)
	tok := holder.acquireOK(2, owner(1), 0, 60, "k")
	a.send(acq(2, owner(2), 60, 60, "k"))
	a.expectNothing(100 * time.Millisecond)
	b.send(acq(2, owner(3), 60, 60, "k"))
	b.expectNothing(100 * time.Millisecond)

	delay.Store(int64(50 * time.Millisecond))
	// a releases the holder's lock (the key goes to a, being committed)
	// and closes its session at once.
	r1, _ := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeRelease, ReqID: 3, Token: tok, Key: []byte("k")})
	a.sendRaw(r1)
	a.nc.Close()
	// b must get the key: a's grant is freed again as a is gone.
	r, err := b.recvErr(5 * time.Second)
	delay.Store(0)
	if err != nil || r.Type != wire.TypeGranted || r.ReqID != 2 {
		t.Fatalf("b (the next waiter) after a's session closed during its hand-off: %v %v, want G req 2", show(r), err)
	}
	if w := tc.nodes[l].s.Stats().Waiters; w != 0 {
		t.Errorf("waiters %d after every waiter was answered, want 0", w)
	}
}

func showAll(rs []wire.Response) []string {
	var s []string
	for _, r := range rs {
		s = append(s, show(r))
	}
	return s
}

// Every node's machine must be the same function of the log. Restore
// raises the restored counter to the node's own floor (Config.InitialToken
// or a standalone ceiling in its data dir), which is not in the log: a
// follower with a higher floor that installs a snapshot continues its
// counter elsewhere than the leader, so the same committed Grant gets
// another token on it (and, once it leads, its holdings carry tokens no
// holder was ever given).
func TestClusterRestoreFloorIsDeterministic(t *testing.T) {
	tc := newTestCluster(t, 3, func(_ int, cfg *server.Config) {
		server.SetRaftTuning(cfg.Cluster, func(rc *raft.Config) {
			rc.TrailingLogs = 5
			rc.SnapshotThreshold = 1 << 30
		})
	})
	l := tc.leader()
	f := (l + 1) % 3
	tc.stop(f)
	tc.isolate(f) // no RPC to it is queued meanwhile (start heals)
	c := tc.leaderSession(l)
	for i := range 20 {
		c.acquireOK(uint32(10+i), owner(i), 0, 60, "key-"+string(rune('a'+i)))
	}
	if err := tc.nodes[l].s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	// The follower comes back with a floor of its own (its operator set
	// --initial-token, or imported a standalone data dir into it).
	tc.nodes[f].cfg.InitialToken = 1_000_000
	tc.start(f)
	eventually(t, "the follower to install the snapshot", func() bool { return tc.nodes[f].s.Stats().HeldLocks == 20 })
	tok := c.acquireOK(40, owner(99), 0, 60, "after")
	var got uint64
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got = tc.nodes[f].s.Stats().LastToken; got == tok {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("after the same log, the leader's counter is %d and the follower's %d", tok, got)
}

// docs/server.md, "Raft mode": a standalone ceiling found in a node's data dir (a
// migration) is a floor for the cluster's tokens. Only that node's own
// takeover can put it into the log (while another node led, the
// cluster issued tokens from 1), so a cluster may start from it only with
// that node alone, the others added afterwards; a bootstrap of several
// nodes with it is refused, naming the file and what to do.
func TestClusterImportedCeiling(t *testing.T) {
	const ceiling = 1_000_000
	dir := t.TempDir()
	if err := server.WriteCeiling(dir, ceiling); err != nil {
		t.Fatal(err)
	}
	in := server.NewInmemNode("a")
	cc := server.ClusterConfig{NodeID: "a", Advertise: "127.0.0.1:1",
		Peers: []server.Peer{{ID: "a", Address: in.Addr}, {ID: "b", Address: "inmem-b:1"}}}
	in.Use(&cc)
	_, err := server.New(server.Config{DataDir: dir, Cluster: &cc})
	if err == nil || !strings.Contains(err.Error(), "tokens.ceiling") || !strings.Contains(err.Error(), "alone") {
		t.Fatalf("bootstrap of two nodes from a standalone data dir: %v", err)
	}

	tc := newTestCluster(t, 3, func(i int, cfg *server.Config) {
		if i == 0 {
			if err := server.WriteCeiling(cfg.DataDir, ceiling); err != nil {
				t.Fatal(err)
			}
			cfg.Cluster.Peers = cfg.Cluster.Peers[:1]
		} else {
			cfg.Cluster.Peers = nil // joined later
		}
	})
	if l := tc.leader(); l != 0 {
		t.Fatalf("leader %d of a cluster bootstrapped by node 0 alone", l)
	}
	c := tc.leaderSession(0)
	tok := c.acquireOK(2, owner(1), 0, 10, "k")
	if tok <= ceiling {
		t.Fatalf("first token %d, not above the imported standalone ceiling %d", tok, ceiling)
	}
	for _, nd := range tc.nodes[1:] {
		if err := tc.nodes[0].s.AddVoter(t.Context(), nd.in.ID, nd.in.Addr); err != nil {
			t.Fatal(err)
		}
	}
	// The new nodes catch up (the configuration with all three included)
	// before the first one goes.
	st, _ := tc.nodes[0].s.ClusterStatus()
	for _, nd := range tc.nodes[1:] {
		eventually(t, "the added nodes to catch up", func() bool {
			fs, err := nd.s.ClusterStatus()
			return err == nil && fs.AppliedIndex >= st.CommitIndex && len(fs.Servers) == 3
		})
	}
	tc.stop(0)
	nl := tc.leader(1, 2)
	c2 := tc.leaderSession(nl)
	if got := c2.acquireOK(2, owner(1), 0, 10, "k"); got != tok {
		t.Fatalf("holder's retry on the new leader: %d, want %d", got, tok)
	}
	if got := c2.acquireOK(3, owner(2), 0, 10, "k2"); got <= tok {
		t.Fatalf("token %d on the next leader, not above %d", got, tok)
	}
}
