package server_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/server"
)

// A cluster as deployed: the TCP Raft transport (package raftnet, plain
// TCP here), the durable stores in each node's data dir, and the real
// broker given the three client addresses.

type diskNode struct {
	cfg  server.Config
	s    *server.Server
	addr string
	done chan error
}

func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := proctest.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(p)
}

func (n *diskNode) start(t *testing.T) {
	t.Helper()
	s, err := server.New(n.cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", n.cfg.Cluster.NodeID, err)
	}
	var ln net.Listener
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ln, err = net.Listen("tcp", n.addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	n.s, n.done = s, make(chan error, 1)
	go func() { n.done <- s.Serve(ln) }()
}

func (n *diskNode) stop(t *testing.T, graceful bool) {
	if n.s == nil {
		return
	}
	if graceful {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n.s.Shutdown(ctx)
		cancel()
	} else {
		n.s.Close()
	}
	if err := <-n.done; !errors.Is(err, server.ErrServerClosed) {
		t.Errorf("Serve returned %v", err)
	}
	n.s = nil
}

// newDiskNodes makes three nodes, a, b and c, not started, and their
// configuration (peers), which no node has yet; each tweak adjusts every
// node's Config. The nodes are stopped when the test ends.
func newDiskNodes(t *testing.T, tweak ...func(*server.Config)) ([]*diskNode, []server.Peer) {
	t.Helper()
	var nodes []*diskNode
	var peers []server.Peer
	for i := range 3 {
		id := string(rune('a' + i))
		raftAddr := freeAddr(t)
		n := &diskNode{addr: freeAddr(t)}
		n.cfg = server.Config{DataDir: t.TempDir(), NodeName: id, Cluster: &server.ClusterConfig{
			NodeID: id, RaftListen: raftAddr, Advertise: n.addr,
			HeartbeatTimeout: testHeartbeat, ElectionTimeout: testElection,
		}}
		for _, f := range tweak {
			f(&n.cfg)
		}
		peers = append(peers, server.Peer{ID: id, Address: raftAddr})
		nodes = append(nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.stop(t, false)
		}
	})
	return nodes, peers
}

// startDiskCluster starts three nodes (newDiskNodes) that bootstrap
// together; each tweak adjusts every node's Config before it starts.
func startDiskCluster(t *testing.T, tweak ...func(*server.Config)) []*diskNode {
	t.Helper()
	nodes, peers := newDiskNodes(t, tweak...)
	for _, n := range nodes {
		n.cfg.Cluster.Peers = peers
		n.start(t)
	}
	return nodes
}

func diskLeader(t *testing.T, nodes []*diskNode) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for i, n := range nodes {
			if n.s != nil && n.s.Stats().Role == "leader" {
				return i
			}
		}
	}
	t.Fatal("no leader within 10 s")
	return -1
}

func TestClusterOnDiskWithBroker(t *testing.T) {
	nodes := startDiskCluster(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	b, err := broker.New(broker.Config{Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := b.Acquire(ctx, "held", broker.AcquireOptions{Lease: 30 * time.Second, Work: 25 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	last := held.Token()

	// kill the leader (Close: no goodbye to clients or peers), twice, each
	// time with the killed node restarted from its data dir.
	for round := range 2 {
		l := diskLeader(t, nodes)
		nodes[l].stop(t, false)
		if err := b.WaitReady(ctx); err != nil {
			t.Fatalf("round %d: broker not ready after the leader's loss: %v", round, err)
		}
		tk, err := acquireRetry(ctx, b, "k")
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if tk.Token() <= last {
			t.Fatalf("round %d: token %d after a failover, not above %d", round, tk.Token(), last)
		}
		last = tk.Token()
		if err := tk.Release(ctx); err != nil {
			t.Fatalf("round %d: release: %v", round, err)
		}
		nodes[l].start(t)
	}

	// Stop all three (gracefully) and start them again from disk.
	for _, n := range nodes {
		n.stop(t, true)
	}
	for _, n := range nodes {
		n.start(t)
	}
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	tk, err := acquireRetry(ctx, b, "after-restart")
	if err != nil {
		t.Fatal(err)
	}
	if tk.Token() <= last {
		t.Fatalf("token %d after a full restart, not above %d", tk.Token(), last)
	}
	// The lock granted before the failovers and the full restart is still
	// held: its release frees it.
	if err := held.Release(ctx); err != nil {
		t.Fatalf("the lock held across failovers and a full restart: release: %v", err)
	}
}

// acquireRetry acquires key, retrying what the broker reports as not sent
// or indeterminate (a leader change under the request).
func acquireRetry(ctx context.Context, b *broker.Broker, key string) (*broker.Ticket, error) {
	for {
		tk, err := b.Acquire(ctx, key, broker.AcquireOptions{Lease: 10 * time.Second, Wait: 5 * time.Second, Work: 5 * time.Second})
		if err == nil || ctx.Err() != nil || !(errors.Is(err, broker.ErrUnsent) || errors.Is(err, broker.ErrIndeterminate) || errors.Is(err, broker.ErrNotReady)) {
			return tk, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
