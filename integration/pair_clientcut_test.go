package integration_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/faultproxy"
	"github.com/ticketing-dev/ticketing/integration/harness"
)

// TestPairClientLinkCutFirst: a pair of ticketingd processes with the
// broker's defaults that decide where it goes (its 2 s PairSettle and its
// default backoff, up to 5 s) and a 4 s heartbeat: the backup counts its
// peer dead after 8 s of silence, so a stalled primary (a loaded machine)
// cannot make it take over while the test needs it passive; with the 1 s
// default a 2 s stall did. The broker reaches each
// node through a fault proxy. First its link to the active primary is cut
// (the proxy drops everything) while the peer link holds: the backup,
// hearing its peer, answers M, and the broker goes back and forth between
// the two as its settle delay says. Then the peer link is cut too: the
// backup takes over at the first HELLO after two missed heartbeats. Pass:
// the broker, which keeps retrying the backup, gets a grant from it
// (within a generous deadline; no speed is asserted), of a later token
// epoch than the primary's, and a lock held on the primary before the
// cut is still held on the backup.
func TestPairClientLinkCutFirst(t *testing.T) {
	p := startPair(t, harness.PairOptions{Heartbeat: 4 * time.Second})
	proxy := func(target string) *faultproxy.Proxy {
		px, err := faultproxy.New(target)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		return px
	}
	toPrimary, toBackup := proxy(p.Primary.Addr()), proxy(p.Backup.Addr())
	cfg := loadBroker([]string{toPrimary.Addr(), toBackup.Addr()}, "client-cut")
	cfg.BackoffMin, cfg.BackoffMax = broker.DefaultBackoffMin, broker.DefaultBackoffMax
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 3*hangGuard)
	defer cancel()
	rctx, rcancel := context.WithTimeout(ctx, hangGuard)
	err = b.WaitReady(rctx)
	rcancel()
	if err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	held, err := b.Acquire(ctx, "held", broker.AcquireOptions{Lease: 2 * time.Minute, Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("acquire on the primary: %v", err)
	}
	waitFor(t, "the pair replicating the held lock", func() bool {
		ps, perr := p.Primary.Status()
		bs, berr := p.Backup.Status()
		return perr == nil && berr == nil && ps.Replicating && bs.HasState
	})
	before := toBackup.Accepted()

	// The client link to the primary is cut: the backup still hears its
	// peer and answers M; the broker comes to it after the settle delay.
	toPrimary.SetDefault(faultproxy.Faults{Blackhole: true})
	for _, c := range toPrimary.Conns() {
		c.Blackhole(true)
	}
	waitFor(t, "the broker trying the backup", func() bool { return toBackup.Accepted() >= before+2 })
	if st, err := p.Backup.Status(); err != nil || st.Serving {
		t.Fatalf("the backup with its peer alive: %+v (%v), want passive", st, err)
	}

	// The peer link is cut too: the backup takes over at the next HELLO
	// after two missed heartbeats.
	p.Cut()
	var tk *broker.Ticket
	for {
		tk, err = b.Acquire(ctx, "other", broker.AcquireOptions{Lease: 30 * time.Second})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			st, serr := p.Backup.Status()
			t.Fatalf("no grant from the backup: %v (backup %+v, %v)", err, st, serr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st, err := p.Backup.Status(); err != nil || !st.Serving {
		t.Fatalf("the grant came, but the backup does not serve: %+v (%v)", st, err)
	}
	if tokenEpoch(tk.Token()) <= tokenEpoch(held.Token()) {
		t.Fatalf("token %d (epoch %d) after the takeover, want an epoch above the primary's %d (token %d)",
			tk.Token(), tokenEpoch(tk.Token()), tokenEpoch(held.Token()), held.Token())
	}
	if _, err := b.Acquire(ctx, "held", broker.AcquireOptions{Lease: 30 * time.Second}); !errors.Is(err, broker.ErrTimedOut) {
		t.Fatalf("the held key on the backup: %v, want ErrTimedOut (still held)", err)
	}
	if err := tk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("releasing the held lock on the backup: %v", err)
	}
}
