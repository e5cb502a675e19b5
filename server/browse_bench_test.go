package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// BenchmarkBrowsedCycle: uncontended ACQUIRE+RELEASE cycles (64 clients,
// as BenchmarkPairCycle) on a pair's active holding 100,000 locks (one
// scheduler under one mutex, as a cluster leader's), without and with 8
// pollers of the lock browser asking in a loop for pages of prefixes that
// select nothing (each a prefix of its own: no answer is shared), back to
// back or 10 ms apart. Compare the sub-benchmarks' cycles/s, in one run:
//
//	go test -run '^$' -bench BenchmarkBrowsedCycle -benchtime 3s -count 3 ./server
func BenchmarkBrowsedCycle(b *testing.B) {
	s, addr := benchPairServer(b)
	holdLocks(b, addr, 100_000)
	for _, bc := range []struct {
		pollers int
		pace    time.Duration // between a poller's pages (0: none)
	}{{0, 0}, {8, 0}, {8, 10 * time.Millisecond}} {
		pollers := bc.pollers
		name := fmt.Sprintf("pollers=%d", pollers)
		if bc.pace > 0 {
			name += ",paced=" + bc.pace.String()
		}
		b.Run(name, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var pages atomic.Int64
			for p := range pollers {
				wg.Go(func() {
					for i := 0; ctx.Err() == nil; i++ {
						if _, err := s.Locks(ctx, server.LockQuery{Prefix: fmt.Sprintf("nothing/%d/%d", p, i)}); err != nil && ctx.Err() == nil {
							b.Errorf("Locks: %v", err)
							return
						}
						pages.Add(1)
						if bc.pace > 0 {
							time.Sleep(bc.pace)
						}
					}
				})
			}
			benchCycles(b, addr, wire.RoleActive)
			b.StopTimer()
			cancel()
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
			b.ReportMetric(float64(pages.Load())/b.Elapsed().Seconds(), "pages/s")
		})
	}
}
