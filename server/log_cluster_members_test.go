package server_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/server"
)

// Members (log_cluster_boot.go): a node takes Raft RPCs only from the
// members of its configuration or its bootstrap record.

// TestClusterWipedMemberAloneIsNotPulledIn is the fork of a wiped member
// under a cluster-id written by hand (not bound to the peers): with keys
// granted, member F is stopped, its data directory wiped, and it is
// started again with peers naming itself alone. It bootstraps a one-node
// configuration whose first entry has the index and term of the real
// one's. Without the member check the leader's AppendEntries matched it,
// F took the cluster's entries as a follower of the old history (and, cut
// off later, led it alone beside the real leader). Now F refuses them, and
// learns from the sender that its state is a second history under its ID:
// it refuses to go on, saying what to do. It never applies the cluster's
// grants, and the cluster goes on issuing tokens above them.
//
// Two ways in: a cluster bootstrapped by its three nodes together (the
// leader's bootstrap record names F's old data directory), and one that
// began with F alone from a standalone token ceiling, the others added
// (F's config still names F alone; the others have no bootstrap record,
// but list F). TestClusterImportedCeilingNotBootstrappedAgain has the
// wipe of F's Raft state alone, which leaves the ceiling.
func TestClusterWipedMemberAloneIsNotPulledIn(t *testing.T) {
	for _, migrated := range []bool{false, true} {
		t.Run(fmt.Sprintf("migrated=%v", migrated), func(t *testing.T) {
			tc := newTestCluster(t, 3, func(i int, cfg *server.Config) {
				cfg.Cluster.ClusterID = "my-own-cluster"
				if !migrated {
					return
				}
				if i > 0 {
					cfg.Cluster.Peers = nil // added below
					return
				}
				if err := server.WriteCeiling(cfg.DataDir, 1000); err != nil {
					t.Fatal(err)
				}
				cfg.Cluster.Peers = cfg.Cluster.Peers[:1]
			})
			f := 0
			if migrated {
				tc.leader(0)
				for _, nd := range tc.nodes[1:] {
					if err := tc.nodes[0].s.AddVoter(t.Context(), nd.in.ID, nd.in.Addr); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				f = tc.others(tc.leader())[0]
			}
			l := tc.leader()
			c := tc.leaderSession(l)
			var last uint64
			for i := range 4 {
				last = c.acquireOK(uint32(2+i), owner(1), 0, 120, fmt.Sprintf("k%d", i))
			}
			for _, nd := range tc.nodes {
				eventually(t, "every node to apply the grants", func() bool { return nd.s.Stats().LastToken == last })
			}
			tc.stop(f)
			tc.wipe(f)
			if migrated { // the whole data directory: the ceiling and its mark go too
				for _, name := range []string{"tokens.ceiling", "tokens.ceiling.imported"} {
					if err := os.Remove(filepath.Join(tc.nodes[f].cfg.DataDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
						t.Fatal(err)
					}
				}
			}
			fID := tc.nodes[f].in.ID
			tc.nodes[f].cfg.Cluster.Peers = []server.Peer{{ID: fID, Address: tc.nodes[f].in.Addr}}
			tc.start(f)

			nd := tc.nodes[f]
			var err error
			deadline := time.After(15 * time.Second)
		wait:
			for {
				select {
				case err = <-nd.done:
					nd.s.Close()
					nd.s = nil
					break wait
				case <-deadline:
					t.Fatalf("the wiped node %s, bootstrapped alone, did not refuse within 15 s (role %s, last token %d)", fID, nd.s.Stats().Role, nd.s.Stats().LastToken)
				case <-time.After(5 * time.Millisecond):
					if tok := nd.s.Stats().LastToken; tok >= last {
						t.Fatalf("the wiped node %s, bootstrapped alone, took the cluster's entries (last token %d): it joined the old history with a state of its own", fID, tok)
					}
				}
			}
			if err == nil {
				t.Fatal("Serve returned nil")
			}
			for _, want := range []string{"node " + fID + " refuses to go on", "wiped or replaced", "'ticketingd cluster remove " + fID + "'", "ticketingd init --cluster --add"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal lacks %q:\n%v", want, err)
				}
			}
			nl := tc.leader(tc.others(f)...)
			if tok := tc.leaderSession(nl).acquireOK(2, owner(2), 0, 10, "fresh"); tok <= last {
				t.Fatalf("token %d after the wiped node's refusal, not above %d", tok, last)
			}
		})
	}
}

// TestClusterAdmitOnlyMembers sends each kind of Raft RPC to a follower
// from a transport of a node that is not in the configuration, and from
// one under a member's ID: the stranger's are refused, with an error that
// says so, before Raft sees them (the follower's term does not move); the
// member's reach Raft.
func TestClusterAdmitOnlyMembers(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	f := tc.others(l)[0]
	target := raft.ServerAddress(tc.nodes[f].in.Addr)
	term := clusterTerm(t, tc.nodes[f].s)
	for _, from := range []string{"stranger", tc.nodes[l].in.ID} {
		_, tr := raft.NewInmemTransport(raft.ServerAddress("inmem-" + from + "-2:1"))
		tr.Connect(target, tc.nodes[f].in.Trans)
		tc.nodes[f].in.Trans.Connect(tr.LocalAddr(), tr)
		hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(from), Addr: []byte(tr.LocalAddr())}
		big := term + 100 // a stranger's term would make the follower step up
		calls := map[string]func() error{
			"AppendEntries": func() error {
				return tr.AppendEntries("f", target, &raft.AppendEntriesRequest{RPCHeader: hdr, Term: 0, PrevLogEntry: 1 << 40}, &raft.AppendEntriesResponse{})
			},
			"RequestVote": func() error {
				return tr.RequestVote("f", target, &raft.RequestVoteRequest{RPCHeader: hdr, Term: 1}, &raft.RequestVoteResponse{})
			},
			"RequestPreVote": func() error {
				return tr.RequestPreVote("f", target, &raft.RequestPreVoteRequest{RPCHeader: hdr, Term: big, LastLogIndex: 1 << 40, LastLogTerm: big}, &raft.RequestPreVoteResponse{})
			},
			"InstallSnapshot": func() error {
				return tr.InstallSnapshot("f", target, &raft.InstallSnapshotRequest{RPCHeader: hdr, Term: 1, SnapshotVersion: raft.SnapshotVersionMax}, &raft.InstallSnapshotResponse{}, bytes.NewReader(nil))
			},
			"TimeoutNow": func() error {
				return tr.TimeoutNow("f", target, &raft.TimeoutNowRequest{RPCHeader: hdr}, &raft.TimeoutNowResponse{})
			},
		}
		for name, call := range calls {
			err := call()
			refused := err != nil && strings.Contains(err.Error(), "is not a member of its Raft configuration")
			if from == "stranger" && !refused {
				t.Errorf("%s from a node not in the configuration: %v, want a refusal", name, err)
			}
			if from != "stranger" && refused {
				t.Errorf("%s from member %s refused: %v", name, from, err)
			}
		}
		if from == "stranger" {
			if now := clusterTerm(t, tc.nodes[f].s); now != term {
				t.Fatalf("the follower's term went from %d to %d on a stranger's requests", term, now)
			}
		}
	}
}

func clusterTerm(t *testing.T, s *server.Server) uint64 {
	t.Helper()
	st, err := s.ClusterStatus()
	if err != nil {
		t.Fatal(err)
	}
	return st.Term
}

// TestClusterFollowerTakesLeaderAddedInItsAbsence: follower C is cut off
// while node D is added, and D then leads. C's configuration lacks D (the
// entry that adds it has not reached C), so D is a stranger to it; a
// member of C's configuration lists D, and so vouches for it: C takes D's
// entries and catches up. Without that, C refused D for as long as D led.
func TestClusterFollowerTakesLeaderAddedInItsAbsence(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	c := tc.others(l)[0]
	d := &tnode{in: server.NewInmemNode("d")}
	ln := listen(t)
	d.addr = ln.Addr().String()
	ln.Close()
	cc := &server.ClusterConfig{NodeID: "d", Advertise: d.addr, Join: true, HeartbeatTimeout: testHeartbeat, ElectionTimeout: testElection}
	d.in.Use(cc)
	d.cfg = server.Config{DataDir: t.TempDir(), Cluster: cc, NodeName: "node-d"}
	tc.nodes = append(tc.nodes, d)
	di := len(tc.nodes) - 1
	tc.start(di)
	tc.isolate(c)
	if err := tc.nodes[l].s.AddVoter(t.Context(), "d", d.in.Addr); err != nil {
		t.Fatal(err)
	}
	tok := tc.leaderSession(l).acquireOK(2, owner(1), 0, 60, "k")
	eventually(t, "D to apply the grant", func() bool { return d.s.Stats().LastToken == tok })
	if err := tc.nodes[l].s.TransferLeadershipTo("d", d.in.Addr); err != nil {
		t.Fatal(err)
	}
	if nl := tc.leader(di); nl != di {
		t.Fatalf("leader %d, want D", nl)
	}
	tok = tc.leaderSession(di).acquireOK(2, owner(2), 0, 60, "k2")
	tc.heal()
	deadline := time.Now().Add(30 * time.Second)
	for tc.nodes[c].s.Stats().LastToken != tok {
		if time.Now().After(deadline) {
			st, _ := tc.nodes[c].s.ClusterStatus()
			t.Fatalf("C did not take the entries of D, added while C was cut off, within 30 s: last token %d, want %d; C's configuration %v", tc.nodes[c].s.Stats().LastToken, tok, st.Servers)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := tc.leader(); s != di {
		t.Fatalf("leader %d after C's return, want D (C disturbed it)", s)
	}
}

// TestClusterImportedCeilingNotBootstrappedAgain: a cluster began with
// node A alone from a standalone token ceiling, the others added. Once the
// cluster's counter has reached the ceiling, A marks it as imported
// (tokens.ceiling.imported beside it). A's Raft state is then wiped (or
// moved aside: the ceiling stays in the data directory) and A started
// again with its config unchanged (peers naming itself alone): it must
// refuse to bootstrap, even under a cluster-id bound to its peers, where
// a standalone ceiling otherwise lets a node alone in. Without the mark it
// bootstrapped a second history of the cluster's tokens, from the ceiling.
func TestClusterImportedCeilingNotBootstrappedAgain(t *testing.T) {
	const ceiling = 1000
	var id string
	tc := newTestCluster(t, 3, func(i int, cfg *server.Config) {
		if id == "" {
			id = server.NewClusterIDFor(cfg.Cluster.Peers[:1])
		}
		cfg.Cluster.ClusterID = id
		if i > 0 {
			cfg.Cluster.Peers = nil // added below
			return
		}
		if err := server.WriteCeiling(cfg.DataDir, ceiling); err != nil {
			t.Fatal(err)
		}
		cfg.Cluster.Peers = cfg.Cluster.Peers[:1]
	})
	tc.leader(0)
	for _, nd := range tc.nodes[1:] {
		if err := tc.nodes[0].s.AddVoter(t.Context(), nd.in.ID, nd.in.Addr); err != nil {
			t.Fatal(err)
		}
	}
	if tok := tc.leaderSession(0).acquireOK(2, owner(1), 0, 60, "k"); tok <= ceiling {
		t.Fatalf("token %d, not above the ceiling %d", tok, ceiling)
	}
	mark := filepath.Join(tc.nodes[0].cfg.DataDir, "tokens.ceiling.imported")
	eventually(t, "the ceiling to be marked as imported", func() bool { _, err := os.Stat(mark); return err == nil })
	tc.stop(0)
	tc.wipe(0)
	_, err := server.New(tc.nodes[0].cfg)
	if !errors.Is(err, server.ErrClusterRefused) {
		t.Fatalf("New of the node whose ceiling was imported, its Raft state gone: %v, want ErrClusterRefused", err)
	}
	for _, want := range []string{"imported into a cluster already", mark, "'ticketingd cluster remove a'"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal lacks %q:\n%v", want, err)
		}
	}
}
