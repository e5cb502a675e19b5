package raftlog

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// counterFSM sums the commands (8-byte values) applied to it.
type counterFSM struct {
	mu  sync.Mutex
	sum uint64
}

func (f *counterFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sum += binary.LittleEndian.Uint64(l.Data)
	return nil
}

func (f *counterFSM) value() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sum
}

func (f *counterFSM) Snapshot() (raft.FSMSnapshot, error) {
	return counterSnap(f.value()), nil
}

func (f *counterFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var b [8]byte
	if _, err := io.ReadFull(rc, b[:]); err != nil {
		return err
	}
	f.mu.Lock()
	f.sum = binary.LittleEndian.Uint64(b[:])
	f.mu.Unlock()
	return nil
}

type counterSnap uint64

func (s counterSnap) Persist(sink raft.SnapshotSink) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(s))
	if _, err := sink.Write(b[:]); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (counterSnap) Release() {}

type raftNode struct {
	r     *raft.Raft
	fsm   *counterFSM
	log   *Store
	trans *raft.InmemTransport
	done  bool // shut down and closed
}

// waitFor polls cond for up to a minute (a bound for a hang, not a timing
// assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// nonMonotonic hides the Store's IsMonotonic: raft then keeps the old log
// after a snapshot install and stores the next entries after a gap.
type nonMonotonic struct{ raft.LogStore }

// TestRaftFollowerInstallsSnapshot runs hashicorp/raft on Stores: a
// follower cut off while the leader snapshots and compacts its log gets an
// InstallSnapshot, then entries from after the snapshot, beyond its own
// log; it must catch up and hold the leader's entries. As raftstore.Open
// has it (behind a raft.LogCache, monotonic: raft deletes the old log after
// the install), and without IsMonotonic (raft v1.8.0 keeps the old log and
// stores the next entries after a gap).
func TestRaftFollowerInstallsSnapshot(t *testing.T) {
	for _, tt := range []struct {
		name string
		wrap func(*Store) raft.LogStore
		gap  bool // whether the follower's StoreLogs sees a gap
	}{
		{"LogCache", func(s *Store) raft.LogStore {
			c, err := raft.NewLogCache(512, s)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}, false},
		{"not monotonic", func(s *Store) raft.LogStore { return nonMonotonic{s} }, true},
	} {
		t.Run(tt.name, func(t *testing.T) { testRaftFollowerInstallsSnapshot(t, tt.wrap, tt.gap) })
	}
}

func testRaftFollowerInstallsSnapshot(t *testing.T, wrap func(*Store) raft.LogStore, gap bool) {
	const n = 3
	nodes := make([]*raftNode, n)
	var servers []raft.Server
	for i := range nodes {
		addr, trans := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("n%d", i)))
		log, err := Open(t.TempDir(), Options{SegmentSize: 4096})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = &raftNode{fsm: &counterFSM{}, log: log, trans: trans}
		servers = append(servers, raft.Server{ID: raft.ServerID(addr), Address: addr})
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.trans.Connect(b.trans.LocalAddr(), b.trans)
			}
		}
	}
	for i, nd := range nodes {
		conf := raft.DefaultConfig()
		conf.LocalID = servers[i].ID
		// Not too short: a shared machine must not cause elections.
		conf.HeartbeatTimeout = 500 * time.Millisecond
		conf.ElectionTimeout = 500 * time.Millisecond
		conf.LeaderLeaseTimeout = 500 * time.Millisecond
		conf.CommitTimeout = 5 * time.Millisecond
		conf.SnapshotThreshold = 1 << 30 // snapshots by hand only
		conf.SnapshotInterval = time.Hour
		conf.TrailingLogs = 10
		conf.Logger = hclog.NewNullLogger()
		stable := raft.NewInmemStore()
		if err := raft.BootstrapCluster(conf, nd.log, stable, raft.NewInmemSnapshotStore(), nd.trans, raft.Configuration{Servers: servers}); err != nil {
			t.Fatal(err)
		}
		r, err := raft.NewRaft(conf, nd.fsm, wrap(nd.log), stable, raft.NewInmemSnapshotStore(), nd.trans)
		if err != nil {
			t.Fatal(err)
		}
		nd.r = r
	}
	defer func() {
		for _, nd := range nodes {
			if nd.done {
				continue
			}
			if err := nd.r.Shutdown().Error(); err != nil {
				t.Error(err)
			}
			nd.trans.Close()
			if err := nd.log.Close(); err != nil {
				t.Error(err)
			}
		}
	}()

	var leader *raftNode
	waitFor(t, "a leader", func() bool {
		for _, nd := range nodes {
			if nd.r.State() == raft.Leader {
				leader = nd
				return true
			}
		}
		return false
	})
	apply := func(k int, sum *uint64) {
		t.Helper()
		for i := range k {
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], uint64(i+1))
			if err := leader.r.Apply(b[:], 10*time.Second).Error(); err != nil {
				t.Fatal(err)
			}
			*sum += uint64(i + 1)
		}
	}
	var sum uint64
	apply(20, &sum)
	var follower *raftNode
	for _, nd := range nodes {
		if nd != leader {
			follower = nd
		}
	}
	waitFor(t, "the follower to apply the first entries", func() bool { return follower.fsm.value() == sum })
	cutLast, err := follower.log.LastIndex()
	if err != nil {
		t.Fatal(err)
	}

	// Cut the follower off; the leader goes on (with the third node),
	// snapshots and compacts its log beyond the follower's.
	follower.trans.DisconnectAll()
	for _, nd := range nodes {
		if nd != follower {
			nd.trans.Disconnect(follower.trans.LocalAddr())
		}
	}
	apply(200, &sum)
	if err := leader.r.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	leaderFirst, _ := leader.log.FirstIndex()
	if leaderFirst <= cutLast+1 {
		t.Fatalf("the leader's log starts at %d after its compaction; the follower's ends at %d", leaderFirst, cutLast)
	}
	for _, nd := range nodes {
		if nd != follower {
			nd.trans.Connect(follower.trans.LocalAddr(), follower.trans)
			follower.trans.Connect(nd.trans.LocalAddr(), nd.trans)
		}
	}
	apply(30, &sum)
	waitFor(t, "the follower to catch up", func() bool { return follower.fsm.value() == sum })

	first, _ := follower.log.FirstIndex()
	last, _ := follower.log.LastIndex()
	if first <= cutLast+1 {
		t.Fatalf("the follower's log is [%d, %d]; its log ended at %d before the snapshot: no gap?", first, last, cutLast)
	}
	follower.log.wmu.Lock()
	resets := follower.log.gapResets
	follower.log.wmu.Unlock()
	if (resets > 0) != gap {
		t.Fatalf("the follower's StoreLogs came after a gap %d times; want a gap: %v", resets, gap)
	}
	waitFor(t, "the follower's log to reach the leader's", func() bool {
		l1, _ := leader.log.LastIndex()
		l2, _ := follower.log.LastIndex()
		return l1 == l2
	})
	last, _ = follower.log.LastIndex()
	var a, b raft.Log
	for i := first; i <= last; i++ {
		if err := follower.log.GetLog(i, &a); err != nil {
			t.Fatalf("follower GetLog(%d) in [%d, %d]: %v", i, first, last, err)
		}
		if err := leader.log.GetLog(i, &b); err != nil {
			t.Fatalf("leader GetLog(%d): %v", i, err)
		}
		if a.Term != b.Term || a.Type != b.Type || !bytes.Equal(a.Data, b.Data) {
			t.Fatalf("entry %d: follower term %d type %v data %x, leader term %d type %v data %x", i, a.Term, a.Type, a.Data, b.Term, b.Type, b.Data)
		}
	}
	// And the follower's log reopens.
	if err := follower.r.Shutdown().Error(); err != nil {
		t.Fatal(err)
	}
	follower.trans.Close()
	follower.done = true
	if err := follower.log.Close(); err != nil {
		t.Fatal(err)
	}
	reopened, err := Open(follower.log.dir, Options{SegmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if f2, _ := reopened.FirstIndex(); f2 != first {
		t.Fatalf("reopened FirstIndex %d, want %d", f2, first)
	}
	if l2, _ := reopened.LastIndex(); l2 != last {
		t.Fatalf("reopened LastIndex %d, want %d", l2, last)
	}
	if err := reopened.Close(); err != nil {
		t.Fatal(err)
	}
}
