package server_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestClusterDamagedLogRefused is the damaged-log refusal in a cluster: tokens
// 4-6 granted (leases of 250 s) while one follower is down, the two others
// killed, the length field of token 4's entry zeroed in a survivor's tail
// segment. Before, the survivor started without a word with its log cut
// before that entry, and with the lagging follower elected a leader whose
// last token was 3, which granted 4, 5 and 6 again while their first
// holders' leases had minutes left. Now the survivor refuses to start,
// naming the segment file and the offset.
func TestClusterDamagedLogRefused(t *testing.T) {
	nodes := startDiskCluster(t)
	l := diskLeader(t, nodes)
	session := func(n *diskNode) *client {
		c := dial(t, n.addr)
		c.send(wire.Request{Type: wire.TypeHello, ReqID: 1, Version: wire.Version2, Name: []byte("test")})
		if r := c.expect(wire.TypeHelloOK, 1); r.Role != wire.RoleLeader {
			t.Fatalf("HELLO_OK role %d, want leader", r.Role)
		}
		return c
	}
	lastIndex := func(n *diskNode) uint64 {
		st, err := n.s.ClusterStatus()
		if err != nil {
			t.Fatal(err)
		}
		return st.LastLogIndex
	}
	c := session(nodes[l])
	for i := uint32(2); i <= 4; i++ { // tokens 1-3, released
		tok := c.acquireOK(i, owner(1), 0, 10, "warm")
		c.send(rel(i+100, tok, "warm"))
		c.expect(wire.TypeReleased, i+100)
	}
	for _, n := range nodes {
		eventually(t, "every node to have the first tokens", func() bool { return lastIndex(n) >= lastIndex(nodes[l]) })
	}
	down, survivor := nodes[(l+1)%3], nodes[(l+2)%3]
	down.stop(t, false)
	idx0 := lastIndex(nodes[l])
	for i, key := range []string{"k4", "k5", "k6"} {
		if tok := c.acquireOK(uint32(10+i), owner(2), 0, 250, key); tok != uint64(4+i) {
			t.Fatalf("token %d for %s, want %d", tok, key, 4+i)
		}
	}
	if lastIndex(survivor) <= idx0+2 {
		t.Fatalf("the survivor's log ends at %d, want at least %d", lastIndex(survivor), idx0+3)
	}
	nodes[l].stop(t, false)
	survivor.stop(t, false)

	// Zero the length of entry idx0+1 (token 4's) in the survivor's tail.
	segs, err := filepath.Glob(filepath.Join(survivor.cfg.DataDir, "raft", "log", "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("the survivor's segments: %v %v", segs, err)
	}
	path := segs[len(segs)-1]
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	off := -1
	for o := 32; o+16 <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[o:]))
		if n == 0 {
			break
		}
		if binary.LittleEndian.Uint64(b[o+8:]) == idx0+1 {
			off = o
			break
		}
		o += 8 + n
	}
	if off < 0 {
		t.Fatalf("no record of index %d in %s", idx0+1, path)
	}
	copy(b[off:], make([]byte, 4))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}

	s, err := server.New(survivor.cfg)
	if err == nil {
		// What it did before: start, and (with the lagging follower) grant
		// token 4 again.
		s.Close()
		down.start(t)
		survivor.start(t)
		nl := nodes[diskLeader(t, []*diskNode{nodes[0], nodes[1], nodes[2]})]
		tok := session(nl).acquireOK(2, owner(3), 0, 10, "k4")
		t.Fatalf("the survivor started with entry %d's length zeroed in %s; the new leader granted token %d on k4 (tokens 4-6 were granted before, leases 250 s)", idx0+1, path, tok)
	}
	for _, want := range []string{path, "corrupt record at offset", "not a torn write"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("New(survivor) = %v; want an error with %q", err, want)
		}
	}
}
