package lockcore

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// TestEntrySize keeps an entry in the 96-byte size class: a standalone
// server holds millions, and the lock browser's session identity
// (entry.client) had to fit in it.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n > 96 {
		t.Fatalf("entry is %d bytes, more than its 96-byte size class", n)
	}
}

// fullPage is a page of q as the old full scan gave it: every selected
// lock up to q.Limit, in order, and whether one more was left out; scan
// goes through the index in chunks of 7 keys, resuming after Last.
func fullPage(scan func(q LockQuery, max int, page []LockInfo) ([]LockInfo, ScanResult), q LockQuery) ([]LockInfo, bool) {
	if q.Limit <= 0 {
		return nil, false // (as the old scan: nothing fits, nothing is said)
	}
	var page []LockInfo
	want := q.Limit
	q.Limit++
	for {
		var r ScanResult
		page, r = scan(LockQuery{Prefix: q.Prefix, After: q.After, Limit: q.Limit - len(page)}, 7, page)
		if r.Done || len(page) >= q.Limit {
			break
		}
		q.After = r.Last
	}
	if len(page) > want {
		return page[:want], true
	}
	return page, false
}

func coreScan(c *Core, now int64) func(LockQuery, int, []LockInfo) ([]LockInfo, ScanResult) {
	return func(q LockQuery, max int, page []LockInfo) ([]LockInfo, ScanResult) { return c.Scan(now, q, max, page) }
}

// TestScanAgainstAllKeys: paged in chunks (Scan from the last key
// visited), the lock browser's page is the held locks that a filter of
// every key selects, in order, for prefixes, cursors and limits of every
// kind, over a core holding locks, free entries kept for reuse, ended
// leases and forgotten keys, and over a machine.
func TestScanAgainstAllKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "ab", "b", "\xff", "\x00", "a/", "/", "zz"}
	key := func() string {
		var b strings.Builder
		for range 1 + rng.IntN(4) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	c := New(Config{Capacity: &Capacity{MaxLocks: 1 << 20, MaxWaiters: 1 << 20}, MaxKeyWaiters: 16}, &benchLog{})
	m := NewMachine()
	held := map[string]bool{} // the core's held keys, their lease not ended
	now := int64(1)
	var s Session = benchSession{}
	for range 3000 {
		k := key()
		now += msNs
		switch {
		case !held[k] && rng.IntN(4) > 0:
			lease := uint8(1 + rng.IntN(3))
			c.Acquire(now, &Acquire{S: s, Key: []byte(k), Owner: Owner{1}, LeaseS: lease})
			if fx := c.Effects(); len(fx) != 1 || fx[0].Kind != Granted {
				t.Fatalf("acquire %q: %+v", k, fx)
			}
			held[k] = true
			if tok, r := m.Grant(k, Owner{1}, lease, false, 0); r != GrantNew || tok == 0 {
				t.Fatalf("machine grant %q: %v", k, r)
			}
		case held[k]:
			e := c.m[k]
			c.Release(now, &Release{S: s, Key: []byte(k), Token: e.token, Owner: Owner{1}})
			delete(held, k)
			h, _ := m.Holding(k)
			if !m.Free(FreeRelease, k, h.Token, Owner{1}) {
				t.Fatalf("machine free %q", k)
			}
		}
		if rng.IntN(200) == 0 {
			now += int64(rng.IntN(3)) * secondNs // leases end; idle entries are forgotten
			c.Tick(now)
			for k := range held {
				if c.m[k] == nil || !c.m[k].held {
					delete(held, k)
					h, _ := m.Holding(k)
					m.Free(FreeExpire, k, h.Token, Owner{1})
				}
			}
		}
	}
	if len(c.m) != c.idx.Len() || len(m.h) != m.idx.Len() {
		t.Fatalf("index of %d keys for %d entries; machine's %d for %d", c.idx.Len(), len(c.m), m.idx.Len(), len(m.h))
	}
	all := slices.Sorted(maps.Keys(held))
	machineScan := func(q LockQuery, max int, page []LockInfo) ([]LockInfo, ScanResult) { return m.Scan(q, max, page) }
	var starts []string
	for range 50 {
		starts = append(starts, key())
	}
	starts = append(starts, "", "\xff\xff\xff\xff\xff")
	for _, prefix := range append(starts[:10:10], "", "a", "b", "q") {
		for _, after := range starts {
			for _, limit := range []int{0, 1, 3, 100, 5000} {
				q := LockQuery{Prefix: prefix, After: after, Limit: limit}
				var want []string
				for _, k := range all {
					if strings.HasPrefix(k, prefix) && k > after {
						want = append(want, k)
					}
				}
				wantMore := len(want) > limit
				want = want[:min(len(want), limit)]
				for name, scan := range map[string]func(LockQuery, int, []LockInfo) ([]LockInfo, ScanResult){
					"core": coreScan(c, now), "machine": machineScan} {
					page, more := fullPage(scan, q)
					got := make([]string, len(page))
					for i := range page {
						got[i] = page[i].Key
					}
					if !slices.Equal(got, want) || more != (wantMore && limit > 0) {
						t.Fatalf("%s %+v: %q more %v, want %q more %v", name, q, got, more, want, wantMore)
					}
				}
			}
		}
	}
}

// TestScanVisitsOnlyItsKeys: over a core holding 100,000 locks, a prefix
// that selects nothing visits no key, one that selects 10 visits those
// 10, a page from a cursor visits the keys after it only, and no scan
// visits more than its max: the work of a page is the keys it goes
// through, not the table's size.
func TestScanVisitsOnlyItsKeys(t *testing.T) {
	c := New(Config{Capacity: &Capacity{MaxLocks: 1 << 20, MaxWaiters: 1 << 20}, MaxKeyWaiters: 16}, &benchLog{})
	m := NewMachine()
	a := Acquire{S: benchSession{}, Owner: Owner{1}, LeaseS: 250}
	for i := range 100_000 {
		k := fmt.Sprintf("lock/%06d", i)
		a.Key = []byte(k)
		c.Acquire(1, &a)
		c.Effects()
		m.Grant(k, Owner{1}, 250, false, 0)
	}
	for name, scan := range map[string]func(LockQuery, int, []LockInfo) ([]LockInfo, ScanResult){
		"core": coreScan(c, 2), "machine": func(q LockQuery, max int, page []LockInfo) ([]LockInfo, ScanResult) { return m.Scan(q, max, page) }} {
		for _, tc := range []struct {
			q       LockQuery
			max     int
			locks   int
			visited int
			done    bool
		}{
			{LockQuery{Prefix: "nothing/", Limit: 100}, 1000, 0, 0, true},
			{LockQuery{Prefix: "lock/00001", Limit: 100}, 1000, 10, 10, true},
			{LockQuery{Prefix: "lock/", After: "lock/099990", Limit: 100}, 1000, 9, 9, true},
			{LockQuery{Prefix: "lock/", After: "lock/05", Limit: 100}, 1000, 100, 100, false},
			{LockQuery{Limit: 1000}, 64, 64, 64, false},
			{LockQuery{Prefix: "lock/", After: "m", Limit: 100}, 1000, 0, 0, true},
		} {
			page, r := scan(tc.q, tc.max, nil)
			if len(page) != tc.locks || r.Visited != tc.visited || r.Done != tc.done ||
				(len(page) > 0 && r.Last != page[len(page)-1].Key) {
				t.Errorf("%s %+v max %d: %d locks, %+v; want %d locks, %d visited, done %v",
					name, tc.q, tc.max, len(page), r, tc.locks, tc.visited, tc.done)
			}
		}
	}
}
