//go:build linux

package server_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// TestClusterFollowerDiskFull: a follower whose data
// dir is on a small file system (a 4 MiB tmpfs with about 200 KiB free,
// less than a 64 MiB segment) follows in smaller segments; once its disk
// is full, its appends fail and it reports itself unhealthy with the
// reason (TokenStoreErr, what /healthz answers, and
// ticketing_token_store_ok); once space is freed it catches up and is
// healthy again. Before, it could not even start (its first segment could
// not be preallocated), and a node whose appends failed said it was
// healthy.
func TestClusterFollowerDiskFull(t *testing.T) {
	fs := t.TempDir()
	if err := syscall.Mount("tmpfs", fs, "tmpfs", 0, "size=4m,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs (%v): run as root to test a full disk", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(fs, 0); err != nil {
			t.Errorf("unmount %s: %v", fs, err)
		}
	})
	// Leave about 200 KiB free: the follower's segments get 128 KiB,
	// then 64 KiB, and then nothing.
	filler := filepath.Join(fs, "filler")
	var st syscall.Statfs_t
	if err := syscall.Statfs(fs, &st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filler, make([]byte, int64(st.Bavail)*st.Bsize-200<<10), 0o600); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewPedanticRegistry()
	nodes, peers := newDiskNodes(t)
	f := nodes[2]
	f.cfg.DataDir = filepath.Join(fs, "c")
	f.cfg.Registerer = reg
	// a and b form the cluster and elect the leader; c starts as a node
	// that joins an existing cluster (it never bootstraps) and is added as
	// a voter, so that it must catch up on its small disk.
	for _, n := range nodes[:2] {
		n.cfg.Cluster.Peers = peers[:2]
	}
	f.cfg.Cluster.Join = true
	nodes[0].start(t)
	nodes[1].start(t)
	l := nodes[diskLeader(t, nodes[:2])]
	f.start(t)
	addCtx, addCancel := context.WithTimeout(context.Background(), 30*time.Second)
	if err := l.s.AddVoter(addCtx, "c", peers[2].Address); err != nil {
		addCancel()
		t.Fatalf("AddVoter(c): %v", err)
	}
	addCancel()

	lastIndex := func(n *diskNode) uint64 {
		st, err := n.s.ClusterStatus()
		if err != nil {
			t.Fatal(err)
		}
		return st.LastLogIndex
	}
	tokenStoreOK := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "ticketing_token_store_ok" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no ticketing_token_store_ok")
		return 0
	}
	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out after %v waiting for %s (leader at %d, follower at %d, follower's health: %v)",
					d, what, lastIndex(l), lastIndex(f), f.s.TokenStoreErr())
			}
		}
	}
	c := dial(t, l.addr)
	c.send(wire.Request{Type: wire.TypeHello, ReqID: 1, Version: wire.Version2, Name: []byte("test")})
	if r := c.expect(wire.TypeHelloOK, 1); r.Role != wire.RoleLeader {
		t.Fatalf("HELLO_OK role %d, want leader", r.Role)
	}
	key := strings.Repeat("k", wire.MaxKeyLen) // about 300 bytes an entry
	id := uint32(1)
	grant := func() {
		t.Helper()
		id++
		tok := c.acquireOK(id, owner(1), 0, 60, key)
		id++
		c.send(rel(id, tok, key))
		c.expect(wire.TypeReleased, id)
	}
	grant()
	waitFor("the follower to follow", 10*time.Second, func() bool { return lastIndex(f) >= lastIndex(l) })
	if err := f.s.TokenStoreErr(); err != nil || tokenStoreOK() != 1 {
		t.Fatalf("the follower's health: %v, ticketing_token_store_ok %v", err, tokenStoreOK())
	}

	// Fill the follower's disk: the majority (a, b) goes on granting.
	start := time.Now()
	for n := 0; f.s.TokenStoreErr() == nil; n++ {
		if n == 5000 {
			t.Fatalf("5000 grants later the follower is at %d (leader %d) and reports no error", lastIndex(f), lastIndex(l))
		}
		grant()
	}
	err := f.s.TokenStoreErr()
	t.Logf("after %v, at index %d (leader %d): %v", time.Since(start), lastIndex(f), lastIndex(l), err)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "cannot write its Raft log") {
		t.Fatalf("the follower's TokenStoreErr = %v; want the log's ENOSPC", err)
	}
	if st := f.s.Stats(); !strings.Contains(st.TokenStoreError, "no space left on device") {
		t.Fatalf("the follower's Stats().TokenStoreError = %q", st.TokenStoreError)
	}
	if v := tokenStoreOK(); v != 0 {
		t.Fatalf("ticketing_token_store_ok = %v on a follower that cannot write its log", v)
	}
	grant() // the leader still grants
	if err := l.s.TokenStoreErr(); err != nil {
		t.Fatalf("the leader's health: %v", err)
	}

	// Space freed: the follower catches up and is healthy again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	grant()
	target := lastIndex(l)
	waitFor("the follower to catch up after space was freed", 10*time.Second, func() bool {
		return lastIndex(f) >= target && f.s.TokenStoreErr() == nil
	})
	if v := tokenStoreOK(); v != 1 {
		t.Fatalf("ticketing_token_store_ok = %v after the follower caught up", v)
	}
}
