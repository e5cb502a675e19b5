package server_test

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// BenchmarkAcquireRelease: uncontended ACQUIRE+RELEASE cycles, one key per
// client, 64 raw clients over loopback (run with -cpu to vary). One op is one
// cycle (two round trips). Reports p50/p99 ACQUIRE latency.
func BenchmarkAcquireRelease(b *testing.B) {
	_, addr := startServer(b, server.Config{})
	const clients = 64
	b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
	var mu sync.Mutex
	var lat []time.Duration
	var id atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := session(b, addr)
		c.nc.SetReadDeadline(time.Time{})
		n := id.Add(1)
		key := []byte(fmt.Sprintf("bench-key-%d", n))
		own := owner(int(n))
		acqF, _ := wire.AppendRequest(nil, &wire.Request{Type: wire.TypeAcquire, ReqID: 1, Owner: own, LeaseS: 30, Key: key})
		relF := make([]byte, 0, 64)
		var resp wire.Response
		my := make([]time.Duration, 0, 1024)
		for i := 0; pb.Next(); i++ {
			t0 := time.Now()
			c.nc.Write(acqF)
			body, err := c.fr.Next()
			if err != nil || wire.DecodeResponse(body, &resp) != nil || resp.Type != wire.TypeGranted {
				b.Errorf("acquire: %v %c", err, resp.Type)
				return
			}
			if i%16 == 0 {
				my = append(my, time.Since(t0))
			}
			relF, _ = wire.AppendRequest(relF[:0], &wire.Request{Type: wire.TypeRelease, ReqID: 2, Token: resp.Token, Key: key})
			c.nc.Write(relF)
			body, err = c.fr.Next()
			if err != nil || wire.DecodeResponse(body, &resp) != nil || resp.Type != wire.TypeReleased {
				b.Errorf("release: %v %c", err, resp.Type)
				return
			}
		}
		mu.Lock()
		lat = append(lat, my...)
		mu.Unlock()
	})
	b.StopTimer()
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-acquire-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-acquire-µs")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

// BenchmarkHeldLocks1M holds one million locks (pipelined ACQUIREs over four
// sessions) and reports the heap bytes per held lock and the process RSS.
// Run with -benchtime=1x.
func BenchmarkHeldLocks1M(b *testing.B) {
	const locks, conns = 1_000_000, 4
	for it := 0; it < b.N; it++ {
		s, addr := startServer(b, server.Config{})
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		var wg sync.WaitGroup
		for ci := 0; ci < conns; ci++ {
			c := session(b, addr)
			c.nc.SetReadDeadline(time.Time{})
			wg.Add(2)
			go func() {
				defer wg.Done()
				w := bufio.NewWriterSize(c.nc, 64<<10)
				for i := ci; i < locks; i += conns {
					r := wire.Request{Type: wire.TypeAcquire, ReqID: uint32(i), Owner: owner(ci), LeaseS: 250, Key: []byte("lock-key-" + strconv.Itoa(i))}
					f, _ := wire.AppendRequest(nil, &r)
					w.Write(f)
				}
				w.Flush()
			}()
			go func() {
				defer wg.Done()
				var resp wire.Response
				for i := ci; i < locks; i += conns {
					body, err := c.fr.Next()
					if err != nil || wire.DecodeResponse(body, &resp) != nil || resp.Type != wire.TypeGranted {
						b.Errorf("acquire: %v %c", err, resp.Type)
						return
					}
				}
			}()
		}
		wg.Wait()
		if st := s.Stats(); st.HeldLocks != locks {
			b.Fatalf("held %d", st.HeldLocks)
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/locks, "heap-B/lock")
		b.ReportMetric(float64(rssBytes())/(1<<20), "RSS-MiB")
		runtime.KeepAlive(s)
	}
}

func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(f), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkPipelined measures the server's cost per request without the
// round trip: 8 sessions each keep a window of ACQUIRE+RELEASE pairs in
// flight on their own keys. One op is one ACQUIRE+RELEASE cycle.
func BenchmarkPipelined(b *testing.B) {
	_, addr := startServer(b, server.Config{})
	const conns, window = 8, 64
	per := b.N/conns + 1
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for ci := 0; ci < conns; ci++ {
		c := session(b, addr)
		c.nc.SetReadDeadline(time.Time{})
		sem := make(chan struct{}, window)
		wg.Add(2)
		go func() {
			defer wg.Done()
			w := bufio.NewWriterSize(c.nc, 16<<10)
			var f []byte
			for i := 0; i < per; i++ {
				select {
				case sem <- struct{}{}:
				default:
					w.Flush()
					sem <- struct{}{}
				}
				key := []byte("pipe-" + strconv.Itoa(ci) + "-" + strconv.Itoa(i%window))
				// The token is unknown when pipelining, so release by a
				// wrong one (N) and let the owner's retry be idempotent:
				// same work for the server as a real cycle.
				f, _ = wire.AppendRequest(f[:0], &wire.Request{Type: wire.TypeAcquire, ReqID: uint32(2 * i), Owner: owner(ci), LeaseS: 1, Key: key})
				w.Write(f)
				f, _ = wire.AppendRequest(f[:0], &wire.Request{Type: wire.TypeRelease, ReqID: uint32(2*i + 1), Token: 1, Key: key})
				w.Write(f)
			}
			w.Flush()
		}()
		go func() {
			defer wg.Done()
			for i := 0; i < 2*per; i++ {
				if _, err := c.fr.Next(); err != nil {
					b.Error(err)
					return
				}
				if i%2 == 1 {
					<-sem
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(conns*per)/b.Elapsed().Seconds(), "cycles/s")
}
