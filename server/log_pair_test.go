package server_test

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/integration/faultproxy"
	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// pairHB is the tests' heartbeat interval: the peer is dead after 2.
const pairHB = 100 * time.Millisecond

// pairNode is one node of a pair started in this process.
type pairNode struct {
	t      *testing.T
	s      *server.Server
	addr   string // client address
	peer   string // its peer address
	cfg    server.Config
	clk    *server.FakeClock // nil: the real clock
	done   chan error
	closed bool
}

// pairAddrs returns two free peer addresses on 127.0.0.1.
func pairAddrs(t *testing.T) (primary, backup string) { return pairAddrsTB(t) }

func pairAddrsTB(t testing.TB) (primary, backup string) {
	t.Helper()
	p, err := proctest.FreePortRun("127.0.0.1", 2)
	if err != nil {
		t.Fatal(err)
	}
	return "127.0.0.1:" + strconv.Itoa(p), "127.0.0.1:" + strconv.Itoa(p+1)
}

// startPairNode starts a pair node of role whose peer link listens on
// self and dials peer; dataDir "" is a new one.
func startPairNode(t *testing.T, role server.PairRole, self, peer, dataDir string) *pairNode {
	t.Helper()
	return startPairNodeOn(t, role, self, peer, dataDir, listen(t))
}

// restart starts n again on its data dir and addresses (after close).
func (n *pairNode) restart() *pairNode {
	n.t.Helper()
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if ln, err = net.Listen("tcp", n.addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		n.t.Fatal(err)
	}
	return startPairNodeClock(n.t, n.cfg.Pair.Role, n.peer, n.cfg.Pair.Peer, n.cfg.DataDir, ln, n.clk)
}

// startPairNodeOn is startPairNode serving clients on ln.
func startPairNodeOn(t *testing.T, role server.PairRole, self, peer, dataDir string, ln net.Listener) *pairNode {
	t.Helper()
	return startPairNodeClock(t, role, self, peer, dataDir, ln, nil)
}

// fakeHB is the heartbeat interval of pair nodes on a fake clock: no
// heartbeat is sent by the interval's ticker while a test runs (only those
// of each link's start and of each transition), and the peer counts as
// silent, a starting primary's guard ends, only when the test advances
// the clock past two intervals. So no machine is too slow for them.
const fakeHB = time.Hour

// startPairNodeFake starts a pair node on clk (heartbeat fakeHB).
func startPairNodeFake(t *testing.T, role server.PairRole, self, peer string, clk *server.FakeClock) *pairNode {
	t.Helper()
	return startPairNodeClock(t, role, self, peer, "", listen(t), clk)
}

// startPairNodeClock is startPairNodeOn on clk (nil: the real clock, with
// heartbeat pairHB; else fakeHB).
func startPairNodeClock(t *testing.T, role server.PairRole, self, peer, dataDir string, ln net.Listener, clk *server.FakeClock) *pairNode {
	t.Helper()
	return startPairNodeLog(t, role, self, peer, dataDir, ln, clk, nil)
}

// startPairNodeLog is startPairNodeClock logging to lg (nil: discarded).
func startPairNodeLog(t *testing.T, role server.PairRole, self, peer, dataDir string, ln net.Listener, clk *server.FakeClock, lg *slog.Logger) *pairNode {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	cfg := server.Config{DataDir: dataDir, Pair: &server.PairConfig{Role: role, Peer: peer, Listen: self,
		Advertise: ln.Addr().String(), Heartbeat: pairHB}, Logger: lg}
	if clk != nil {
		cfg.Pair.Heartbeat = fakeHB
		server.SetClock(&cfg, clk)
	}
	s, err := server.New(cfg)
	if err != nil {
		ln.Close()
		t.Fatalf("New(%s): %v", role, err)
	}
	n := &pairNode{t: t, s: s, addr: ln.Addr().String(), peer: self, cfg: cfg, clk: clk, done: make(chan error, 1)}
	go func() { n.done <- s.Serve(ln) }()
	t.Cleanup(n.close)
	return n
}

// close stops the node (as a crash would, for its peer: the link drops).
func (n *pairNode) close() {
	if n.closed {
		return
	}
	n.closed = true
	n.s.Close()
	if err := <-n.done; !errors.Is(err, server.ErrServerClosed) {
		n.t.Errorf("Serve returned %v, want ErrServerClosed", err)
	}
}

func (n *pairNode) status() server.PairStatus {
	st, ok := n.s.PairStatus()
	if !ok {
		n.t.Fatal("PairStatus: not a pair node")
	}
	return st
}

// hello dials n and sends HELLO; it returns the reply (HELLO_OK or M).
func (n *pairNode) hello() (*client, wire.Response) {
	n.t.Helper()
	c := dial(n.t, n.addr)
	c.send(helloReq(1, ""))
	return c, c.recv()
}

// serving waits until a HELLO to n is answered HELLO_OK with role 2 (a
// client asking again and again, as one that lost the other node would).
func (n *pairNode) serving() *client {
	n.t.Helper()
	var c *client
	eventually(n.t, n.peer+" serving", func() bool {
		var r wire.Response
		c, r = n.hello()
		if r.Type == wire.TypeHelloOK {
			if r.Role != wire.RoleActive {
				n.t.Fatalf("HELLO_OK role %d, want %d (active of a pair)", r.Role, wire.RoleActive)
			}
			return true
		}
		c.nc.Close()
		return false
	})
	return c
}

// TestPairFailover: a primary serves (role 2) and replicates to its
// passive backup, which refuses clients with M naming the primary; when
// the primary dies, the first client after two heartbeats makes the
// backup active with the held locks (holder, token) and tokens above
// every token the primary issued.
//
// On a fake clock (fakeHB): the primary goes silent for the backup only
// when the test advances the clock, never because a heartbeat was late.
func TestPairFailover(t *testing.T) {
	clk := server.NewFakeClock()
	pa, ba := pairAddrs(t)
	p := startPairNodeFake(t, server.PairPrimary, pa, ba, clk)
	b := startPairNodeFake(t, server.PairBackup, ba, pa, clk)

	cp := p.serving()
	t1 := cp.acquireOK(2, owner(1), 0, 60, "a")
	if t1 != 1 {
		t.Fatalf("a new pair's first token %d, want 1", t1)
	}
	eventually(t, "the backup in sync", func() bool {
		st := b.status()
		return st.State == "PASSIVE" && st.HasState && p.status().Replicating
	})
	t2 := cp.acquireOK(3, owner(2), 0, 60, "b")
	if ps := p.status(); ps.State != "ACTIVE" || ps.Epoch != 0 || !ps.Replicating {
		t.Fatalf("primary %+v: want ACTIVE, epoch 0, replicating", ps)
	}
	// The passive refuses clients and names the active.
	c, r := b.hello()
	if r.Type != wire.TypeNotActive || string(r.Hint) != p.addr {
		t.Fatalf("HELLO to the passive: %s, want M with hint %s", show(r), p.addr)
	}
	c.expectClosed()
	if st := b.status(); st.LastToken != t2 || st.HeldLocks != 2 {
		t.Fatalf("passive %+v: want last token %d and 2 held locks (the replicated grant)", st, t2)
	}

	p.close()
	clk.Advance(2*fakeHB + time.Second)
	cb := b.serving()
	// The held locks survived, with their tokens.
	cb.send(acq(2, owner(3), 0, 60, "a"))
	cb.expect(wire.TypeTimedOut, 2)
	if tok := cb.acquireOK(3, owner(1), 0, 60, "a"); tok != t1 {
		t.Fatalf("the holder's retry on the new active: token %d, want %d", tok, t1)
	}
	t3 := cb.acquireOK(4, owner(4), 0, 60, "c")
	if t3 <= t2 || t3>>40 != 1 {
		t.Fatalf("the backup's first token %d (epoch %d), want above %d in epoch 1", t3, t3>>40, t2)
	}
	cb.send(rel(5, t2, "b"))
	cb.expect(wire.TypeReleased, 5)
	if st := b.status(); st.Epoch != 1 || st.State != "ACTIVE" {
		t.Fatalf("backup after the failover %+v", st)
	}
}

// linkProxies puts a fault proxy on each direction of a pair's peer link:
// the primary dials toB, the backup toP.
func linkProxies(t *testing.T, pa, ba string) (toP, toB *faultproxy.Proxy) {
	t.Helper()
	var err error
	if toP, err = faultproxy.New(pa); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { toP.Close() })
	if toB, err = faultproxy.New(ba); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { toB.Close() })
	return toP, toB
}

// cutLink blackholes (on) or restores (off) every connection of the
// proxies, present and future.
func cutLink(on bool, ps ...*faultproxy.Proxy) {
	for _, p := range ps {
		p.SetDefault(faultproxy.Faults{Blackhole: on})
		for _, c := range p.Conns() {
			c.Blackhole(on)
		}
	}
}

// refuseLink cuts (on) the proxies' connections with a reset and refuses
// new ones, or (off) forwards new ones again: a cut that each node sees
// at once, without a timer (the nodes' dials are retried on the real
// clock, at most every 250 ms, and fail while it lasts).
func refuseLink(on bool, ps ...*faultproxy.Proxy) {
	for _, p := range ps {
		p.SetDefault(faultproxy.Faults{Refuse: on})
		if on {
			for _, c := range p.Conns() {
				c.Reset()
			}
		}
	}
}

// TestPairSplitBrain: the peer link is cut while a client still reaches
// the primary. The backup does not serve until a client comes to it after
// the primary went silent for it; then both serve (a split brain), and
// every token the backup issues is above every token the primary can
// issue (disjoint epochs, the newer above), so no token is issued twice
// and a fence that has seen the backup's token rejects the primary's.
// When the link heals, the primary (lower epoch) steps down: its session
// gets M naming the backup, and it resyncs from the backup.
//
// The nodes run on a fake clock (fakeHB): the primary goes silent for the
// backup only when the test advances the clock, so neither the backup's
// staying passive before the cut, nor its takeover after it, depends on
// how fast the machine delivers heartbeats. The cut resets the link and
// refuses it (the primary stops replicating as its link drops; silence
// with the link up is the tick's business, on the real clock, and
// TestPairSplitBrainNewActiveDies' blackhole's).
func TestPairSplitBrain(t *testing.T) {
	clk := server.NewFakeClock()
	pa, ba := pairAddrs(t)
	toP, toB := linkProxies(t, pa, ba)
	p := startPairNodeClock(t, server.PairPrimary, pa, toB.Addr(), "", listen(t), clk)
	b := startPairNodeClock(t, server.PairBackup, ba, toP.Addr(), "", listen(t), clk)
	cp := p.serving()
	cp.acquireOK(2, owner(1), 0, 60, "held")
	eventually(t, "the backup in sync", func() bool { return b.status().HasState && p.status().Replicating })
	// No client comes to the backup while the link is up: it stays
	// passive, naming the primary, however long the clock runs.
	clk.Advance(5 * fakeHB)
	if st := b.status(); st.State != "PASSIVE" || st.Serving {
		t.Fatalf("backup with the link up and no client: %+v, want PASSIVE", st)
	}

	refuseLink(true, toP, toB)
	// The primary keeps serving its client, alone.
	eventually(t, "the primary unreplicated", func() bool { return !p.status().Replicating })
	before := cp.acquireOK(3, owner(2), 0, 60, "k1")
	// No client came to the backup: it stays passive, however long the
	// link is cut.
	clk.Advance(5 * fakeHB)
	if st := b.status(); st.State != "PASSIVE" || st.Serving || st.PeerAlive {
		t.Fatalf("backup with a cut link and no client: %+v, want PASSIVE, the primary silent", st)
	}

	// A client that lost the primary comes to the backup: split brain.
	cb := b.serving()
	onB := cb.acquireOK(2, owner(3), 0, 60, "k2")
	onP := cp.acquireOK(4, owner(4), 0, 60, "k3")
	if onB <= onP || onB <= before {
		t.Fatalf("split brain: the backup's token %d is not above the primary's %d and %d", onB, onP, before)
	}
	if onP>>40 != 0 || onB>>40 != 1 {
		t.Fatalf("epochs: primary's token %d in epoch %d, backup's %d in epoch %d; want 0 and 1", onP, onP>>40, onB, onB>>40)
	}
	// The same key on both sides: each grants it (the split brain), with
	// tokens that the fence orders.
	kp := cp.acquireOK(5, owner(5), 0, 60, "same")
	kb := cb.acquireOK(3, owner(6), 0, 60, "same")
	if kb <= kp {
		t.Fatalf("same key: backup's token %d not above the primary's %d", kb, kp)
	}

	refuseLink(false, toP, toB)
	// The primary, with the lower epoch, steps down: its session gets M
	// with the backup's address.
	r := cp.recv()
	if r.Type != wire.TypeNotActive || string(r.Hint) != b.addr {
		t.Fatalf("primary's session after the heal: %s, want M with hint %s", show(r), b.addr)
	}
	eventually(t, "the primary resynced from the backup", func() bool {
		ps, bs := p.status(), b.status()
		return ps.State == "PASSIVE" && ps.HasState && bs.State == "ACTIVE" && bs.Replicating
	})
	if ps, bs := p.status(), b.status(); ps.DualActives == 0 || ps.HeldLocks != bs.HeldLocks || ps.LastToken != bs.LastToken {
		t.Fatalf("after the heal: primary %+v, backup %+v", ps, bs)
	}
	// The backup's state wins: its grant of "same" holds, the primary's is gone.
	cb.send(rel(4, kp, "same"))
	cb.expect(wire.TypeNotHeld, 4)
	cb.send(rel(5, kb, "same"))
	cb.expect(wire.TypeReleased, 5)
}

// refusesFor checks that every HELLO to n for d is answered M (the node
// does not serve), with hint if hint is not "".
func (n *pairNode) refusesFor(d time.Duration, hint string) {
	n.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(pairHB / 4) {
		c, r := n.hello()
		if r.Type != wire.TypeNotActive || hint != "" && string(r.Hint) != hint {
			n.t.Fatalf("HELLO to %s (%+v): %s, want M (hint %q)", n.peer, n.status(), show(r), hint)
		}
		c.nc.Close()
	}
}

// TestPairRestarts: restarts in every order. The old primary comes back
// passive behind the backup that took over, never serving meanwhile (the
// start guard), and resyncs; both at once, and the backup first, then
// the primary: the pair serves again with tokens above every earlier
// one (the epochs are durable); a backup alone never serves.
//
// The nodes run on a fake clock: a HELLO to a restarting primary, or to
// a passive, makes it serve once its peer has been silent for two
// heartbeats, which on a real clock a loaded machine can make happen
// whenever a heartbeat is late; here only the test's Advance does.
func TestPairRestarts(t *testing.T) {
	clk := server.NewFakeClock()
	pa, ba := pairAddrs(t)
	p := startPairNodeFake(t, server.PairPrimary, pa, ba, clk)
	b := startPairNodeFake(t, server.PairBackup, ba, pa, clk)
	cp := p.serving()
	t1 := cp.acquireOK(2, owner(1), 0, 200, "a")
	eventually(t, "the backup in sync", func() bool { return b.status().HasState })

	// The primary dies; the backup takes over once the primary has been
	// silent for two heartbeats.
	p.close()
	clk.Advance(2*fakeHB + time.Second)
	cb := b.serving()
	t2 := cb.acquireOK(2, owner(2), 0, 200, "b")

	// The old primary comes back: passive, never serving, in sync.
	p = p.restart()
	p.refusesFor(4*pairHB, "")
	eventually(t, "the old primary passive and in sync", func() bool {
		ps := p.status()
		return ps.State == "PASSIVE" && ps.HasState && ps.HeldLocks == 2 && b.status().Replicating
	})
	p.refusesFor(2*pairHB, b.addr)
	if tok := cb.acquireOK(3, owner(1), 0, 200, "a"); tok != t1 {
		t.Fatalf("the first holder's retry on the backup: %d, want %d", tok, t1)
	}

	// Both at once.
	p.close()
	b.close()
	p, b = p.restart(), b.restart()
	cp = p.serving()
	t3 := cp.acquireOK(2, owner(3), 0, 200, "c")
	if t3 <= t2 {
		t.Fatalf("after restarting both: token %d, want above %d", t3, t2)
	}
	eventually(t, "the backup passive", func() bool { return b.status().State == "PASSIVE" })

	// The backup first: alone, it never serves, however long it waits;
	// then the primary.
	p.close()
	b.close()
	b = b.restart()
	b.refusesFor(2*pairHB, "")
	clk.Advance(5 * fakeHB)
	b.refusesFor(2*pairHB, "")
	if st := b.status(); st.State != "BACKUP" {
		t.Fatalf("a backup alone: %+v, want BACKUP", st)
	}
	p = p.restart()
	cp = p.serving()
	if t4 := cp.acquireOK(2, owner(4), 0, 200, "d"); t4 <= t3 {
		t.Fatalf("after the backup first, then the primary: token %d, want above %d", t4, t3)
	}
	eventually(t, "the backup passive", func() bool { return b.status().State == "PASSIVE" && b.status().HasState })
}

// TestPairSameRole: two nodes started as primary, each the other's peer,
// find out on their own dials and neither serves (they would issue tokens
// of the same epochs), the one that served included; neither takes an
// epoch afterwards (the heartbeats do not make it serve again).
//
// On a fake clock: the second primary's start guard does not end while
// the test runs, so it cannot serve before its dial finds the first.
func TestPairSameRole(t *testing.T) {
	clk := server.NewFakeClock()
	pa, ba := pairAddrs(t)
	p := startPairNodeFake(t, server.PairPrimary, pa, ba, clk) // its peer is not there yet
	clk.Advance(2*fakeHB + time.Second)                        // its start guard ends
	p.serving()
	q := startPairNodeFake(t, server.PairPrimary, ba, pa, clk)
	eventually(t, "the first primary stops serving", func() bool { return !p.status().Serving })
	mark := p.status().EpochMark
	p.refusesFor(3*pairHB, "")
	q.refusesFor(3*pairHB, "")
	if ps, qs := p.status(), q.status(); ps.Serving || qs.Serving || ps.EpochMark != mark || qs.EpochMark != 0 {
		t.Fatalf("two primaries: %+v and %+v; want neither serving, no epoch taken after the first's (mark %d)", ps, qs, mark)
	}
}

// TestPairSameRoleStops: a primary whose configured peer address turns
// out to be another primary stops serving and stays stopped, although its
// backup's heartbeats keep coming (a real clock: the heartbeats of every
// interval are the point): it takes no new epoch and serves no client
// until it is restarted (as its log line says). Every HELLO goes to the
// stopped node, which refuses it whatever the timing.
func TestPairSameRoleStops(t *testing.T) {
	pa, ba := pairAddrs(t)
	qa, _ := pairAddrs(t)
	p := startPairNode(t, server.PairPrimary, pa, qa, "") // the node at qa is not there yet
	startPairNode(t, server.PairBackup, ba, pa, "")
	p.serving()
	eventually(t, "the primary hearing its backup", func() bool { return p.status().PeerAlive })
	mark := p.status().EpochMark
	startPairNode(t, server.PairPrimary, qa, "127.0.0.1:1", "")
	eventually(t, "the primary stops serving", func() bool { return !p.status().Serving })
	p.refusesFor(10*pairHB, "")
	if ps := p.status(); ps.Serving || ps.EpochMark != mark {
		t.Fatalf("the stopped primary, its backup alive: %+v; want not serving, epoch mark still %d", ps, mark)
	}
}

// strangerLink dials addr's peer listener in plain TCP, sends hello (role,
// pair ID) and then frames, and reads what the node answers until it
// closes the link (or 2 s pass: a hang guard, reported as kept open).
func strangerLink(t *testing.T, addr string, role byte, id string, frames ...[]byte) (answered []byte, closed bool) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	body := append([]byte("TKPR"), 1, role, 0, byte(len(id)))
	body = append(body, id...)
	hello := append(binary.BigEndian.AppendUint32(nil, uint32(1+len(body))), 'H')
	nc.Write(append(hello, body...))
	for _, f := range frames {
		nc.Write(f)
	}
	nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(nc)
	var ne net.Error
	return b, !(errors.As(err, &ne) && ne.Timeout())
}

// forgedHeartbeat is a heartbeat frame: state, mark, serving, has state.
func forgedHeartbeat(state byte, mark, serving uint64) []byte {
	b := binary.BigEndian.AppendUint32(nil, 19)
	b = append(b, 'B', state)
	b = binary.BigEndian.AppendUint64(b, mark)
	b = binary.BigEndian.AppendUint64(b, serving)
	return append(b, 1)
}

// TestPairStrangers: a plaintext pair (on loopback) and a stranger on its
// peer port. A hello without the pair ID, or with another, is answered
// and the link closed before any heartbeat is read; with the pair's ID
// (which is no secret: the answer carries it), a heartbeat claiming an
// epoch beyond what the peer can have reached closes the link and changes
// nothing; hellos claiming the active's own role are refused and neither
// stop it nor make it take epochs. The pair serves on, in the same epoch.
func TestPairStrangers(t *testing.T) {
	pa, ba := pairAddrs(t)
	p := startPairNode(t, server.PairPrimary, pa, ba, "")
	b := startPairNode(t, server.PairBackup, ba, pa, "")
	cp := p.serving()
	cp.acquireOK(2, owner(1), 0, 60, "a")
	eventually(t, "the backup in sync", func() bool { return b.status().HasState && p.status().Replicating })
	before := p.status()
	rid, err := os.ReadFile(filepath.Join(p.cfg.DataDir, "pair.id"))
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(string(rid))
	const backupRole, primaryRole, active, passive = 2, 1, 3, 4
	huge := uint64(1) << 23
	for _, tc := range []struct {
		name string
		role byte
		id   string
	}{
		{"no pair ID", backupRole, ""},
		{"another pair's ID", backupRole, "another-pair"},
		{"the pair's ID", backupRole, id},
		{"the active's role", primaryRole, id},
		{"the active's role, no pair ID", primaryRole, ""},
	} {
		for range 3 {
			answer, closed := strangerLink(t, pa, tc.role, tc.id, forgedHeartbeat(active, huge, huge), forgedHeartbeat(passive, huge, 0))
			if !closed {
				t.Fatalf("%s: the primary kept the link open", tc.name)
			}
			if len(answer) == 0 || !strings.Contains(string(answer), id) {
				t.Errorf("%s: the primary answered %q, want its hello with the pair ID", tc.name, answer)
			}
		}
		if ps := p.status(); !ps.Serving || ps.State != "ACTIVE" || ps.Epoch != before.Epoch || ps.EpochMark != before.EpochMark {
			t.Fatalf("%s: the primary after the stranger %+v, want it active in epoch %d, mark %d", tc.name, ps, before.Epoch, before.EpochMark)
		}
	}
	eventually(t, "the backup in sync again", func() bool { return b.status().HasState && p.status().Replicating })
	if bs := b.status(); bs.EpochMark > before.EpochMark {
		t.Fatalf("the backup after the strangers: %+v, want epoch mark %d", bs, before.EpochMark)
	}
	if tok := cp.acquireOK(3, owner(2), 0, 60, "b"); tok>>40 != uint64(before.Epoch) {
		t.Fatalf("a grant after the strangers: token %d, want one of epoch %d", tok, before.Epoch)
	}
}

// TestPairPeerTLS: with PeerCertificate and PeerRoots the peer link is
// mutual TLS against the pair's CA: the pair settles and replicates; a
// dialler with another CA's node certificate, or with none, or speaking
// plain TCP, gets no hello and changes nothing.
func TestPairPeerTLS(t *testing.T) {
	ca, err := pki.NewCA("pair CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.NewCA("another CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *pki.CA) tls.Certificate {
		kp, err := ca.Issue(pki.Node, []string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return kp.TLSCertificate()
	}
	pa, ba := pairAddrs(t)
	start := func(role server.PairRole, self, peer string) *pairNode {
		cert := issue(ca)
		ln := listen(t)
		cfg := server.Config{DataDir: t.TempDir(), Pair: &server.PairConfig{Role: role, Peer: peer, Listen: self,
			Advertise: ln.Addr().String(), Heartbeat: pairHB, PeerCertificate: &cert, PeerRoots: ca.Pool()}}
		s, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		n := &pairNode{t: t, s: s, addr: ln.Addr().String(), peer: self, cfg: cfg, done: make(chan error, 1)}
		go func() { n.done <- s.Serve(ln) }()
		t.Cleanup(n.close)
		return n
	}
	p := start(server.PairPrimary, pa, ba)
	b := start(server.PairBackup, ba, pa)
	cp := p.serving()
	cp.acquireOK(2, owner(1), 0, 60, "a")
	eventually(t, "the backup in sync over mutual TLS", func() bool { return b.status().HasState && p.status().Replicating })

	// Strangers: a heartbeat saying ACTIVE with a huge epoch would make
	// the primary step down, if it got through.
	forged := []byte{0, 0, 0, 8, 'H', 'T', 'K', 'P', 'R', 1, 2, 0}
	stranger := issue(other)
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"another CA's node certificate", &tls.Config{Certificates: []tls.Certificate{stranger}, RootCAs: ca.Pool(), ServerName: "127.0.0.1"}},
		{"no certificate", &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}},
		{"plain TCP", nil},
	} {
		nc, err := net.Dial("tcp", pa)
		if err != nil {
			t.Fatal(err)
		}
		if tc.cfg != nil {
			tlc := tls.Client(nc, tc.cfg)
			tlc.SetDeadline(time.Now().Add(2 * time.Second))
			if err := tlc.Handshake(); err == nil {
				// TLS 1.3: the client learns of a refused certificate on
				// its first read.
				tlc.Write(forged)
				if _, err := tlc.Read(make([]byte, 1)); err == nil {
					t.Errorf("%s: the primary answered", tc.name)
				}
			}
			tlc.Close()
		} else {
			nc.SetDeadline(time.Now().Add(2 * time.Second))
			nc.Write(forged)
			if _, err := nc.Read(make([]byte, 1)); err == nil {
				t.Errorf("%s: the primary answered", tc.name)
			}
			nc.Close()
		}
	}
	if ps := p.status(); ps.State != "ACTIVE" || !ps.Serving || ps.DualActives != 0 {
		t.Fatalf("primary after the strangers: %+v", ps)
	}
	cp.acquireOK(3, owner(2), 0, 60, "b")
}

// TestPairConfigErrors: New refuses a PairConfig it could not run, before
// anything listens, with an error naming the field.
func TestPairConfigErrors(t *testing.T) {
	ca, err := pki.NewCA("pair CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(pki.Server, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serverOnly := kp.TLSCertificate()
	ok := func() *server.PairConfig {
		return &server.PairConfig{Role: server.PairPrimary, Peer: "127.0.0.1:7001", Listen: "127.0.0.1:7000", Advertise: "127.0.0.1:5225"}
	}
	for _, tc := range []struct {
		name string
		edit func(c *server.Config)
		want string
	}{
		{"role", func(c *server.Config) { c.Pair.Role = "leader" }, `server: PairConfig.Role "leader": want "primary" or "backup"`},
		{"no peer", func(c *server.Config) { c.Pair.Peer = "" }, "server: PairConfig.Peer (the other node's peer address) is required"},
		{"wildcard peer", func(c *server.Config) { c.Pair.Peer = "0.0.0.0:7001" }, "server: PairConfig.Peer: "},
		{"no listen", func(c *server.Config) { c.Pair.Listen = "" }, "server: PairConfig.Listen (this node's peer address) is required"},
		{"bad listen", func(c *server.Config) { c.Pair.Listen = "7000" }, "server: PairConfig.Listen: "},
		{"no advertise", func(c *server.Config) { c.Pair.Advertise = "" }, "server: PairConfig.Advertise (the client address the peer gives as hint) is required"},
		{"long advertise", func(c *server.Config) { c.Pair.Advertise = strings.Repeat("a", 256) }, "server: PairConfig.Advertise longer than 255 bytes"},
		{"negative heartbeat", func(c *server.Config) { c.Pair.Heartbeat = -time.Second }, "server: PairConfig.Heartbeat is negative (-1s)"},
		{"with a cluster", func(c *server.Config) { c.Cluster = &server.ClusterConfig{NodeID: "n1"} }, "server: Config.Pair and Config.Cluster are exclusive"},
		{"with standby", func(c *server.Config) { c.Standby = true }, "server: Config.Standby and Config.Pair are exclusive"},
		{"certificate without roots", func(c *server.Config) { c.Pair.PeerCertificate = &serverOnly }, "server: PairConfig.PeerCertificate without PeerRoots"},
		{"roots without certificate", func(c *server.Config) { c.Pair.PeerRoots = ca.Pool() }, "server: PairConfig.PeerRoots without PeerCertificate"},
		{"plaintext, listen off loopback", func(c *server.Config) { c.Pair.Listen = "0.0.0.0:7000" }, `server: PairConfig.Listen "0.0.0.0:7000" is not a loopback address, and the peer link is plain TCP`},
		{"plaintext, peer off loopback", func(c *server.Config) { c.Pair.Peer = "192.0.2.7:7001" }, `server: PairConfig.Peer "192.0.2.7:7001" is not a loopback address, and the peer link is plain TCP`},
		{"not a node certificate", func(c *server.Config) { c.Pair.PeerCertificate, c.Pair.PeerRoots = &serverOnly, ca.Pool() }, "server: PairConfig.PeerCertificate: raftnet: peer TLS: own certificate: "},
	} {
		cfg := server.Config{DataDir: t.TempDir(), Pair: ok()}
		tc.edit(&cfg)
		s, err := server.New(cfg)
		if err == nil {
			s.Close()
			t.Errorf("%s: New succeeded", tc.name)
			continue
		}
		if !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q...", tc.name, err, tc.want)
		}
	}
	// PeerPlaintext: the operator accepts a plaintext link off loopback.
	cfg := server.Config{DataDir: t.TempDir(), Pair: ok()}
	cfg.Pair.Listen, cfg.Pair.Peer, cfg.Pair.PeerPlaintext = "0.0.0.0:0", "192.0.2.7:7001", true
	s, err := server.New(cfg)
	if err != nil {
		t.Fatalf("plaintext off loopback with PeerPlaintext: %v", err)
	}
	s.Close()
}

// TestPairSplitBrainNewActiveDies: the peer link is cut while clients
// reach both nodes; the backup takes over under a higher epoch and grants,
// then dies before the link heals, so the primary never sees two actives.
// When the backup comes back (passive-to-be, its epoch mark durable), its
// first heartbeat tells the primary that a higher epoch was used: the
// primary moves above it before its next grant, so its tokens are above
// every token the dead side issued (the fence accepts its holders' writes
// again), while the locks it holds keep their tokens.
func TestPairSplitBrainNewActiveDies(t *testing.T) {
	pa, ba := pairAddrs(t)
	toP, toB := linkProxies(t, pa, ba)
	p := startPairNode(t, server.PairPrimary, pa, toB.Addr(), "")
	b := startPairNode(t, server.PairBackup, ba, toP.Addr(), "")
	cp := p.serving()
	held := cp.acquireOK(2, owner(1), 0, 200, "held")
	eventually(t, "the backup in sync", func() bool { return b.status().HasState && p.status().Replicating })

	cutLink(true, toP, toB)
	eventually(t, "the primary unreplicated", func() bool { return !p.status().Replicating })
	cb := b.serving()
	onB := cb.acquireOK(2, owner(2), 0, 200, "res")
	onP := cp.acquireOK(3, owner(3), 0, 200, "other")
	if onB>>40 != 1 || onP>>40 != 0 {
		t.Fatalf("split brain: backup's token %d (epoch %d), primary's %d (epoch %d); want epochs 1 and 0", onB, onB>>40, onP, onP>>40)
	}

	// The new active dies; the link heals with nobody behind it.
	b.close()
	cutLink(false, toP, toB)
	if ps := p.status(); !ps.Serving || ps.Epoch != 0 {
		t.Fatalf("the primary after the backup died: %+v, want serving epoch 0", ps)
	}

	// The backup comes back: its heartbeat carries its epoch mark.
	b = b.restart()
	eventually(t, "the primary hearing the restarted backup's epoch mark", func() bool { return p.status().EpochMark > uint64(onB>>40) })
	next := cp.acquireOK(4, owner(4), 0, 200, "res")
	if next <= onB {
		t.Fatalf("the primary's next grant after it heard of epoch %d: token %d (epoch %d), want above the dead side's %d", onB>>40, next, next>>40, onB)
	}
	if ps := p.status(); !ps.Serving || ps.Epoch != int64(next>>40) || ps.Epoch <= 1 {
		t.Fatalf("the primary after the move: %+v, want serving in the epoch of token %d, above 1", ps, next)
	}
	// The held lock kept its token; the restarted backup resyncs to the
	// primary's state, the move included.
	if tok := cp.acquireOK(5, owner(1), 0, 200, "held"); tok != held {
		t.Fatalf("the holder's retry after the move: token %d, want %d", tok, held)
	}
	eventually(t, "the backup passive and in sync", func() bool {
		bs, ps := b.status(), p.status()
		return bs.State == "PASSIVE" && bs.HasState && ps.Replicating && bs.LastToken == ps.LastToken
	})
	after := cp.acquireOK(6, owner(5), 0, 200, "later")
	if after <= next {
		t.Fatalf("a grant after the resync: token %d, want above %d", after, next)
	}
}
