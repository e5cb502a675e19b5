package broker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/integration/faultproxy"
	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// Protocol version 3 (docs/protocol.md "Version 3 additions"): the
// negotiation, the cluster identity, Ticket.Refresh (EXTEND) and
// Ticket.KeepAlive, against in-process servers where the behaviour is
// the server's, and the fake where a reply must be scripted.

func newFakeV3(t testing.TB) *fakeServer {
	f := newFake(t)
	f.SetVersion(3)
	return f
}

// ignoreSessions is goleak's option for the goroutines there are now, and
// for the reader and writer of every session: a session counts as ready
// (ReadySessions) a moment before its reader and writer start.
func ignoreSessions() []goleak.Option {
	return []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/ticketing-dev/ticketing/broker.(*conn).readLoop"),
		goleak.IgnoreAnyFunction("github.com/ticketing-dev/ticketing/broker.(*conn).writeLoop")}
}

// waitDone waits for ctx to be done (at most 20 s) and returns when it was.
func waitDone(t *testing.T, ctx context.Context, what string) time.Time {
	t.Helper()
	select {
	case <-ctx.Done():
		return time.Now()
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: not signalled within 20 s", what)
	}
	return time.Time{}
}

// mustNotBeDone fails if ctx is done.
func mustNotBeDone(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
		t.Fatalf("%s: lost signal fired: %v", what, context.Cause(ctx))
	default:
	}
}

// heldV3 is the start of most tests here: a fake version-3 node, a
// broker with one session to it (its config changed by cfg, if not nil)
// and a ticket of key with lease, acquired.
func heldV3(t *testing.T, cfg func(*broker.Config), key string, lease time.Duration) (*fakeServer, *broker.Broker, *broker.Ticket) {
	t.Helper()
	f := newFakeV3(t)
	b := oneSession(t, f, cfg)
	tk, err := b.Acquire(t.Context(), key, broker.AcquireOptions{Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	return f, b, tk
}

func TestV3_Negotiation(t *testing.T) {
	t.Run("version-3 node: version 3 at once", func(t *testing.T) {
		f := newFakeV3(t)
		d := &recordingDialer{}
		cfg := testConfig(f.Addr)
		cfg.Dialer = d.Dial
		allReady(t, f, cfg)
		if n := f.versionRefused.Load(); n != 0 {
			t.Fatalf("%d HELLOs refused by a version-3 node", n)
		}
		for _, fc := range f.Conns() {
			if fc.Version != 3 {
				t.Fatalf("session of version %d, want 3", fc.Version)
			}
		}
		hello3 := mustHexT(t, "000000084800000001030000") // the protocol's test vector
		for i, w := range d.written() {
			if !bytes.HasPrefix(w, hello3) {
				t.Fatalf("HELLO %d: %x, want version 3 %x", i, w, hello3)
			}
		}
	})
	t.Run("version-2 node: E(2) to version 3, then version 2; Refresh and KeepAlive unsupported, nothing sent", func(t *testing.T) {
		f := newFakeV2(t)
		b := allReady(t, f, testConfig(f.Addr))
		if n := f.versionRefused.Load(); n < 1 || n > 2 {
			t.Fatalf("%d version-3 HELLOs refused, want 1 or 2 (one per session at most)", n)
		}
		for _, fc := range f.Conns() {
			if fc.Version != 2 {
				t.Fatalf("session of version %d, want 2", fc.Version)
			}
		}
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
		if err != nil {
			t.Fatal(err)
		}
		d0 := tk.Deadline()
		mustIs(t, tk.Refresh(t.Context(), 5*s), broker.ErrUnsupported)
		_, err = tk.KeepAlive(t.Context(), 5*s)
		mustIs(t, err, broker.ErrUnsupported)
		if n := f.Count(wire.TypeExtend); n != 0 || !tk.Deadline().Equal(d0) {
			t.Fatalf("%d EXTENDs sent to a version-2 node (deadline moved: %v)", n, !tk.Deadline().Equal(d0))
		}
		// The sessions are unharmed.
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("rolling upgrade: a version-2 node restarted at version 3 gets version-3 sessions", func(t *testing.T) {
		f := newFakeV2(t)
		b := allReady(t, f, testConfig(f.Addr))
		f = f.Restart(3)
		eventually(t, "sessions reopened", func() bool { return f.hellos.Load() >= 2 && b.ReadySessions() == 2 })
		if n := f.versionRefused.Load(); n != 0 {
			t.Fatalf("%d HELLOs refused by a version-3 node", n)
		}
		for _, fc := range f.Conns() {
			if fc.Version != 3 {
				t.Fatalf("session of version %d after the upgrade, want 3", fc.Version)
			}
		}
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Refresh(t.Context(), 5*s); err != nil {
			t.Fatal(err)
		}
	})
}

// soloCluster starts a one-node Raft cluster with identity id ("" draws
// one, as a node started with a wrong peer list does) and waits until it
// serves.
func soloCluster(t *testing.T, id string) *realServer {
	t.Helper()
	port, err := proctest.FreePortRun("127.0.0.1", 2)
	if err != nil {
		t.Fatal(err)
	}
	raftAddr, client := "127.0.0.1:"+strconv.Itoa(port), "127.0.0.1:"+strconv.Itoa(port+1)
	rs := startServer(t, server.Config{NodeName: "node-" + id, Cluster: &server.ClusterConfig{
		NodeID: "a", RaftListen: raftAddr, Advertise: client, Peers: []server.Peer{{ID: "a", Address: raftAddr}},
		ClusterID: id, HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
	}}, client)
	eventually(t, "the one-node cluster serving", func() bool { return rs.Stats().Role == "leader" })
	return rs
}

// TestV3_ClusterIdentity: a broker given the addresses of two clusters
// (two one-node Raft clusters: what a node started with a wrong peer list
// forms) uses only one: the configured one, or without one the first it
// meets. The other is never used, the log says so at Error, and no token
// is granted twice (both clusters count from 1): without the identity
// rule, the round robin sends every other request to each leader, which
// grants the same tokens and the same key twice.
func TestV3_ClusterIdentity(t *testing.T) {
	x, y := soloCluster(t, "cluster-x"), soloCluster(t, "cluster-y")
	run := func(t *testing.T, cfg broker.Config, used, unused *realServer, want string) {
		t.Helper()
		h := &captureHandler{}
		cfg.Logger = slog.New(h)
		b := newBroker(t, cfg)
		gx, gy := used.Stats().Grants, unused.Stats().Grants
		tokens := map[uint64]bool{}
		hold, err := b.Acquire(t.Context(), "held", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		tokens[hold.Token()] = true
		for i := range 20 {
			// The held key is refused on every request (two clusters
			// would each grant it once).
			_, err := b.Acquire(t.Context(), "held", broker.AcquireOptions{Lease: 30 * s})
			mustIs(t, err, broker.ErrTimedOut)
			tk, err := b.Acquire(t.Context(), fmt.Sprint("k", i), broker.AcquireOptions{Lease: 30 * s})
			if err != nil {
				t.Fatal(err)
			}
			if tokens[tk.Token()] {
				t.Fatalf("token %d granted twice", tk.Token())
			}
			tokens[tk.Token()] = true
			if err := tk.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		if err := hold.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if d := unused.Stats().Grants - gy; d != 0 {
			t.Fatalf("the other cluster granted %d locks", d)
		}
		if d := used.Stats().Grants - gx; d != 21 {
			t.Fatalf("the broker's cluster granted %d locks, want 21", d)
		}
		if b.Cluster() != want {
			t.Fatalf("Cluster() = %q, want %q", b.Cluster(), want)
		}
		eventually(t, "the Error line", func() bool {
			for _, l := range h.since(0, slog.LevelError) {
				if l.msg == "broker: node belongs to another cluster; not used" && l.attrs["addr"].String() == unused.Addr &&
					l.attrs["want"].String() == want && l.attrs["cluster"].String() != want && l.attrs["cluster"].String() != "" {
					return true
				}
			}
			return false
		})
	}
	t.Run("configured, the other cluster listed first", func(t *testing.T) {
		cfg := testConfig(y.Addr, x.Addr)
		cfg.Cluster = "cluster-x"
		run(t, cfg, x, y, "cluster-x")
	})
	t.Run("from the URL", func(t *testing.T) {
		cfg, err := broker.ParseURL("ticketing://" + x.Addr + "," + y.Addr + "?cluster=cluster-y")
		if err != nil {
			t.Fatal(err)
		}
		tc := testConfig(cfg.Addrs...)
		tc.Cluster = cfg.Cluster
		run(t, tc, y, x, "cluster-y")
	})
	t.Run("not configured: the first met", func(t *testing.T) {
		// The first address is dialled first (see "Connections"): x.
		run(t, testConfig(x.Addr, y.Addr), x, y, "cluster-x")
	})
	t.Run("no node of the configured cluster: refused at once, ErrWrongCluster visible", func(t *testing.T) {
		cfg := testConfig(x.Addr, y.Addr)
		cfg.Cluster = "cluster-z"
		b, err := broker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		err = b.WaitReady(within(t, 10*s))
		mustIs(t, err, broker.ErrNotReady, broker.ErrWrongCluster)
		var wc *broker.WrongClusterError
		if !errors.As(err, &wc) || wc.Want != "cluster-z" || !wc.Configured {
			t.Fatalf("WaitReady: %v, want a *WrongClusterError for cluster-z", err)
		}
		_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		mustIs(t, err, broker.ErrUnsent, broker.ErrWrongCluster)
		if b.ReadySessions() != 0 {
			t.Fatal("a node of another cluster is used")
		}
	})
	t.Run("configured: nodes without an identity are refused", func(t *testing.T) {
		// A standalone server (version 3, no identity) and a server of
		// version 2 (no identity field): neither can be shown to be of
		// cluster-x, so neither is used, and the error says why.
		standalone := startServer(t, server.Config{}, "127.0.0.1:0")
		v2 := newFakeV2(t)
		for _, c := range []struct {
			addr    string
			version uint8
			why     string
		}{{standalone.Addr, 3, "it is a standalone server"}, {v2.Addr, 2, "it speaks protocol version 2, which carries no cluster identity"}} {
			h := &captureHandler{}
			cfg := testConfig(c.addr)
			cfg.Cluster = "cluster-x"
			cfg.Logger = slog.New(h)
			b, err := broker.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = b.WaitReady(within(t, 10*s))
			mustIs(t, err, broker.ErrNotReady, broker.ErrWrongCluster, broker.ErrNoClusterIdentity)
			var wc *broker.WrongClusterError
			if !errors.As(err, &wc) || wc.Cluster != "" || wc.Want != "cluster-x" || !wc.Configured || wc.Version != c.version ||
				!strings.Contains(err.Error(), "has no cluster identity") || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("%s: WaitReady: %v, want a *WrongClusterError for a node without an identity (%s)", c.addr, err, c.why)
			}
			_, err = b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
			mustIs(t, err, broker.ErrUnsent, broker.ErrWrongCluster, broker.ErrNoClusterIdentity)
			if b.ReadySessions() != 0 {
				t.Fatalf("%s: a node without an identity is used", c.addr)
			}
			b.Close()
			found := false
			for _, l := range h.since(0, slog.LevelError) {
				found = found || (l.msg == "broker: node has no cluster identity; not used" && l.attrs["addr"].String() == c.addr && l.attrs["want"].String() == "cluster-x")
			}
			if !found {
				t.Fatalf("%s: no Error line for the node without an identity", c.addr)
			}
		}
		if n := standalone.Stats().Grants; n != 0 {
			t.Fatalf("the standalone server granted %d locks", n)
		}
		if n := v2.Count(wire.TypeAcquire); n != 0 {
			t.Fatalf("the version-2 server got %d ACQUIREs", n)
		}
	})
	t.Run("not configured: nodes without an identity are used", func(t *testing.T) {
		standalone := startServer(t, server.Config{}, "127.0.0.1:0")
		v2 := newFakeV2(t)
		for _, addr := range []string{standalone.Addr, v2.Addr} {
			b := newBroker(t, testConfig(addr))
			cycle(t, b, 2)
			if b.Cluster() != "" {
				t.Fatalf("Cluster() = %q, want none", b.Cluster())
			}
		}
	})
}

// TestV3_ClusterIdentityDrawn: two one-node clusters started without an
// identity (each draws its own, as ticketingd does): the broker keeps to
// the first it meets.
func TestV3_ClusterIdentityDrawn(t *testing.T) {
	x, y := soloCluster(t, ""), soloCluster(t, "")
	b := newBroker(t, testConfig(x.Addr, y.Addr))
	cx, err := x.ClusterStatus()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "identity learned", func() bool { return b.Cluster() != "" })
	if b.Cluster() != cx.ClusterID {
		t.Fatalf("Cluster() = %q, want the first node's %q", b.Cluster(), cx.ClusterID)
	}
	gy := y.Stats().Grants
	tokens := map[uint64]bool{}
	for i := range 10 {
		tk, err := b.Acquire(t.Context(), fmt.Sprint("k", i), broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		if tokens[tk.Token()] {
			t.Fatalf("token %d granted twice", tk.Token())
		}
		tokens[tk.Token()] = true
	}
	if y.Stats().Grants != gy {
		t.Fatal("the second cluster granted locks")
	}
}

// refreshBounds checks that d, the deadline after a refresh of lease
// confirmed between before and after, is t1 + lease*0.99 for a t1 in
// [before, after].
func refreshBounds(t *testing.T, d, before, after time.Time, lease time.Duration) {
	t.Helper()
	c := lease * 99 / 100
	if d.Before(before.Add(c)) || d.After(after.Add(c)) {
		t.Fatalf("deadline %v after the call: want in [%v, %v] (send time + 0.99 x lease)", d.Sub(before), c, after.Add(c).Sub(before))
	}
}

func TestV3_Refresh(t *testing.T) {
	t.Run("K moves the deadline, only forward; the server keeps the lock past the original lease", func(t *testing.T) {
		rs := startServer(t, server.Config{}, "127.0.0.1:0")
		b, other := newBroker(t, testConfig(rs.Addr)), newBroker(t, testConfig(rs.Addr))
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 2 * s})
		if err != nil {
			t.Fatal(err)
		}
		d0 := tk.Deadline()
		before := time.Now()
		if err := tk.Refresh(t.Context(), 9500*time.Millisecond); err != nil { // rounded up: 10 s
			t.Fatal(err)
		}
		d1 := tk.Deadline()
		refreshBounds(t, d1, before, time.Now(), 10*s)
		if !d1.After(d0) || !d1.After(before.Add(9*s)) {
			t.Fatalf("deadline not moved: %v -> %v", d0, d1)
		}
		// A shorter lease never moves it back (nor does the server).
		if err := tk.Refresh(t.Context(), s); err != nil {
			t.Fatal(err)
		}
		if !tk.Deadline().Equal(d1) {
			t.Fatalf("a shorter refresh moved the deadline %v -> %v", d1, tk.Deadline())
		}
		// Past the original lease's end on the server (d0 is 1% short of
		// it, counted from before the ACQUIRE was sent), the key is still
		// held, with its token.
		time.Sleep(time.Until(d0.Add(300 * time.Millisecond)))
		_, err = other.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 2 * s})
		mustIs(t, err, broker.ErrTimedOut)
		if err := tk.Release(t.Context()); err != nil {
			t.Fatalf("release after the original lease: %v, want R", err)
		}
	})
	t.Run("N: ErrNotHeld, the deadline no later than the EXTEND (expired, another holder)", func(t *testing.T) {
		rs := startServer(t, server.Config{}, "127.0.0.1:0")
		b, other := newBroker(t, testConfig(rs.Addr)), newBroker(t, testConfig(rs.Addr))
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: s})
		if err != nil {
			t.Fatal(err)
		}
		d0 := tk.Deadline()
		time.Sleep(time.Until(d0.Add(300 * time.Millisecond))) // the server's lease has ended
		mustIs(t, tk.Refresh(t.Context(), 5*s), broker.ErrNotHeld)
		if back := time.Now(); tk.Deadline().After(d0) || tk.Deadline().After(back) {
			t.Fatalf("ErrNotHeld left the deadline %v after the EXTEND's answer", tk.Deadline().Sub(back))
		}
		newer, err := other.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 5 * s})
		if err != nil {
			t.Fatal(err)
		}
		mustIs(t, tk.Refresh(t.Context(), 5*s), broker.ErrNotHeld)
		if err := newer.Release(t.Context()); err != nil {
			t.Fatalf("the other holder's lock was touched: %v", err)
		}
	})
	t.Run("EXTEND carries the key, the token, the acquire's owner and the rounded lease", func(t *testing.T) {
		f, _, tk := heldV3(t, nil, "k", 5*s)
		if err := tk.Refresh(t.Context(), 1200*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		acq, ext := logOf(f, wire.TypeAcquire), logOf(f, wire.TypeExtend)
		if len(ext) != 1 || ext[0].Key != "k" || ext[0].Token != tk.Token() || ext[0].Owner != acq[0].Owner || ext[0].LeaseS != 2 {
			t.Fatalf("EXTEND %+v, want key k, token %d, owner %x, lease_s 2", ext, tk.Token(), acq[0].Owner)
		}
	})
	t.Run("invalid lease, released ticket: refused, nothing sent", func(t *testing.T) {
		f, _, tk := heldV3(t, nil, "k", 5*s)
		d0 := tk.Deadline()
		for _, l := range []time.Duration{0, -s, 251 * s, 250*s + time.Millisecond} {
			mustIs(t, tk.Refresh(t.Context(), l), broker.ErrInvalidArgument)
			_, err := tk.KeepAlive(t.Context(), l)
			mustIs(t, err, broker.ErrInvalidArgument)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		mustIs(t, tk.Refresh(t.Context(), 5*s), broker.ErrNotHeld)
		_, err := tk.KeepAlive(t.Context(), 5*s)
		mustIs(t, err, broker.ErrNotHeld)
		if n := f.Count(wire.TypeExtend); n != 0 || tk.Remaining() >= 0 || tk.Deadline().After(d0) {
			t.Fatalf("%d EXTENDs sent; remaining %v after the release", n, tk.Remaining())
		}
	})
	t.Run("lost on the wire: ErrRefreshUnconfirmed, the deadline unchanged (the server did extend)", func(t *testing.T) {
		rs := startServer(t, server.Config{}, "127.0.0.1:0")
		px, err := faultproxy.New(rs.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer px.Close()
		b, direct := newBroker(t, testConfig(px.Addr())), newBroker(t, testConfig(rs.Addr))
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 2 * s})
		if err != nil {
			t.Fatal(err)
		}
		d0 := tk.Deadline()
		for _, c := range px.Conns() {
			c.Cut(faultproxy.ServerToClient, 1) // the K: one byte, then both sockets closed
		}
		mustIs(t, tk.Refresh(t.Context(), 10*s), broker.ErrRefreshUnconfirmed)
		if !tk.Deadline().Equal(d0) {
			t.Fatal("an unconfirmed refresh moved the deadline")
		}
		// It did happen: past the original lease the key is held.
		time.Sleep(time.Until(d0.Add(300 * time.Millisecond)))
		_, err = direct.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 2 * s})
		mustIs(t, err, broker.ErrTimedOut)
	})
	t.Run("never answered: ErrRefreshUnconfirmed and ctx's error, the deadline unchanged", func(t *testing.T) {
		f, _, tk := heldV3(t, nil, "ext-never", 5*s)
		d0 := tk.Deadline()
		mustIs(t, tk.Refresh(within(t, 200*time.Millisecond), 10*s), broker.ErrRefreshUnconfirmed, context.DeadlineExceeded)
		if !tk.Deadline().Equal(d0) || f.Count(wire.TypeExtend) != 1 {
			t.Fatal("deadline moved, or the EXTEND not sent")
		}
	})
	t.Run("no reply within ReplyGrace: the session closed, ErrRefreshUnconfirmed", func(t *testing.T) {
		_, _, tk := heldV3(t, func(c *broker.Config) { c.ReplyGrace = 300 * time.Millisecond }, "ext-never", 5*s)
		err := tk.Refresh(t.Context(), 10*s)
		mustIs(t, err, broker.ErrRefreshUnconfirmed)
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v: the call was not cancelled", err)
		}
	})
	t.Run("no ready session: ErrUnsent", func(t *testing.T) {
		f, b, tk := heldV3(t, nil, "k", 5*s)
		f.Close()
		eventually(t, "no ready session", func() bool { return b.ReadySessions() == 0 })
		mustIs(t, tk.Refresh(t.Context(), 5*s), broker.ErrUnsent)
	})
	t.Run("Deadline read concurrently with refreshes only moves forward", func(t *testing.T) {
		rs := startServer(t, server.Config{}, "127.0.0.1:0")
		b := newBroker(t, testConfig(rs.Addr))
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 2 * s})
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var back atomic.Bool
		wg.Add(1)
		go func() {
			defer wg.Done()
			prev := tk.Deadline()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d := tk.Deadline()
				if d.Before(prev) {
					back.Store(true)
				}
				prev = d
				_ = tk.Remaining()
			}
		}()
		var rw sync.WaitGroup
		for i := range 4 {
			rw.Add(1)
			go func() {
				defer rw.Done()
				for j := range 25 {
					if err := tk.Refresh(t.Context(), time.Duration(1+(i+j)%5)*s); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		rw.Wait()
		close(stop)
		wg.Wait()
		if back.Load() {
			t.Fatal("the deadline moved back")
		}
	})
}

func TestV3_KeepAlive(t *testing.T) {
	t.Run("across many leases: one token, the key held throughout", func(t *testing.T) {
		rs := startServer(t, server.Config{}, "127.0.0.1:0")
		b, other := newBroker(t, testConfig(rs.Addr)), newBroker(t, testConfig(rs.Addr))
		eventually(t, "every session ready", func() bool { return b.ReadySessions() == 2 && other.ReadySessions() == 2 })
		ignore := ignoreSessions()
		// 6 s: the keeper refreshes at a third of the lease and signals
		// loss at two thirds without a confirmed refresh, so a stall of
		// up to about 2 s (a loaded machine) cannot fail the test.
		const lease = 6 * s
		tk, err := b.Acquire(t.Context(), "job", broker.AcquireOptions{Lease: lease})
		if err != nil {
			t.Fatal(err)
		}
		lost, err := tk.KeepAlive(t.Context(), lease)
		if err != nil {
			t.Fatal(err)
		}
		start, d0 := time.Now(), tk.Deadline()
		for time.Since(start) < 3*lease+500*time.Millisecond {
			mustNotBeDone(t, lost, "while kept alive")
			_, err := other.Acquire(t.Context(), "job", broker.AcquireOptions{Lease: lease})
			mustIs(t, err, broker.ErrTimedOut)
			time.Sleep(200 * time.Millisecond)
		}
		mustNotBeDone(t, lost, "while kept alive")
		if !tk.Deadline().After(d0.Add(2 * lease)) {
			t.Fatalf("deadline moved by %v over three leases", tk.Deadline().Sub(d0))
		}
		// The server still has this token and owner: R.
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-lost.Done():
		default:
			t.Fatal("Release returned before the lost signal fired")
		}
		mustIs(t, context.Cause(lost), broker.ErrNotHeld)
		goleak.VerifyNone(t, ignore...) // the keep-alive's goroutine has exited
		next, err := other.Acquire(t.Context(), "job", broker.AcquireOptions{Lease: lease})
		if err != nil {
			t.Fatal(err)
		}
		if next.Token() <= tk.Token() {
			t.Fatalf("token %d after %d", next.Token(), tk.Token())
		}
	})
	t.Run("server unreachable: the signal fires before the deadline, while the server still holds the key", func(t *testing.T) {
		rs := startServer(t, server.Config{}, "127.0.0.1:0")
		px, err := faultproxy.New(rs.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer px.Close()
		b, direct := newBroker(t, testConfig(px.Addr())), newBroker(t, testConfig(rs.Addr))
		const lease = 3 * s
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: lease})
		if err != nil {
			t.Fatal(err)
		}
		lost, err := tk.KeepAlive(t.Context(), lease)
		if err != nil {
			t.Fatal(err)
		}
		d1 := tk.Deadline()
		eventually(t, "a background refresh", func() bool { return tk.Deadline().After(d1) })
		px.SetDefault(faultproxy.Faults{Blackhole: true})
		for _, c := range px.Conns() {
			c.Blackhole(true)
		}
		fired := waitDone(t, lost, "server unreachable")
		dl := tk.Deadline()
		if !fired.Before(dl) {
			t.Fatalf("fired %v after the conservative deadline", fired.Sub(dl))
		}
		mustIs(t, context.Cause(lost), broker.ErrLeaseEnding)
		// Nobody else can have the key yet (the server's lease ends no
		// earlier than dl). Checked only while that holds for this
		// test's own clock reading.
		_, err = direct.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: lease})
		if time.Now().Before(dl) {
			mustIs(t, err, broker.ErrTimedOut)
		} else {
			t.Logf("the acquire ended after the deadline (a slow host): not checked (%v)", err)
		}
	})
	t.Run("a refresh answered N: the signal fires at once, ErrNotHeld", func(t *testing.T) {
		f := newFakeV3(t)
		var n atomic.Int32
		f.SetHandle(func(fc *fakeConn, req *wire.Request) {
			if req.Type == wire.TypeExtend && n.Add(1) > 1 {
				fc.send(wire.AppendSimple(nil, wire.TypeNotHeld, req.ReqID))
				return
			}
			f.script(fc, req)
		})
		b := oneSession(t, f, nil)
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 2 * s})
		if err != nil {
			t.Fatal(err)
		}
		lost, err := tk.KeepAlive(t.Context(), 2*s)
		if err != nil {
			t.Fatal(err)
		}
		d1 := tk.Deadline() // the first refresh's
		fired := waitDone(t, lost, "N")
		mustIs(t, context.Cause(lost), broker.ErrNotHeld)
		if n.Load() != 2 || !fired.Before(d1) {
			t.Fatalf("%d EXTENDs; fired %v before the deadline", n.Load(), d1.Sub(fired))
		}
		if tk.Remaining() >= 0 {
			t.Fatalf("the N left %v of the lease", tk.Remaining())
		}
	})
	t.Run("ctx ended: the keep-alive stops, the ticket stays held", func(t *testing.T) {
		rs := startServer(t, server.Config{}, "127.0.0.1:0")
		b := newBroker(t, testConfig(rs.Addr))
		eventually(t, "every session ready", func() bool { return b.ReadySessions() == 2 })
		ignore := ignoreSessions()
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 2 * s})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		lost, err := tk.KeepAlive(ctx, 2*s)
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		waitDone(t, lost, "ctx cancelled")
		if cause := context.Cause(lost); cause != context.Canceled {
			t.Fatalf("cause %v, want ctx's (context.Canceled)", cause)
		}
		goleak.VerifyNone(t, ignore...)
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Release with the keep-alive's own context is still made", func(t *testing.T) {
		f, _, tk := heldV3(t, nil, "k", 5*s)
		held, err := tk.KeepAlive(t.Context(), 5*s)
		if err != nil {
			t.Fatal(err)
		}
		work, cancel := context.WithTimeout(held, time.Minute) // derived from it
		defer cancel()
		if err := tk.Release(work); err != nil {
			t.Fatalf("Release(held): %v, want R", err)
		}
		if n := f.Count(wire.TypeReleaseOwned); n != 1 {
			t.Fatalf("%d RELEASE_OWNED sent, want 1", n)
		}
		mustIs(t, context.Cause(held), broker.ErrNotHeld)
	})
	t.Run("Close: the signal fires (ErrClosed), the goroutine has exited", func(t *testing.T) {
		_, b, tk := heldV3(t, nil, "k", 5*s)
		lost, err := tk.KeepAlive(t.Context(), 5*s)
		if err != nil {
			t.Fatal(err)
		}
		b.Close()
		select {
		case <-lost.Done():
		default:
			t.Fatal("Close returned before the lost signal fired")
		}
		mustIs(t, context.Cause(lost), broker.ErrClosed)
		_, err = tk.KeepAlive(t.Context(), 5*s)
		mustIs(t, err, broker.ErrNotHeld) // released by Close
	})
}

// A ticket the broker knows it no longer holds is refused by the fence,
// however long its deadline had to run: an EXTEND answered N (the lock
// was freed under it: released by its token elsewhere, or expired by an
// operator) or a RELEASE made (answered R, N, or unconfirmed) puts the
// deadline back to when that request was sent, and no later K moves it
// forward again.
func TestV3_LostTicketIsRefusedByTheFence(t *testing.T) {
	const s = time.Second
	t.Run("EXTEND answered N", func(t *testing.T) {
		_, _, tk := heldV3(t, nil, "k-ext-notheld", 30*s)
		if err := fence.CheckLease(tk); err != nil {
			t.Fatalf("a fresh 30 s ticket: %v", err)
		}
		mustIs(t, tk.Refresh(t.Context(), 30*s), broker.ErrNotHeld)
		if rem := tk.Remaining(); rem >= 0 {
			t.Fatalf("after N: remaining %v", rem)
		}
		if err := fence.CheckLease(tk); !errors.Is(err, fence.ErrLeaseExpired) {
			t.Fatalf("the fence's lease check: %v, want ErrLeaseExpired", err)
		}
	})
	t.Run("a K handled after an N does not bring the ticket back", func(t *testing.T) {
		f := newFakeV3(t)
		var n atomic.Int32
		f.SetHandle(func(fc *fakeConn, req *wire.Request) {
			if req.Type == wire.TypeExtend {
				if id := req.ReqID; n.Add(1) == 1 { // the first EXTEND's K comes after the second's N
					f.later(300*time.Millisecond, func() { fc.send(wire.AppendSimple(nil, wire.TypeKept, id)) })
				} else {
					fc.send(wire.AppendSimple(nil, wire.TypeNotHeld, req.ReqID))
				}
				return
			}
			f.script(fc, req)
		})
		b := oneSession(t, f, nil)
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		first := make(chan error, 1)
		go func() { first <- tk.Refresh(t.Context(), 60*s) }()
		for n.Load() < 1 {
			time.Sleep(time.Millisecond)
		}
		mustIs(t, tk.Refresh(t.Context(), 60*s), broker.ErrNotHeld)
		if err := <-first; err != nil {
			t.Fatalf("the first refresh: %v, want its late K", err)
		}
		if tk.Remaining() >= 0 {
			t.Fatalf("a K handled after the N moved the deadline of a lost ticket %v ahead", tk.Remaining())
		}
		if err := fence.CheckLease(tk); !errors.Is(err, fence.ErrLeaseExpired) {
			t.Fatalf("the fence's lease check: %v, want ErrLeaseExpired", err)
		}
	})
	t.Run("released", func(t *testing.T) {
		rs := startServer(t, server.Config{}, "127.0.0.1:0")
		b := newBroker(t, testConfig(rs.Addr))
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if rem := tk.Remaining(); rem >= 0 {
			t.Fatalf("after R: remaining %v", rem)
		}
		if err := fence.CheckLease(tk); !errors.Is(err, fence.ErrLeaseExpired) {
			t.Fatalf("the fence's lease check: %v, want ErrLeaseExpired", err)
		}
	})
}
