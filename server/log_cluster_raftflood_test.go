package server_test

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/server"
)

// raftFlood is a stranger without a certificate that keeps idle TCP
// connections open to a Raft port, from many source addresses, and opens a
// new one, at most rate a second, whenever one ends (refused at once, its
// handshake timed out, or closed by the stranger): what used to keep every
// handshake slot of the node busy.
type raftFlood struct {
	stop chan struct{}
	wg   sync.WaitGroup
}

// startRaftFlood floods target with idle connections from sources (local
// IPs, taken in turn), per connections at a time.
func startRaftFlood(t *testing.T, target string, sources []net.IP, idle, rate int) *raftFlood {
	t.Helper()
	f := &raftFlood{stop: make(chan struct{})}
	tokens := make(chan struct{})
	f.wg.Add(1)
	go func() { // the rate limit: one token per 1/rate s
		defer f.wg.Done()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				select {
				case tokens <- struct{}{}:
				case <-f.stop:
					return
				}
			case <-f.stop:
				return
			}
		}
	}()
	for w := range idle {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: sources[w%len(sources)]}, Timeout: time.Second}
			held := false
			for {
				// A connection that held a slot is replaced at once; one
				// refused at once waits for the rate limit.
				if !held {
					select {
					case <-tokens:
					case <-f.stop:
						return
					}
				}
				held = false
				c, err := d.Dial("tcp", target)
				if err != nil {
					continue
				}
				// Idle until the node closes it (a read returns), the
				// stranger closes it (after a random 0.5 to 4.5 s, so that
				// the slots do not all come free at once when the
				// connections of a burst time out together), or the flood
				// stops.
				closed := make(chan struct{})
				go func() {
					_, _ = c.Read(make([]byte, 1))
					close(closed)
				}()
				opened := time.Now()
				life := time.NewTimer(500*time.Millisecond + rand.N(4*time.Second))
				select {
				case <-closed:
				case <-life.C:
				case <-f.stop:
				}
				held = time.Since(opened) > 100*time.Millisecond
				life.Stop()
				_ = c.Close()
				<-closed
			}
		}()
	}
	t.Cleanup(f.end)
	return f
}

// end stops the flood and closes its connections; it is idempotent.
func (f *raftFlood) end() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.wg.Wait()
}

// TestClusterElectsUnderRaftPortFlood runs a three-node cluster over mutual
// TLS, each node on a loopback address of its own, while a stranger
// without a certificate floods every node's Raft port with idle
// connections (70 per node, reopened at up to 1,000 a second, from 40
// other loopback addresses). The nodes must still elect a serving leader,
// and elect another after the leader is killed, each within the 10 s the
// test waits (about a second without the flood). The flood used to take
// every handshake slot that peers needed.
func TestClusterElectsUnderRaftPortFlood(t *testing.T) {
	ca, err := pki.NewCA("flood test cluster CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var strangers []net.IP
	for i := range 40 {
		strangers = append(strangers, net.IPv4(127, 0, 18, byte(100+i)))
	}
	var nodes []*diskNode
	var peers []server.Peer
	var logs []*proctest.LogBuffer
	for i := range 3 {
		id := fmt.Sprintf("n%d", i+1)
		ip := fmt.Sprintf("127.0.18.%d", 11+i)
		ln, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Skipf("no loopback address %s: %v", ip, err)
		}
		raftAddr := ln.Addr().String()
		_ = ln.Close()
		kp, err := ca.Issue(pki.Node, []string{ip}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		cert := kp.TLSCertificate()
		n := &diskNode{addr: freeAddr(t)}
		lb := proctest.NewLogBuffer()
		logs = append(logs, lb)
		n.cfg = server.Config{DataDir: t.TempDir(), NodeName: id,
			Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelWarn})), Cluster: &server.ClusterConfig{
				NodeID: id, RaftListen: raftAddr, Advertise: n.addr, PeerCertificate: &cert, PeerRoots: ca.Pool(),
				HeartbeatTimeout: testHeartbeat, ElectionTimeout: testElection,
			}}
		peers = append(peers, server.Peer{ID: id, Address: raftAddr})
		nodes = append(nodes, n)
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			n.stop(t, false)
		}
	})
	// Each node is flooded, to the point of refusing the flood's
	// connections, before the next starts: no peer connects to a node
	// before the flood is there.
	refusing := func(line string) bool { return strings.Contains(line, "too many handshakes in progress") }
	for i, n := range nodes {
		n.cfg.Cluster.Peers = peers
		n.start(t)
		startRaftFlood(t, n.cfg.Cluster.RaftListen, strangers, 70, 1000)
		if _, _, err := logs[i].WaitLine(0, refusing, nil, 10*time.Second); err != nil {
			t.Fatalf("%s: the flood is not refused: %v\n%s", n.cfg.Cluster.NodeID, err, logs[i].String())
		}
	}

	// servingLeader waits for one of nodes to lead and serve.
	servingLeader := func(what string, among ...int) (int, time.Duration) {
		t.Helper()
		start := time.Now()
		for time.Since(start) < 10*time.Second {
			for _, i := range among {
				if n := nodes[i]; n.s != nil && n.s.Stats().Role == "leader" {
					return i, time.Since(start)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s: no serving leader within 10 s while a stranger floods the Raft ports", what)
		return -1, 0
	}
	l, took := servingLeader("first election", 0, 1, 2)
	t.Logf("first election under the flood: %s leads after %v", nodes[l].cfg.Cluster.NodeID, took.Round(time.Millisecond))

	nodes[l].stop(t, false)
	var rest []int
	for i := range nodes {
		if i != l {
			rest = append(rest, i)
		}
	}
	l2, took := servingLeader("after the leader was killed", rest...)
	t.Logf("after the leader was killed under the flood: %s leads after %v", nodes[l2].cfg.Cluster.NodeID, took.Round(time.Millisecond))

	// The flood never took a member's slots.
	for i, lb := range logs {
		if log := lb.String(); strings.Contains(log, "from a member's address") {
			t.Errorf("%s: a member's connection refused or failed:\n%s", nodes[i].cfg.Cluster.NodeID, log)
		}
	}
}
