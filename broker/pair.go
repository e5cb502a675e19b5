package broker

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// pair decides which addresses the sessions may dial: it makes the broker
// the witness of a Binary Star pair (see "Hot-standby pairs" in the
// package documentation).
//
// Until a node answers HELLO_OK with role 2 (active of a pair), every
// session dials its address as it always did, except at start: the
// sessions to the other addresses wait until the first address's first
// attempt has ended (or PairSettle has passed), so that a pair whose
// first address is the active is never contacted on its other node.
//
// From the first role 2 on (for the life of the broker), one node is the
// target: the only one whose sessions may dial. It is the active while it
// serves, and stays the target while it is lost (dropped, or failing to
// open), until it has been lost for PairSettle with no attempt to it in
// flight: then the next node of Addrs becomes the target. An M whose hint
// names another listed node moves the target there at once (the node that
// says so has stopped serving), except that a node reached by a hint does
// not pass its own hint on until it has served (two passives naming each
// other cannot make the broker alternate without the settle delay), and a
// hint naming the node deserted after the settle delay is not followed
// (the hinting node has not seen yet what the broker saw: it is lost).
type pair struct {
	b      *Broker
	settle time.Duration
	nodes  []*node // the distinct nodes, in Addrs order
	first  *node   // the node of Addrs[0]

	mu sync.Mutex
	// changed is closed and replaced on every change that may let a
	// waiting session dial (see wait).
	changed chan struct{}
	// startDone: the first node's first attempt has ended; startBy: the
	// start gate opens then at the latest.
	startDone bool
	startBy   time.Time
	on        bool  // a HELLO_OK with role 2 was seen
	target    *node // pair mode: the only node whose sessions may dial
	// lostAt: pair mode, since when the target has not served; zero while
	// it serves. A new target counts as lost from when it became the
	// target (see moveLocked), until it serves.
	lostAt time.Time
	// byHint: the target was chosen by a hint and has not served since.
	byHint bool
	// deserted: the node left after the settle delay, until a target
	// serves.
	deserted *node
	// moves: targets moved to after a settle delay since a target last
	// served (for the log level).
	moves int
	// pending: log lines to write once p.mu is released (see later).
	pending []func()
}

// Fields of node guarded by pair.mu.
type nodePair struct {
	addr     string
	attempts int // opens in flight
	ready    int // ready sessions
	// became counts the times the node became the target (moveLocked):
	// a session whose next attempt follows such a swing restarts its
	// backoff (see wait).
	became uint64
}

// minPairRetry bounds the pair retry pace from below (see retryPace), so
// that a tiny PairSettle cannot make a session redial in a tight loop.
const minPairRetry = 10 * time.Millisecond

// retryPace is the longest pause between two attempts to the target in
// pair mode: a quarter of PairSettle (half a heartbeat when PairSettle
// is two of the pair's heartbeats, as advised; 500 ms by default), at
// least minPairRetry. The broker cannot know the servers' heartbeat (no
// frame carries it), but PairSettle is set from it. A passive takes over
// at the first client HELLO after its peer has been silent for two
// heartbeats, so retrying it at this pace reaches it within half a
// heartbeat of its being able to take over, rather than after a backoff
// grown to BackoffMax; and a lost active that comes back within the
// settle delay is found as soon.
func (p *pair) retryPace() time.Duration { return max(p.settle/4, minPairRetry) }

func newPair(b *Broker, nodes []*node, settle time.Duration) *pair {
	return &pair{
		b: b, settle: settle, nodes: nodes, first: nodes[0],
		changed: make(chan struct{}),
		startBy: time.Now().Add(settle),
	}
}

// later runs f (a log line) after p.mu is released: the Logger's
// handler, user code, never runs under the lock. Called under p.mu.
func (p *pair) later(f func()) { p.pending = append(p.pending, f) }

// unlock releases p.mu and runs what later left.
func (p *pair) unlock() {
	pending := p.pending
	p.pending = nil
	p.mu.Unlock()
	for _, f := range pending {
		f()
	}
}

func (p *pair) broadcastLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// wait blocks until s may dial its address, and counts the attempt that
// follows as in flight (opened or failed ends it). It returns false if
// the broker closed first. swung says that s's node became the target
// (the pair swung to it) since s's previous attempt: the session then
// restarts its backoff, so that the node it is sent to is tried from the
// shortest backoff, whatever its backoff grew to while it was not the
// target or during an earlier swing.
func (p *pair) wait(s *session) (ok, swung bool) {
	for {
		p.mu.Lock()
		now := time.Now()
		var wake time.Time
		if p.on {
			p.settledLocked(now)
			if s.node == p.target {
				s.node.p.attempts++
				swung = s.pairSeen != s.node.p.became
				s.pairSeen = s.node.p.became
				p.unlock()
				return true, swung
			}
			// Wake when the settle delay ends; once it has ended, only a
			// change can help (an attempt to the target ending).
			if end := p.lostAt.Add(p.settle); !p.lostAt.IsZero() && now.Before(end) {
				wake = end
			}
		} else {
			if s.node == p.first || p.startDone || !now.Before(p.startBy) {
				s.node.p.attempts++
				p.unlock()
				return true, false
			}
			wake = p.startBy
		}
		ch := p.changed
		p.unlock()
		var t *time.Timer
		var tc <-chan time.Time
		if !wake.IsZero() {
			t = time.NewTimer(max(time.Until(wake), 0))
			tc = t.C
		}
		closed := false
		select {
		case <-ch:
		case <-tc:
		case <-p.b.ctx.Done():
			closed = true
		}
		if t != nil {
			t.Stop()
		}
		if closed {
			return false, false
		}
	}
}

// settledLocked moves the target to the next node once it has been lost
// for the settle delay with no attempt to it in flight (an attempt that
// succeeds would make it serve again: the broker never dials the other
// node while one to the active may still answer).
func (p *pair) settledLocked(now time.Time) {
	t := p.target
	if len(p.nodes) < 2 || p.lostAt.IsZero() || now.Sub(p.lostAt) < p.settle || t.p.attempts > 0 || t.p.ready > 0 {
		return
	}
	// The next node in Addrs order, passing over the nodes found to
	// belong to another cluster (no failover target: see checkCluster);
	// if every other node is one, the lost target stays.
	next := t
	for i, n := range p.nodes {
		if n != t {
			continue
		}
		for j := 1; j < len(p.nodes); j++ {
			if c := p.nodes[(i+j)%len(p.nodes)]; !c.foreign.Load() {
				next = c
				break
			}
		}
	}
	if next == t {
		return
	}
	lostFor := now.Sub(p.lostAt)
	p.moveLocked(next, now, false)
	p.deserted = t
	// The first move of an outage at Warn, the others (one per settle
	// delay while no node serves) at Debug: a long outage of both nodes
	// logs a bounded number of lines.
	lvl := slog.LevelDebug
	if p.moves == 0 {
		lvl = slog.LevelWarn
	}
	p.moves++
	moves := p.moves
	p.later(func() {
		p.b.log.Log(p.b.ctx, lvl, "broker: pair: active lost for the settle delay; trying the other node",
			"lost", t.p.addr, "lost_for", lostFor.Round(time.Millisecond), "settle", p.settle, "next", next.p.addr, "moves", moves)
	})
}

// moveLocked makes n the target, not serving yet: the settle delay counts
// from now. Its sessions dial at once (those in a backoff are poked), from
// the shortest backoff (see wait).
func (p *pair) moveLocked(n *node, now time.Time, byHint bool) {
	p.target, p.lostAt, p.byHint = n, now, byHint
	n.p.became++
	for _, o := range p.b.sessions {
		if o.node == n {
			select {
			case o.poke <- struct{}{}:
			default:
			}
		}
	}
	p.broadcastLocked()
}

// hintLocked returns the node that err's M hint names, if the pair
// follows it: a listed node other than from, from not reached by a hint
// (and not served since), and not the node deserted after the settle
// delay. Called for the target only.
func (p *pair) hintLocked(from *node, err error) *node {
	var na *NotActiveError
	if !errors.As(err, &na) || na.Hint == "" || p.byHint {
		return nil
	}
	h, nerr := normalizeAddr(na.Hint)
	if nerr != nil {
		return nil
	}
	for _, n := range p.nodes {
		if n.p.addr == h && n != from && n != p.deserted && !n.foreign.Load() {
			return n
		}
	}
	return nil
}

// followLocked moves the target to the node err's hint names, if the pair
// follows it (see hintLocked), and reports whether it did.
func (p *pair) followLocked(from *node, err error, now time.Time) bool {
	n := p.hintLocked(from, err)
	if n == nil {
		return false
	}
	p.moveLocked(n, now, true)
	p.later(func() { p.b.log.Debug("broker: pair: following M hint", "addr", from.p.addr, "hint", n.p.addr) })
	return true
}

// failed ends an attempt of s that failed with err. fallback says that
// it was a version-2 HELLO answered E(2), which the session retries at
// once with version 1: no failure of the node. It reports whether the
// broker is in pair mode, where the pair, not followHint, follows M
// hints.
func (p *pair) failed(s *session, err error, fallback bool) bool {
	p.mu.Lock()
	defer p.unlock()
	now := time.Now()
	s.node.p.attempts--
	if fallback {
		p.broadcastLocked()
		return p.on
	}
	if s.node == p.first && !p.startDone {
		p.startDone = true
		p.broadcastLocked()
	}
	if !p.on {
		return false
	}
	if s.node == p.target && s.node.p.ready == 0 {
		if p.lostAt.IsZero() {
			p.lostAt = now
		}
		p.followLocked(s.node, err, now)
	}
	p.broadcastLocked() // an attempt fewer in flight: a settle may be due
	return true
}

// opened ends an attempt of s that opened c, and reports whether c is
// used: then s.cur is c. A HELLO_OK with role 2 turns pair mode on, with
// c's node as target (the ready sessions to other nodes are closed). In
// pair mode only the target's sessions are used: a session opened to
// another node (a second active: a split brain, or a node that was slow
// to answer) is not, and is closed by the caller.
func (p *pair) opened(s *session, c *conn) bool {
	p.mu.Lock()
	s.node.p.attempts--
	if s.node == p.first {
		p.startDone = true
	}
	var others []*conn
	if !p.on && c.role == wire.RoleActive {
		p.on, p.target = true, s.node
		for _, o := range p.b.sessions {
			if o.node != s.node {
				if oc := o.cur.Load(); oc != nil {
					others = append(others, oc)
				}
			}
		}
		if len(p.nodes) > 1 {
			p.later(func() {
				p.b.log.Info("broker: pair: active found; the other addresses are dialled only after losing it for the settle delay",
					"addr", s.addr, "node", c.nodeName, "settle", p.settle)
			})
		}
	}
	admit := !p.on || s.node == p.target
	if admit {
		if p.on {
			p.lostAt, p.byHint, p.deserted, p.moves = time.Time{}, false, nil, 0
		}
		s.node.p.ready++
		s.cur.Store(c)
	}
	p.broadcastLocked()
	target := p.target
	p.unlock()
	for _, oc := range others {
		oc.fail(oc.s.errorf(nil, "closed: %s is the active of a pair, this node is not used while it serves", s.addr))
	}
	if !admit {
		p.b.log.Warn("broker: pair: a node other than the active answered HELLO; not used",
			"addr", s.addr, "node", c.nodeName, "role", c.role, "active", target.p.addr)
	}
	return admit
}

// dropped ends c, a ready session of s, which ended with err. It reports
// whether the broker is in pair mode, where the pair, not followHint and
// probeOthers, decides what to dial next: when the target lost its last
// ready session, the target stays (its sessions retry it) and the settle
// delay counts from now, unless an M hint moves the target at once.
func (p *pair) dropped(s *session, err error) bool {
	p.mu.Lock()
	defer p.unlock()
	now := time.Now()
	s.node.p.ready--
	if !p.on {
		return false
	}
	if s.node == p.target && s.node.p.ready == 0 {
		if !p.followLocked(s.node, err, now) {
			p.lostAt = now
			p.broadcastLocked()
		}
	}
	return true
}
