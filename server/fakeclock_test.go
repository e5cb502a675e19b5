package server

import (
	"slices"
	"sync"
	"time"
)

// FakeClock is a manual clock for the scheduler (see SetClock): time moves
// only by Advance, which runs the timers that came due, in order of their
// instants, before it returns.
type FakeClock struct {
	mu     sync.Mutex
	t      int64
	timers map[*fakeTimer]struct{}
}

type fakeTimer struct {
	c  *FakeClock
	at int64
	f  func()
}

// NewFakeClock returns a FakeClock at an arbitrary instant.
func NewFakeClock() *FakeClock {
	return &FakeClock{t: int64(time.Hour), timers: make(map[*fakeTimer]struct{})}
}

// SetClock makes a Server created from cfg use c as its clock.
func SetClock(cfg *Config, c *FakeClock) { cfg.clock = c }

func (c *FakeClock) now() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *FakeClock) afterFunc(d time.Duration, f func()) timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	ft := &fakeTimer{c: c, at: c.t + int64(d), f: f}
	c.timers[ft] = struct{}{}
	return ft
}

func (ft *fakeTimer) Stop() bool {
	ft.c.mu.Lock()
	defer ft.c.mu.Unlock()
	_, ok := ft.c.timers[ft]
	delete(ft.c.timers, ft)
	return ok
}

func (ft *fakeTimer) Reset(d time.Duration) bool {
	ft.c.mu.Lock()
	defer ft.c.mu.Unlock()
	_, ok := ft.c.timers[ft]
	ft.at = ft.c.t + int64(d)
	ft.c.timers[ft] = struct{}{}
	return ok
}

// Advance moves the clock forward by d, one due timer at a time: each runs
// (in Advance's goroutine) with the clock at its own instant.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.t + int64(d)
	for {
		var due []*fakeTimer
		for ft := range c.timers {
			if ft.at <= end {
				due = append(due, ft)
			}
		}
		if len(due) == 0 {
			break
		}
		ft := slices.MinFunc(due, func(a, b *fakeTimer) int { return int(min(max(a.at-b.at, -1), 1)) })
		delete(c.timers, ft)
		c.t = max(c.t, ft.at)
		c.mu.Unlock()
		ft.f()
		c.mu.Lock()
	}
	c.t = end
	c.mu.Unlock()
}

// Pending returns how many timers are set on c.
func (c *FakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}
