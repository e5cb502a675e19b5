package server_test

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// Bootstrap refusals (log_cluster_boot.go). These tests compare error texts,
// not server.ErrClusterRefused, so that they also build, and fail, without
// the bootstrap check.

// wipe gives node i (stopped) new, empty Raft stores: its disk was wiped
// or replaced.
func (tc *tcluster) wipe(i int) {
	nd := tc.nodes[i]
	nd.in.Store, nd.in.Snaps = raft.NewInmemStore(), raft.NewInmemSnapshotStore()
	nd.in.Use(nd.cfg.Cluster)
}

// refused waits for node i's Serve to return an error other than
// ErrServerClosed (a refusal) and closes the node. While it waits, any node
// of among that serves as leader is a failure: fail is called with it.
func (tc *tcluster) refused(i int, among []int, fail func(leader int)) error {
	tc.t.Helper()
	nd := tc.nodes[i]
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-nd.done:
			nd.s.Close()
			nd.s = nil
			if err == nil {
				tc.t.Fatalf("node %s: Serve returned nil", nd.in.ID)
			}
			return err
		case <-deadline:
			tc.t.Fatalf("node %s did not refuse within 10 s", nd.in.ID)
		case <-time.After(20 * time.Millisecond):
			for _, j := range among { // (none: fail is not called)
				if s := tc.nodes[j].s; s != nil && s.Stats().Role == "leader" {
					fail(j)
				}
			}
		}
	}
}

// TestClusterWipedNodeRefusesToBootstrap is the scenario of a wiped
// follower: with follower F2 down, keys are granted on the leader and F1;
// the leader is killed; F1's disk is wiped and F1 restarted with F2. With
// peers in its config, F1 must refuse to bootstrap (naming F2 and what to
// do); without (a node that waits to be added), it must grant no vote.
// Either way F1 and F2 elect no leader, and once the old leader is back,
// tokens continue above every token issued. Without the checks, F1
// bootstrapped again (or just voted), F1 and F2 elected F2, and F2 issued
// the same tokens again.
func TestClusterWipedNodeRefusesToBootstrap(t *testing.T) {
	for _, withPeers := range []bool{true, false} {
		t.Run(fmt.Sprintf("peers=%v", withPeers), func(t *testing.T) {
			tc := newTestCluster(t, 3, nil)
			l := tc.leader()
			f1, f2 := tc.others(l)[0], tc.others(l)[1]
			// F2 goes down cut off, so that no append reaches it late (the
			// in-memory transport would queue one for its next start).
			tc.isolate(f2)
			tc.stop(f2)
			c := tc.leaderSession(l)
			var last uint64
			for i := range 4 {
				last = c.acquireOK(uint32(2+i), owner(1), 0, 120, fmt.Sprintf("k%d", i))
			}
			// F1 has them: a grant commits on the leader and F1.
			eventually(t, "F1 to apply the grants", func() bool { return tc.nodes[f1].s.Stats().LastToken == last })
			tc.stop(l)
			tc.stop(f1)
			tc.wipe(f1)
			if !withPeers {
				tc.nodes[f1].cfg.Cluster.Peers = nil
			}
			tc.start(f2)
			tc.start(f1)

			f1ID, f2ID := tc.nodes[f1].in.ID, tc.nodes[f2].in.ID
			reissued := func(j int) {
				s := tc.leaderSession(j)
				tok := s.acquireOK(2, owner(9), 0, 10, "fresh")
				t.Fatalf("F1 (%s), wiped, took part again: %s leads without the grants and issued token %d (tokens up to %d were issued before)",
					f1ID, tc.nodes[j].in.ID, tok, last)
			}
			if withPeers {
				msg := tc.refused(f1, []int{f1, f2}, reissued).Error()
				for _, want := range []string{"node " + f1ID + " refuses to bootstrap", "its peer " + f2ID + " (" + tc.nodes[f2].in.Addr + ") has the state of cluster",
					"'ticketingd cluster remove " + f1ID + "'", "ticketingd init --cluster --add"} {
					if !strings.Contains(msg, want) {
						t.Errorf("refusal lacks %q:\n%s", want, msg)
					}
				}
			}

			// F1 and F2 elect nobody (F1 refused, or grants no vote).
			deadline := time.Now().Add(8 * testElection)
			for time.Now().Before(deadline) {
				for _, j := range []int{f1, f2} {
					if s := tc.nodes[j].s; s != nil && s.Stats().Role == "leader" {
						reissued(j)
					}
				}
				time.Sleep(10 * time.Millisecond)
			}

			// The old leader comes back: it leads (its log is the longest),
			// the locks are held, and tokens go on above the last.
			tc.start(l)
			nl := tc.leader(l, f2)
			s := tc.leaderSession(nl)
			s.send(acq(2, owner(2), 0, 10, "k0"))
			s.expect(wire.TypeTimedOut, 2)
			if tok := s.acquireOK(3, owner(2), 0, 10, "fresh"); tok <= last {
				t.Fatalf("token %d after the wiped node's return, not above %d", tok, last)
			}
		})
	}
}

// TestClusterPeersMismatchRefused: nodes whose initial configurations
// differ refuse to bootstrap, each naming the node it differs from and the
// entry (a typo in one node's peers); a peers entry whose address reaches
// another node is refused naming that node. Without the check the two
// nodes that agree elected a leader, and the third stayed a candidate.
func TestClusterPeersMismatchRefused(t *testing.T) {
	for _, tt := range []struct {
		name string
		addr string            // node c's (wrong) address for b
		want map[string]string // node -> a part of its refusal (or another, after a '|')
	}{
		{"typo", "inmem-b:2", map[string]string{
			"a": "differs from that of c (inmem-c:1): this node lists b=inmem-b:1, c lists b=inmem-b:2",
			"b": "differs from that of c (inmem-c:1): this node lists b=inmem-b:1, c lists b=inmem-b:2",
			// (c may judge a's list or b's first: either names the difference)
			"c": "this node lists b=inmem-b:2, a lists b=inmem-b:1|this node lists b=inmem-b:2, b lists b=inmem-b:1",
		}},
		{"another node's address", "inmem-a:1", map[string]string{
			"a": "c lists b=inmem-a:1",
			"b": "c lists b=inmem-a:1",
			// (or, if b's probe reaches c before c's reaches a's address,
			// the difference of c's list and b's, named with the address c
			// has for b)
			"c": "gives b the Raft address inmem-a:1, but the node there is a|this node lists b=inmem-a:1, a lists b=inmem-b:1|this node lists b=inmem-a:1, b lists b=inmem-b:1",
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := newTestClusterOpts(t, 3, func(i int, cfg *server.Config) {
				if i != 2 {
					return
				}
				var peers []server.Peer
				for _, p := range cfg.Cluster.Peers {
					if p.ID == "b" {
						p.Address = tt.addr
					}
					peers = append(peers, p)
				}
				cfg.Cluster.Peers = peers
			}, nil)
			for i, nd := range tc.nodes {
				err := tc.refused(i, []int{0, 1, 2}, func(j int) {
					t.Fatalf("%s leads, although node c's peers differ from the others'", tc.nodes[j].in.ID)
				})
				want := tt.want[nd.in.ID]
				ok := false
				for _, w := range strings.Split(want, "|") {
					ok = ok || strings.Contains(err.Error(), w)
				}
				if !ok || !strings.Contains(err.Error(), "node "+nd.in.ID+" refuses to bootstrap") {
					t.Errorf("node %s's refusal lacks %q:\n%v", nd.in.ID, want, err)
				}
			}
		})
	}
}

// TestClusterLateNodeBootstraps: a node whose own probes do not get
// through (its peers' do) lets the others bootstrap with its agreement;
// once its probes pass, it finds them bootstrapped with this very data
// directory's agreement, bootstraps too, and catches up.
func TestClusterLateNodeBootstraps(t *testing.T) {
	var cut atomic.Bool
	cut.Store(true)
	tc := newTestClusterOpts(t, 3, func(i int, cfg *server.Config) {
		if i == 2 {
			server.UseDropping(cfg.Cluster, cut.Load)
		}
	}, nil)
	l := tc.leader(0, 1)
	tok := tc.leaderSession(l).acquireOK(2, owner(1), 0, 30, "k")
	st, _ := tc.nodes[2].s.ClusterStatus()
	if !strings.HasPrefix(st.Bootstrap, "waiting for ") || st.LastLogIndex != 0 {
		t.Fatalf("node c, cut off, is not waiting for its peers: %+v", st)
	}
	cut.Store(false)
	tc.waitApplied(tok)
	eventually(t, "c to follow the leader", func() bool {
		st, _ := tc.nodes[2].s.ClusterStatus()
		return st.Leader == tc.nodes[l].in.ID && st.Bootstrap == "" && len(st.Servers) == 3
	})
}

// TestClusterID: the first leader records the cluster ID (ClusterID, or a
// random one) in the replicated state; every node shows it, a snapshot
// keeps it, and a node whose state names another cluster than its
// ClusterID refuses to go on.
func TestClusterID(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	var id string
	for i, nd := range tc.nodes {
		eventually(t, "every node to apply the cluster ID", func() bool {
			st, _ := nd.s.ClusterStatus()
			if i == 0 {
				id = st.ClusterID
			}
			return len(st.ClusterID) == 32 && st.ClusterID == id
		})
	}
	// A snapshot carries it: a node restarted from one still has it. (Its
	// config names none: ClusterStatus would show a configured one in the
	// place of a missing recorded one.)
	f := tc.others(l)[0]
	if err := tc.nodes[f].s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	tc.stop(f)
	tc.start(f)
	if st, _ := tc.nodes[f].s.ClusterStatus(); st.ClusterID != id {
		t.Fatalf("after a restart from a snapshot: cluster ID %q, want %q", st.ClusterID, id)
	}
	// Another cluster's ID in the config: refused.
	tc.stop(f)
	tc.nodes[f].cfg.Cluster.ClusterID = "another-cluster"
	tc.start(f)
	err := tc.refused(f, nil, nil)
	if !errors.Is(err, server.ErrClusterRefused) || !strings.Contains(err.Error(), "it is of cluster "+id+", but this node's cluster-id is another-cluster") {
		t.Fatalf("node with another cluster-id: %v", err)
	}
	if st := tc.nodes[l].s.Stats(); st.Role != "leader" {
		t.Fatalf("the leader stopped leading: %+v", st)
	}
}

// TestClusterJoinConfig: Join (initial-cluster-state existing) excludes
// Peers; a ClusterID is checked.
func TestClusterJoinConfig(t *testing.T) {
	_, err := server.New(server.Config{DataDir: t.TempDir(), Cluster: &server.ClusterConfig{NodeID: "a", RaftListen: "127.0.0.1:7000", Advertise: "127.0.0.1:1",
		Join: true, Peers: []server.Peer{{ID: "a", Address: "127.0.0.1:7000"}}}})
	if err == nil || !strings.Contains(err.Error(), "exclude each other") {
		t.Fatalf("Join with Peers: %v", err)
	}
	_, err = server.New(server.Config{DataDir: t.TempDir(), Cluster: &server.ClusterConfig{NodeID: "a", RaftListen: "127.0.0.1:0", Advertise: "127.0.0.1:1", ClusterID: "a b"}})
	if err == nil || !strings.Contains(err.Error(), "ClusterID") {
		t.Fatalf("bad ClusterID: %v", err)
	}
}

// An identity made for a bundle (NewClusterIDFor) binds the initial
// configuration: a node configured with it refuses to bootstrap with other
// peers (a bundle node with its peers cut to itself would otherwise lead a
// second cluster under the bundle's identity), except alone from a
// standalone token ceiling (the way in from a standalone node). Peers in
// another order, and a node that only waits to be added, are fine.
func TestClusterBoundIdentity(t *testing.T) {
	bundle := []server.Peer{{ID: "a", Address: "inmem-a:1"}, {ID: "b", Address: "inmem-b:1"}, {ID: "c", Address: "inmem-c:1"}}
	id := server.NewClusterIDFor(bundle)
	if !regexp.MustCompile(`^[0-9a-f]{32}\.p[0-9a-f]{12}$`).MatchString(id) || !server.ValidNodeID(id) {
		t.Fatalf("NewClusterIDFor: %q", id)
	}
	if a, b := server.NewClusterIDFor(bundle), server.NewClusterIDFor([]server.Peer{bundle[2], bundle[0], bundle[1]}); a[34:] != id[34:] || b[34:] != id[34:] || a[:32] == id[:32] {
		t.Fatalf("the peers' digest depends on their order, or the random part repeats: %s %s %s", id, a, b)
	}
	start := func(t *testing.T, dir string, peers []server.Peer, join bool) error {
		in := server.NewInmemNode("a")
		cc := server.ClusterConfig{NodeID: "a", Advertise: "127.0.0.1:1", ClusterID: id, Peers: peers, Join: join}
		in.Use(&cc)
		s, err := server.New(server.Config{DataDir: dir, Cluster: &cc})
		if err == nil {
			s.Close()
		}
		return err
	}
	self := []server.Peer{{ID: "a", Address: "inmem-a:1"}}
	err := start(t, t.TempDir(), self, false)
	if !errors.Is(err, server.ErrClusterRefused) || !strings.Contains(err.Error(), "made by ticketingd init") || !strings.Contains(err.Error(), id) {
		t.Fatalf("a bundle node bootstrapping alone: %v, want ErrClusterRefused naming the bundle's identity", err)
	}
	moved := []server.Peer{bundle[0], bundle[1], {ID: "c", Address: "inmem-c:2"}}
	if err := start(t, t.TempDir(), moved, false); !errors.Is(err, server.ErrClusterRefused) {
		t.Fatalf("a bundle node with one peer's address changed: %v, want ErrClusterRefused", err)
	}
	if err := start(t, t.TempDir(), []server.Peer{bundle[1], bundle[2], bundle[0]}, false); err != nil {
		t.Fatalf("the bundle's peers in another order: %v", err)
	}
	if err := start(t, t.TempDir(), nil, true); err != nil {
		t.Fatalf("a node waiting to be added: %v", err)
	}
	dir := t.TempDir()
	if err := server.WriteCeiling(dir, 1000); err != nil {
		t.Fatal(err)
	}
	if err := start(t, dir, self, false); err != nil {
		t.Fatalf("alone from a standalone ceiling (the migration): %v", err)
	}
	// An identity that is not a bundle's binds nothing.
	in := server.NewInmemNode("a")
	cc := server.ClusterConfig{NodeID: "a", Advertise: "127.0.0.1:1", ClusterID: "my-cluster", Peers: self}
	in.Use(&cc)
	s, err := server.New(server.Config{DataDir: t.TempDir(), Cluster: &cc})
	if err != nil {
		t.Fatalf("a one-node cluster with an identity of its own: %v", err)
	}
	s.Close()
}
