package server_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// The lock browser (Server.Locks, Server.Lock) and the operator's expire
// now (Server.ExpireLock), in each mode. The decisions are the core's
// (lockcore's browse.txt and expire.txt); these test that every mode
// reaches them, with the sessions' identities, and answers once applied.

func bctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// expireNow is the end-to-end case on a serving node s: a holder, a
// waiter, the browser shows both with their sessions; expire with the
// wrong token (ErrLockToken) and of a key not held (ErrLockNotFound)
// change nothing; expire with the exact token grants the waiter a higher
// token, and the old holder's RELEASE gets N.
func expireNow(t *testing.T, s *server.Server, holder, waiter *client, view string) {
	t.Helper()
	ctx := bctx(t)
	tok := holder.acquireOK(10, owner(1), 0, 60, "job/k")
	waiter.send(acq(11, owner(2), 30, 20, "job/k"))
	waiter.expectNothing(50 * time.Millisecond) // queued

	var d server.LockDetail
	eventually(t, "the waiter in the browser", func() bool {
		var err error
		d, err = s.Lock(ctx, "job/k")
		if err != nil {
			t.Fatalf("Lock: %v", err)
		}
		return len(d.Queue) == 1
	})
	if d.View != view || d.Token != tok || d.Owner != owner(1) || d.LeaseS != 60 || d.Waiters != 1 ||
		d.LeaseLeft <= 0 || d.LeaseLeft > 60*time.Second || time.Until(d.LeaseEnd) > 61*time.Second {
		t.Fatalf("Lock: %+v, want view %s, token %d, owner 1, lease 60 s, 1 waiter", d, view, tok)
	}
	if d.Holder == nil || d.Holder.Name != "test" || d.Holder.Addr != holder.nc.LocalAddr().String() {
		t.Fatalf("holder's session %+v, want test at %s", d.Holder, holder.nc.LocalAddr())
	}
	w := d.Queue[0]
	if w.Owner != owner(2) || w.LeaseS != 20 || w.Session == nil || w.Session.Addr != waiter.nc.LocalAddr().String() ||
		w.WaitLeft <= 0 || w.WaitLeft > 30*time.Second {
		t.Fatalf("waiter %+v (session %+v)", w, w.Session)
	}
	pg, err := s.Locks(ctx, server.LockQuery{Prefix: "job/"})
	if err != nil || pg.View != view || len(pg.Locks) != 1 || pg.Locks[0].Key != "job/k" || pg.Locks[0].Waiters != 1 || pg.More {
		t.Fatalf("Locks: %+v, %v", pg, err)
	}

	if err := s.ExpireLock(ctx, "job/k", tok+1000, "test"); !errors.Is(err, server.ErrLockToken) {
		t.Fatalf("expire with another token: %v, want ErrLockToken", err)
	}
	if err := s.ExpireLock(ctx, "job/none", tok, "test"); !errors.Is(err, server.ErrLockNotFound) {
		t.Fatalf("expire of a key not held: %v, want ErrLockNotFound", err)
	}
	waiter.expectNothing(50 * time.Millisecond)
	if err := s.ExpireLock(ctx, "job/k", tok, "test"); err != nil {
		t.Fatalf("expire now: %v", err)
	}
	g := waiter.expect(wire.TypeGranted, 11)
	if g.Token <= tok {
		t.Fatalf("the waiter's token %d, not above the expired %d", g.Token, tok)
	}
	holder.send(rel(12, tok, "job/k"))
	holder.expect(wire.TypeNotHeld, 12)
	d, err = s.Lock(ctx, "job/k")
	if err != nil || d.Token != g.Token || d.Owner != owner(2) || d.Holder == nil || d.Holder.Addr != waiter.nc.LocalAddr().String() {
		t.Fatalf("after the expiry: %+v, %v", d, err)
	}
	// Expired again: the key is free.
	if err := s.ExpireLock(ctx, "job/k", g.Token, "test"); err != nil {
		t.Fatalf("expire now again: %v", err)
	}
	if _, err := s.Lock(ctx, "job/k"); !errors.Is(err, server.ErrLockNotFound) {
		t.Fatalf("Lock after the last expiry: %v, want ErrLockNotFound", err)
	}
}

func TestExpireNowStandalone(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	expireNow(t, s, session(t, addr), session(t, addr), server.ViewStandalone)
}

// TestLocksPagesAcrossShards: standalone's 256 shards give one sorted
// page at a time, by prefix, with a cursor, to the last lock; a holding
// outlives its session, with its identity; keys are bytes.
func TestLocksPagesAcrossShards(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	ctx := bctx(t)
	c := session(t, addr)
	const n = 57
	for i := range n {
		c.acquireOK(uint32(i+1), owner(1), 0, 60, fmt.Sprintf("p/%03d", i))
	}
	c.acquireOK(100, owner(1), 0, 60, "q/other")
	odd := "p/\xff\x00 %/"
	c.acquireOK(101, owner(1), 0, 60, odd)
	c.nc.Close()

	var keys []string
	q := server.LockQuery{Prefix: "p/", Limit: 10}
	for pages := 0; ; pages++ {
		pg, err := s.Locks(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if pages > 10 || len(pg.Locks) > 10 {
			t.Fatalf("page %d: %d locks", pages, len(pg.Locks))
		}
		for _, l := range pg.Locks {
			keys = append(keys, l.Key)
			if l.Holder == nil || l.Holder.Name != "test" {
				t.Fatalf("%q: holder %+v after its session closed", l.Key, l.Holder)
			}
		}
		if !pg.More {
			break
		}
		if pg.Next != pg.Locks[len(pg.Locks)-1].Key {
			t.Fatalf("Next %q, want the page's last key", pg.Next)
		}
		q.After = pg.Next
	}
	if len(keys) != n+1 || keys[n] != odd {
		t.Fatalf("%d keys (last %q), want %d and the non-UTF-8 key last", len(keys), keys[len(keys)-1], n+1)
	}
	for i := range n {
		if keys[i] != fmt.Sprintf("p/%03d", i) {
			t.Fatalf("key %d: %q", i, keys[i])
		}
	}
	if pg, err := s.Locks(ctx, server.LockQuery{}); err != nil || len(pg.Locks) != n+2 || pg.More {
		t.Fatalf("all, default limit: %d locks, more %v, %v", len(pg.Locks), pg.More, err)
	}
	if _, err := s.Lock(ctx, odd); err != nil {
		t.Fatalf("Lock of a non-UTF-8 key: %v", err)
	}
	if _, err := s.Lock(ctx, ""); !errors.Is(err, server.ErrBadKey) {
		t.Fatalf("Lock(\"\"): %v, want ErrBadKey", err)
	}
}

// TestExpireNowCluster: on the leader, expire now is a replicated command
// answered once applied; a follower browses its applied state (no
// waiters, no sessions) and refuses expire now, naming the leader.
func TestExpireNowCluster(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	s := tc.nodes[l].s
	expireNow(t, s, tc.leaderSession(l), tc.leaderSession(l), server.ViewLeader)

	c := tc.leaderSession(l)
	tok := c.acquireOK(1, owner(3), 0, 60, "f/k")
	tc.waitApplied(tok)
	f := tc.others(l)[0]
	ctx := bctx(t)
	pg, err := tc.nodes[f].s.Locks(ctx, server.LockQuery{Prefix: "f/"})
	if err != nil || pg.View != server.ViewFollowerApplied || len(pg.Locks) != 1 || pg.Locks[0].Token != tok ||
		pg.Locks[0].Holder != nil || !pg.Locks[0].LeaseEnd.IsZero() || pg.Locks[0].LeaseS != 60 {
		t.Fatalf("follower's Locks: %+v, %v", pg, err)
	}
	err = tc.nodes[f].s.ExpireLock(ctx, "f/k", tok, "test")
	var nl *server.NotLeaderError
	if !errors.Is(err, server.ErrNotLeader) || !errors.As(err, &nl) || nl.Leader != tc.nodes[l].in.ID {
		t.Fatalf("expire on a follower: %v, want a NotLeaderError naming %s", err, tc.nodes[l].in.ID)
	}
	if _, err := s.Lock(ctx, "f/k"); err != nil {
		t.Fatalf("the follower's refusal changed the lock: %v", err)
	}
}

// TestExpireNowPair: on the active, answered once the passive has it; the
// passive browses its applied state and refuses, naming the active.
func TestExpireNowPair(t *testing.T) {
	pa, ba := pairAddrs(t)
	p := startPairNode(t, server.PairPrimary, pa, ba, "")
	blog := proctest.NewLogBuffer()
	b := startPairNodeLog(t, server.PairBackup, ba, pa, "", listen(t), nil, slog.New(slog.NewJSONHandler(blog, &slog.HandlerOptions{Level: slog.LevelDebug})))
	holder := p.serving()
	eventually(t, "the backup in sync", func() bool { return b.status().HasState && p.status().Replicating })
	expireNow(t, p.s, holder, p.serving(), server.ViewActive)

	tok := holder.acquireOK(20, owner(3), 0, 60, "f/k")
	ctx := bctx(t)
	eventually(t, "the passive to apply the grant", func() bool { return b.status().LastToken == tok })
	pg, err := b.s.Locks(ctx, server.LockQuery{Prefix: "f/"})
	if err != nil || pg.View != server.ViewPassiveApplied || len(pg.Locks) != 1 || pg.Locks[0].Token != tok || pg.Locks[0].Holder != nil {
		t.Fatalf("passive's Locks: %+v, %v", pg, err)
	}
	err = b.s.ExpireLock(ctx, "f/k", tok, "test")
	var na *server.NotActiveError
	if !errors.Is(err, server.ErrNotActive) || !errors.As(err, &na) || na.Active != p.addr {
		t.Fatalf("expire on the passive: %v, want a NotActiveError naming %s", err, p.addr)
	}
	// The operator's tool tries the nodes in turn: the passive's refusal
	// is routine, logged at Debug, not Warn.
	rec, err := blog.WaitJSON(0, "admin: expire now of a lock", nil, 30*time.Second)
	if err != nil || rec["level"] != "DEBUG" {
		t.Errorf("the passive's log of the refused expire: %v %v, want it at DEBUG", rec, err)
	}
}
