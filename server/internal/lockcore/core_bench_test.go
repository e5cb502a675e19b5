package lockcore

import (
	"fmt"
	"testing"
)

type benchSession struct{}

func (benchSession) Live() bool { return true }

type benchLog struct{ last uint64 }

func (l *benchLog) Propose(p *Proposal) bool {
	if !p.Grants() {
		p.SetResult(Result{Freed: true})
		return true
	}
	l.last++
	p.SetResult(Result{Freed: true, Token: l.last})
	return true
}

// BenchmarkCoreCycle is the Core's share of an uncontended cycle, applied
// at once (as standalone): ACQUIRE of a free key, then its RELEASE.
func BenchmarkCoreCycle(b *testing.B) {
	c := New(Config{Capacity: &Capacity{MaxLocks: 1 << 20, MaxWaiters: 1 << 20}, MaxKeyWaiters: 16}, &benchLog{})
	keys := make([][]byte, 64)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("bench-key-%d", i))
	}
	var s Session = benchSession{}
	a := Acquire{S: s, ReqID: 1, Owner: Owner{1}, LeaseS: 30}
	r := Release{S: s, ReqID: 2, Owner: Owner{1}}
	b.ReportAllocs()
	i, now := 0, int64(1)
	for b.Loop() {
		k := keys[i%len(keys)]
		i++
		now += 1000
		a.Key, a.Arrived = k, now
		c.Acquire(now, &a)
		fx := c.Effects()
		if len(fx) != 1 || fx[0].Kind != Granted {
			b.Fatalf("%+v", fx)
		}
		r.Key, r.Token = k, fx[0].Token
		c.Release(now, &r)
		if fx := c.Effects(); len(fx) != 1 || fx[0].Kind != Released {
			b.Fatalf("%+v", fx)
		}
	}
}

// BenchmarkCoreLocks is one page of the lock browser (100 locks, no
// prefix) over a core holding 100,000 locks: a seek and 100 keys visited
// in its ordered index.
func BenchmarkCoreLocks(b *testing.B) {
	c := New(Config{Capacity: &Capacity{MaxLocks: 1 << 20, MaxWaiters: 1 << 20}, MaxKeyWaiters: 16}, &benchLog{})
	a := Acquire{S: benchSession{}, ReqID: 1, Owner: Owner{1}, LeaseS: 250}
	for i := range 100_000 {
		a.Key = []byte(fmt.Sprintf("lock-key-%d", i))
		c.Acquire(1, &a)
	}
	b.ReportAllocs()
	var page []LockInfo
	for b.Loop() {
		var r ScanResult
		page, r = c.Scan(2, LockQuery{Limit: 100}, 1000, page[:0])
		if len(page) != 100 || r.Done || r.Visited != 100 {
			b.Fatalf("%d locks, %+v", len(page), r)
		}
	}
}

// BenchmarkNextExpiry is the earliest lease end over a core holding 64
// locks with leases of 30 s and 250 s: a replicated driver asks it after
// every batch of effects (Server.rearm), so its cost is per request.
func BenchmarkNextExpiry(b *testing.B) {
	c := New(Config{Capacity: &Capacity{MaxLocks: 1 << 20, MaxWaiters: 1 << 20}, MaxKeyWaiters: 16}, &benchLog{})
	for i := range 64 {
		a := Acquire{S: benchSession{}, ReqID: uint32(i + 1), Owner: Owner{1}, LeaseS: uint8(30 + 220*(i%2)), Key: []byte(fmt.Sprintf("k%d", i)), Arrived: 1}
		c.Acquire(1, &a)
		c.Effects()
	}
	var n int64
	for b.Loop() {
		n += c.NextExpiry()
	}
	if n == 0 {
		b.Fatal("no lease end")
	}
}

// BenchmarkCoreChurn is BenchmarkCoreCycle over keys never seen before:
// each cycle makes a new entry, and idle ones are forgotten (Tick) as
// they come due, so the core's table (and its ordered index of keys) takes
// an insertion and a removal per cycle, over a table of 100,000 held
// locks.
func BenchmarkCoreChurn(b *testing.B) {
	c := New(Config{Capacity: &Capacity{MaxLocks: 1 << 22, MaxWaiters: 1 << 20}, MaxKeyWaiters: 16}, &benchLog{})
	hold := Acquire{S: benchSession{}, ReqID: 1, Owner: Owner{2}, LeaseS: 250}
	for i := range 100_000 {
		hold.Key = []byte(fmt.Sprintf("held-key-%d", i))
		c.Acquire(1, &hold)
	}
	var s Session = benchSession{}
	a := Acquire{S: s, ReqID: 1, Owner: Owner{1}, LeaseS: 30}
	r := Release{S: s, ReqID: 2, Owner: Owner{1}}
	key := make([]byte, 0, 32)
	b.ReportAllocs()
	i, now := 0, int64(2)
	for b.Loop() {
		key = fmt.Appendf(key[:0], "churn-key-%d", i)
		i++
		now += 1000
		a.Key, a.Arrived = key, now
		c.Acquire(now, &a)
		fx := c.Effects()
		if len(fx) != 1 || fx[0].Kind != Granted {
			b.Fatalf("%+v", fx)
		}
		r.Key, r.Token = key, fx[0].Token
		c.Release(now, &r)
		if i%1024 == 0 {
			c.Tick(now) // forgets the entries idle for IdleTTL
		}
	}
}

// BenchmarkMachineCycle is a replicated node's apply of a cycle: Grant of
// a free key, then its Free, over a machine holding 100,000 keys.
func BenchmarkMachineCycle(b *testing.B) {
	m := NewMachine()
	for i := range 100_000 {
		m.Grant(fmt.Sprintf("held-key-%d", i), Owner{2}, 250, false, 0)
	}
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("cycle-key-%d", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := keys[i%len(keys)]
		i++
		tok, res := m.Grant(k, Owner{1}, 30, false, 0)
		if res != GrantNew || !m.Free(FreeRelease, k, tok, Owner{1}) {
			b.Fatal("cycle failed")
		}
	}
}
