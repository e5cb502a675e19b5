package raft

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// gatedStore is an in-memory log store whose StoreLogs can be held: while
// the gate is shut, an append that holds an index at or above from waits
// for open. It stands for a disk whose fsync has not returned yet.
type gatedStore struct {
	*InmemStore
	mu     sync.Mutex
	from   uint64        // 0: the gate is open
	opened chan struct{} // closed by open
	held   chan struct{} // gets a value when an append starts to wait
	fail   uint64        // 0, or every append of an index >= fail fails
}

// failFrom makes every later append of an index >= from fail.
func (g *gatedStore) failFrom(from uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fail = from
}

func newGatedStore() *gatedStore {
	return &gatedStore{InmemStore: NewInmemStore(), held: make(chan struct{}, 16)}
}

// shut holds every later append of an index >= from.
func (g *gatedStore) shut(from uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.from, g.opened = from, make(chan struct{})
}

func (g *gatedStore) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.from != 0 {
		g.from = 0
		close(g.opened)
	}
}

func (g *gatedStore) StoreLogs(logs []*Log) error {
	g.mu.Lock()
	from, opened, fail := g.from, g.opened, g.fail
	g.mu.Unlock()
	if fail != 0 && len(logs) > 0 && logs[len(logs)-1].Index >= fail {
		return errors.New("disk gone")
	}
	if from != 0 && len(logs) > 0 && logs[len(logs)-1].Index >= from {
		g.held <- struct{}{}
		<-opened
	}
	return g.InmemStore.StoreLogs(logs)
}

func (g *gatedStore) StoreLog(l *Log) error { return g.StoreLogs([]*Log{l}) }

// has reports whether the store holds entry index.
func (g *gatedStore) has(index uint64) bool {
	var l Log
	return g.InmemStore.GetLog(index, &l) == nil
}

type gatedNode struct {
	r     *Raft
	store *gatedStore
	fsm   *MockFSM
}

// gatedCluster starts three bootstrapped nodes on in-memory transports and
// returns them with the leader first.
func gatedCluster(t *testing.T, serial bool) []*gatedNode {
	t.Helper()
	var nodes []*gatedNode
	var trans []*InmemTransport
	var servers []Server
	for i := range 3 {
		addr, tr := NewInmemTransportWithTimeout(ServerAddress(fmt.Sprintf("node%d", i)), 10*time.Second)
		trans = append(trans, tr)
		servers = append(servers, Server{ID: ServerID(addr), Address: addr})
	}
	for _, a := range trans {
		for _, b := range trans {
			a.Connect(b.LocalAddr(), b)
		}
	}
	for i, tr := range trans {
		conf := DefaultConfig()
		conf.LocalID = servers[i].ID
		conf.HeartbeatTimeout = 500 * time.Millisecond
		conf.ElectionTimeout = 500 * time.Millisecond
		conf.LeaderLeaseTimeout = 500 * time.Millisecond
		conf.CommitTimeout = 5 * time.Millisecond
		conf.SerialLeaderAppend = serial
		conf.BatchApplyCh = true // as the product sets it: applyCh is buffered
		conf.Logger = hclog.NewNullLogger()
		store := newGatedStore()
		snaps := NewInmemSnapshotStore()
		if err := BootstrapCluster(conf, store, store, snaps, tr, Configuration{Servers: servers}); err != nil {
			t.Fatal(err)
		}
		fsm := &MockFSM{}
		r, err := NewRaft(conf, fsm, store, store, snaps, tr)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, &gatedNode{r: r, store: store, fsm: fsm})
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.store.open()
		}
		for _, n := range nodes {
			_ = n.r.Shutdown().Error()
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for i, n := range nodes {
			if n.r.State() == Leader {
				// A first entry of the leader's term, committed, so that
				// later entries commit as soon as a quorum stores them.
				if err := n.r.Barrier(10 * time.Second).Error(); err != nil {
					break
				}
				nodes[0], nodes[i] = nodes[i], nodes[0]
				return nodes
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no leader elected")
	return nil
}

// waitFor polls cond until it holds, failing the test after a minute (a
// bound on a hang, not a timing assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func applyAsync(r *Raft, data string) <-chan error {
	done := make(chan error, 1)
	f := r.Apply([]byte(data), 30*time.Second)
	go func() { done <- f.Error() }()
	return done
}

// TestLeaderSendsWhileItsAppendIsInFlight: a commit costs one fsync, not
// two in series. The followers receive and store an entry while the
// leader's own append of it has not returned; the leader answers the
// Apply only once its append returned.
func TestLeaderSendsWhileItsAppendIsInFlight(t *testing.T) {
	nodes := gatedCluster(t, false)
	leader := nodes[0]
	next := leader.r.LastIndex() + 1
	leader.store.shut(next)
	done := applyAsync(leader.r, "x")
	<-leader.store.held
	waitFor(t, "both followers store the entry", func() bool {
		return nodes[1].store.has(next) && nodes[2].store.has(next)
	})
	select {
	case err := <-done:
		t.Fatalf("the Apply was answered (%v) before the leader's append returned", err)
	default:
	}
	leader.store.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !leader.store.has(next) {
		t.Fatal("the leader answered without the entry in its store")
	}
}

// TestSerialLeaderAppendStoresFirst: with SerialLeaderAppend, no follower
// sees an entry before the leader's append of it returned (the upstream
// behaviour, kept for measuring).
func TestSerialLeaderAppendStoresFirst(t *testing.T) {
	nodes := gatedCluster(t, true)
	leader := nodes[0]
	next := leader.r.LastIndex() + 1
	leader.store.shut(next)
	done := applyAsync(leader.r, "x")
	<-leader.store.held
	// The leader's goroutine is held in StoreLogs; the replicators could
	// only have been woken before it, which the serial path does not do.
	time.Sleep(50 * time.Millisecond)
	if nodes[1].store.has(next) || nodes[2].store.has(next) {
		t.Fatal("a follower stored the entry before the leader's append returned")
	}
	leader.store.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both followers store the entry", func() bool {
		return nodes[1].store.has(next) && nodes[2].store.has(next)
	})
}

// TestLeaderCountsItselfOnlyOnceDurable: with one follower's append and
// the leader's held, the other follower's acknowledgement alone does not
// commit the entry (one durable copy of three); the leader's durable
// append then makes the quorum.
func TestLeaderCountsItselfOnlyOnceDurable(t *testing.T) {
	nodes := gatedCluster(t, false)
	leader, fast, slow := nodes[0], nodes[1], nodes[2]
	next := leader.r.LastIndex() + 1
	leader.store.shut(next)
	slow.store.shut(next)
	done := applyAsync(leader.r, "x")
	<-leader.store.held
	waitFor(t, "the leader records the fast follower's acknowledgement", func() bool {
		c := leader.r.leaderState.commitment
		c.Lock()
		defer c.Unlock()
		return c.matchIndexes[fast.r.localID] >= next
	})
	if ci := leader.r.leaderState.commitment.getCommitIndex(); ci >= next {
		t.Fatalf("commit index %d reached entry %d with only one follower's append durable", ci, next)
	}
	leader.store.open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if slow.store.has(next) {
		t.Fatal("the slow follower's append was not held")
	}
	slow.store.open()
	waitFor(t, "the slow follower stores the entry", func() bool { return slow.store.has(next) })
}

// TestFailedLeaderAppendStepsDown: a leader whose append fails answers the
// Apply with the error and steps down, and its last log is where its store
// ends, although its followers may hold the entry.
func TestFailedLeaderAppendStepsDown(t *testing.T) {
	nodes := gatedCluster(t, false)
	leader := nodes[0]
	last := leader.r.LastIndex()
	leader.store.failFrom(last + 1)
	err := leader.r.Apply([]byte("x"), 30*time.Second).Error()
	if err == nil || err.Error() != "disk gone" {
		t.Fatalf("Apply: %v, want the store's error", err)
	}
	waitFor(t, "the leader steps down", func() bool { return leader.r.State() != Leader })
	if got := leader.r.LastIndex(); got != last {
		t.Fatalf("last index %d after the failed append, want %d (where the store ends)", got, last)
	}
}
