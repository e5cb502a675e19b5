package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

var starters = map[string]func(dirs, addrs []string) (group, error){
	"hashicorp":        func(dirs, addrs []string) (group, error) { return startHashi(dirs, addrs, false) },
	"hashicorp-serial": func(dirs, addrs []string) (group, error) { return startHashi(dirs, addrs, true) },
	"etcd":             startEtcd,
	"etcdasync":        startEtcdAsync,
}

func main() {
	variants := flag.String("variants", "hashicorp,etcd", "variants, measured in this order in every round")
	rounds := flag.Int("rounds", 3, "rounds")
	dur := flag.Duration("duration", 5*time.Second, "measuring time per variant, round and client count")
	clients := flag.String("clients", "1,64", "concurrent proposers, one measurement each")
	dir := flag.String("dir", "", "parent of the nodes' data directories (default: a temporary directory)")
	flag.Parse()
	if err := run(*variants, *rounds, *dur, *clients, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "raftcommit:", err)
		os.Exit(1)
	}
}

type result struct {
	commits  int
	p50, p99 time.Duration
	dur      time.Duration
}

func (r result) rate() float64 { return float64(r.commits) / r.dur.Seconds() }

func run(variants string, rounds int, dur time.Duration, clients, dir string) error {
	base, err := os.MkdirTemp(dir, "raftcommit-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	var cs []int
	for _, c := range strings.Split(clients, ",") {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return fmt.Errorf("clients %q", c)
		}
		cs = append(cs, n)
	}
	vs := strings.Split(variants, ",")
	type key struct {
		v string
		c int
	}
	all := map[key][]result{}
	var id atomic.Uint64
	for r := 1; r <= rounds; r++ {
		for _, v := range vs {
			start := starters[v]
			if start == nil {
				return fmt.Errorf("unknown variant %q", v)
			}
			dirs := make([]string, 3)
			for i := range dirs {
				dirs[i] = filepath.Join(base, fmt.Sprintf("%s-r%d-n%d", v, r, i))
			}
			addrs, err := freeAddrs(3)
			if err != nil {
				return err
			}
			g, err := start(dirs, addrs)
			if err != nil {
				return err
			}
			// Wait for a leader, then warm up.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err = g.Propose(ctx, command(id.Add(1)))
			cancel()
			if err == nil {
				_, err = measure(g, 8, 500*time.Millisecond, &id)
			}
			for _, c := range cs {
				if err != nil {
					break
				}
				var res result
				res, err = measure(g, c, dur, &id)
				all[key{v, c}] = append(all[key{v, c}], res)
				fmt.Printf("round %d %-9s clients %3d: %8.0f commits/s  p50 %7.3f ms  p99 %7.3f ms\n", r, v, c, res.rate(), ms(res.p50), ms(res.p99))
			}
			if cerr := g.Close(); err == nil {
				err = cerr
			}
			for _, d := range dirs {
				os.RemoveAll(d)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", v, err)
			}
		}
	}
	fmt.Println("\nmedian over rounds; ratio = variant / first variant, per round then median")
	for _, c := range cs {
		for _, v := range vs {
			rs := all[key{v, c}]
			fs := all[key{vs[0], c}]
			var rate, p50, p99, rr, r50, r99 []float64
			for i, x := range rs {
				rate, p50, p99 = append(rate, x.rate()), append(p50, ms(x.p50)), append(p99, ms(x.p99))
				rr = append(rr, x.rate()/fs[i].rate())
				r50 = append(r50, ms(x.p50)/ms(fs[i].p50))
				r99 = append(r99, ms(x.p99)/ms(fs[i].p99))
			}
			fmt.Printf("clients %3d %-9s %8.0f commits/s  p50 %7.3f ms  p99 %7.3f ms   ratio: rate %.2f  p50 %.2f  p99 %.2f\n",
				c, v, median(rate), median(p50), median(p99), median(rr), median(r50), median(r99))
		}
	}
	return nil
}

// measure runs c proposers for d, each proposing one command at a time and
// waiting for the leader to apply it.
func measure(g group, c int, d time.Duration, id *atomic.Uint64) (result, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var lats []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(deadline) {
				t := time.Now()
				pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
				err := g.Propose(pctx, command(id.Add(1)))
				pcancel()
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if firstErr != nil {
		return result{}, firstErr
	}
	slices.Sort(lats)
	if len(lats) == 0 {
		return result{}, fmt.Errorf("no commit in %v", d)
	}
	return result{commits: len(lats), p50: lats[len(lats)/2], p99: lats[len(lats)*99/100], dur: el}, nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// freeAddrs returns n 127.0.0.1 addresses whose ports were free a moment ago.
func freeAddrs(n int) ([]string, error) {
	var out []string
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}
