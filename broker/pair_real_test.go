package broker_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/integration/faultproxy"
	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/server"
)

const realPairHB = 100 * time.Millisecond

// realPair is a hot-standby pair of in-process servers whose peer link
// goes through a fault proxy each way.
type realPair struct {
	primary, backup *realServer
	proxies         []*faultproxy.Proxy
}

func startRealPair(t *testing.T) *realPair {
	t.Helper()
	port, err := proctest.FreePortRun("127.0.0.1", 4)
	if err != nil {
		t.Fatal(err)
	}
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(port+i) }
	pa, ba := addr(0), addr(1) // peer listeners
	pc, bc := addr(2), addr(3) // client listeners
	rp := &realPair{}
	for _, target := range []string{pa, ba} {
		px, err := faultproxy.New(target)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		rp.proxies = append(rp.proxies, px)
	}
	rp.primary = startServer(t, server.Config{Pair: &server.PairConfig{Role: server.PairPrimary, Listen: pa, Peer: rp.proxies[1].Addr(),
		Advertise: pc, Heartbeat: realPairHB}}, pc)
	rp.backup = startServer(t, server.Config{Pair: &server.PairConfig{Role: server.PairBackup, Listen: ba, Peer: rp.proxies[0].Addr(),
		Advertise: bc, Heartbeat: realPairHB}}, bc)
	return rp
}

func (rp *realPair) cut() {
	for _, px := range rp.proxies {
		px.SetDefault(faultproxy.Faults{Blackhole: true})
		for _, c := range px.Conns() {
			c.Blackhole(true)
		}
	}
}

func pairStatus(t *testing.T, s *server.Server) server.PairStatus {
	st, ok := s.PairStatus()
	if !ok {
		t.Fatal("not a pair node")
	}
	return st
}

// TestRealPair_CutLinkNeverMakesBackupActive: with the peer link cut and
// every client reaching the primary, the broker (given both addresses,
// either order) keeps using the primary and never contacts the backup,
// so the backup never becomes active, however long the cut lasts.
func TestRealPair_CutLinkNeverMakesBackupActive(t *testing.T) {
	for _, order := range []string{"primary first", "backup first"} {
		t.Run(order, func(t *testing.T) {
			rp := startRealPair(t)
			addrs := []string{rp.primary.Addr, rp.backup.Addr}
			if order == "backup first" {
				addrs[0], addrs[1] = addrs[1], addrs[0]
			}
			cfg := testConfig(addrs...)
			cfg.KeepAlive, cfg.KeepAliveTimeout = realPairHB, 4*realPairHB
			b, err := broker.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			waitReady(t, b)
			acquire := func() {
				t.Helper()
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				tk, err := b.Acquire(ctx, "k", broker.AcquireOptions{Lease: 30 * time.Second, Wait: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				tk.Release(ctx)
			}
			acquire()
			eventually(t, "the pair replicating", func() bool {
				return pairStatus(t, rp.primary.Server).Replicating && pairStatus(t, rp.backup.Server).HasState
			})
			rp.cut()
			for end := time.Now().Add(30 * realPairHB); time.Now().Before(end); {
				acquire()
				if st := pairStatus(t, rp.backup.Server); st.Serving || st.State != "PASSIVE" {
					t.Fatalf("the backup with a cut link: %+v", st)
				}
			}
			if st := pairStatus(t, rp.primary.Server); st.Replicating || !st.Serving {
				t.Fatalf("the primary with a cut link: %+v, want serving unreplicated", st)
			}
		})
	}
}

// TestRealPair_Failover: the broker loses the active primary, waits out
// the settle delay, and goes on with the backup, which has the held lock
// and grants above every earlier token.
func TestRealPair_Failover(t *testing.T) {
	rp := startRealPair(t)
	cfg := testConfig(rp.primary.Addr, rp.backup.Addr)
	cfg.PairSettle = 500 * time.Millisecond
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	waitReady(t, b)
	held, err := b.Acquire(t.Context(), "held", broker.AcquireOptions{Lease: 60 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pair replicating", func() bool {
		return pairStatus(t, rp.primary.Server).Replicating && pairStatus(t, rp.backup.Server).HasState
	})
	rp.primary.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var tk *broker.Ticket
	for {
		tk, err = b.Acquire(ctx, "other", broker.AcquireOptions{Lease: 30 * time.Second})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no grant after the failover: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if tk.Token() <= held.Token() || !pairStatus(t, rp.backup.Server).Serving {
		t.Fatalf("after the failover: token %d (held %d), backup %+v", tk.Token(), held.Token(), pairStatus(t, rp.backup.Server))
	}
	if _, err := b.Acquire(ctx, "held", broker.AcquireOptions{Lease: 30 * time.Second}); !errors.Is(err, broker.ErrTimedOut) {
		t.Fatalf("the held key on the new active: %v, want ErrTimedOut (still held)", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("releasing the held lock on the new active: %v", err)
	}
}

func waitReady(t *testing.T, b *broker.Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRealPair_ClientLinkCutFirst: the broker's link to the active primary
// is cut first (a fault proxy in front of each node's client listener
// drops everything to the primary) while the peer link still holds: the
// backup, hearing its peer, answers M naming it, and the broker goes back
// and forth between the two as its settle delay says. Then the peer link
// is cut too: the backup takes over at the first HELLO after two missed
// heartbeats, and the broker, which kept retrying it, gets grants from it,
// above every earlier token, with the held lock kept. The broker's
// backoff is the default one (up to 5 s); nothing here asserts a speed.
func TestRealPair_ClientLinkCutFirst(t *testing.T) {
	const hb = 200 * time.Millisecond
	port, err := proctest.FreePortRun("127.0.0.1", 4)
	if err != nil {
		t.Fatal(err)
	}
	addr := func(i int) string { return "127.0.0.1:" + strconv.Itoa(port+i) }
	pa, ba, pc, bc := addr(0), addr(1), addr(2), addr(3)
	proxy := func(target string) *faultproxy.Proxy {
		px, err := faultproxy.New(target)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		return px
	}
	peerToPrimary, peerToBackup := proxy(pa), proxy(ba)
	clientToPrimary, clientToBackup := proxy(pc), proxy(bc)
	// Each node advertises its proxied client address: the M hints name
	// the addresses the broker was given.
	primary := startServer(t, server.Config{Pair: &server.PairConfig{Role: server.PairPrimary, Listen: pa, Peer: peerToBackup.Addr(),
		Advertise: clientToPrimary.Addr(), Heartbeat: hb}}, pc)
	backup := startServer(t, server.Config{Pair: &server.PairConfig{Role: server.PairBackup, Listen: ba, Peer: peerToPrimary.Addr(),
		Advertise: clientToBackup.Addr(), Heartbeat: hb}}, bc)

	cfg := testConfig(clientToPrimary.Addr(), clientToBackup.Addr())
	cfg.BackoffMin, cfg.BackoffMax = broker.DefaultBackoffMin, broker.DefaultBackoffMax
	cfg.PairSettle = 2 * hb
	cfg.DialTimeout = time.Second
	cfg.KeepAlive, cfg.KeepAliveTimeout = hb, 4*hb
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	waitReady(t, b)
	held, err := b.Acquire(t.Context(), "held", broker.AcquireOptions{Lease: 60 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pair replicating", func() bool {
		return pairStatus(t, primary.Server).Replicating && pairStatus(t, backup.Server).HasState
	})
	before := clientToBackup.Accepted() // a starting primary may send the broker there first

	// The client link to the primary is cut: the broker loses it and
	// comes to the backup, which answers M while it hears its peer.
	clientToPrimary.SetDefault(faultproxy.Faults{Blackhole: true})
	for _, c := range clientToPrimary.Conns() {
		c.Blackhole(true)
	}
	eventually(t, "the broker trying the backup", func() bool { return clientToBackup.Accepted() >= before+2 })
	if st := pairStatus(t, backup.Server); st.Serving {
		t.Fatalf("the backup took over while it heard its peer: %+v", st)
	}

	// Now the peer link is cut as well: the backup takes over at the next
	// HELLO after two missed heartbeats.
	for _, px := range []*faultproxy.Proxy{peerToPrimary, peerToBackup} {
		px.SetDefault(faultproxy.Faults{Blackhole: true})
		for _, c := range px.Conns() {
			c.Blackhole(true)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var tk *broker.Ticket
	for {
		tk, err = b.Acquire(ctx, "other", broker.AcquireOptions{Lease: 30 * time.Second})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no grant from the backup: %v (backup %+v)", err, pairStatus(t, backup.Server))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if tk.Token() <= held.Token() || !pairStatus(t, backup.Server).Serving {
		t.Fatalf("after the take-over: token %d (held %d), backup %+v", tk.Token(), held.Token(), pairStatus(t, backup.Server))
	}
	if _, err := b.Acquire(ctx, "held", broker.AcquireOptions{Lease: 30 * time.Second}); !errors.Is(err, broker.ErrTimedOut) {
		t.Fatalf("the held key on the new active: %v, want ErrTimedOut (still held)", err)
	}
	if err := tk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
