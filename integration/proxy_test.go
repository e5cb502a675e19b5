package integration_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/faultproxy"
	"github.com/ticketing-dev/ticketing/integration/harness"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

// proxyDuration is TICKETING_PROXY_DURATION (a Go duration); default 10 s
// when CI=true, 5 s otherwise.
func proxyDuration(t *testing.T) time.Duration {
	if s := os.Getenv("TICKETING_PROXY_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("TICKETING_PROXY_DURATION=%q: not a positive duration", s)
		}
		return d
	}
	if os.Getenv("CI") == "true" {
		return 10 * time.Second
	}
	return 5 * time.Second
}

// TestBrokerThroughFaultProxy drives one broker, through a fault proxy in
// front of an in-process server, with many goroutines that acquire a few
// keys, sometimes hold past the lease, and release, while a nemesis cycles
// latency, mid-frame cuts (either direction), blackholes and resets on the
// live connections and blackholes new ones for a while. Every operation is
// recorded with its times on one monotonic clock. Every acquire must end as
// granted, timed out, busy, indeterminate or unsent, with no ticket beside
// an error; every release as released, not held or unconfirmed; no token
// is granted twice; tokens follow real time; and per key no two holders
// overlap (by lease deadline and release, and for confirmed releases by
// [grant, release] intervals in token order).
func TestBrokerThroughFaultProxy(t *testing.T) {
	t.Parallel()
	d := proxyDuration(t)

	srv := servertest.Start(t, server.Config{TokenBlock: 64})
	defer srv.Close()

	px, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()

	b, err := broker.New(broker.Config{
		Addrs:            []string{px.Addr()},
		Name:             "proxy-test",
		DialTimeout:      500 * time.Millisecond,
		BackoffMin:       10 * time.Millisecond,
		BackoffMax:       200 * time.Millisecond,
		KeepAlive:        200 * time.Millisecond,
		KeepAliveTimeout: 300 * time.Millisecond,
		ReplyGrace:       300 * time.Millisecond,
		ReleaseWindow:    2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	{
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := b.WaitReady(ctx)
		cancel()
		if err != nil {
			t.Fatalf("WaitReady: %v", err)
		}
	}

	h := harness.NewHistory()
	h.WriteArtifactOnFailure(t, "proxy-history")
	deadline := time.Now().Add(d)
	keys := []string{"k1", "k2", "k3"}
	const goroutines = 16

	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			proc := fmt.Sprintf("g%d", g)
			for time.Now().Before(deadline) {
				proxyOp(t, b, h, proc, keys[rand.IntN(len(keys))])
			}
		}()
	}

	// The nemesis cycles faults over the live connections.
	faults := map[string]int{}
	var newBlackholed atomic.Bool
	for time.Now().Before(deadline) {
		time.Sleep(50*time.Millisecond + rand.N(100*time.Millisecond))
		if newBlackholed.Load() {
			px.SetDefault(faultproxy.Faults{})
			newBlackholed.Store(false)
			h.Event("nemesis", "default-heal", "")
		}
		conns := px.Conns()
		if len(conns) == 0 {
			continue
		}
		c := conns[rand.IntN(len(conns))]
		var what string
		switch rand.IntN(7) {
		case 0:
			dl := rand.N(150 * time.Millisecond)
			c.SetDelay(dl)
			what = "delay"
		case 1:
			c.SetDelay(0)
			c.Blackhole(false)
			what = "heal"
		case 2:
			c.Cut(faultproxy.ServerToClient, 1+rand.IntN(8))
			what = "cut-server-to-client"
		case 3:
			c.Cut(faultproxy.ClientToServer, 1+rand.IntN(8))
			what = "cut-client-to-server"
		case 4:
			c.Blackhole(true)
			what = "blackhole"
		case 5:
			c.Reset()
			what = "reset"
		case 6:
			px.SetDefault(faultproxy.Faults{Blackhole: true})
			newBlackholed.Store(true)
			what = "blackhole-new-conns"
		}
		faults[what]++
		h.Event("nemesis", what, fmt.Sprintf("conn %d", c.ID()))
	}
	px.SetDefault(faultproxy.Faults{})
	wg.Wait()

	for _, err := range []error{
		harness.CheckOutcomes(h, harness.OfKind(harness.KindAcquire), harness.OutcomeOK, harness.OutcomeTimedOut,
			harness.OutcomeBusy, harness.OutcomeIndeterminate, harness.OutcomeUnsent),
		harness.CheckOutcomes(h, harness.OfKind(harness.KindRelease), harness.OutcomeOK, harness.OutcomeNotHeld,
			harness.OutcomeReleaseUnconfirmed),
		harness.CheckNoTicketAfterIndeterminate(h),
		harness.CheckTokensUnique(h),
		harness.CheckTokensFollowRealTime(h),
		harness.CheckLeaseExclusion(h),
		harness.CheckReleasedIntervals(h),
	} {
		if err != nil {
			t.Error(err)
		}
	}
	counts := h.Counts()
	var parts []string
	for k, v := range counts {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	t.Logf("proxy: duration=%v connections=%d %s", d, px.Accepted(), strings.Join(parts, " "))
	t.Logf("proxy: faults %v", faults)
	if counts[harness.KindAcquire+"/"+harness.OutcomeOK] == 0 {
		t.Error("no acquire was granted")
	}
}

// proxyOp is one acquire and, if granted, a short hold (sometimes past the
// lease) and a release, all recorded in h.
func proxyOp(t *testing.T, b *broker.Broker, h *harness.History, proc, key string) {
	wait := time.Duration(rand.IntN(2)) * time.Second // 0 (one try) or 1 s
	lease := time.Second + time.Duration(rand.IntN(2))*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), wait+3*time.Second)
	defer cancel()
	tk, err := harness.Acquire(ctx, h, proc, b, key, broker.AcquireOptions{Lease: lease, Wait: wait})
	if err != nil {
		if tk != nil {
			t.Errorf("%s: Acquire returned a ticket (token %d) with the error %v", proc, tk.Token(), err)
		}
		time.Sleep(rand.N(20 * time.Millisecond))
		return
	}
	if tk == nil {
		t.Errorf("%s: Acquire returned neither a ticket nor an error", proc)
		return
	}
	hold := rand.N(30 * time.Millisecond)
	if rand.IntN(20) == 0 {
		hold = lease + 200*time.Millisecond // past the lease: the release must say N
	}
	time.Sleep(hold)
	_ = harness.Release(context.Background(), h, proc, tk)
}
