package benchkit

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// CycleClient is one client of RunCycles: it holds at most one lock at a
// time. Each is used by one goroutine only.
type CycleClient interface {
	Acquire(key string) error // takes the lock on key
	Release() error           // releases the lock Acquire took
}

// Cycles is a workload of acquire+release cycles: every client loops
// Acquire, then Release, on its own key (uncontended) or on one shared
// key (Contended), until Warmup+Duration has passed.
type Cycles struct {
	Contended        bool
	Warmup, Duration time.Duration
	// Key is client i's key; contended, it is the same for every i.
	Key func(i int) string
	// Skip, if set, tells an Acquire error that is counted (Skipped)
	// rather than ending the run; the client then tries again.
	Skip func(err error) bool
}

// CycleResult is what RunCycles measured: the cycles that started after
// the warmup, over the time from the warmup's end to Duration's.
type CycleResult struct {
	Seconds      float64
	Cycles       uint64
	CyclesPerSec float64
	All          uint64 // the cycles completed, warmup included
	Skipped      uint64 // the Acquire errors Skip counted
	Acquire      *LatencySummary
	Cycle        *LatencySummary // acquire+release
	Handoff      *LatencySummary // contended: from the holder's Release call to the next holder's Acquire return
}

// RunCycles runs w with one goroutine per client (as etcd-bench and
// peers-bench do). The first Acquire or Release error (other than those
// w.Skip counts) ends the run with that error; a client whose ctx has
// ended stops quietly, and RunCycles then reports what was measured.
// Contended, it also checks that no two clients hold the key at once.
func RunCycles(ctx context.Context, w Cycles, clients []CycleClient) (*CycleResult, error) {
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	measureFrom := w.Warmup
	end := measureFrom + w.Duration
	var lastRelease atomic.Int64 // contended: when the holder called Release
	var holders atomic.Int32     // contended: clients holding the shared key; more than 1 is a bug

	type clientStats struct {
		acq, cycle, handoff Hist
		cycles, all, skip   uint64
	}
	stats := make([]clientStats, len(clients))
	errs := make(chan error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			st := &stats[i]
			key := w.Key(i)
			for {
				t0 := now()
				if t0 >= end || ctx.Err() != nil {
					return
				}
				measured := t0 >= measureFrom
				if err := c.Acquire(key); err != nil {
					if ctx.Err() != nil {
						return
					}
					if w.Skip != nil && w.Skip(err) {
						st.skip++
						continue
					}
					errs <- fmt.Errorf("acquire of %s: %w", key, err)
					return
				}
				t1 := now()
				if w.Contended {
					if n := holders.Add(1); n != 1 {
						errs <- fmt.Errorf("mutual exclusion broken: %d holders of %s", n, key)
						return
					}
					if rel := lastRelease.Load(); rel > 0 && measured {
						st.handoff.Record(t1 - time.Duration(rel))
					}
					holders.Add(-1)
					lastRelease.Store(int64(now()))
				}
				if err := c.Release(); err != nil {
					errs <- fmt.Errorf("release of %s: %w", key, err)
					return
				}
				t2 := now()
				st.all++
				if measured {
					st.acq.Record(t1 - t0)
					st.cycle.Record(t2 - t0)
					st.cycles++
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	res := &CycleResult{Seconds: (min(now(), end) - measureFrom).Seconds()}
	var acq, cyc, hand Hist
	for i := range stats {
		st := &stats[i]
		acq.Merge(&st.acq)
		cyc.Merge(&st.cycle)
		hand.Merge(&st.handoff)
		res.Cycles += st.cycles
		res.All += st.all
		res.Skipped += st.skip
	}
	if res.Seconds > 0 {
		res.CyclesPerSec = float64(res.Cycles) / res.Seconds
	}
	a, c := acq.Summary(), cyc.Summary()
	res.Acquire, res.Cycle = &a, &c
	if w.Contended {
		h := hand.Summary()
		res.Handoff = &h
	}
	return res, nil
}

// WriteLine writes s as one line of the load tools' human output, named
// name; nothing for a nil or empty summary.
func (s *LatencySummary) WriteLine(w io.Writer, name string) {
	if s == nil || s.Count == 0 {
		return
	}
	fmt.Fprintf(w, "  %-16s p50 %8.1f µs  p90 %8.1f µs  p99 %8.1f µs  p99.9 %8.1f µs  max %9.1f µs  (n=%d)\n",
		name, s.P50US, s.P90US, s.P99US, s.P999US, s.MaxUS, s.Count)
}

// WriteLine writes h as the load tools' "host:" line; nothing for nil.
func (h *HostLoad) WriteLine(w io.Writer) {
	if h == nil {
		return
	}
	fmt.Fprintf(w, "  host: this process used %.1f CPU-s and its threads waited %.1f s for a CPU (load average %.1f)\n",
		h.CPUSeconds, h.RunqWaitSeconds, h.LoadAvg1)
}
