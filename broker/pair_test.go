package broker_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

// pairNode is a fake node of a hot-standby pair (docs/ha.md). Serving, it
// answers HELLO with HELLO_OK of its role (2, the active of a pair, unless
// set otherwise); not serving, it answers HELLO with M and its hint and
// closes the session, as a passive node does.
type pairNode struct {
	*fakeServer
	role    atomic.Uint32
	serving atomic.Bool
	hint    atomic.Pointer[string]
	// serveAt > 0: the node serves from its serveAt-th HELLO on (a
	// passive that takes over once its peer is silent long enough).
	serveAt atomic.Int64
	gate    <-chan struct{} // see newPairNodeGated
}

func newPairNode(t testing.TB, addr string, role uint8, serving bool, hint string) *pairNode {
	t.Helper()
	return newPairNodeGated(t, addr, role, serving, hint, nil)
}

// newPairNodeGated is newPairNode answering each HELLO only once gate is
// closed (nil: at once).
func newPairNodeGated(t testing.TB, addr string, role uint8, serving bool, hint string, gate <-chan struct{}) *pairNode {
	t.Helper()
	n := &pairNode{gate: gate}
	n.role.Store(uint32(role))
	n.serving.Store(serving)
	n.hint.Store(&hint)
	n.fakeServer = newFakeSetup(t, addr, nil, wire.Version2, func(f *fakeServer) { f.Hello = n.hello })
	return n
}

func (n *pairNode) hello(fc *fakeConn, req *wire.Request) {
	if n.gate != nil {
		<-n.gate
	}
	if at := n.serveAt.Load(); at > 0 && n.hellos.Load() >= at {
		n.serving.Store(true)
	}
	if n.serving.Load() {
		fc.sendResp(&wire.Response{Type: wire.TypeHelloOK, ReqID: req.ReqID, Version: req.Version, Role: uint8(n.role.Load()), Node: []byte("pair")})
		return
	}
	fc.sendResp(&wire.Response{Type: wire.TypeNotActive, ReqID: req.ReqID, Hint: []byte(*n.hint.Load())})
	fc.Close()
}

// StepDown makes the node stop serving as an active stepping down does:
// every session gets M with hint and is closed, and later HELLOs are
// answered M with hint.
func (n *pairNode) StepDown(hint string) {
	n.hint.Store(&hint)
	n.serving.Store(false)
	for _, fc := range n.Conns() {
		fc.sendResp(&wire.Response{Type: wire.TypeNotActive, ReqID: 0, Hint: []byte(hint)})
		fc.Close()
	}
}

// acquires returns how many ACQUIREs the fake received.
func (f *fakeServer) acquires() int {
	n := 0
	for _, r := range f.Log() {
		if r.Type == wire.TypeAcquire {
			n++
		}
	}
	return n
}

// dialLog records every dial, by address and time.
type dialLog struct {
	mu    sync.Mutex
	addrs []string
	at    []time.Time
}

func (d *dialLog) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.addrs = append(d.addrs, addr)
	d.at = append(d.at, time.Now())
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

// times returns the times of the dials to addr, in order.
func (d *dialLog) times(addr string) []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []time.Time
	for i, a := range d.addrs {
		if a == addr {
			out = append(out, d.at[i])
		}
	}
	return out
}

// between counts the dials to addr at or after from and before to.
func (d *dialLog) between(addr string, from, to time.Time) int {
	n := 0
	for _, at := range d.times(addr) {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// freeAddr is a loopback address for a fake that is restarted on it.
func freeAddr(t testing.TB) string {
	t.Helper()
	p, err := proctest.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
}

// pairConfig is testConfig for addrs with d as Dialer and a settle delay.
func pairConfig(d *dialLog, settle time.Duration, addrs ...string) broker.Config {
	cfg := testConfig(addrs...)
	cfg.Dialer = d.Dial
	cfg.PairSettle = settle
	return cfg
}

// neverAcquire starts an ACQUIRE that f never answers, returns once f has
// read it, and returns its outcome's channel.
func neverAcquire(t *testing.T, b *broker.Broker, f *fakeServer) <-chan error {
	t.Helper()
	before := f.acquires()
	errc := make(chan error, 1)
	go func() {
		_, err := b.Acquire(context.Background(), "never/inflight", broker.AcquireOptions{Lease: 30 * s, Wait: 5 * s})
		errc <- err
	}()
	eventually(t, "the ACQUIRE read by the active", func() bool { return f.acquires() > before })
	return errc
}

// TestPair_NoProbeWhileActiveServes: once a node has answered HELLO as
// the active of a pair, the broker never dials the other address while
// it serves: no background probe, no race at start, none at the
// keepalives.
func TestPair_NoProbeWhileActiveServes(t *testing.T) {
	for _, tc := range []struct {
		name         string
		passiveFirst bool
	}{
		// The broker tries the first address first: the active answers,
		// and the passive is never contacted, not even at start.
		{name: "active listed first"},
		// The passive, listed first, is contacted at start: it answers M
		// naming the active, and is not contacted again once the active
		// has answered.
		{name: "passive listed first", passiveFirst: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			active := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
			passive := newPairNode(t, "127.0.0.1:0", wire.RoleActive, false, active.Addr)
			addrs := []string{active.Addr, passive.Addr}
			if tc.passiveFirst {
				addrs = []string{passive.Addr, active.Addr}
			}
			d := &dialLog{}
			// A settle delay longer than the test: with the default (2 s),
			// a stall of the fake active's goroutines of a keepalive
			// timeout plus 2 s would send the broker to the passive, as it
			// should after losing the active. A probe, or a race at start,
			// does not wait for the settle delay, so it is caught as well.
			cfg := pairConfig(d, time.Hour, addrs...)
			cfg.KeepAlive, cfg.KeepAliveTimeout = 20*time.Millisecond, 5*s
			b := newBroker(t, cfg) // ready on the active
			atStart := passive.TCPAccepted()
			if !tc.passiveFirst && atStart != 0 {
				t.Fatalf("the passive, listed second, was contacted at start (%d connections)", atStart)
			}
			if tc.passiveFirst && atStart == 0 {
				t.Fatal("the passive, listed first, was not contacted at start")
			}
			cycle(t, b, 200)
			eventually(t, "a few keepalive intervals", func() bool { return active.Count(wire.TypePing) >= 5 })
			cycle(t, b, 200)
			if got := active.acquires(); got != 400 {
				t.Fatalf("the active got %d ACQUIREs, want 400", got)
			}
			if n, dials := passive.TCPAccepted(), len(d.times(passive.Addr)); n != atStart || dials != atStart {
				t.Fatalf("the passive accepted %d connections (%d dials), want %d: none since the active answered", n, dials, atStart)
			}
		})
	}
}

// TestPair_SettleBeforeOtherNode: the active dies (its listener closed,
// its connections dropped). The ACQUIRE in flight on it is Indeterminate;
// the broker retries the lost address alone, and dials the other node no
// earlier than the settle delay after the loss (a lower bound only); it
// then works against that node, which answers as the new active. That the
// lost address is retried within the settle delay is checked on the pause
// its session chose (at most the pair's pace), not on a dial made in time,
// which a stalled machine could delay past the settle delay.
func TestPair_SettleBeforeOtherNode(t *testing.T) {
	const settle = time.Second // also the longest the first address is tried alone at start
	active := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
	other := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
	d := &dialLog{}
	b := newBroker(t, pairConfig(d, settle, active.Addr, other.Addr))
	cycle(t, b, 10)
	pauses := recordPauses(b)
	inflight := neverAcquire(t, b, active.fakeServer)

	lost := time.Now()
	active.Close()
	check(t, <-inflight, "ErrIndeterminate")
	if err := b.WaitReady(within(t, 10*s)); err != nil {
		t.Fatalf("not ready on the other node: %v", err)
	}
	dials := d.times(other.Addr)
	if len(dials) == 0 {
		t.Fatal("ready without dialling the other node")
	}
	first := dials[0]
	t.Logf("first dial to the other node %v after the loss (settle %v)", first.Sub(lost).Round(time.Millisecond), settle)
	if first.Before(lost.Add(settle)) {
		t.Fatalf("the other node was dialled %v after the loss, before the settle delay %v", first.Sub(lost), settle)
	}
	retry := false
	for _, p := range pauses.since(0) {
		if p.Addr == active.Addr && p.Dropped {
			retry = p.InPair && p.D <= settle/4
			t.Logf("the lost active's session paused %v after the drop", p.D)
			break
		}
	}
	if !retry {
		t.Fatalf("the lost active's session did not choose to retry it within the pair's pace after the drop: %+v", pauses.since(0))
	}
	cycle(t, b, 10)
	if got := other.acquires(); got != 10 {
		t.Fatalf("the new active got %d ACQUIREs, want 10", got)
	}
}

// TestPair_ActiveBackDuringSettle: the active is lost and comes back
// within the settle delay (here an hour): the broker reconnects to it
// and never contacts the other node (which would serve if asked), for
// each way of losing it: the node restarted, an M without hint, a
// keepalive timeout.
func TestPair_ActiveBackDuringSettle(t *testing.T) {
	for _, tc := range []struct {
		name string
		// lose makes the broker lose the active a, and brings it (or a
		// new one on its address) back once the broker has failed to
		// reach it.
		lose func(t *testing.T, a *pairNode, d *dialLog, b *broker.Broker)
	}{
		{"restarted", func(t *testing.T, a *pairNode, d *dialLog, b *broker.Broker) {
			n := len(d.times(a.Addr))
			a.Close()
			eventually(t, "a failed redial of the lost active", func() bool { return len(d.times(a.Addr)) > n })
			newPairNode(t, a.Addr, wire.RoleActive, true, "")
		}},
		{"M without hint", func(t *testing.T, a *pairNode, d *dialLog, b *broker.Broker) {
			n := a.hellos.Load()
			a.StepDown("")
			eventually(t, "HELLOs answered M", func() bool { return a.hellos.Load() >= n+2 })
			a.serving.Store(true)
		}},
		{"keepalive timeout", func(t *testing.T, a *pairNode, d *dialLog, b *broker.Broker) {
			n := a.hellos.Load()
			a.SetHandle(func(fc *fakeConn, req *wire.Request) {
				if req.Type != wire.TypePing { // PINGs unanswered
					a.script(fc, req)
				}
			})
			eventually(t, "the silent session closed and redialled", func() bool { return a.hellos.Load() > n })
			a.SetHandle(nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newPairNode(t, freeAddr(t), wire.RoleActive, true, "")
			other := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
			d := &dialLog{}
			cfg := pairConfig(d, time.Hour, a.Addr, other.Addr)
			cfg.KeepAlive, cfg.KeepAliveTimeout = 20*time.Millisecond, 200*time.Millisecond
			b := newBroker(t, cfg)
			cycle(t, b, 10)
			tc.lose(t, a, d, b)
			eventually(t, "an ACQUIRE granted again", func() bool {
				tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
				if err != nil {
					return false
				}
				return tk.Release(t.Context()) == nil
			})
			cycle(t, b, 10)
			if n, dials := other.TCPAccepted(), len(d.times(other.Addr)); n != 0 || dials != 0 {
				t.Fatalf("the other node accepted %d connections (%d dials), want 0", n, dials)
			}
		})
	}
}

// TestPair_NoSwitchWhileAttemptInFlight: the active restarts at once but
// answers the broker's HELLO only after the settle delay has passed. The
// settle delay alone does not move the broker: while an attempt to the
// lost active is in flight (it may still answer), the other node is not
// dialled; the active answers, and the other node is never contacted.
func TestPair_NoSwitchWhileAttemptInFlight(t *testing.T) {
	// Between the loss and the redial to the restarted active (a pause of
	// at most a quarter of it) no attempt is in flight: a stall of the
	// machine as long as the settle delay there would rightly send the
	// broker to the other node. Six seconds leave a stall of more than
	// four (the redial comes within a quarter of the settle delay).
	const settle = 6 * time.Second
	addr := freeAddr(t)
	a := newPairNode(t, addr, wire.RoleActive, true, "")
	other := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
	d := &dialLog{}
	cfg := pairConfig(d, settle, a.Addr, other.Addr)
	cfg.DialTimeout = 30 * s
	b := newBroker(t, cfg)
	cycle(t, b, 10)

	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	defer open()
	a.Close()
	slow := newPairNodeGated(t, addr, wire.RoleActive, true, "", release)
	eventually(t, "a HELLO to the restarted active pending", func() bool { return slow.hellos.Load() >= 1 })
	// The broker lost the active before it redialled it: the settle delay
	// has passed once it has passed since now.
	time.Sleep(settle + 50*time.Millisecond)
	open()
	if err := b.WaitReady(within(t, 10*s)); err != nil {
		t.Fatal(err)
	}
	cycle(t, b, 10)
	if got := slow.acquires(); got != 10 {
		t.Fatalf("the restarted active got %d ACQUIREs, want 10", got)
	}
	if n, dials := other.TCPAccepted(), len(d.times(other.Addr)); n != 0 || dials != 0 {
		t.Fatalf("the other node accepted %d connections (%d dials) while an attempt to the active was in flight, want 0", n, dials)
	}
}

// TestPair_SecondActiveNotUsed: the first address is slow to answer at
// start, so the broker tries the second after the settle delay, which
// answers as the active. Then the first answers as an active too (a split
// brain): the broker does not use it, and sends every request to the
// active it found first.
func TestPair_SecondActiveNotUsed(t *testing.T) {
	gate := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	defer open()
	slow := newPairNodeGated(t, "127.0.0.1:0", wire.RoleActive, true, "", gate)
	active := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
	h := &captureHandler{}
	cfg := pairConfig(&dialLog{}, 100*time.Millisecond, slow.Addr, active.Addr)
	cfg.DialTimeout = 30 * s
	cfg.Logger = slog.New(h)
	b := newBroker(t, cfg) // ready on the second address
	if slow.hellos.Load() != 1 {
		t.Fatalf("%d HELLOs to the first address, want 1 (pending)", slow.hellos.Load())
	}
	open()
	const msg = "broker: pair: a node other than the active answered HELLO; not used"
	eventually(t, "the second active refused", func() bool { return h.count(0, msg) == 1 })
	if n := b.ReadySessions(); n != 1 {
		t.Fatalf("%d ready sessions, want 1", n)
	}
	cycle(t, b, 50)
	if got, other := active.acquires(), slow.acquires(); got != 50 || other != 0 {
		t.Fatalf("ACQUIREs: %d to the active, %d to the second active; want 50 and 0", got, other)
	}
}

// TestPair_ActiveFoundClosesOthers: a node that answers as a standalone
// server is in use when another listed node answers as the active of a
// pair (a deployment being moved to a pair, or a misconfiguration). From
// then on the broker uses the active only: the other session is closed.
func TestPair_ActiveFoundClosesOthers(t *testing.T) {
	standalone := newPairNode(t, "127.0.0.1:0", wire.RoleStandalone, true, "")
	active := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
	h := &captureHandler{}
	cfg := pairConfig(&dialLog{}, time.Hour, standalone.Addr, active.Addr)
	cfg.Logger = slog.New(h)
	b := newBroker(t, cfg)
	const msg = "broker: pair: active found; the other addresses are dialled only after losing it for the settle delay"
	eventually(t, "the active found and the other session closed", func() bool {
		return h.count(0, msg) == 1 && b.ReadySessions() == 1
	})
	before := standalone.acquires()
	cycle(t, b, 50)
	if got, other := active.acquires(), standalone.acquires()-before; got != 50 || other != 0 {
		t.Fatalf("ACQUIREs: %d to the active, %d to the standalone node; want 50 and 0", got, other)
	}
}

// TestPair_HintFollowedAtOnce: the active steps down, sending M naming the
// other node to its sessions. The broker follows the hint at once (the
// settle delay, an hour here, does not apply: the node that says so has
// stopped serving); the ACQUIRE in flight on the old active is
// Indeterminate.
func TestPair_HintFollowedAtOnce(t *testing.T) {
	a := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
	other := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
	d := &dialLog{}
	b := newBroker(t, pairConfig(d, time.Hour, a.Addr, other.Addr))
	cycle(t, b, 10)
	if n := other.TCPAccepted(); n != 0 {
		t.Fatalf("the other node was contacted while the active served (%d connections)", n)
	}
	inflight := neverAcquire(t, b, a.fakeServer)
	a.StepDown(other.Addr)
	check(t, <-inflight, "ErrIndeterminate")
	if err := b.WaitReady(within(t, 10*s)); err != nil {
		t.Fatalf("not ready on the hinted node: %v", err)
	}
	cycle(t, b, 10)
	if got := other.acquires(); got != 10 {
		t.Fatalf("the new active got %d ACQUIREs, want 10", got)
	}
	if got := a.acquires(); got != 11 {
		t.Fatalf("the old active got %d ACQUIREs, want 11 (10 and the one in flight)", got)
	}
}

// TestPair_HintNotPassedOn: the active steps down naming the other node,
// which is a passive naming the first (both passive: a moment of a
// failover, or a misconfiguration). The broker follows the first hint
// only: a node reached by a hint does not pass its own on until it has
// served, so the two cannot send the broker back and forth without the
// settle delay. It keeps retrying the hinted node.
func TestPair_HintNotPassedOn(t *testing.T) {
	a := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
	other := newPairNode(t, "127.0.0.1:0", wire.RoleActive, false, a.Addr)
	d := &dialLog{}
	b := newBroker(t, pairConfig(d, time.Hour, a.Addr, other.Addr))
	cycle(t, b, 10)
	n := len(d.times(a.Addr))
	a.StepDown(other.Addr)
	eventually(t, "the hinted node retried", func() bool { return other.hellos.Load() >= 5 })
	if got := len(d.times(a.Addr)); got != n {
		t.Fatalf("the node that stepped down was dialled %d more times, following the hinted node's hint back", got-n)
	}
	// The hinted node takes over: the broker is ready on it.
	other.serving.Store(true)
	if err := b.WaitReady(within(t, 10*s)); err != nil {
		t.Fatal(err)
	}
	cycle(t, b, 10)
	if got := other.acquires(); got != 10 {
		t.Fatalf("the new active got %d ACQUIREs, want 10", got)
	}
}

// TestPair_DesertedNodeHintNotFollowed: the active dies; after the settle
// delay the broker tries the other node, which has not yet seen that its
// peer is dead: it answers M naming the dead node. The broker does not go
// back to the node it lost (it knows better than the hint), and retries
// the other node until it takes over.
func TestPair_DesertedNodeHintNotFollowed(t *testing.T) {
	const settle = 500 * time.Millisecond
	a := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
	other := newPairNode(t, "127.0.0.1:0", wire.RoleActive, false, a.Addr)
	other.serveAt.Store(3) // the third HELLO finds the peer dead: it takes over
	d := &dialLog{}
	b := newBroker(t, pairConfig(d, settle, a.Addr, other.Addr))
	cycle(t, b, 10)
	a.Close()
	eventually(t, "the other node's take-over", func() bool { return other.serving.Load() })
	if err := b.WaitReady(within(t, 10*s)); err != nil {
		t.Fatal(err)
	}
	first := d.times(other.Addr)[0]
	if n := d.between(a.Addr, first, time.Now()); n != 0 {
		t.Fatalf("the lost node was dialled %d times after the other node named it", n)
	}
	cycle(t, b, 10)
	if got := other.acquires(); got != 10 {
		t.Fatalf("the new active got %d ACQUIREs, want 10", got)
	}
}

// TestPair_OtherRolesUnchanged: against a standalone node (role 1) or a
// cluster leader (role 3) the pair rule does not apply: every node is
// contacted, and when the serving node is lost the others are redialled
// at once (their backoff and the settle delay are an hour here).
func TestPair_OtherRolesUnchanged(t *testing.T) {
	for _, role := range []uint8{wire.RoleStandalone, wire.RoleLeader} {
		t.Run(fmt.Sprintf("role %d", role), func(t *testing.T) {
			a := newPairNode(t, "127.0.0.1:0", role, true, "")
			other := newPairNode(t, "127.0.0.1:0", role, false, a.Addr)
			d := &dialLog{}
			cfg := pairConfig(d, time.Hour, a.Addr, other.Addr)
			cfg.BackoffMin, cfg.BackoffMax = time.Hour, time.Hour
			b := newBroker(t, cfg)
			eventually(t, "the other node contacted", func() bool { return other.hellos.Load() >= 1 })
			cycle(t, b, 10)
			other.serving.Store(true)
			a.Close()
			eventually(t, "an ACQUIRE granted by the other node", func() bool {
				tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
				return err == nil && tk.Release(t.Context()) == nil
			})
			cycle(t, b, 10)
			if got, want := other.acquires(), 11; got != want {
				t.Fatalf("the other node got %d ACQUIREs, want %d", got, want)
			}
		})
	}
}

// TestConfig_PairSettle: PairSettle defaults to 2 s; a negative one is
// refused by New before anything is sent; ParseURL's pair_settle sets it.
func TestConfig_PairSettle(t *testing.T) {
	if broker.DefaultPairSettle != 2*s {
		t.Fatalf("DefaultPairSettle %v, want 2s", broker.DefaultPairSettle)
	}
	f := newFake(t)
	cfg := testConfig(f.Addr)
	cfg.PairSettle = -time.Millisecond
	b, err := broker.New(cfg)
	mustIs(t, err, broker.ErrInvalidConfig)
	if b != nil || f.TCPAccepted() != 0 {
		t.Fatalf("New with a negative PairSettle: broker %v, %d connections", b, f.TCPAccepted())
	}
	for _, c := range []struct {
		in   string
		want time.Duration
		bad  bool
	}{
		{in: "ticketing://a,b?pair_settle=3s", want: 3 * s},
		{in: "ticketing://a,b?pair_settle=1500ms", want: 1500 * time.Millisecond},
		{in: "ticketing://a,b", want: 0},
		{in: "ticketing://a,b?pair_settle=-1s", bad: true},
		{in: "ticketing://a,b?pair_settle=soon", bad: true},
	} {
		cfg, err := broker.ParseURL(c.in)
		if c.bad {
			mustIs(t, err, broker.ErrInvalidConfig)
			continue
		}
		if err != nil || cfg.PairSettle != c.want {
			t.Fatalf("%s: PairSettle %v, err %v; want %v", c.in, cfg.PairSettle, err, c.want)
		}
	}
}

// pauseLog records the pauses a broker's sessions choose before
// reopening (see broker.OnPause): the decisions, which no stall of the
// machine changes, where the time a take-over took would depend on it.
type pauseLog struct {
	mu sync.Mutex
	p  []broker.Pause
}

func recordPauses(b *broker.Broker) *pauseLog {
	l := &pauseLog{}
	broker.OnPause(b, func(p broker.Pause) {
		l.mu.Lock()
		l.p = append(l.p, p)
		l.mu.Unlock()
	})
	return l
}

// since returns the pauses from the n-th on.
func (l *pauseLog) since(n int) []broker.Pause {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]broker.Pause(nil), l.p[n:]...)
}

// count is the number of pauses so far.
func (l *pauseLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.p)
}

// failedOpens returns the pauses of addr's sessions after failed opens
// (not after drops), from the n-th pause on.
func (l *pauseLog) failedOpens(n int, addr string) []broker.Pause {
	var out []broker.Pause
	for _, p := range l.since(n) {
		if p.Addr == addr && !p.Dropped {
			out = append(out, p)
		}
	}
	return out
}

// TestPair_PassiveRetriedAtPairPace: the active is lost without a hint
// (its address refuses connections: the client link to it is cut) while
// its peer link still held, so the passive answers M naming it until it
// notices that its peer is silent, and takes over at the third HELLO. The
// broker comes to the passive after the settle delay and retries it at the
// pair's pace (a quarter of PairSettle), not with its usual backoff (an
// hour here, which would leave the passive one HELLO per settle delay,
// alternating with the lost active). Checked on the pauses the broker
// chose, not on how long the take-over took (a stalled machine stretches
// that): every pause in pair mode, of the passive's session and of the
// lost active's, is at most the pace; and the passive does take over.
func TestPair_PassiveRetriedAtPairPace(t *testing.T) {
	const settle = 400 * time.Millisecond
	const pace = settle / 4
	a := newPairNode(t, "127.0.0.1:0", wire.RoleActive, true, "")
	other := newPairNode(t, "127.0.0.1:0", wire.RoleActive, false, a.Addr)
	other.serveAt.Store(3)
	d := &dialLog{}
	cfg := pairConfig(d, settle, a.Addr, other.Addr)
	cfg.BackoffMin, cfg.BackoffMax = time.Hour, time.Hour
	b := newBroker(t, cfg)
	cycle(t, b, 10)
	if n := other.hellos.Load(); n != 0 {
		t.Fatalf("the passive got %d HELLOs while the active served", n)
	}
	pauses := recordPauses(b)
	// A pause of the backoff (an hour) would stall the broker: stop
	// waiting as soon as one is chosen, and say so.
	tooLong := func() (broker.Pause, bool) {
		for _, p := range pauses.since(0) {
			if p.InPair && p.D > pace {
				return p, true
			}
		}
		return broker.Pause{}, false
	}
	a.Close()
	eventually(t, "the passive's take-over", func() bool {
		_, bad := tooLong()
		return other.serving.Load() || bad
	})
	if p, bad := tooLong(); bad {
		t.Fatalf("a session to %s paused %v (attempt %d) in pair mode, want at most the pair's pace %v", p.Addr, p.D, p.Attempt, pace)
	}
	if n := len(pauses.failedOpens(0, other.Addr)); n < 2 {
		t.Fatalf("%d pauses of the passive's session after failed opens, want 2 or more (two HELLOs answered M)", n)
	}
	if err := b.WaitReady(within(t, 20*s)); err != nil {
		t.Fatal(err)
	}
	cycle(t, b, 10)
	if got := other.acquires(); got != 10 {
		t.Fatalf("the new active got %d ACQUIREs, want 10", got)
	}
	if got := other.hellos.Load(); got != 3 {
		t.Fatalf("the passive got %d HELLOs, want 3 (two answered M, the third took over)", got)
	}
}

// TestPair_BackoffResetWhenPairSwings: a session's backoff restarts when
// the pair swings to its node. In a first outage the broker retries the
// passive (which never takes over) until its session's backoff has grown;
// the active comes back and serves. In a second outage, the passive takes
// over at its third HELLO: the first pause of its session after the pair
// swung to it comes from the shortest backoff (attempt 0, at most
// BackoffMin), not from the backoff the first outage left. Checked on the
// pauses the broker chose, not on how long the take-over took (a stalled
// machine stretches that); the passive does take over.
func TestPair_BackoffResetWhenPairSwings(t *testing.T) {
	const settle = 400 * time.Millisecond // pace: 50..100 ms
	const backoffMin = 5 * time.Millisecond
	addr := freeAddr(t)
	a := newPairNode(t, addr, wire.RoleActive, true, "")
	other := newPairNode(t, "127.0.0.1:0", wire.RoleActive, false, addr)
	d := &dialLog{}
	cfg := pairConfig(d, settle, a.Addr, other.Addr)
	cfg.BackoffMin, cfg.BackoffMax = backoffMin, time.Hour
	b := newBroker(t, cfg)
	pauses := recordPauses(b)
	cycle(t, b, 10)

	// First outage: the passive answers M every time, until its session's
	// backoff has grown (attempt 3 or more).
	a.Close()
	eventually(t, "the passive's backoff grown", func() bool {
		for _, p := range pauses.failedOpens(0, other.Addr) {
			if p.Attempt >= 3 {
				return true
			}
		}
		return false
	})
	a = newPairNode(t, addr, wire.RoleActive, true, "")
	if err := b.WaitReady(within(t, 20*s)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "grants from the active back", func() bool {
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		return err == nil && tk.Release(t.Context()) == nil
	})
	cycle(t, b, 10)

	// Second outage: the passive takes over at its third HELLO from now.
	other.serveAt.Store(other.hellos.Load() + 3)
	n := pauses.count()
	a.Close()
	eventually(t, "the passive's take-over", func() bool { return other.serving.Load() })
	if err := b.WaitReady(within(t, 20*s)); err != nil {
		t.Fatal(err)
	}
	cycle(t, b, 10)
	if got := other.acquires(); got != 10 {
		t.Fatalf("the new active got %d ACQUIREs, want 10", got)
	}
	swings := 0
	for _, p := range pauses.failedOpens(n, other.Addr) {
		if !p.Swung {
			continue
		}
		swings++
		if p.Attempt != 0 || p.D > backoffMin {
			t.Fatalf("the first pause of the passive's session after the pair swung to it: %v at attempt %d, want attempt 0 and at most BackoffMin %v", p.D, p.Attempt, backoffMin)
		}
	}
	if swings == 0 {
		t.Fatalf("no failed open of the passive after the pair swung to it: %+v", pauses.since(n))
	}
}
