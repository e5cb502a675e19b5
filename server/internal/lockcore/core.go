package lockcore

import (
	"container/heap"
	"math"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/google/btree"
)

const (
	secondNs = int64(time.Second)
	msNs     = int64(time.Millisecond)
	// IdleTTL is how long a free entry is kept for reuse.
	IdleTTL = int64(2 * time.Second)
	// NoDeadline is the deadline of a waiter that has none (a grant at
	// once), and what Next returns when nothing is due.
	NoDeadline = math.MaxInt64
)

// Config is a Core's settings.
type Config struct {
	// Capacity is shared by the server's cores (required).
	Capacity *Capacity
	// MaxKeyWaiters bounds one key's queue.
	MaxKeyWaiters int
	// MaxPending bounds the commands of requests in flight (proposed, not
	// yet applied; the ends of leases are not counted): past it an
	// ACQUIRE of a free key is answered B. 0: no bound.
	MaxPending int
	// MaxCommit: a grant applied more than this after it was proposed is
	// answered B and freed again (a leader stalled while another restarted
	// the lease from an earlier instant). 0: no bound.
	MaxCommit int64
	// EarlyRelease answers a RELEASE R as soon as its Free is proposed,
	// before it applies (an opt-in deviation: see the server's docs).
	EarlyRelease bool
	// TokenWait: an ACQUIRE of a free key whose grant applied without a
	// token that may come soon (Result.Retry: the token store is writing
	// its next reservation) waits for one this long (ns) as a token
	// waiter: counted among the waiters (MaxWaiters), answered T by a
	// CANCEL, decided again at TokensReady, B (NoToken) once the time is
	// up. 0: no such wait; the ACQUIRE is answered B (NoToken) at once.
	TokenWait int64
}

// Core is the lock scheduler over a set of keys (see the package doc).
// It is not safe for concurrent use: its driver serialises every call.
type Core struct {
	cfg   Config
	log   Proposer
	m     map[string]*entry
	idx   *btree.BTreeG[*entry] // m's keys in order, for the lock browser (Scan)
	lists [numLists]expList
	// nonempty has bit i set while lists[i] has entries.
	nonempty [(numLists + 63) / 64]uint64
	waits    waitHeap
	keys     keyHeap
	fx       []Effect
	tokenq   []*Waiter   // token waiters, oldest first (TokenWait)
	out      []*Proposal // the commands of the last event, not yet handed to the log (drain)
	spare    *Proposal   // recycled proposals
	nheld    int64       // projected holdings (counted in Capacity.Held)
	nwait    int64       // queued waiters (counted in Capacity.Waiters)
	pending  int         // proposals in flight
	expiring int         // of pending, the expiries
	gen      uint64      // Demote's count: a proposal of an earlier one is not awaited
}

// New returns a Core that proposes its commands to log.
func New(cfg Config, log Proposer) *Core {
	return &Core{cfg: cfg, log: log, m: make(map[string]*entry), idx: newEntryIndex()}
}

// Acquire is an ACQUIRE, well-formed and in range (the session's reader
// checked it).
type Acquire struct {
	S         Session
	ReqID     uint32
	Key       []byte
	Owner     Owner
	LeaseS    uint8
	WaitS     uint8
	OwnedOnly bool  // a grant may be freed only by RELEASE_OWNED
	Arrived   int64 // when the whole frame was read: wait_s counts from it
	// By is the driver's number for S, to which the commands the ACQUIRE
	// causes are charged (Proposal.By); 0: none. A number, not the
	// session: a holding outlives its session.
	By uint64
	// Client is S's identity for the lock browser (Locks, Lock): one per
	// session, shared by its holdings and waiters (nil: none).
	Client *Client

	tokenBy int64 // a token waiter decided again: the end of its token wait (its answers are Queued)
}

// Release is a RELEASE, or with Owned a RELEASE_OWNED.
type Release struct {
	S     Session
	ReqID uint32
	Key   []byte
	Token uint64
	Owner Owner
	Owned bool
	By    uint64 // as Acquire.By
}

// Extend is an EXTEND (protocol version 3), well-formed and in range.
type Extend struct {
	S      Session
	ReqID  uint32
	Key    []byte
	Token  uint64
	Owner  Owner
	LeaseS uint8
	By     uint64 // as Acquire.By
}

// Effects hands the commands of the last event to the log, in the order
// the event made them, then returns the event's effects (those of the
// commands the log applied at once included), valid until the next
// event. An event only decides and records: it calls no Proposer; the
// driver reads Effects after each event, as go.etcd.io/raft's Ready is
// read after each step.
func (c *Core) Effects() []Effect {
	c.drain()
	return c.fx
}

// drain hands each command of out to the log: one applied at once has
// its outcome carried out now (as of the instant it was proposed, which
// may propose more: they follow in turn); one that is not is in flight.
func (c *Core) drain() {
	for i := 0; i < len(c.out); i++ {
		p := c.out[i]
		c.out[i] = nil
		if c.log.Propose(p) {
			c.apply(p, &p.res, p.at)
		} else {
			c.inFlight(p)
		}
	}
	c.out = c.out[:0]
}

// begin starts an event: the last event's commands are handed to the log
// (should its effects not have been read), and its effects are done with.
func (c *Core) begin() {
	if len(c.out) > 0 {
		c.drain()
	}
	c.fx = c.fx[:0] // (the references left in it are overwritten by the next effects)
}

func (c *Core) emit(e Effect) { c.fx = append(c.fx, e) }

func (c *Core) reply(k Kind, g *grantee, why Why) {
	c.emit(Effect{Kind: k, Why: why, S: g.s, ReqID: g.reqID, Queued: g.recorded()})
}

// Acquire decides an ACQUIRE.
func (c *Core) Acquire(now int64, a *Acquire) {
	c.begin()
	c.acquire(now, a)
}

func (c *Core) acquire(now int64, a *Acquire) {
	e := c.m[string(a.Key)]
	if e != nil && e.held && e.token != 0 && now >= e.end {
		c.free(e, FreeExpire, nil, 0, 0, e.owner, now)
	}
	res := decide(e != nil && e.held, ownerOf(e), &a.Owner)
	if res == GrantNew {
		if c.cfg.MaxPending > 0 && c.pending-c.expiring >= c.cfg.MaxPending {
			c.emit(Effect{Kind: Busy, Why: Backlog, S: a.S, ReqID: a.ReqID, Queued: a.tokenBy != 0})
			return
		}
		if !c.cfg.Capacity.takeHeld() {
			c.emit(Effect{Kind: Busy, Why: Full, S: a.S, ReqID: a.ReqID, Queued: a.tokenBy != 0})
			return
		}
		c.nheld++
		if e == nil {
			e = &entry{key: string(a.Key)}
			c.m[e.key] = e
			c.idx.ReplaceOrInsert(e)
		} else {
			c.unlink(e) // idle
		}
		e.held, e.owner, e.lease, e.ownedOnly, e.token = true, a.Owner, a.LeaseS, a.OwnedOnly, 0
		e.client = a.Client
		e.setBy(a.By)
		p := c.proposal(e, a.By, now)
		p.to.from(a) // (field by field: this is every grant's path)
		p.hasTo = true
		p.first = true
		c.propose(p)
		return
	}
	g := a.grantee()
	if res == GrantRetry {
		// The holder's retry: its token, the lease not extended; or, while
		// its grant is in flight, the grant's answer.
		if e.token != 0 {
			c.emit(Effect{Kind: Granted, Why: Again, S: a.S, ReqID: a.ReqID, Token: e.token, Queued: a.tokenBy != 0})
			return
		}
		w := &Waiter{g: g, e: e, proposed: true}
		w.g.queued = true
		pend := e.x.pend // (token 0: its grant is in flight)
		pend.retries = append(pend.retries, w)
		c.emit(Effect{Kind: Queue, S: a.S, ReqID: a.ReqID, W: w})
		return
	}
	if a.WaitS == 0 {
		c.reply(TimedOut, &g, NoWait)
		return
	}
	q := e.q
	var old *Waiter
	if q != nil {
		old = q.byOwner[a.Owner]
	}
	if old == nil {
		if q != nil && q.n >= c.cfg.MaxKeyWaiters || !c.cfg.Capacity.TakeWaiter() {
			c.reply(Busy, &g, Full)
			return
		}
		c.nwait++
	}
	g.deadline = a.Arrived + int64(a.WaitS)*secondNs
	g.queued = true
	w := &Waiter{g: g, e: e}
	if q == nil {
		q = &queue{byOwner: make(map[Owner]*Waiter, 1)}
		e.q = q
		if e.token != 0 {
			c.watchKey(e)
		}
	}
	if old == nil {
		q.push(w)
	} else {
		// The same owner's earlier ACQUIRE of the key (a deliberate
		// retry, perhaps on another session): w takes its place, old is
		// answered T.
		q.replace(old, w)
		old.done = true
		c.unwatchWaiter(old)
		c.reply(TimedOut, &old.g, Replaced)
	}
	heap.Push(&c.waits, w)
	c.emit(Effect{Kind: Queue, S: a.S, ReqID: a.ReqID, W: w})
}

// from sets g from a, as a.grantee() would.
func (g *grantee) from(a *Acquire) {
	g.s, g.by, g.reqID, g.owner, g.lease, g.ownedOnly = a.S, a.By, a.ReqID, a.Owner, a.LeaseS, a.OwnedOnly
	g.client = a.Client
	g.arrived, g.deadline, g.queued = a.Arrived, NoDeadline, false
	g.waitS, g.tokenBy = a.WaitS, a.tokenBy
}

func (a *Acquire) grantee() (g grantee) {
	g.from(a)
	return g
}

func ownerOf(e *entry) *Owner {
	if e == nil {
		return nil
	}
	return &e.owner
}

// Release decides a RELEASE or RELEASE_OWNED.
func (c *Core) Release(now int64, r *Release) {
	c.begin()
	e := c.m[string(r.Key)]
	if e != nil && e.held && e.token != 0 && now >= e.end {
		// The lease ended: N, once the expiry applies (a deposed leader
		// cannot apply it, and so never says N for a lock its successor
		// restarted).
		c.free(e, FreeExpire, r.S, r.By, r.ReqID, e.owner, now)
		return
	}
	kind := uint8(FreeRelease)
	if r.Owned {
		kind = FreeReleaseOwned
	}
	if e == nil || !mayFree(kind, r.Token, &r.Owner, e.held, e.token, &e.owner, e.ownedOnly) {
		c.notHeld(e, r.Token, r.S, r.ReqID, 0)
		return
	}
	c.free(e, kind, r.S, r.By, r.ReqID, r.Owner, now)
}

// Extend is an EXTEND: if the key's holding has x's token and owner and
// its lease has not ended, its lease ends no earlier than x.LeaseS after
// now (the later of its end and that instant: never shortened) and the
// holding's lease_s becomes x.LeaseS, answered K once the Extend command
// applies; otherwise N. If the lease ended, its expiry is proposed and the
// EXTEND answered N once it applies (as a RELEASE is: a deposed leader
// cannot apply it, so never says N for a lock its successor restarted).
//
// When the current end is later than now + x.LeaseS, the end stays, and
// so does lease_s: a takeover restarts each lease at its holding's lease_s
// (Promote), which must not end before the end its holder was told.
func (c *Core) Extend(now int64, x *Extend) {
	c.begin()
	e := c.m[string(x.Key)]
	if e != nil && e.held && e.token != 0 && e.token == x.Token && now >= e.end {
		c.free(e, FreeExpire, x.S, x.By, x.ReqID, e.owner, now)
		return
	}
	if e == nil || !mayExtend(x.Token, &x.Owner, e.held, e.token, &e.owner) {
		c.notHeld(e, x.Token, x.S, x.ReqID, 0)
		return
	}
	if end := now + int64(x.LeaseS)*secondNs; end > e.end {
		c.unlink(e)
		e.end, e.lease = end, x.LeaseS
		c.link(e, uint16(x.LeaseS))
		if e.q != nil {
			c.watchKey(e)
		}
	}
	p := c.proposal(e, x.By, now)
	p.extend, p.tok, p.owner, p.elease, p.rc, p.rid = true, e.token, e.owner, e.lease, x.S, x.ReqID
	c.propose(p)
}

// Expire is an operator's "expire now" of a key (an admin request, not a
// session's): its answer goes to S, under ReqID.
type Expire struct {
	S     Session
	ReqID uint32
	Key   []byte
	Token uint64 // the exact token the key must be held with
	By    uint64 // as Acquire.By (0: none)
}

// Expire ends x.Key's lease now if the key is held with x.Token, exactly
// as when the lease ends: a Free of kind FreeExpire, with the grant to
// the oldest live waiter whose wait has not ended, if any, in the same
// command, so that waiter gets a new token, above the old one, and the
// old holder's RELEASE and EXTEND get N. It is answered Ended once the
// Free applies. A key held with another token (or whose grant is in
// flight) is answered NotHeld with Why OtherToken, a key not held
// NotHeld; so is a key whose lease has already ended, once that end,
// proposed now, applies (as a RELEASE that finds the lease ended).
func (c *Core) Expire(now int64, x *Expire) {
	c.begin()
	e := c.m[string(x.Key)]
	if e != nil && e.held && e.token != 0 && now >= e.end {
		c.free(e, FreeExpire, x.S, x.By, x.ReqID, e.owner, now)
		return
	}
	if e == nil || !mayFree(FreeExpire, x.Token, &e.owner, e.held, e.token, &e.owner, e.ownedOnly) {
		var why Why
		if e != nil && e.held {
			why = OtherToken
		}
		c.notHeld(e, x.Token, x.S, x.ReqID, why)
		return
	}
	c.free(e, freeForced, x.S, x.By, x.ReqID, e.owner, now)
}

// notHeld answers N (with why) to request rid of s naming token, which
// does not hold e's key (e may be nil): once e's Free in flight of that
// token applies, if there is one (that holding's end is in flight), else
// now.
func (c *Core) notHeld(e *entry, token uint64, s Session, rid uint32, why Why) {
	if f := e.freeingOf(); f != nil && f.tok == token {
		f.late = append(f.late, lateRelease{s, rid})
		return
	}
	c.emit(Effect{Kind: NotHeld, Why: why, S: s, ReqID: rid})
}

// extended carries out an Extend's outcome: K, or (not reached) N and a
// Desync.
func (c *Core) extended(e *entry, p *Proposal, r *Result) {
	if r.Kept {
		c.emit(Effect{Kind: Kept, S: p.rc, ReqID: p.rid})
		return
	}
	c.emit(Effect{Kind: NotHeld, S: p.rc, ReqID: p.rid})
	c.emit(Effect{Kind: Desync, Err: &DesyncError{e.key}})
}

// Cancel removes w, if it still waits in a queue, and answers it T. A
// waiter whose grant is in flight, or already answered, is left alone.
func (c *Core) Cancel(now int64, w *Waiter) bool {
	c.begin()
	if w.done || w.proposed {
		return false
	}
	c.dropWaiter(w)
	c.reply(TimedOut, &w.g, Cancelled)
	return true
}

// Drop removes w, of a closing session, without a reply. It emits nothing
// and may be called while the last event's effects are being carried out.
func (c *Core) Drop(w *Waiter) {
	if !w.done && !w.proposed {
		c.dropWaiter(w)
	}
}

// dropWaiter removes w from its queue, or from the token waiters.
func (c *Core) dropWaiter(w *Waiter) {
	if w.tok {
		c.dropToken(w)
		return
	}
	c.dropQueued(w)
}

// awaitToken makes the ACQUIRE g, whose grant of e's key applied with no
// token yet (err says why), a token waiter until its token wait ends; past
// that end it is B (NoToken), as is one of a closing session, and so is
// one the waiters' bound refuses (Full).
func (c *Core) awaitToken(e *entry, g *grantee, err error, now int64) {
	by := g.tokenBy
	if by == 0 {
		by = now + c.cfg.TokenWait
	}
	queued := g.recorded()
	if now >= by || !g.s.Live() {
		// (A session that closed while the grant was in flight is
		// answered, not made to wait: nothing would drop its waiter.)
		c.emit(Effect{Kind: Busy, Why: NoToken, S: g.s, ReqID: g.reqID, Queued: queued, Err: err})
		return
	}
	if !c.cfg.Capacity.TakeWaiter() {
		c.emit(Effect{Kind: Busy, Why: Full, S: g.s, ReqID: g.reqID, Queued: queued})
		return
	}
	c.nwait++
	w := &Waiter{g: *g, e: e, tok: true, err: err}
	w.g.tokenBy, w.g.deadline, w.g.queued = by, by, true
	c.tokenq = append(c.tokenq, w)
	heap.Push(&c.waits, w)
	c.emit(Effect{Kind: Queue, S: g.s, ReqID: g.reqID, W: w})
}

// dropToken removes w from the token waiters.
func (c *Core) dropToken(w *Waiter) {
	if i := slices.Index(c.tokenq, w); i >= 0 {
		c.tokenq = slices.Delete(c.tokenq, i, i+1)
	}
	c.nwait--
	c.cfg.Capacity.Waiters.Add(-1)
	w.done = true
	c.unwatchWaiter(w)
}

// TokensReady is the driver's word that the token store's reservation
// ended (done, or failed): every token waiter, oldest first, is decided
// again, as the key is now (granted, queued, T, or a token waiter again
// until its token wait ends); those of closing sessions are dropped.
func (c *Core) TokensReady(now int64) {
	c.begin()
	ws := c.tokenq
	c.tokenq = nil
	for _, w := range ws {
		if w.done {
			continue
		}
		c.dropToken(w)
		if !w.g.s.Live() {
			continue
		}
		a := Acquire{S: w.g.s, ReqID: w.g.reqID, Key: []byte(w.e.key), Owner: w.g.owner, LeaseS: w.g.lease,
			WaitS: w.g.waitS, OwnedOnly: w.g.ownedOnly, Arrived: w.g.arrived, By: w.g.by,
			Client: w.g.client, tokenBy: w.g.tokenBy}
		c.acquire(now, &a)
	}
}

// TokenWaiters is the number of token waiters (TokenWait).
func (c *Core) TokenWaiters() int { return len(c.tokenq) }

func (c *Core) dropQueued(w *Waiter) {
	e := w.e
	e.q.remove(w)
	c.nwait--
	c.cfg.Capacity.Waiters.Add(-1)
	w.done = true
	c.unwatchWaiter(w)
	if e.q.head == nil {
		c.unwatchKey(e)
		e.q = nil
	}
}

// Next is the earliest instant at which Tick has a waiter to answer or a
// contended key's lease to end (NoDeadline: none). A driver keeps a timer
// at it.
func (c *Core) Next() int64 {
	n := int64(NoDeadline)
	if len(c.waits) > 0 {
		n = c.waits[0].g.deadline
	}
	if len(c.keys) > 0 {
		n = min(n, c.keys[0].end)
	}
	return n
}

// NextExpiry is the earliest end of any lease, or of an idle entry's
// reuse (NoDeadline: none). Leases of keys without waiters need not end
// on time (every request checks the lease first); a driver that wants
// them ended promptly (a replicated one: the followers' state, a
// takeover's restart) keeps a timer at it, others sweep now and then.
func (c *Core) NextExpiry() int64 {
	n := int64(NoDeadline)
	for w, bitsSet := range c.nonempty {
		for bitsSet != 0 {
			i := w<<6 + bits.TrailingZeros64(bitsSet)
			bitsSet &= bitsSet - 1
			n = min(n, c.lists[i].head.end)
		}
	}
	return n
}

// Tick does everything due at now: waiters whose wait ended get T, every
// lease that ended is freed (and granted to the next waiter), and idle
// entries past their reuse are forgotten.
func (c *Core) Tick(now int64) {
	c.begin()
	for len(c.waits) > 0 && c.waits[0].g.deadline <= now {
		w := c.waits[0]
		if w.tok {
			// Its token wait ended with no token: B, with the last reason.
			c.dropToken(w)
			c.emit(Effect{Kind: Busy, Why: NoToken, S: w.g.s, ReqID: w.g.reqID, Queued: true, Err: w.err})
			continue
		}
		c.dropQueued(w)
		c.reply(TimedOut, &w.g, WaitEnded)
	}
	for i := 0; i < numLists; i++ {
		if c.nonempty[i>>6]&(1<<(i&63)) == 0 {
			if c.nonempty[i>>6]>>(i&63) == 0 {
				i |= 63 // no more bits in this word
			}
			continue
		}
		l := &c.lists[i]
		for e := l.head; e != nil && e.end <= now; e = l.head {
			if i == idleList {
				c.unlink(e)
				if !e.held && e.q == nil && !e.inFlight() && c.m[e.key] == e {
					delete(c.m, e.key)
					c.idx.Delete(e)
				}
				continue
			}
			c.free(e, FreeExpire, nil, 0, 0, e.owner, now)
		}
	}
}

// proposal returns a proposal of a command on e charged to by: a Grant,
// with no recipient yet. (A recycled one is reset field by field, not
// zeroed whole: it is on every grant's path.)
func (c *Core) proposal(e *entry, by uint64, now int64) *Proposal {
	p := c.spare
	if p == nil {
		p = new(Proposal)
	} else {
		c.spare, p.next = p.next, nil
		p.free, p.hasTo, p.inFlight, p.expiry, p.extend, p.forced, p.first = false, false, false, false, false, false, false
		p.tok, p.fkind, p.rid = 0, 0, 0
	}
	p.e, p.by, p.at, p.gen = e, by, now, c.gen
	return p
}

// propose records p, a command of this event, for the log: Effects hands
// it over once the event has ended (drain).
func (c *Core) propose(p *Proposal) { c.out = append(c.out, p) }

// inFlight is what follows a command the log did not apply at once: it
// counts as in flight, an ACQUIRE whose grant it is is tracked (Track),
// and a Free's releaser may be answered at once (EarlyRelease).
func (c *Core) inFlight(p *Proposal) {
	p.inFlight = true
	c.pending++
	if p.expiry {
		c.expiring++
	}
	e := p.e
	if p.first {
		e.ext().pend = p
		p.to.queued = true
		c.emit(Effect{Kind: Track, S: p.to.s, ReqID: p.to.reqID})
		return
	}
	if !p.free {
		return
	}
	e.ext().freeing = p
	if c.cfg.EarlyRelease && p.rc != nil && p.fkind != FreeExpire {
		// R now: the log's order has decided it (the Free is behind
		// everything granted before, and any grant of the key goes behind
		// it). If it never applies, the holding stays until its lease
		// ends, as if its holder had died: no token or exclusion changes.
		c.emit(Effect{Kind: Released, S: p.rc, ReqID: p.rid})
		p.rc = nil
	}
}

// freeForced is free's kind for an Expire: a Free of kind FreeExpire whose
// requester (rc) is answered Ended.
const freeForced = FreeExpire + 1

// free ends e's holding (an expiry, a RELEASE by rc, or with freeForced
// an Expire by rc), with the grant to the oldest live waiter whose wait
// has not ended, if any, in the same command.
func (c *Core) free(e *entry, kind uint8, rc Session, rby uint64, rid uint32, owner Owner, now int64) {
	forced := kind == freeForced
	if forced {
		kind = FreeExpire
	}
	c.unlink(e)
	c.unwatchKey(e)
	by := e.by()
	if rc != nil {
		by = rby
	}
	p := c.proposal(e, by, now)
	p.free, p.tok, p.fkind, p.owner, p.rc, p.rid, p.expiry = true, e.token, kind, owner, rc, rid, rc == nil
	p.forced = forced
	if w := c.nextWaiter(e, now); w != nil {
		p.to, p.hasTo = w.g, true
		e.owner, e.lease, e.ownedOnly, e.token, e.client = w.g.owner, w.g.lease, w.g.ownedOnly, 0, w.g.client
		e.setBy(w.g.by)
	} else {
		e.held, e.token, e.client = false, 0, nil
		c.nheld--
		c.cfg.Capacity.Held.Add(-1)
	}
	if p.hasTo {
		// Recorded now: this event may meet the grant again (an ACQUIRE
		// of its recipient's owner, after the expiry it decided first).
		x := e.ext()
		x.freeing, x.pend = p, p
	}
	c.propose(p)
}

// nextWaiter takes the oldest waiter of e that is live and whose wait has
// not ended; the others it passes are dropped (T if their wait ended).
func (c *Core) nextWaiter(e *entry, now int64) *Waiter {
	q := e.q
	if q == nil {
		return nil
	}
	for q.head != nil {
		w := q.head
		c.dropQueued(w)
		if !w.g.s.Live() {
			continue
		}
		if now >= w.g.deadline {
			// Its wait ended before its timer could run: not granted in
			// time, and its client has given up. T, never a grant nobody
			// uses.
			c.reply(TimedOut, &w.g, WaitEnded)
			continue
		}
		w.proposed = true
		return w
	}
	return nil
}

// Applied is the outcome of p, a command in flight.
func (c *Core) Applied(now int64, p *Proposal, r Result) {
	c.begin()
	if !p.inFlight || p.gen != c.gen {
		return
	}
	p.inFlight = false
	c.pending--
	if p.expiry {
		c.expiring--
	}
	c.apply(p, &r, now)
}

// apply carries out p's outcome, then recycles p: nothing refers to a
// proposal once it has applied.
func (c *Core) apply(p *Proposal, r *Result, now int64) {
	c.outcome(p, r, now)
	if len(p.late) > 0 {
		clear(p.late)
		p.late = p.late[:0]
	}
	if len(p.retries) > 0 {
		clear(p.retries)
		p.retries = p.retries[:0]
	}
	p.to.s, p.rc = nil, nil // no closed session kept alive by the pool
	p.next, c.spare = c.spare, p
}

func (c *Core) outcome(p *Proposal, r *Result, now int64) {
	e := p.e
	if p.extend {
		c.extended(e, p, r)
		return
	}
	if !p.free {
		c.granted(e, p, r, now)
		return
	}
	if e.x != nil && e.x.freeing == p {
		e.x.freeing = nil
	}
	if !r.Freed {
		// Not reached: the projection said the token held the key.
		if p.rc != nil {
			c.emit(Effect{Kind: NotHeld, S: p.rc, ReqID: p.rid})
		}
		if p.hasTo {
			// Nor is its grant made: answered (with its holder's retries),
			// and the key projected free, as the Free meant it, until Resync.
			if e.x != nil && e.x.pend == p {
				e.x.pend, e.held = nil, false
				c.nheld--
				c.cfg.Capacity.Held.Add(-1)
			}
			c.reply(TimedOut, &p.to, WaitEnded)
			c.answerRetries(p, TimedOut, WaitEnded, 0)
		}
		c.answerLate(p)
		c.emit(Effect{Kind: Desync, Err: &DesyncError{e.key}})
		return
	}
	if p.fkind == FreeExpire {
		c.emit(Effect{Kind: Expired})
		if p.forced {
			c.emit(Effect{Kind: Ended, S: p.rc, ReqID: p.rid})
		} else if p.rc != nil { // a RELEASE that found the lease ended
			c.emit(Effect{Kind: NotHeld, S: p.rc, ReqID: p.rid})
		}
	} else if p.rc != nil { // (an early R was answered at once)
		c.emit(Effect{Kind: Released, S: p.rc, ReqID: p.rid})
	}
	if p.hasTo {
		c.granted(e, p, r, now)
	} else {
		c.idle(e, now)
	}
	c.answerLate(p)
}

func (c *Core) answerLate(p *Proposal) {
	for _, lr := range p.late {
		c.emit(Effect{Kind: NotHeld, S: lr.s, ReqID: lr.rid})
	}
}

// idle makes e, if nothing is left of it, an idle entry.
func (c *Core) idle(e *entry, now int64) {
	if !e.held && e.q == nil && !e.inFlight() && !e.linked {
		e.end = now + IdleTTL
		c.link(e, idleList)
	}
}

// granted completes the grant of e that p carried.
func (c *Core) granted(e *entry, p *Proposal, r *Result, now int64) {
	g := &p.to
	if e.x != nil && e.x.pend == p {
		e.x.pend = nil
	}
	if r.Token == 0 {
		// Not granted: the key stays free.
		e.held = false
		c.nheld--
		c.cfg.Capacity.Held.Add(-1)
		switch {
		case r.Held:
			c.reply(Busy, g, NoToken)
			c.emit(Effect{Kind: Desync, Err: &DesyncError{e.key}})
		case r.Retry && p.first && c.cfg.TokenWait > 0 && !(r.Fatal && g.tokenBy != 0):
			// A token waiter until its token wait ends. (A failed store
			// gets one more reservation before E(6).)
			c.awaitToken(e, g, r.Err, now)
		case r.Fatal:
			c.emit(Effect{Kind: Failed, S: g.s, ReqID: g.reqID, Queued: g.recorded(), Err: r.Err})
		default:
			c.emit(Effect{Kind: Busy, Why: NoToken, S: g.s, ReqID: g.reqID, Queued: g.recorded(), Err: r.Err})
		}
		c.answerRetries(p, Busy, NoToken, 0)
		// The next waiter, if any, is tried in turn.
		c.grantNext(e, now)
		return
	}
	e.token = r.Token
	e.end = now + int64(e.lease)*secondNs
	c.link(e, uint16(e.lease))
	if e.q != nil {
		c.watchKey(e)
	}
	stale := c.cfg.MaxCommit > 0 && now-p.at > c.cfg.MaxCommit
	// (A first try applied at once is its session reader's own request:
	// that session is live.)
	if live := !g.recorded() || g.s.Live(); !live || now >= g.deadline || stale {
		// Its session is gone, or its wait ended while the grant was in
		// flight (T), or the commit was too slow to trust (B): it is
		// answered (if it is still there), and the key is freed again at
		// once rather than held by nobody for a lease.
		if live {
			if stale {
				// Wait: how long the commit took (the retries' carry 0).
				c.emit(Effect{Kind: Busy, Why: SlowCommit, S: g.s, ReqID: g.reqID, Queued: g.recorded(), Wait: now - p.at})
			} else {
				c.reply(TimedOut, g, GrantTooLate)
			}
		}
		why, kind := GrantTooLate, TimedOut
		if stale {
			why, kind = SlowCommit, Busy
		}
		c.answerRetries(p, kind, why, 0)
		c.free(e, FreeExpire, nil, 0, 0, e.owner, now)
		return
	}
	c.emit(Effect{Kind: Granted, S: g.s, ReqID: g.reqID, Queued: g.recorded(), Token: r.Token, Wait: now - g.arrived})
	c.answerRetries(p, Granted, Again, r.Token)
}

// answerRetries answers the holder's retries that waited for p's grant:
// G with token, or k for why. A retry whose session is closing gets
// nothing, as the grant's own ACQUIRE would not (Drop leaves a retry alone:
// it is not queued).
func (c *Core) answerRetries(p *Proposal, k Kind, why Why, token uint64) {
	for _, rw := range p.retries {
		rw.done = true
		if rw.g.s.Live() {
			c.emit(Effect{Kind: k, Why: why, S: rw.g.s, ReqID: rw.g.reqID, Queued: true, Token: token})
		}
	}
}

// grantNext proposes the grant of e, free, to its next waiter, if any, or
// makes e idle. A waiter that the capacity refuses (another core took the
// lock, or a Promote restored more than MaxLocks) is B, and the next one is
// tried: none may be left queued on a free key, where nothing would hand it
// over.
func (c *Core) grantNext(e *entry, now int64) {
	for e.q != nil {
		w := c.nextWaiter(e, now)
		if w == nil {
			break
		}
		if !c.cfg.Capacity.takeHeld() {
			c.reply(Busy, &w.g, Full)
			continue
		}
		c.nheld++
		e.held, e.owner, e.lease, e.ownedOnly, e.token, e.client = true, w.g.owner, w.g.lease, w.g.ownedOnly, 0, w.g.client
		e.setBy(w.g.by)
		np := c.proposal(e, w.g.by, now)
		np.to, np.hasTo = w.g, true
		e.ext().pend = np // (cleared when it applies)
		c.propose(np)
		return
	}
	c.idle(e, now)
}

// WaitedMS is the waited_ms of a G: whole milliseconds from arrived to now,
// saturated rather than wrapped.
func WaitedMS(now, arrived int64) uint32 {
	if now <= arrived {
		return 0
	}
	return uint32(min((now-arrived)/msNs, math.MaxUint32))
}

// Resync sets key's projection to the machine's holding h (nil: free),
// after a command that did not apply as projected.
func (c *Core) Resync(now int64, key string, h *Holding) {
	c.begin()
	e := c.m[key]
	if e == nil {
		if h == nil {
			return
		}
		e = &entry{key: key}
		c.m[key] = e
		c.idx.ReplaceOrInsert(e)
	}
	if e.held != (h != nil) {
		d := int64(1)
		if h == nil {
			d = -1
		}
		c.nheld += d
		c.cfg.Capacity.Held.Add(d)
	}
	c.unlink(e)
	c.unwatchKey(e)
	e.held = h != nil
	if h == nil {
		e.token, e.client = 0, nil
		c.grantNext(e, now)
		return
	}
	if e.owner != h.Owner || e.token != h.Token {
		e.client = nil // (not the holding the session made)
	}
	e.owner, e.token, e.lease, e.ownedOnly = h.Owner, h.Token, h.LeaseS, h.OwnedOnly
	e.end = now + int64(e.lease)*secondNs
	c.link(e, uint16(e.lease))
	if e.q != nil {
		c.watchKey(e)
	}
}

// Holding is one held key.
type Holding struct {
	Key       string
	Owner     Owner
	Token     uint64
	LeaseS    uint8
	OwnedOnly bool
}

// Promote makes c the scheduler of the holdings hs (a new leader's, from
// the applied log), every lease restarted in full plus margin: a takeover
// never shortens a lease. Whatever c held before is forgotten.
func (c *Core) Promote(now int64, hs []Holding, margin int64) {
	c.Demote()
	// Indexed in hs's order: Machine.Holdings', by key, is the B-tree's
	// fastest (each insertion at its right edge).
	es := make([]*entry, len(hs))
	for i, h := range hs {
		e := &entry{key: h.Key, held: true, owner: h.Owner, token: h.Token, lease: h.LeaseS, ownedOnly: h.OwnedOnly}
		e.end = now + int64(h.LeaseS)*secondNs + margin
		c.m[h.Key] = e
		c.idx.ReplaceOrInsert(e)
		es[i] = e
	}
	// One instant for all: sorted by lease_s, their ends are in order.
	slices.SortFunc(es, func(a, b *entry) int {
		if a.lease != b.lease {
			return int(a.lease) - int(b.lease)
		}
		return strings.Compare(a.key, b.key)
	})
	for _, e := range es {
		c.link(e, restoredList)
	}
	c.nheld = int64(len(hs))
	c.cfg.Capacity.Held.Add(c.nheld)
}

// Demote forgets everything: holdings, waiters (marked done; their
// sessions are closed by the driver), commands in flight (their outcomes
// are no longer awaited). The Core is empty, as new.
func (c *Core) Demote() {
	c.begin()
	for _, w := range c.waits {
		w.done = true
	}
	c.cfg.Capacity.Held.Add(-c.nheld)
	c.cfg.Capacity.Waiters.Add(-c.nwait)
	c.m = make(map[string]*entry)
	c.idx = newEntryIndex()
	c.lists = [numLists]expList{}
	c.nonempty = [len(c.nonempty)]uint64{}
	c.waits, c.keys, c.tokenq = nil, nil, nil
	c.nheld, c.nwait, c.pending, c.expiring = 0, 0, 0, 0
	clear(c.out)
	c.out = c.out[:0] // (not handed to the log: nothing of this core is awaited)
	c.spare = nil
	c.gen++
}

// Len is the number of held keys (projected).
func (c *Core) Len() int { return int(c.nheld) }

// Pending is the number of commands in flight.
func (c *Core) Pending() int { return c.pending }

// Holdings returns the held keys whose token is known, sorted by key, with
// their lease ends.
func (c *Core) Holdings() []Holding {
	var hs []Holding
	for k, e := range c.m {
		if e.held && e.token != 0 {
			hs = append(hs, Holding{Key: k, Owner: e.owner, Token: e.token, LeaseS: e.lease, OwnedOnly: e.ownedOnly})
		}
	}
	slices.SortFunc(hs, func(a, b Holding) int { return strings.Compare(a.Key, b.Key) })
	return hs
}
