package server_test

import (
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/ticketing-dev/ticketing/server"
)

// The lock browser's work does not grow with the table: over 50,000 held
// locks, pollers of a prefix that selects nothing visit no key, a page of
// a prefix visits its keys only, every chunk under a table's mutex visits
// at most LockChunkVisits keys, and pollers of one page share one scan.
// These count the work (keys visited, chunks), never time.

const browseHeld = 50_000

// browsePollers has 8 pollers ask for pages of prefixes that select
// nothing, each a prefix of its own (no answer is shared), and checks that
// they visited no key; then pages through every lock with the largest
// page, checking the order and the bounds of each page's work.
func browsePollers(t *testing.T, s *server.Server, view string) {
	t.Helper()
	ctx := bctx(t)
	const pollers, polls = 8, 25
	before := s.BrowseWork()
	var wg sync.WaitGroup
	for p := range pollers {
		wg.Go(func() {
			for i := range polls {
				pg, err := s.Locks(ctx, server.LockQuery{Prefix: fmt.Sprintf("nothing/%d/%d", p, i)})
				if err != nil || len(pg.Locks) != 0 || pg.More || pg.View != view {
					t.Errorf("poller %d: %+v, %v", p, pg, err)
					return
				}
			}
		})
	}
	wg.Wait()
	w := s.BrowseWork()
	if got := w.Visits - before.Visits; got != 0 {
		t.Fatalf("%d pages of a prefix that selects nothing visited %d keys (of %d held), want none", pollers*polls, got, browseHeld)
	}
	if got := w.Scans - before.Scans; got != pollers*polls {
		t.Fatalf("%d scans for %d pages of different prefixes", got, pollers*polls)
	}

	// A prefix of 11 keys (lock-key-1234 and lock-key-12340..9): those.
	before = s.BrowseWork()
	pg, err := s.Locks(ctx, server.LockQuery{Prefix: "lock-key-1234"})
	if err != nil || len(pg.Locks) != 11 || pg.More {
		t.Fatalf("prefix lock-key-1234: %d locks, more %v, %v", len(pg.Locks), pg.More, err)
	}
	if got := s.BrowseWork().Visits - before.Visits; got != 11 {
		t.Fatalf("a page of a prefix of 11 held keys visited %d keys", got)
	}

	// Every lock, 1000 a page, in order: each page visits at most its
	// locks and the one after (and, standalone, a few per shard).
	q := server.LockQuery{Limit: server.MaxLockPage}
	var n int
	last := ""
	for pages := 0; ; pages++ {
		before := s.BrowseWork()
		pg, err := s.Locks(ctx, q)
		if err != nil || pages > browseHeld/server.MaxLockPage {
			t.Fatalf("page %d: %v", pages, err)
		}
		for _, l := range pg.Locks {
			if l.Key <= last {
				t.Fatalf("page %d: %q after %q", pages, l.Key, last)
			}
			last = l.Key
		}
		n += len(pg.Locks)
		w := s.BrowseWork()
		bound := int64(server.MaxLockPage + 1)
		if view == server.ViewStandalone {
			bound += 256 * 8 // each shard's first chunk looks a little ahead
		}
		if got := w.Visits - before.Visits; got > bound {
			t.Fatalf("page %d of %d locks visited %d keys, more than %d", pages, len(pg.Locks), got, bound)
		}
		if !pg.More {
			break
		}
		if len(pg.Locks) != server.MaxLockPage || pg.Next != last {
			t.Fatalf("page %d: %d locks, next %q after %q", pages, len(pg.Locks), pg.Next, last)
		}
		q.After = pg.Next
	}
	if n != browseHeld {
		t.Fatalf("%d locks in all the pages, want %d", n, browseHeld)
	}
	if w := s.BrowseWork(); w.MaxChunk > server.LockChunkVisits {
		t.Fatalf("a chunk visited %d keys under a table's mutex, more than %d", w.MaxChunk, server.LockChunkVisits)
	}
}

func TestLocksWorkStandalone(t *testing.T) {
	s, addr := startServer(t, server.Config{})
	holdLocks(t, addr, browseHeld)
	browsePollers(t, s, server.ViewStandalone)
}

// TestLocksWorkPair: the active's one scheduler (a cluster leader's is
// the same core under one mutex) and the passive's applied machine.
func TestLocksWorkPair(t *testing.T) {
	pa, ba := pairAddrs(t)
	p := startPairNode(t, server.PairPrimary, pa, ba, "")
	b := startPairNode(t, server.PairBackup, ba, pa, "")
	p.serving().nc.Close()
	eventually(t, "the backup in sync", func() bool { return b.status().HasState && p.status().Replicating })
	holdLocks(t, p.addr, browseHeld)
	eventually(t, "the passive to apply every grant", func() bool { return b.status().HeldLocks == browseHeld })
	browsePollers(t, p.s, server.ViewActive)
	browsePollers(t, b.s, server.ViewPassiveApplied)
}

// TestLocksPollShared: pollers of one page within LockPollShare share one
// scan; later, a new one.
func TestLocksPollShared(t *testing.T) {
	clk := server.NewFakeClock()
	cfg := server.Config{}
	server.SetClock(&cfg, clk)
	s, addr := startServer(t, cfg)
	c := session(t, addr)
	for i := range 30 {
		c.acquireOK(uint32(i+1), owner(1), 0, 60, "job/"+strconv.Itoa(i))
	}
	ctx := bctx(t)
	poll := func() {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				pg, err := s.Locks(ctx, server.LockQuery{Prefix: "job/", Limit: 20})
				if err != nil || len(pg.Locks) != 20 || !pg.More {
					t.Errorf("%d locks, more %v, %v", len(pg.Locks), pg.More, err)
				}
			})
		}
		wg.Wait()
	}
	before := s.BrowseWork()
	poll()
	if got := s.BrowseWork().Scans - before.Scans; got != 1 {
		t.Fatalf("8 pollers of one page: %d scans, want 1", got)
	}
	clk.Advance(server.LockPollShare)
	poll()
	if got := s.BrowseWork().Scans - before.Scans; got != 2 {
		t.Fatalf("after LockPollShare: %d scans in all, want 2", got)
	}
	// An expire now is seen at once: the answers kept are dropped.
	pg, err := s.Locks(ctx, server.LockQuery{Prefix: "job/", Limit: 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ExpireLock(ctx, pg.Locks[0].Key, pg.Locks[0].Token, "test"); err != nil {
		t.Fatal(err)
	}
	pg2, err := s.Locks(ctx, server.LockQuery{Prefix: "job/", Limit: 20})
	if err != nil || len(pg2.Locks) != 20 || pg2.Locks[0].Key == pg.Locks[0].Key {
		t.Fatalf("after an expire now: first %q, %v; want it gone", pg2.Locks[0].Key, err)
	}
}
