package harness_test

import (
	"context"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/harness"
)

// TestHarnessServerRestart checks the harness itself: a server starts,
// serves, dies by SIGKILL, comes back on the same address and data
// directory, and its tokens go on increasing.
func TestHarnessServerRestart(t *testing.T) {
	srv := harness.StartServer(t, harness.Ticketingd(t), harness.ServerOptions{})
	addr := srv.Addr()
	b, err := broker.New(broker.Config{Addrs: []string{addr}, BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	h := harness.NewHistory()
	h.WriteArtifactOnFailure(t, "history")
	ctx := t.Context()
	acquire := func() uint64 {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := b.WaitReady(wctx); err != nil {
			t.Fatal(err)
		}
		tk, err := harness.Acquire(ctx, h, "main", b, "k", broker.AcquireOptions{Lease: 5 * time.Second, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := harness.Release(ctx, h, "main", tk); err != nil {
			t.Fatal(err)
		}
		return tk.Token()
	}
	first := acquire()
	srv.Kill9()
	killed := h.Event("test", "kill9", "")
	srv.Restart(t)
	up := h.Event("test", "restarted", "")
	if srv.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", srv.Addr(), addr)
	}
	var second uint64
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The broker notices the drop on its own; until then an acquire
		// may fail with unsent or indeterminate.
		tk, err := harness.Acquire(ctx, h, "main", b, "k", broker.AcquireOptions{Lease: 5 * time.Second, Wait: time.Second})
		if err == nil {
			second = tk.Token()
			_ = harness.Release(ctx, h, "main", tk)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no grant after restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if second <= first {
		t.Fatalf("token after restart %d, before %d", second, first)
	}
	for _, err := range []error{
		harness.CheckTokensUnique(h),
		harness.CheckNoTicketAfterIndeterminate(h),
		harness.CheckTokensIncreaseAcross(h, killed, up),
	} {
		if err != nil {
			t.Error(err)
		}
	}
	if code, err := srv.Stop(10 * time.Second); err != nil || code != 0 {
		t.Fatalf("Stop: code %d, %v", code, err)
	}
}
