package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCommitAndRestart commits commands on each variant's 3-node group,
// checks that the three nodes applied the same commands in the same order,
// then stops the whole group and restarts it from its directories: the
// nodes must re-apply exactly the committed commands from their logs (an
// unpersisted log restarts empty, with count 0), and commit one more.
func TestCommitAndRestart(t *testing.T) {
	for name, start := range starters {
		t.Run(name, func(t *testing.T) {
			base := t.TempDir()
			dirs := []string{filepath.Join(base, "n0"), filepath.Join(base, "n1"), filepath.Join(base, "n2")}
			addrs, err := freeAddrs(3)
			if err != nil {
				t.Fatal(err)
			}
			g, err := start(dirs, addrs)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var id atomic.Uint64
			for range 10 {
				if err := g.Propose(ctx, command(id.Add(1))); err != nil {
					t.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 5 {
						if err := g.Propose(ctx, command(id.Add(1))); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			const n = 50
			before := converge(ctx, t, g, n)
			if err := g.Close(); err != nil {
				t.Fatal(err)
			}

			g, err = start(dirs, addrs)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			cmd := command(id.Add(1))
			if err := g.Propose(ctx, cmd); err != nil {
				t.Fatal(err)
			}
			want := machine{count: before.Count, hash: before.Hash}
			want.apply(cmd)
			if got := converge(ctx, t, g, n+1); got != want.state() {
				t.Fatalf("after the restart the nodes hold %+v, want %+v (the %d commands before it, then one)", got, want.state(), n)
			}
		})
	}
}

// converge waits until every node has applied count commands and returns
// their state, failing if two nodes differ.
func converge(ctx context.Context, t *testing.T, g group, count uint64) state {
	t.Helper()
	for {
		ss := g.States()
		done := true
		for _, s := range ss {
			if s.Count > count {
				t.Fatalf("nodes applied %+v: more than the %d commands proposed", ss, count)
			}
			done = done && s.Count == count
		}
		if done {
			for _, s := range ss[1:] {
				if s != ss[0] {
					t.Fatalf("nodes applied the same number of commands differently: %+v", ss)
				}
			}
			return ss[0]
		}
		select {
		case <-ctx.Done():
			t.Fatalf("nodes applied %+v, want %d each: %v", ss, count, fmt.Errorf("%w", ctx.Err()))
		case <-time.After(10 * time.Millisecond):
		}
	}
}
