package main

// Conformance of protocol version 3 (docs/protocol.md, "Version 3
// additions": EXTEND, KEPT and the group's identity in HELLO_OK) against
// the real binary, with raw bytes as in conformance_test.go: a standalone
// server, and a three-node cluster of real processes from 'init
// --cluster', whose leader is killed with -9 while it holds a refreshed
// lock. The same EXTEND cases run against both (extendCases).
//
// Run only this suite: go test ./cmd/ticketingd -run ConformanceVersion3 -count=1

import (
	"bufio"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/server"
)

// extF is an EXTEND frame (hex, not internal/wire).
func extF(t testing.TB, req uint32, token uint64, owner byte, leaseS uint8, key string) []byte {
	return lenPrefix(t, fmt.Sprintf("58%08x%016x%s%02x%02x%x", req, token, ownerHex(owner), leaseS, len(key), key))
}

// helloOKHexV is the exact HELLO_OK of version v (1 to 3) with role and
// node; version 3 adds cluster, the group's identity.
func helloOKHexV(req uint32, v, role byte, node, cluster string) string {
	body := fmt.Sprintf("4f%08x%02x%02x%02x%x", req, v, role, len(node), node)
	if v >= 3 {
		body += fmt.Sprintf("%02x%x", len(cluster), cluster)
	}
	return fmt.Sprintf("%08x%s", len(body)/2, body)
}

// helloHexV is a HELLO of version v with a client token and no name.
func helloHexV(req uint32, v byte, token string) string {
	body := fmt.Sprintf("48%08x%02x%02x%x00", req, v, len(token), token)
	return fmt.Sprintf("%08x%s", len(body)/2, body)
}

// v3Target is a serving node for extendCases: open dials it and completes
// a HELLO of the given version, checking every byte of its HELLO_OK.
type v3Target struct {
	open func(t *testing.T, version byte) *raw
}

// standaloneTarget: a server started by startConf (no client token, node
// n1): its HELLO_OK of version 3 has role 1 and no identity.
func standaloneTarget(c *conf) *v3Target {
	return &v3Target{open: func(t *testing.T, v byte) *raw {
		t.Helper()
		r := dialConf(t, c.addr)
		r.send(x(t, helloHexV(1, v, "")))
		r.expect(helloOKHexV(1, v, 1, "n1", ""))
		return r
	}}
}

// sleepUntil sleeps until the instant at.
func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// extendCases: the rules of EXTEND (docs/protocol.md, "Version 3
// additions") on tg, one subtest each, in parallel (three of them wait
// for leases of 1 to 3 s). Every subtest uses its own keys.
func extendCases(t *testing.T, tg *v3Target) {
	t.Run("K: exact token and owner, from any session; the token stays", func(t *testing.T) {
		t.Parallel()
		r := tg.open(t, 3)
		r.send(acqF(t, 2, 1, 0, 30, "x-kept"))
		tok, _ := r.expectG(2)
		r.send(extF(t, 3, tok, 1, 30, "x-kept"))
		r.expect(simpleHex('K', 3))
		// Locks are not tied to sessions: another session's EXTEND with
		// the token and the owner is as good.
		o := tg.open(t, 3)
		o.send(extF(t, 2, tok, 1, 60, "x-kept"))
		o.expect(simpleHex('K', 2))
		o.send(acqF(t, 3, 9, 0, 30, "x-kept"))
		o.expect(simpleHex('T', 3))
		// The holder's retry gets the same token: an EXTEND issues none.
		r.send(acqF(t, 4, 1, 0, 30, "x-kept"))
		r.expectGExact(4, tok, 0)
		r.send(relOwnedF(t, 5, tok, 1, "x-kept"))
		r.expect(simpleHex('R', 5))
	})
	t.Run("N: wrong token, wrong owner, unknown key; the lock is untouched", func(t *testing.T) {
		t.Parallel()
		r := tg.open(t, 3)
		r.send(acqF(t, 2, 1, 0, 30, "x-wrong"))
		tok, _ := r.expectG(2)
		o := tg.open(t, 3)
		o.send(acqF(t, 2, 2, 0, 30, "x-wrong-2"))
		tok2, _ := o.expectG(2)
		for i, f := range [][]byte{
			extF(t, 3, tok+1, 1, 60, "x-wrong"),       // the owner, another token
			extF(t, 4, tok2, 1, 60, "x-wrong"),        // the owner, another key's token
			extF(t, 5, tok, 2, 60, "x-wrong"),         // the token, another owner
			extF(t, 6, tok, 1, 60, "x-never-held"),    // a key never held
			extF(t, 7, tok, 1, 60, "x-wrong-2"),       // another key, held with another token
			extF(t, 8, tok2, 1, 60, "x-wrong-2"),      // its token, not its owner
			extF(t, 9, 0, 1, 60, "x-wrong"),           // token 0
			extF(t, 10, ^uint64(0), 1, 60, "x-wrong"), // the largest token
		} {
			r.send(f)
			r.expect(simpleHex('N', uint32(3+i)))
		}
		// Both locks are still held, each by its own token and owner.
		o.send(acqF(t, 3, 3, 0, 30, "x-wrong"))
		o.expect(simpleHex('T', 3))
		r.send(acqF(t, 11, 3, 0, 30, "x-wrong-2"))
		r.expect(simpleHex('T', 11))
		r.send(relOwnedF(t, 12, tok, 1, "x-wrong"))
		r.expect(simpleHex('R', 12))
		o.send(relOwnedF(t, 4, tok2, 2, "x-wrong-2"))
		o.expect(simpleHex('R', 4))
	})
	t.Run("N after a release (RELEASE or RELEASE_OWNED)", func(t *testing.T) {
		t.Parallel()
		r := tg.open(t, 3)
		r.send(acqF(t, 2, 1, 0, 30, "x-released"))
		tok, _ := r.expectG(2)
		r.send(relF(t, 3, tok, "x-released"))
		r.expect(simpleHex('R', 3))
		r.send(extF(t, 4, tok, 1, 30, "x-released"))
		r.expect(simpleHex('N', 4))
		r.send(acqF(t, 5, 1, 0, 30, "x-released"))
		tok2, _ := r.expectG(5)
		if tok2 <= tok {
			t.Fatalf("token %d after %d", tok2, tok)
		}
		r.send(relOwnedF(t, 6, tok2, 1, "x-released"))
		r.expect(simpleHex('R', 6))
		r.send(extF(t, 7, tok2, 1, 30, "x-released"))
		r.expect(simpleHex('N', 7))
		// The N brought nothing back: the key is free.
		o := tg.open(t, 3)
		o.send(acqF(t, 2, 2, 0, 30, "x-released"))
		o.expectG(2)
	})
	t.Run("N after the lease ended; the key stays free", func(t *testing.T) {
		t.Parallel()
		r := tg.open(t, 3)
		r.send(acqF(t, 2, 1, 0, 1, "x-expired"))
		tok, _ := r.expectG(2)
		got := time.Now() // the 1 s lease ends before this instant + 1 s
		sleepUntil(got.Add(1200 * time.Millisecond))
		r.send(extF(t, 3, tok, 1, 30, "x-expired"))
		r.expect(simpleHex('N', 3))
		o := tg.open(t, 3)
		o.send(acqF(t, 2, 2, 0, 30, "x-expired"))
		if tok2, _ := o.expectG(2); tok2 <= tok {
			t.Fatalf("token %d after %d", tok2, tok)
		}
	})
	t.Run("a shorter lease never shortens: held until the original end", func(t *testing.T) {
		t.Parallel()
		r := tg.open(t, 3)
		o := tg.open(t, 3)
		sent := time.Now() // the 3 s lease ends no earlier than this + 3 s
		r.send(acqF(t, 2, 1, 0, 3, "x-shorter"))
		tok, _ := r.expectG(2)
		r.send(extF(t, 3, tok, 1, 1, "x-shorter"))
		r.expect(simpleHex('K', 3))
		kept := time.Now() // had the EXTEND shortened it, it would end before this + 1 s
		// Just before the original end, after the end a 1 s lease would
		// have: another owner's wait-0 ACQUIRE finds the key held.
		check := sent.Add(2 * time.Second)
		if c := kept.Add(1200 * time.Millisecond); c.After(check) {
			check = c
		}
		if !check.Before(sent.Add(2700 * time.Millisecond)) {
			t.Skipf("the ACQUIRE and EXTEND took %v: too slow to tell a 1 s lease from a 3 s one", kept.Sub(sent))
		}
		sleepUntil(check)
		o.send(acqF(t, 2, 2, 0, 30, "x-shorter"))
		if f := o.next(); f[4] != 'T' {
			if time.Since(sent) < 3*time.Second {
				t.Fatalf("another owner's ACQUIRE got %x %v after the 3 s lease's grant (1 s after an EXTEND of 1 s): the EXTEND shortened it", f, time.Since(sent))
			}
			t.Skipf("the machine stalled past the original end (%v): the check tells nothing", time.Since(sent))
		}
		// A waiter gets the key when the original lease ends, not before.
		o.send(acqF(t, 3, 2, 10, 30, "x-shorter"))
		tok2, _ := o.expectG(3)
		if el := time.Since(sent); el < 3*time.Second || tok2 <= tok {
			t.Fatalf("the next owner got token %d (after %d) %v after the 3 s lease's ACQUIRE was sent: before its end", tok2, tok, el)
		}
		r.send(relF(t, 4, tok, "x-shorter"))
		r.expect(simpleHex('N', 4))
	})
	t.Run("a longer lease moves the end; the same token releases it", func(t *testing.T) {
		t.Parallel()
		r := tg.open(t, 3)
		o := tg.open(t, 3)
		sent := time.Now() // the EXTEND's 3 s end is no earlier than this + 3 s
		r.send(acqF(t, 2, 1, 0, 1, "x-longer"))
		tok, _ := r.expectG(2)
		got := time.Now() // the 1 s lease would end before this + 1 s
		r.send(extF(t, 3, tok, 1, 3, "x-longer"))
		r.expect(simpleHex('K', 3))
		check := got.Add(1300 * time.Millisecond)
		if !check.Before(sent.Add(2700 * time.Millisecond)) {
			t.Skipf("the ACQUIRE took %v: too slow to tell a 1 s lease from a 3 s one", got.Sub(sent))
		}
		sleepUntil(check)
		o.send(acqF(t, 2, 2, 0, 30, "x-longer"))
		if f := o.next(); f[4] != 'T' {
			if time.Since(sent) < 3*time.Second {
				t.Fatalf("another owner's ACQUIRE got %x %v after the grant of 1 s extended to 3 s: the EXTEND did not extend it", f, time.Since(sent))
			}
			t.Skipf("the machine stalled past the extended end (%v): the check tells nothing", time.Since(sent))
		}
		// The token did not change: RELEASE with it frees the key.
		r.send(relF(t, 4, tok, "x-longer"))
		r.expect(simpleHex('R', 4))
		o.send(acqF(t, 3, 2, 0, 30, "x-longer"))
		o.expectG(3)
	})
	t.Run("versions 1 and 2: X -> E(1) with its req_id, nothing extended", func(t *testing.T) {
		t.Parallel()
		for _, v := range []byte{1, 2} {
			t.Run("version "+strconv.Itoa(int(v)), func(t *testing.T) {
				t.Parallel()
				key := "x-v" + strconv.Itoa(int(v))
				h := tg.open(t, 3)
				h.send(acqF(t, 2, 1, 0, 1, key))
				tok, _ := h.expectG(2)
				got := time.Now() // the 1 s lease ends before this + 1 s
				r := tg.open(t, v)
				r.send(extF(t, 5, tok, 1, 60, key))
				r.expectE(1, 5)
				// The X changed nothing: the 1 s lease ended.
				sleepUntil(got.Add(1200 * time.Millisecond))
				o := tg.open(t, 3)
				o.send(acqF(t, 2, 2, 0, 30, key))
				o.expectG(2)
			})
		}
		// The EXTEND vector on a version-2 session: E(1) as well.
		r := tg.open(t, 2)
		r.send(x(t, "000000275800000004000000000000002a000102030405060708090a0b0c0d0e0f1e086f726465722d3432"))
		r.expectE(1, 4)
	})
	t.Run("malformed EXTEND -> E(1)", func(t *testing.T) {
		t.Parallel()
		owner := ownerHex(1)
		// Bodies: the length header is right, the body is not.
		for _, tc := range []struct {
			name, body string
			req        uint32
		}{
			{"type and req_id only", "5800000007", 7},
			{"cut in the owner", "5800000007" + "000000000000002a" + owner[:14], 7},
			{"no lease_s or key_len", "5800000007" + "000000000000002a" + owner, 7},
			{"no key_len", "5800000007" + "000000000000002a" + owner + "1e", 7},
			{"key_len past the end", "5800000007" + "000000000000002a" + owner + "1e" + "03" + "6162", 7},
			{"key_len 255, 3 bytes", "5800000007" + "000000000000002a" + owner + "1e" + "ff" + "616263", 7},
			{"a trailing byte", "5800000007" + "000000000000002a" + owner + "1e" + "02" + "6162" + "00", 7},
			{"4 bytes: no req_id", "58000000", 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := tg.open(t, 3)
				r.send(lenPrefix(t, tc.body))
				r.expectE(1, tc.req)
			})
		}
	})
	t.Run("out of range -> E(4) with the req_id", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name  string
			frame []byte
		}{
			{"lease_s 0", extF(t, 8, 1, 1, 0, "x-range")},
			{"lease_s 251", extF(t, 8, 1, 1, 251, "x-range")},
			{"lease_s 255", extF(t, 8, 1, 1, 255, "x-range")},
			{"key_len 0", extF(t, 8, 1, 1, 30, "")},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := tg.open(t, 3)
				r.send(tc.frame)
				r.expectE(4, 8)
			})
		}
		// The bounds themselves are in range.
		r := tg.open(t, 3)
		r.send(extF(t, 2, 1, 1, 1, "x-range"), extF(t, 3, 1, 1, 250, "x-range"), extF(t, 4, 1, 1, 30, string(make([]byte, 255))))
		got := map[string]bool{}
		for range 3 {
			got[hex.EncodeToString(r.next())] = true
		}
		for _, id := range []uint32{2, 3, 4} {
			if !got[simpleHex('N', id)] {
				t.Errorf("EXTEND req %d at a bound: replies %v, want N", id, got)
			}
		}
	})
	t.Run("the req_id of a waiting ACQUIRE reused by an EXTEND -> E(1)", func(t *testing.T) {
		t.Parallel()
		h := tg.open(t, 3)
		h.send(acqF(t, 2, 1, 0, 30, "x-inflight"))
		tok, _ := h.expectG(2)
		w := tg.open(t, 3)
		w.send(acqF(t, 9, 2, 30, 30, "x-inflight"))
		w.sync(8)
		w.send(extF(t, 9, tok, 1, 30, "x-inflight"))
		w.expectE(1, 9)
		h.send(relF(t, 3, tok, "x-inflight"))
		h.expect(simpleHex('R', 3))
	})
	t.Run("K answers only EXTEND: pipelined requests each get their own reply", func(t *testing.T) {
		t.Parallel()
		r := tg.open(t, 3)
		r.send(acqF(t, 2, 1, 0, 30, "x-pipe"))
		tok, _ := r.expectG(2)
		r.send(
			extF(t, 3, tok, 1, 30, "x-pipe"),  // K
			pingF(t, 4),                       // PONG
			acqF(t, 5, 1, 0, 30, "x-pipe"),    // the holder's retry: G, same token
			acqF(t, 6, 2, 0, 30, "x-pipe"),    // another owner: T
			relOwnedF(t, 7, tok, 1, "x-pipe"), // R
			extF(t, 8, tok, 1, 30, "x-pipe"),  // released: N
			relF(t, 9, tok, "x-pipe"),         // N
		)
		want := map[uint32]string{
			3: simpleHex('K', 3), 4: simpleHex('P', 4), 5: fmt.Sprintf("0000001147%08x%016x%08x", 5, tok, 0),
			6: simpleHex('T', 6), 7: simpleHex('R', 7), 8: simpleHex('N', 8), 9: simpleHex('N', 9),
		}
		for range want {
			f := r.next()
			if len(f) < 9 {
				t.Fatalf("reply %x", f)
			}
			id := uint32(f[5])<<24 | uint32(f[6])<<16 | uint32(f[7])<<8 | uint32(f[8])
			if w, ok := want[id]; !ok || hex.EncodeToString(f) != w {
				t.Fatalf("reply %x, want %s", f, w)
			}
			delete(want, id)
		}
	})
}

// TestConformanceVersion3: the version-3 vectors against a standalone
// server, byte for byte, then every EXTEND rule (extendCases).
func TestConformanceVersion3(t *testing.T) {
	t.Parallel()
	t.Run("vectors: HELLO v3 -> HELLO_OK v3 without identity, EXTEND -> N, then K", func(t *testing.T) {
		t.Parallel()
		// Tokens above 41: the first grant is token 42, the EXTEND vector's.
		s := startConf(t, "--initial-token", "41", withAdmin)
		r := dialConf(t, s.addr)
		r.send(x(t, "000000084800000001030000"))
		r.expect("0000000b4f000000010301026e3100") // role 1, node "n1", no cluster identity
		// EXTEND req 4, token 42, owner 00..0f, lease 30, key "order-42",
		// nothing held: N.
		r.send(x(t, "000000275800000004000000000000002a000102030405060708090a0b0c0d0e0f1e086f726465722d3432"))
		r.expect(simpleHex('N', 4))
		// The ACQUIRE vector (owner 00..0f): token 42.
		r.send(x(t, "000000204100000002000102030405060708090a0b0c0d0e0f051e086f726465722d3432"))
		if tok, _ := r.expectG(2); tok != 42 {
			t.Fatalf("first token %d with --initial-token 41, want 42", tok)
		}
		// The EXTEND vector again: the KEPT vector.
		r.send(x(t, "000000275800000004000000000000002a000102030405060708090a0b0c0d0e0f1e086f726465722d3432"))
		r.expect("000000054b00000004")
		s.waitStatus(t, "kept", 1)
		if st := s.status(t); st["not_held"] != 1 {
			t.Errorf("/status not_held %v, want 1 (the first EXTEND)", st["not_held"])
		}
	})
	t.Run("HELLO_OK carries the version asked for, with a client token", func(t *testing.T) {
		t.Parallel()
		s := startConf(t, "--client-token", "s3cret")
		for _, v := range []byte{1, 2, 3} {
			r := dialConf(t, s.addr)
			r.send(x(t, helloHexV(1, v, "s3cret")))
			r.expect(helloOKHexV(1, v, 1, "n1", ""))
			r.sync(2)
		}
		r := dialConf(t, s.addr)
		r.send(x(t, helloHexV(1, 3, "")))
		r.expectE(3, 1)
	})
	t.Run("extend", func(t *testing.T) {
		t.Parallel()
		extendCases(t, standaloneTarget(startConf(t)))
	})
}

// clusterTarget: the leader of a cluster from 'init --cluster', over TLS
// with the bundle's client token; its HELLO_OK names it (its node-name is
// its ID), role 3 and, in version 3, the cluster's identity.
func clusterTarget(t *testing.T, dir, token, addr, node, clusterID string) *v3Target {
	pool := certPool(t, filepath.Join(dir, initCACert))
	return &v3Target{open: func(t *testing.T, v byte) *raw {
		t.Helper()
		nc, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		r := &raw{t: t, nc: nc, br: bufio.NewReader(nc)}
		r.send(x(t, helloHexV(1, v, token)))
		r.expect(helloOKHexV(1, v, 3, node, clusterID))
		return r
	}}
}

// TestConformanceVersion3Cluster: a three-node cluster of real processes
// from 'init --cluster'. The leader's version-3 HELLO_OK carries the
// cluster's ID (what 'ticketingd cluster status --json' shows), a
// follower answers M; every EXTEND rule holds on the leader
// (extendCases); a lock refreshed from a 3 s to a 60 s lease survives a
// kill -9 of the leader with its refreshed lease: the new leader holds
// it well after 3 s and its election margin, and releases it to the
// holder's token. Then a node started with a wrong peer list (itself
// alone) leads a one-node cluster of its own, whose HELLO_OK carries
// another identity: a client can tell the two apart.
func TestConformanceVersion3Cluster(t *testing.T) {
	bin := buildBinary(t)
	dir, ex, ports := initClusterBundle(t, 3)
	token := ex["TICKETING_TOKEN"]
	ids := []string{"n1", "n2", "n3"}
	var nodes []*subprocess
	var admins []string
	for i, id := range ids {
		nodes = append(nodes, startBinary(t, bin, "serve", "--config", filepath.Join(dir, id, initConfigFile), "--log-format", "json"))
		admins = append(admins, "127.0.0.1:"+strconv.Itoa(ports[2]+i))
	}
	o1, err := parseServe(t, "--config", filepath.Join(dir, "n1", initConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	clusterID := o1.ClusterID
	views := waitCluster(t, admins, "one leader that all three follow, with the bundle's cluster ID", func(v []server.ClusterStatus) bool {
		for _, x := range v {
			if x.ClusterID != clusterID {
				return false
			}
		}
		return agreedLeader(v, 3) >= 0
	})
	lead := agreedLeader(views, 3)
	leaderID := views[lead].NodeID
	leaderClient := "127.0.0.1:" + strconv.Itoa(ports[0]+lead)
	defer func() {
		if t.Failed() {
			for i, n := range nodes {
				t.Logf("%s's log:\n%s", ids[i], n.stderr.String())
			}
		}
	}()

	// The identity in HELLO_OK is what 'cluster status --json' says of
	// the cluster (asked of the leader), every byte checked by open.
	cs, err := clusterView(t, admins[lead])
	if err != nil {
		t.Fatal(err)
	}
	if cs.ClusterID != clusterID || !reBoundClusterID.MatchString(cs.ClusterID) {
		t.Fatalf("cluster status: cluster ID %q, want the bundle's %q", cs.ClusterID, clusterID)
	}
	tg := clusterTarget(t, dir, token, leaderClient, leaderID, cs.ClusterID)
	t.Run("HELLO v3 to the leader: HELLO_OK v3 with the cluster's ID", func(t *testing.T) {
		tg.open(t, 3).sync(2)
	})
	t.Run("HELLO v3 to a follower: M with the leader's address", func(t *testing.T) {
		f := (lead + 1) % 3
		nc, err := tls.Dial("tcp", "127.0.0.1:"+strconv.Itoa(ports[0]+f), &tls.Config{RootCAs: certPool(t, filepath.Join(dir, initCACert)), ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		r := &raw{t: t, nc: nc, br: bufio.NewReader(nc)}
		r.send(x(t, helloHexV(1, 3, token)))
		r.expect(fmt.Sprintf("%08x4d00000001%02x%x", 6+len(leaderClient), len(leaderClient), leaderClient))
		r.expectEOF()
	})
	t.Run("extend", func(t *testing.T) { extendCases(t, tg) })

	// A lock refreshed from 3 s to 60 s, then a kill -9 of the leader.
	h := tg.open(t, 3)
	h.send(acqF(t, 2, 0xa, 0, 3, "x-failover"))
	tok, _ := h.expectG(2)
	h.send(extF(t, 3, tok, 0xa, 60, "x-failover"))
	h.expect(simpleHex('K', 3)) // committed: every follower that votes has it
	if err := nodes[lead].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-nodes[lead].done
	var survAdmins []string
	for i := range 3 {
		if i != lead {
			survAdmins = append(survAdmins, admins[i])
		}
	}
	views = waitCluster(t, survAdmins, "a new leader after the leader's kill -9", func(v []server.ClusterStatus) bool {
		i := agreedLeader(v, 3)
		return i >= 0 && v[i].NodeID != leaderID
	})
	led := time.Now() // the new leader restarted its leases before this instant
	nl := views[agreedLeader(views, 3)]
	tg2 := clusterTarget(t, dir, token, nl.LeaderAdvertise, nl.NodeID, clusterID) // the same identity on the new leader
	// A lease restarted at the grant's 3 s would have ended by
	// led + 3 s + the election margin (500 ms); one restarted at the
	// refreshed 60 s has not.
	sleepUntil(led.Add(3*time.Second + server.DefaultRaftElection + time.Second))
	o := tg2.open(t, 3)
	o.send(acqF(t, 2, 0xb, 0, 30, "x-failover"))
	o.expect(simpleHex('T', 2))
	// The holder, on a new session to the new leader: its token, which
	// did not change, releases the lock; an EXTEND after it gets N.
	h2 := tg2.open(t, 3)
	h2.send(extF(t, 2, tok, 0xa, 60, "x-failover"))
	h2.expect(simpleHex('K', 2))
	h2.send(relOwnedF(t, 3, tok, 0xa, "x-failover"))
	h2.expect(simpleHex('R', 3))
	h2.send(extF(t, 4, tok, 0xa, 60, "x-failover"))
	h2.expect(simpleHex('N', 4))
	o.send(acqF(t, 3, 0xb, 0, 30, "x-failover"))
	if tok2, _ := o.expectG(3); tok2 <= tok {
		t.Fatalf("token %d after %d", tok2, tok)
	}

	// A node started with a wrong peer list: itself alone, as n1, on a
	// new data dir, without the bundle's config. It bootstraps and leads
	// a one-node cluster of its own, whose HELLO_OK carries that
	// cluster's identity, not the real one's. (Started from a bundle
	// node's config, whose cluster-id it would bootstrap with, it would
	// carry the real cluster's: docs/ha.md, "Cluster identity and bootstrap safety".)
	fp := freePortRun(t, 3)
	fork := startBinary(t, bin, "serve", "--cluster", "--node-id", "n1", "--node-name", "n1", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--listen", "127.0.0.1:"+strconv.Itoa(fp), "--raft-listen", "127.0.0.1:"+strconv.Itoa(fp+1), "--peers", "n1=127.0.0.1:"+strconv.Itoa(fp+1),
		"--admin-listen", "127.0.0.1:"+strconv.Itoa(fp+2), "--admin-token", ex["TICKETING_ADMIN_TOKEN"], "--log-format", "json")
	fork.stderr.waitJSON(t, "cluster: leading", fork.done)
	fv := waitCluster(t, []string{"127.0.0.1:" + strconv.Itoa(fp+2)}, "the fork leading its one-node cluster", func(v []server.ClusterStatus) bool {
		return agreedLeader(v, 1) == 0 && v[0].ClusterID != ""
	})
	forkID := fv[0].ClusterID
	if forkID == clusterID {
		t.Fatalf("the fork's cluster ID is the real cluster's %s", clusterID)
	}
	nc, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(fp))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := &raw{t: t, nc: nc, br: bufio.NewReader(nc)}
	r.send(x(t, helloHexV(1, 3, "")))
	// The same node name and role as the real cluster's n1 when it leads:
	// only the identity tells them apart.
	r.expect(helloOKHexV(1, 3, 3, "n1", forkID))

	// The same fork from n1's own bundle config (whose cluster-id init
	// bound to the bundle's three peers), with peers cut to itself and a
	// new data dir: it would bootstrap a one-node cluster under the real
	// cluster's identity, which no client could tell apart. It refuses
	// to start instead.
	bp := freePortRun(t, 3)
	bundleFork := startBinary(t, bin, "serve", "--config", filepath.Join(dir, "n1", initConfigFile), "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--listen", "127.0.0.1:"+strconv.Itoa(bp), "--raft-listen", "127.0.0.1:"+strconv.Itoa(bp+1), "--peers", "n1=127.0.0.1:"+strconv.Itoa(bp+1),
		"--admin-listen", "127.0.0.1:"+strconv.Itoa(bp+2), "--log-format", "json")
	select {
	case <-bundleFork.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("a bundle node started with its peers cut to itself is still running:\n%s", bundleFork.stderr.String())
	}
	if code, log := bundleFork.exitCode(), bundleFork.stderr.String(); code == 0 || !strings.Contains(log, "refuses to bootstrap") || !strings.Contains(log, "made by ticketingd init") {
		t.Fatalf("a bundle node started with its peers cut to itself: exit %d, want a refusal to bootstrap naming the bundle's identity:\n%s", code, log)
	}
}
