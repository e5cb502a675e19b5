package broker_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/server"
)

// cluster is three in-process servers, one serving (leader), the other two
// standbys whose M hint names it (what every replicated mode promises, docs/server.md).
type cluster struct{ nodes [3]*realServer }

func newCluster(t *testing.T) *cluster {
	t.Helper()
	var c cluster
	for i, name := range []string{"n0", "n1", "n2"} {
		c.nodes[i] = startServer(t, server.Config{NodeName: name}, "127.0.0.1:0")
	}
	c.leadLate(t, 1)
	return &c
}

// lead makes node i the serving one: i serves first, then the others stop
// serving (their sessions get M with node i's address), as when a new
// leader is elected while the old one has not yet noticed. (leadLate is
// the other order.)
func (c *cluster) lead(t *testing.T, i int) {
	t.Helper()
	if err := c.nodes[i].SetRole(server.RoleLeader, ""); err != nil {
		t.Fatal(err)
	}
	for j, n := range c.nodes {
		if j != i {
			if err := n.SetRole(server.RoleStandby, c.nodes[i].Addr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// leadLate makes node i the serving one, the others stopping first: for a
// moment no node serves, and a hint names a node that does not serve yet.
func (c *cluster) leadLate(t *testing.T, i int) {
	t.Helper()
	for j, n := range c.nodes {
		if j != i {
			if err := n.SetRole(server.RoleStandby, c.nodes[i].Addr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.nodes[i].SetRole(server.RoleLeader, ""); err != nil {
		t.Fatal(err)
	}
}

func (c *cluster) addrs() []string {
	return []string{c.nodes[0].Addr, c.nodes[1].Addr, c.nodes[2].Addr}
}

// grants returns each node's Stats().Grants.
func (c *cluster) grants() [3]uint64 {
	var g [3]uint64
	for i, n := range c.nodes {
		g[i] = n.Stats().Grants
	}
	return g
}

// addrDialer counts dials per address.
type addrDialer struct {
	mu    sync.Mutex
	dials map[string]int
}

func (d *addrDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	if d.dials == nil {
		d.dials = map[string]int{}
	}
	d.dials[addr]++
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

func (d *addrDialer) count(addr string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dials[addr]
}

func cycle(t *testing.T, b *broker.Broker, n int) {
	t.Helper()
	for range n {
		tk, err := b.Acquire(t.Context(), "k", broker.AcquireOptions{Lease: 30 * s})
		if err != nil {
			t.Fatal(err)
		}
		if err := tk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCluster_SessionsOnlyToServing: given the three addresses, the broker
// keeps one session per node (attempt), is ready only through the serving
// node, and sends every ACQUIRE and RELEASE to it.
func TestCluster_SessionsOnlyToServing(t *testing.T) {
	c := newCluster(t)
	b := newBroker(t, testConfig(c.addrs()...))
	if n := b.ReadySessions(); n != 1 {
		t.Fatalf("ready sessions %d, want 1 (the leader's)", n)
	}
	cycle(t, b, 50)
	if g := c.grants(); g != [3]uint64{0, 50, 0} {
		t.Fatalf("grants per node %v, want [0 50 0]", g)
	}
	if st := c.nodes[1].Stats(); st.Released != 50 || st.Sessions != 1 {
		t.Fatalf("leader: released %d sessions %d, want 50 and 1", st.Released, st.Sessions)
	}
	for _, i := range []int{0, 2} {
		if st := c.nodes[i].Stats(); st.Sessions != 0 || st.Released != 0 {
			t.Fatalf("standby %d: %+v", i, st)
		}
	}
}

// TestCluster_LeaderChange: the leader hands over to another node. An
// ACQUIRE waiting on the old leader is Indeterminate; the broker is ready
// again on the new leader without caller action, well before its backoff
// (BackoffMin = BackoffMax = an hour here, so only following the M hint
// can make it in time, and a stalled machine cannot); WaitReady returns
// only once the new session is up; no request goes to a node answering M.
func TestCluster_LeaderChange(t *testing.T) {
	c := newCluster(t)
	cfg := testConfig(c.addrs()...)
	cfg.BackoffMin, cfg.BackoffMax = time.Hour, time.Hour
	b := newBroker(t, cfg)
	cycle(t, b, 5)

	held, err := b.Acquire(t.Context(), "h", broker.AcquireOptions{Lease: 30 * s})
	if err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, err := b.Acquire(t.Context(), "h", broker.AcquireOptions{Lease: 30 * s, Wait: 30 * s})
		waitErr <- err
	}()
	for c.nodes[1].Stats().Waiters == 0 { // queued on the old leader
		time.Sleep(time.Millisecond)
	}

	switched := time.Now()
	c.lead(t, 2)
	check(t, <-waitErr, "ErrIndeterminate")

	// No session to the old leader is ready now (its conn read the M);
	// WaitReady waits for the new leader's.
	if err := b.WaitReady(within(t, 30*s)); err != nil {
		t.Fatalf("not ready on the new leader within 30 s (backoff an hour): %v", err)
	}
	t.Logf("ready on the new leader %v after the switch", time.Since(switched).Round(time.Microsecond))
	if n := b.ReadySessions(); n != 1 || c.nodes[2].Stats().Sessions != 1 {
		t.Fatalf("after WaitReady: ready %d, new leader's sessions %d, want 1 and 1", n, c.nodes[2].Stats().Sessions)
	}
	before := c.grants()
	cycle(t, b, 20)
	after := c.grants()
	if after[0] != before[0] || after[1] != before[1] || after[2] != before[2]+20 {
		t.Fatalf("grants per node before %v after %v: want only node 2 to grant", before, after)
	}
	// The ticket of the old leader: its RELEASE goes to the new leader
	// (these in-process nodes do not replicate, so it is not held there).
	check(t, held.Release(t.Context()), "ErrNotHeld")
	// The old leader closed its session (its count drops once its
	// goroutines are done) and accepts no other.
	for deadline := time.Now().Add(20 * s); c.nodes[1].Stats().Sessions != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("old leader still has %d sessions", c.nodes[1].Stats().Sessions)
		}
	}
}

// TestCluster_HintNotListed: a standby whose hint names a serving node
// missing from Addrs. The broker does not follow it (it talks only to the
// nodes it was given), never becomes ready through it, and redials the
// standby only at its backoff, not in a loop.
func TestCluster_HintNotListed(t *testing.T) {
	outside := startServer(t, server.Config{NodeName: "outside"}, "127.0.0.1:0")
	standby := startServer(t, server.Config{NodeName: "sb", Standby: true, StandbyHint: outside.Addr}, "127.0.0.1:0")
	other := startServer(t, server.Config{NodeName: "sb2", Standby: true, StandbyHint: standby.Addr}, "127.0.0.1:0")
	d := &addrDialer{}
	cfg := testConfig(standby.Addr, other.Addr)
	cfg.Dialer = d.Dial
	cfg.BackoffMin, cfg.BackoffMax = 20*time.Millisecond, 40*time.Millisecond
	start := time.Now()
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	err = b.WaitReady(within(t, 500*time.Millisecond))
	if !errors.Is(err, broker.ErrNotReady) || !errors.Is(err, broker.ErrNotActive) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReady: %v, want ErrNotReady", err)
	}
	if st := outside.Stats(); st.Sessions != 0 || d.count(outside.Addr) != 0 {
		t.Fatalf("the unlisted hinted node was dialled: %d dials, %d sessions", d.count(outside.Addr), st.Sessions)
	}
	for _, a := range []string{standby.Addr, other.Addr} {
		eventually(t, "a dial to "+a, func() bool { return d.count(a) > 0 })
	}
	// A backoff of 10..40 ms: at most one attempt per 10 ms per address,
	// plus at most as many cut short by the other's hint, counted over the
	// time until the counts were read (however long a stall made it). A
	// loop without backoff would make thousands in 500 ms.
	n1, n2 := d.count(standby.Addr), d.count(other.Addr)
	elapsed := time.Since(start)
	limit := 2 * (2 + int(elapsed/(10*time.Millisecond)))
	t.Logf("dials in %v: %d and %d (limit %d)", elapsed.Round(time.Millisecond), n1, n2, limit)
	for i, n := range []int{n1, n2} {
		if n > limit {
			t.Fatalf("%d dials to %s in %v, want at most %d", n, []string{standby.Addr, other.Addr}[i], elapsed, limit)
		}
	}
}

// TestCluster_HintsNoSpin: two standbys whose hints name each other (a
// misconfiguration, or a moment of an election). Following hints must
// not make their sessions redial each other without backoff: an attempt
// made on a hint does not pass its own hint on.
func TestCluster_HintsNoSpin(t *testing.T) {
	a := startServer(t, server.Config{NodeName: "a", Standby: true}, "127.0.0.1:0")
	bn := startServer(t, server.Config{NodeName: "b", Standby: true, StandbyHint: a.Addr}, "127.0.0.1:0")
	if err := a.SetRole(server.RoleStandby, bn.Addr); err != nil {
		t.Fatal(err)
	}
	d := &addrDialer{}
	cfg := testConfig(a.Addr, bn.Addr)
	cfg.Dialer = d.Dial
	cfg.BackoffMin, cfg.BackoffMax = 50*time.Millisecond, 50*time.Millisecond
	start := time.Now()
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mustIs(t, b.WaitReady(within(t, 500*time.Millisecond)), broker.ErrNotReady)
	for _, addr := range []string{a.Addr, bn.Addr} {
		eventually(t, "a dial to "+addr, func() bool { return d.count(addr) > 0 })
	}
	// A backoff of 25..50 ms: at most one attempt of its own per 25 ms per
	// address, plus at most as many cut short by the other's hint, counted
	// over the time until the counts were read (however long a stall made
	// it); without backoff, hundreds in 500 ms.
	na, nb := d.count(a.Addr), d.count(bn.Addr)
	elapsed := time.Since(start)
	limit := 2 * (2 + int(elapsed/(25*time.Millisecond)))
	t.Logf("dials in %v: %d and %d (limit %d)", elapsed.Round(time.Millisecond), na, nb, limit)
	for i, n := range []int{na, nb} {
		if n > limit {
			t.Fatalf("%d dials to %s in %v, want at most %d", n, []string{a.Addr, bn.Addr}[i], elapsed, limit)
		}
	}
}

// TestCluster_LeaderChangeHintAhead: the old leader stops serving, and
// names the new one, before the new one serves. The session sent there by
// the hint finds it not serving yet, retries from the shortest backoff,
// and the broker is ready on it without caller action.
func TestCluster_LeaderChangeHintAhead(t *testing.T) {
	c := newCluster(t)
	d := &addrDialer{}
	cfg := testConfig(c.addrs()...)
	cfg.Dialer = d.Dial
	// Growing to an hour: only the restart from the shortest backoff can
	// make it ready within the generous deadline below.
	cfg.BackoffMin, cfg.BackoffMax = 100*time.Millisecond, time.Hour
	b := newBroker(t, cfg)
	cycle(t, b, 5)
	n2 := d.count(c.nodes[2].Addr)
	switched := time.Now()
	for _, i := range []int{1, 0} {
		if err := c.nodes[i].SetRole(server.RoleStandby, c.nodes[2].Addr); err != nil {
			t.Fatal(err)
		}
	}
	for d.count(c.nodes[2].Addr) == n2 { // the hinted node, dialled while still a standby
		time.Sleep(time.Millisecond)
	}
	mustIs(t, b.WaitReady(within(t, 50*time.Millisecond)), broker.ErrNotReady)
	if err := c.nodes[2].SetRole(server.RoleLeader, ""); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitReady(within(t, 30*s)); err != nil {
		t.Fatalf("not ready on the new leader within 30 s: %v", err)
	}
	t.Logf("ready on the new leader %v after the switch", time.Since(switched).Round(time.Millisecond))
	before := c.grants()
	cycle(t, b, 10)
	if after := c.grants(); after[2] != before[2]+10 || after[0] != before[0] || after[1] != before[1] {
		t.Fatalf("grants per node before %v after %v", before, after)
	}
}

// TestCluster_ServingNodeLost: the serving node vanishes without an M (a
// kill -9: its sessions just drop) while the sessions to the other nodes
// sit in a long backoff (they were answered M). The broker makes them try
// again at once, so it is ready on the new leader without waiting out that
// backoff (an hour here, so at least 30 minutes with jitter).
func TestCluster_ServingNodeLost(t *testing.T) {
	c := newCluster(t) // node 1 serves
	cfg := testConfig(c.addrs()...)
	cfg.BackoffMin, cfg.BackoffMax = time.Hour, time.Hour
	b := newBroker(t, cfg)
	cycle(t, b, 5)
	// Node 2 is elected; node 1 has not noticed yet, and then dies.
	if err := c.nodes[2].SetRole(server.RoleLeader, ""); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes[0].SetRole(server.RoleStandby, c.nodes[2].Addr); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	c.nodes[1].Close()
	for c.nodes[2].Stats().Sessions == 0 {
		if time.Since(lost) > 30*s {
			t.Fatal("no session to the new leader within 30 s of losing the serving node (backoff an hour)")
		}
		time.Sleep(time.Millisecond)
	}
	if err := b.WaitReady(within(t, 30*s)); err != nil {
		t.Fatal(err)
	}
	t.Logf("ready on the new leader %v after the serving node was lost", time.Since(lost).Round(time.Microsecond))
	before := c.grants()
	cycle(t, b, 10)
	if after := c.grants(); after[2] != before[2]+10 {
		t.Fatalf("grants per node before %v after %v: want node 2 to grant", before, after)
	}
}
