package server

// The replication seam's contract: what a lockcore.Proposer promises the
// lock core, as the tests below check it against every implementation in
// this package: localLog (standalone: a command applies at once, a grant's
// token comes from the token store), raftLog (a cluster leader: commands go
// into Raft entries through the proposer, the FSM applies them to a
// lockcore.Machine, cluster.applied gives the outcomes back) and memLog
// below (an in-memory log that applies only when the test says so).
//
// (a) Order, once. Every command proposed applies exactly once; the
// commands of one key apply in the order they were proposed; each outcome
// goes back to the core once (from Propose, or by Core.Applied in the
// order the commands apply): a Grant's token, a Free's Freed and the token
// of the next waiter it grants the key to. Commands of different keys may
// apply in another order than proposed (raftLog's proposer takes the
// sessions' queues in turns): the core relies on the order per key only,
// which memLog's reordered mode checks.
//
// (b) Tokens. The token of every new holding is above every token
// issued before (a holder's retry gets its own token back), hence never
// reused, and never 0; across a role change too: a Raft leader's first
// grant is above every token its predecessors issued, a standalone
// Server's first grant above every token issued before it was restarted
// on the same data dir.
//
// (c) Projection. A command applies as the core projected it: a Grant of
// a key it projects free grants it, a Free of the token it projects
// holding the key frees it (no Desync). At rest (nothing in flight) the
// core's holdings are the applied state's, and the log has taken no token
// that no reply shows.
//
// (d) Demotion. After Core.Demote nothing proposed before is answered: a
// Raft leader that loses its leadership closes its sessions with M, and
// the outcomes of its stint never reach a later core (cluster.applied
// checks the stint, the core its generation); a new core starts from the
// applied state (Promote), the holdings with their tokens.
//
// Each implementation runs the same scenario through the sessions' request
// handlers (Server.acquire, release, cancel: what a session's reader calls
// for each frame) on in-memory connections, with the scheduler on a fake
// clock, and must give the same replies: same types and req_ids on every
// session, the same token where the scenario expects the same, and new
// tokens strictly above all earlier ones. Replies are read from each
// session's queued output (no writer runs before HELLO), polled with a
// deadline. TestSeamContract checks (a) to (c) on every log;
// TestSeamContractRestart (b) across a standalone restart;
// TestSeamContractLeaderChange (b) and (d) across Raft leader changes;
// TestSeamContractMemDemote (d) on the core, with the in-memory log.

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/raft"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// seamDeadline bounds every wait for an asynchronous reply or state.
const seamDeadline = 5 * time.Second

// seamLog is one implementation of the seam, behind a Server whose
// sessions run the scenario (a cluster's leader).
type seamLog struct {
	s   *Server
	clk *FakeClock
	// pump applies one command of an in-memory log and reports whether
	// there was one; nil: the log applies by itself.
	pump func() bool
	// rest returns the state once nothing is in flight; why says what is
	// not at rest yet.
	rest func() (st seamState, why string)
}

// seamState is an implementation's state at rest.
type seamState struct {
	last      uint64             // the highest token the log has taken
	projected []lockcore.Holding // the core's holdings
	applied   []lockcore.Holding // the applied state's (machine: false, none apart from the projection)
	machine   bool
}

// --- The implementations ----------------------------------------------

func seamLocal(t *testing.T, clk *FakeClock, dir string) *seamLog {
	cfg := Config{DataDir: dir}
	SetClock(&cfg, clk)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &seamLog{s: s, clk: clk, rest: func() (seamState, string) {
		var hs []lockcore.Holding
		st := s.mode.(*standalone)
		for i := range st.shards {
			sh := &st.shards[i]
			sh.mu.Lock()
			hs = append(hs, sh.core.Holdings()...)
			sh.mu.Unlock()
		}
		slices.SortFunc(hs, func(a, b lockcore.Holding) int { return strings.Compare(a.Key, b.Key) })
		return seamState{last: st.tokens.last.Load(), projected: hs}, ""
	}}
}

type seamNode struct {
	in *InmemNode
	s  *Server
}

// seamCluster starts n nodes on in-memory Raft transports, bootstrapped as
// one cluster, on one fake clock.
func seamCluster(t *testing.T, clk *FakeClock, n int) []*seamNode {
	var nodes []*seamNode
	var peers []Peer
	for i := range n {
		nd := &seamNode{in: NewInmemNode(string(rune('a' + i)))}
		nodes = append(nodes, nd)
		peers = append(peers, Peer{ID: nd.in.ID, Address: nd.in.Addr})
	}
	seamHeal(nodes)
	for i, nd := range nodes {
		cc := &ClusterConfig{NodeID: nd.in.ID, Advertise: fmt.Sprintf("127.0.0.1:%d", 5301+i), Peers: peers,
			HeartbeatTimeout: 500 * time.Millisecond, ElectionTimeout: 500 * time.Millisecond}
		nd.in.Use(cc)
		cfg := Config{DataDir: t.TempDir(), Cluster: cc}
		SetClock(&cfg, clk)
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nd.s = s
		t.Cleanup(func() { s.Close() })
	}
	return nodes
}

func seamHeal(nodes []*seamNode) {
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.in.Trans.Connect(raft.ServerAddress(b.in.Addr), b.in.Trans)
			}
		}
	}
}

func seamIsolate(nodes []*seamNode, i int) {
	for j, nd := range nodes {
		if j != i {
			nd.in.Trans.Disconnect(raft.ServerAddress(nodes[i].in.Addr))
			nodes[i].in.Trans.Disconnect(raft.ServerAddress(nd.in.Addr))
		}
	}
}

// seamLeader waits for a node among those given that serves as leader.
func seamLeader(t *testing.T, nodes []*seamNode, among ...int) int {
	t.Helper()
	deadline := time.Now().Add(2 * seamDeadline)
	for {
		for _, i := range among {
			if r, _ := nodes[i].s.Role(); r == RoleLeader {
				return i
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader among nodes %v within %v", among, 2*seamDeadline)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// seamRaft is the Raft implementation: the leader of a cluster of n
// nodes; at rest, every node's machine is the leader's.
func seamRaft(t *testing.T, clk *FakeClock, n int) *seamLog {
	nodes := seamCluster(t, clk, n)
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	return seamRaftLog(nodes, seamLeader(t, nodes, all...), clk)
}

func seamRaftLog(nodes []*seamNode, leader int, clk *FakeClock) *seamLog {
	s := nodes[leader].s
	cl := s.clusterMode()
	return &seamLog{s: s, clk: clk, rest: func() (seamState, string) {
		cl.sh.mu.Lock()
		pending, projected := cl.sh.core.Pending()+len(cl.pending), cl.sh.core.Holdings()
		cl.sh.mu.Unlock()
		if pending > 0 {
			return seamState{}, fmt.Sprintf("%d commands in flight", pending)
		}
		applied, last := cl.fsm.holdingsNow()
		for _, nd := range nodes {
			if nd.s.isClosed() {
				continue
			}
			if hs, l := nd.s.clusterMode().fsm.holdingsNow(); l != last || !slices.Equal(hs, applied) {
				return seamState{}, fmt.Sprintf("node %s's machine (last %d, %v) is not the leader's (last %d, %v)", nd.in.ID, l, hs, last, applied)
			}
		}
		return seamState{last: last, projected: projected, applied: applied, machine: true}, ""
	}}
}

// memLog is an in-memory lockcore.Proposer for tests: Propose queues the
// command (encoded, as Raft's entries carry it), and apply applies the
// oldest one (reorder: the newest one with no older command of its key
// queued) to a lockcore.Machine and hands the outcome to the core, under
// the shard mutex, as cluster.applied does. Everything is under sh.mu.
type memLog struct {
	t       *testing.T
	s       *Server
	sh      *shard
	m       *lockcore.Machine
	q       []memCmd
	seq     uint64
	reorder bool
}

type memCmd struct {
	p      *lockcore.Proposal
	key    string
	grants bool
	b      []byte
}

func (l *memLog) Propose(p *lockcore.Proposal) bool {
	l.seq++
	l.q = append(l.q, memCmd{p: p, key: p.Key(), grants: p.Grants(), b: p.AppendCommand(nil, l.seq)})
	return false
}

// apply applies one queued command, if any (see memLog).
func (l *memLog) apply() bool {
	sh := l.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(l.q) == 0 {
		return false
	}
	i := 0
	if l.reorder {
		for i = len(l.q) - 1; i > 0; i-- {
			if !slices.ContainsFunc(l.q[:i], func(c memCmd) bool { return c.key == l.q[i].key }) {
				break
			}
		}
	}
	c := l.q[i]
	l.q = slices.Delete(l.q, i, i+1)
	d := lockcore.NewDecoder(c.b)
	typ := d.U8()
	d.Uvarint()
	r, err := l.m.ApplyCommand(d, typ)
	if err != nil {
		l.t.Errorf("memLog: %v", err)
	}
	if typ == lockcore.CmdGrant && r.Token == 0 || typ == lockcore.CmdFree && (!r.Freed || c.grants && r.Token == 0) {
		l.t.Errorf("contract (c): a command of key %q did not apply as projected: %+v", c.key, r)
	}
	sh.core.Applied(l.s.shardNow(sh), c.p, r)
	fx := sh.core.Effects()
	for i := range fx {
		if fx[i].Kind == lockcore.Desync {
			l.t.Errorf("contract (c): %v", fx[i].Err)
			fx[i] = lockcore.Effect{} // (carryOut would hand it to a cluster's resync: there is none)
		}
	}
	l.s.carryOut(sh, nil)
	return true
}

// A mode of its own: memLog is also the whole mode of its Server (one
// type: the lock path is the server's, lockpath.go). Its one shard
// always serves; its status is its machine's.

func (l *memLog) shardOf([]byte) *shard                           { return l.sh }
func (l *memLog) tables() int                                     { return 1 }
func (l *memLog) table(int) *shard                                { return l.sh }
func (l *memLog) admitRequest(*shard, *conn) (uint64, bool, bool) { return 0, false, true }
func (l *memLog) notServing() error                               { return nil }
func (l *memLog) readApplied(f func(*lockcore.Machine)) string {
	f(l.m)
	return "mem"
}

func (l *memLog) hello()         {}
func (l *memLog) refusal() error { return nil }
func (l *memLog) stopping()      {}
func (l *memLog) counts() modeCounts {
	return modeCounts{last: l.m.Last(), ceiling: l.m.Last(), held: l.m.Len()}
}
func (l *memLog) health() error                      { return nil }
func (l *memLog) collectors() []prometheus.Collector { return nil }
func (l *memLog) close()                             { l.sh.stopTimer() }

// seamMem is the in-memory log, the mode of a Server of its own, driven
// like a cluster leader's core (exact lease ends).
func seamMem(t *testing.T, clk *FakeClock, reorder bool) (*seamLog, *memLog) {
	var ml *memLog
	cfg := Config{DataDir: t.TempDir(), mode: func(s *Server) mode {
		sh := &shard{wakeAt: lockcore.NoDeadline, exact: true, serving: true, view: "mem"}
		ml = &memLog{t: t, s: s, sh: sh, m: lockcore.NewMachine(), reorder: reorder}
		sh.core = lockcore.New(lockcore.Config{Capacity: &s.capacity, MaxKeyWaiters: s.cfg.MaxKeyWaiters}, ml)
		return ml
	}}
	SetClock(&cfg, clk)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sh := ml.sh
	return &seamLog{s: s, clk: clk, pump: ml.apply, rest: func() (seamState, string) {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if len(ml.q) > 0 {
			return seamState{}, fmt.Sprintf("%d commands queued", len(ml.q))
		}
		return seamState{last: ml.m.Last(), projected: sh.core.Holdings(), applied: ml.m.Holdings(), machine: true}, ""
	}}, ml
}

// --- Sessions, replies and their check ---------------------------------

type seamReply struct {
	typ byte
	id  uint32
	tok uint64
}

func (r seamReply) String() string {
	if r.typ == wire.TypeGranted {
		return fmt.Sprintf("G%d(%d)", r.id, r.tok)
	}
	return fmt.Sprintf("%c%d", r.typ, r.id)
}

// seamWant is an expected reply; tok names a G's token: a name seen before
// is that token, a new one a token above every one seen before.
type seamWant struct {
	typ byte
	id  uint32
	tok string
}

func (w seamWant) String() string {
	if w.typ == wire.TypeGranted {
		return fmt.Sprintf("G%d(%s)", w.id, w.tok)
	}
	return fmt.Sprintf("%c%d", w.typ, w.id)
}

func wG(id uint32, tok string) seamWant { return seamWant{wire.TypeGranted, id, tok} }
func wR(id uint32) seamWant             { return seamWant{typ: wire.TypeReleased, id: id} }
func wN(id uint32) seamWant             { return seamWant{typ: wire.TypeNotHeld, id: id} }
func wT(id uint32) seamWant             { return seamWant{typ: wire.TypeTimedOut, id: id} }
func wM() seamWant                      { return seamWant{typ: wire.TypeNotActive} }
func wK(id uint32) seamWant             { return seamWant{typ: wire.TypeKept, id: id} }

// seamSess is a session on an in-memory connection: the test plays its
// reader.
type seamSess struct {
	r     *seamRun
	name  string
	s     *Server
	c     *conn
	owner lockcore.Owner
	want  []seamWant
}

// seamRun is one run of a scenario: its sessions and the tokens seen.
type seamRun struct {
	t    *testing.T
	pump func() bool
	toks map[string]uint64
	max  uint64 // the highest token seen
	sess []*seamSess
}

func newSeamRun(t *testing.T, pump func() bool) *seamRun {
	return &seamRun{t: t, pump: pump, toks: make(map[string]uint64)}
}

// session opens a version-2 session on s for owner, tracked by s as
// Serve's are (a role change or Close reaches it).
func (r *seamRun) session(s *Server, name string, owner byte) *seamSess {
	c := pipeConn(r.t, s)
	c.ver = wire.Version2
	s.mu.Lock()
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	ss := &seamSess{r: r, name: name, s: s, c: c, owner: lockcore.Owner{owner}}
	r.sess = append(r.sess, ss)
	return ss
}

// request hands req to the session's handler, as its reader does (which
// reads nothing more once the session is closing).
func (ss *seamSess) request(req wire.Request) {
	ss.r.t.Helper()
	if ss.c.dead.Load() {
		return
	}
	if req.Type != wire.TypeCancel && ss.c.isInflight(req.ReqID) {
		ss.r.t.Fatalf("session %s: req_id %d in flight", ss.name, req.ReqID)
	}
	switch req.Type {
	case wire.TypeAcquire:
		ss.s.acquire(ss.c, &req, ss.s.now())
	case wire.TypeRelease, wire.TypeReleaseOwned:
		ss.s.release(ss.c, &req, req.Type == wire.TypeReleaseOwned)
	case wire.TypeCancel:
		ss.s.cancel(ss.c, req.ReqID)
	case wire.TypeExtend:
		ss.s.extend(ss.c, &req, ss.s.now())
	}
}

func (ss *seamSess) acq(id uint32, key string, waitS, leaseS uint8) {
	ss.request(wire.Request{Type: wire.TypeAcquire, ReqID: id, Owner: ss.owner, Key: []byte(key), WaitS: waitS, LeaseS: leaseS})
}

func (ss *seamSess) rel(id uint32, key string, tok uint64) {
	ss.request(wire.Request{Type: wire.TypeRelease, ReqID: id, Key: []byte(key), Token: tok})
}

func (ss *seamSess) relOwned(id uint32, key string, tok uint64) {
	ss.request(wire.Request{Type: wire.TypeReleaseOwned, ReqID: id, Owner: ss.owner, Key: []byte(key), Token: tok})
}

func (ss *seamSess) extend(id uint32, key string, tok uint64, leaseS uint8) {
	ss.request(wire.Request{Type: wire.TypeExtend, ReqID: id, Owner: ss.owner, Key: []byte(key), Token: tok, LeaseS: leaseS})
}

func (ss *seamSess) cancel(id uint32) { ss.request(wire.Request{Type: wire.TypeCancel, ReqID: id}) }

// replies parses the session's queued output.
func (ss *seamSess) replies() []seamReply {
	b := ss.c.queued()
	var out []seamReply
	for len(b) >= wire.HeaderLen {
		n := int(binary.BigEndian.Uint32(b))
		if len(b) < wire.HeaderLen+n {
			break
		}
		var resp wire.Response
		if err := wire.DecodeResponse(b[wire.HeaderLen:wire.HeaderLen+n], &resp); err != nil {
			ss.r.t.Fatalf("session %s: bad reply % x: %v", ss.name, b[:wire.HeaderLen+n], err)
		}
		out = append(out, seamReply{resp.Type, resp.ReqID, resp.Token})
		b = b[wire.HeaderLen+n:]
	}
	return out
}

type seamExp struct {
	ss   *seamSess
	want []seamWant
}

func on(ss *seamSess, want ...seamWant) seamExp { return seamExp{ss, want} }

// tok is the token named name.
func (r *seamRun) tok(name string) uint64 {
	r.t.Helper()
	v, ok := r.toks[name]
	if !ok {
		r.t.Fatalf("no token %s yet", name)
	}
	return v
}

// await polls cond until it holds, applying an in-memory log's commands
// meanwhile, for up to seamDeadline; what() says what was seen.
func (r *seamRun) await(cond func() bool, what func() string) {
	r.t.Helper()
	deadline := time.Now().Add(seamDeadline)
	for !cond() {
		if r.pump != nil && r.pump() {
			continue
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("not within %v: %s", seamDeadline, what())
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *seamRun) seen() string {
	var b strings.Builder
	for _, ss := range r.sess {
		fmt.Fprintf(&b, "\n  %s: got %v, want %v", ss.name, ss.replies(), ss.want)
	}
	return b.String()
}

// expect adds the replies each session must get next, waits for them and
// checks every session's replies so far. Tokens first named here must be
// distinct and above every token seen before.
func (r *seamRun) expect(exps ...seamExp) {
	r.t.Helper()
	for _, e := range exps {
		e.ss.want = append(e.ss.want, e.want...)
	}
	r.await(func() bool {
		for _, e := range exps {
			if len(e.ss.replies()) < len(e.ss.want) {
				return false
			}
		}
		return true
	}, func() string { return "the replies" + r.seen() })
	r.check()
}

// check compares every session's replies with what it must have got.
func (r *seamRun) check() {
	r.t.Helper()
	before, fresh := r.max, map[uint64]bool{}
	for _, ss := range r.sess {
		got := ss.replies()
		ok := len(got) == len(ss.want)
		for i := 0; ok && i < len(got); i++ {
			g, w := got[i], ss.want[i]
			ok = g.typ == w.typ && g.id == w.id && (g.typ == wire.TypeGranted) == (w.tok != "")
			if !ok || w.tok == "" {
				continue
			}
			if v, known := r.toks[w.tok]; known {
				ok = g.tok == v
				continue
			}
			if g.tok <= before || fresh[g.tok] {
				r.t.Fatalf("contract (b): session %s: new token %s = %d is not above every earlier token (%d) or was seen twice%s", ss.name, w.tok, g.tok, before, r.seen())
			}
			r.toks[w.tok], fresh[g.tok] = g.tok, true
			r.max = max(r.max, g.tok)
		}
		if !ok {
			r.t.Fatalf("session %s: unexpected replies%s", ss.name, r.seen())
		}
	}
}

// closed waits until ss's session is closed, and accepts an M as its
// last reply.
func (r *seamRun) closed(ss *seamSess) {
	r.t.Helper()
	r.await(ss.c.dead.Load, func() string { return "session " + ss.name + " to close" })
	if got := ss.replies(); len(got) == len(ss.want)+1 && got[len(got)-1].typ == wire.TypeNotActive {
		ss.want = append(ss.want, wM())
	}
	r.check()
}

type seamHeld struct {
	key    string
	ss     *seamSess
	tok    string
	leaseS uint8
}

// final waits until l is at rest, checks every session's replies (none
// more came) and the state: the core's holdings, and the applied ones, are
// held, and the highest token the log took is the highest any reply showed.
func (r *seamRun) final(l *seamLog, held ...seamHeld) {
	r.t.Helper()
	var st seamState
	var why string
	r.await(func() bool { st, why = l.rest(); return why == "" }, func() string { return "rest: " + why })
	r.check()
	var want []lockcore.Holding
	for _, h := range held {
		want = append(want, lockcore.Holding{Key: h.key, Owner: h.ss.owner, Token: r.tok(h.tok), LeaseS: h.leaseS})
	}
	slices.SortFunc(want, func(a, b lockcore.Holding) int { return strings.Compare(a.Key, b.Key) })
	if !slices.Equal(st.projected, want) {
		r.t.Errorf("contract (c): the core holds %v, want %v", st.projected, want)
	}
	if st.machine && !slices.Equal(st.applied, want) {
		r.t.Errorf("contract (c): the applied state holds %v, want %v", st.applied, want)
	}
	if st.last != r.max {
		r.t.Errorf("contract (a): the log's last token is %d, the replies' highest %d", st.last, r.max)
	}
}

// --- The scenario ---------------------------------------------------------

// seamScenario: grant and the holder's retry, wrong token, queued waiters
// with the FIFO hand-off on release and on lease end, RELEASE_OWNED, two
// commands of a key in flight, CANCEL, the end of a wait, the end of a
// lease, and grants of three sessions at once.
func seamScenario(t *testing.T, l *seamLog) {
	r := newSeamRun(t, l.pump)
	a, b, c := r.session(l.s, "a", 'A'), r.session(l.s, "b", 'B'), r.session(l.s, "c", 'C')

	// A grant, and the holder's retry sent before its reply: one token.
	a.acq(1, "k", 0, 10)
	a.acq(2, "k", 0, 10)
	r.expect(on(a, wG(1, "t1"), wG(2, "t1")))
	b.rel(3, "k", r.tok("t1")+1000)
	r.expect(on(b, wN(3)))

	// Two waiters; a RELEASE hands the key to the first, its lease's end
	// to the second.
	b.acq(4, "k", 30, 2)
	c.acq(5, "k", 30, 10)
	a.rel(6, "k", r.tok("t1"))
	r.expect(on(a, wR(6)), on(b, wG(4, "t2")))
	l.clk.Advance(2 * time.Second)
	r.expect(on(c, wG(5, "t3")))
	b.rel(7, "k", r.tok("t2"))
	r.expect(on(b, wN(7)))

	// RELEASE_OWNED frees the key only for its holder.
	b.relOwned(8, "k", r.tok("t3"))
	r.expect(on(b, wN(8)))
	c.relOwned(9, "k", r.tok("t3"))
	r.expect(on(c, wR(9)))

	// A Free and the next Grant of one key in flight together.
	c.acq(10, "k2", 0, 10)
	r.expect(on(c, wG(10, "t4")))
	c.rel(11, "k2", r.tok("t4"))
	a.acq(12, "k2", 0, 10)
	r.expect(on(c, wR(11)), on(a, wG(12, "t5")))

	// CANCEL of a waiter; the key is then freed, and a RELEASE of the same
	// token sent behind it is N.
	b.acq(13, "k2", 30, 10)
	b.cancel(13)
	r.expect(on(b, wT(13)))
	a.rel(14, "k2", r.tok("t5"))
	a.rel(15, "k2", r.tok("t5"))
	r.expect(on(a, wR(14), wN(15)))

	// A wait that ends, one that does not start (wait_s 0), then a lease
	// that ends with nobody waiting.
	c.acq(16, "k3", 0, 10)
	r.expect(on(c, wG(16, "t6")))
	a.acq(17, "k3", 1, 10)
	b.acq(18, "k3", 0, 10)
	r.expect(on(b, wT(18)))
	l.clk.Advance(time.Second)
	r.expect(on(a, wT(17)))
	l.clk.Advance(10 * time.Second)
	c.rel(19, "k3", r.tok("t6"))
	r.expect(on(c, wN(19)))

	// EXTEND (version 3): K by the holder, its token kept; N from another
	// owner; the lease then ends at the extended end, not before (the
	// waiter is granted only then).
	a.acq(23, "k4", 0, 2)
	r.expect(on(a, wG(23, "t10")))
	a.extend(24, "k4", r.tok("t10"), 5)
	b.extend(25, "k4", r.tok("t10"), 5)
	r.expect(on(a, wK(24)), on(b, wN(25)))
	c.acq(26, "k4", 30, 10)
	l.clk.Advance(3 * time.Second)
	r.expect()
	l.clk.Advance(2 * time.Second)
	r.expect(on(c, wG(26, "t11")))
	c.rel(27, "k4", r.tok("t11"))
	r.expect(on(c, wR(27)))

	// Three sessions' grants at once.
	a.acq(20, "k10", 0, 10)
	b.acq(21, "k11", 0, 10)
	c.acq(22, "k12", 0, 10)
	r.expect(on(a, wG(20, "t7")), on(b, wG(21, "t8")), on(c, wG(22, "t9")))

	r.final(l, seamHeld{"k10", a, "t7", 10}, seamHeld{"k11", b, "t8", 10}, seamHeld{"k12", c, "t9", 10})
}

// TestSeamContract runs the scenario against every log: standalone, Raft
// with one node and with three, and the in-memory log, in order and
// reordered across keys.
func TestSeamContract(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  func(t *testing.T, clk *FakeClock) *seamLog
	}{
		{"local", func(t *testing.T, clk *FakeClock) *seamLog { return seamLocal(t, clk, t.TempDir()) }},
		{"raft1", func(t *testing.T, clk *FakeClock) *seamLog { return seamRaft(t, clk, 1) }},
		{"raft3", func(t *testing.T, clk *FakeClock) *seamLog { return seamRaft(t, clk, 3) }},
		{"mem", func(t *testing.T, clk *FakeClock) *seamLog { l, _ := seamMem(t, clk, false); return l }},
		{"mem-reordered", func(t *testing.T, clk *FakeClock) *seamLog { l, _ := seamMem(t, clk, true); return l }},
	} {
		t.Run(tc.name, func(t *testing.T) { seamScenario(t, tc.log(t, NewFakeClock())) })
	}
}

// TestSeamContractRestart: a standalone Server restarted on its data dir
// grants above every token it issued before; its sessions were closed.
func TestSeamContractRestart(t *testing.T) {
	dir, clk := t.TempDir(), NewFakeClock()
	l := seamLocal(t, clk, dir)
	r := newSeamRun(t, nil)
	a := r.session(l.s, "a", 'A')
	a.acq(1, "k", 0, 10)
	a.acq(2, "k2", 0, 10)
	r.expect(on(a, wG(1, "t1"), wG(2, "t2")))
	l.s.Close()
	r.closed(a)

	l = seamLocal(t, clk, dir)
	b := r.session(l.s, "b", 'B')
	b.acq(1, "k", 0, 10) // (locks do not survive a restart: k is free)
	r.expect(on(b, wG(1, "t3")))
	r.final(l, seamHeld{"k", b, "t3", 10})
}

// TestSeamContractLeaderChange: a Raft leader cut off from the others
// closes its sessions with M, with a grant in flight unanswered, and its
// core forgets everything; the new leader restores the holdings with
// their tokens and grants above them; so does the next one once that
// leader stops.
func TestSeamContractLeaderChange(t *testing.T) {
	clk := NewFakeClock()
	nodes := seamCluster(t, clk, 3)
	r := newSeamRun(t, nil)
	l1 := seamLeader(t, nodes, 0, 1, 2)
	s1 := nodes[l1].s
	a, b := r.session(s1, "a", 'A'), r.session(s1, "b", 'B')
	a.acq(1, "k", 0, 60)
	r.expect(on(a, wG(1, "t1")))
	b.acq(1, "k", 30, 60)
	a.acq(2, "k2", 0, 60)
	r.expect(on(a, wG(2, "t2")))

	seamIsolate(nodes, l1)
	a.acq(3, "k9", 0, 60) // cannot commit
	r.expect(on(a, wM()), on(b, wM()))
	s1.clusterMode().sh.mu.Lock()
	held, pending := s1.clusterMode().sh.core.Len(), s1.clusterMode().sh.core.Pending()
	s1.clusterMode().sh.mu.Unlock()
	if held != 0 || pending != 0 {
		t.Fatalf("contract (d): the deposed leader's core has %d holdings and %d commands in flight", held, pending)
	}

	var others []int
	for i := range nodes {
		if i != l1 {
			others = append(others, i)
		}
	}
	l2 := seamLeader(t, nodes, others...)
	c, d := r.session(nodes[l2].s, "c", 'A'), r.session(nodes[l2].s, "d", 'B')
	d.acq(1, "k", 0, 60) // held by A, restored
	r.expect(on(d, wT(1)))
	c.acq(1, "k", 0, 60) // A's retry: its token
	d.acq(2, "k3", 0, 60)
	r.expect(on(c, wG(1, "t1")), on(d, wG(2, "t3")))

	seamHeal(nodes)
	nodes[l2].s.Close()
	r.closed(c)
	r.closed(d)
	var left []int
	for i := range nodes {
		if i != l2 {
			left = append(left, i)
		}
	}
	l3 := seamLeader(t, nodes, left...)
	e := r.session(nodes[l3].s, "e", 'C')
	e.acq(1, "k4", 0, 60)
	r.expect(on(e, wG(1, "t4")))
	e.acq(2, "k", 0, 60) // (replies may come out of order: one at a time)
	r.expect(on(e, wT(2)))
	r.final(seamRaftLog(nodes, l3, clk),
		seamHeld{"k", a, "t1", 60}, seamHeld{"k2", a, "t2", 60}, seamHeld{"k3", d, "t3", 60}, seamHeld{"k4", e, "t4", 60})
}

// TestSeamContractMemDemote: the in-memory log applies a command that was
// in flight when its core was demoted: nothing is answered; the core
// promoted from the applied state holds it with its token, and grants
// above it.
func TestSeamContractMemDemote(t *testing.T) {
	l, ml := seamMem(t, NewFakeClock(), false)
	sh := ml.sh
	r := newSeamRun(t, l.pump)
	a := r.session(l.s, "a", 'A')
	a.acq(1, "k", 0, 10)
	r.expect(on(a, wG(1, "t1")))
	a.acq(2, "k2", 0, 10)
	sh.mu.Lock()
	sh.core.Demote()
	sh.mu.Unlock()
	for ml.apply() {
	}
	r.check() // (apply carries out the effects before it returns)
	h, ok := ml.m.Holding("k2")
	if !ok || h.Token <= r.tok("t1") {
		t.Fatalf("the grant in flight applied as %+v (held %v)", h, ok)
	}
	r.toks["t2"], r.max = h.Token, h.Token

	sh.mu.Lock()
	sh.core.Promote(l.s.shardNow(sh), ml.m.Holdings(), 0)
	l.s.rearm(sh)
	sh.mu.Unlock()
	b, a2 := r.session(l.s, "b", 'B'), r.session(l.s, "a2", 'A')
	b.acq(1, "k2", 0, 10)
	b.acq(2, "k3", 0, 10)
	a2.acq(1, "k2", 0, 10)
	r.expect(on(b, wT(1), wG(2, "t3")), on(a2, wG(1, "t2")))
	r.final(l, seamHeld{"k", a, "t1", 10}, seamHeld{"k2", a, "t2", 10}, seamHeld{"k3", b, "t3", 10})
}
