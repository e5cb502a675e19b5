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
