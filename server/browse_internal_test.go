package server

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// coresMode is a mode whose lock browser's tables are serving shards
// whose cores are filled directly (the rest of the mode is not used).
type coresMode struct {
	mode
	shards []*shard
}

func (m *coresMode) tables() int        { return len(m.shards) }
func (m *coresMode) table(i int) *shard { return m.shards[i] }

// grantAll applies every command at once, with the next token.
type grantAll struct{ last uint64 }

func (g *grantAll) Propose(p *lockcore.Proposal) bool {
	if p.Grants() {
		g.last++
	}
	p.SetResult(lockcore.Result{Freed: true, Token: g.last})
	return true
}

type liveSession struct{}

func (liveSession) Live() bool { return true }

// TestLocksMergeBounded: over 1, 5 and 256 tables holding a few locks
// among 30,000 free keys kept for reuse (which a page visits but does not
// show), every page visits at most maxLockVisits keys, a page that ran
// out of them says More with a Next after the previous one, and paging on
// gives exactly the held locks the query selects, in order.
func TestLocksMergeBounded(t *testing.T) {
	for _, n := range []int{1, 5, numShards} {
		m := &coresMode{}
		s := &Server{clk: NewFakeClock(), mode: m}
		now := s.now()
		log := &grantAll{}
		for range n {
			core := lockcore.New(lockcore.Config{Capacity: &lockcore.Capacity{MaxLocks: 1 << 20, MaxWaiters: 1 << 10}, MaxKeyWaiters: 4}, log)
			m.shards = append(m.shards, &shard{core: core, serving: true, view: "test"})
		}
		var held []string
		for i := range 30_000 {
			k := fmt.Sprintf("idle/%05d", i)
			c := m.shards[i%n].core
			c.Acquire(now, &lockcore.Acquire{S: liveSession{}, Key: []byte(k), LeaseS: 60})
			tok := c.Effects()[0].Token
			if i%997 == 0 || i > 29_990 {
				held = append(held, k)
				continue
			}
			c.Release(now, &lockcore.Release{S: liveSession{}, Key: []byte(k), Token: tok})
		}
		for _, k := range []string{"a", "held/1", "held/2", "zz"} {
			c := m.shards[len(k)%n].core
			c.Acquire(now, &lockcore.Acquire{S: liveSession{}, Key: []byte(k), LeaseS: 60})
			c.Effects() // (hands the grant to the log)
			held = append(held, k)
		}
		slices.Sort(held)
		short := 0 // pages that ran out of visits before they were full
		for _, prefix := range []string{"", "idle/", "idle/1", "held/", "none"} {
			for _, limit := range []int{1, 7, 100, MaxLockPage} {
				var want []string
				for _, k := range held {
					if strings.HasPrefix(k, prefix) {
						want = append(want, k)
					}
				}
				b := newBrowser()
				q := lockcore.LockQuery{Prefix: prefix, Limit: limit}
				var got []string
				for pages := 0; ; pages++ {
					before := b.visits.Load()
					a, err := b.scan(s, q)
					if err != nil {
						t.Fatal(err)
					}
					if v := b.visits.Load() - before; v > maxLockVisits {
						t.Fatalf("%d tables, %+v: a page visited %d keys", n, q, v)
					}
					if pages > 100 || len(a.locks) > limit {
						t.Fatalf("%d tables, %+v: page %d of %d locks", n, q, pages, len(a.locks))
					}
					for _, l := range a.locks {
						got = append(got, l.Key)
					}
					if c := b.maxChunk.Load(); c > lockChunkVisits {
						t.Fatalf("a chunk visited %d keys", c)
					}
					if !a.more {
						break
					}
					if len(a.locks) < limit {
						short++
					}
					if a.next <= q.After || (len(a.locks) > 0 && a.next < a.locks[len(a.locks)-1].Key) {
						t.Fatalf("%d tables, %+v: next %q", n, q, a.next)
					}
					q.After = a.next
				}
				if !slices.Equal(got, want) {
					t.Fatalf("%d tables, prefix %q limit %d: %q, want %q", n, prefix, limit, got, want)
				}
			}
		}
		if short == 0 {
			t.Fatalf("%d tables: no page ran out of visits", n)
		}
	}
}
