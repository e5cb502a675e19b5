package server

import (
	"sync/atomic"
	"time"
)

// The leader's proposer: how the scheduler's commands become log entries,
// and how one session is kept from taking the log from the others.
//
// Every command the scheduler proposes is queued for the session it is
// charged to, and counts against that session until its entry is applied:
// an ACQUIRE's Grant and a RELEASE's Free to the session that sent it, and
// the Free that ends a lease (an expiry) to the session whose ACQUIRE made
// that holding, so that the expiries of a flood's locks take the flood's
// turns, not the others' (the leader's own queue has only the expiries of
// holdings restored at a takeover). A session with
// ClusterConfig.MaxSessionProposals commands awaiting their apply is not
// read from (its reader waits in admitLocked: the session's socket buffers
// fill and TCP holds its client back), so no session can queue more than
// that of its own requests (plus the expiries of its holdings); an ACQUIRE
// that would take the leader's commands awaiting their apply past
// ClusterConfig.MaxProposals is answered B.
//
// The proposer keeps at most maxEntriesInFlight entries proposed and not
// yet applied, and fills each entry, of at most maxEntryCommands commands
// and maxEntryBytes bytes, in turns: one command from each queue with
// commands, then the next round, starting where the previous entry stopped.
// A queue none of whose commands is in an entry in flight (a session that
// sends one request at a time, or has just started) does not wait for one
// of those entries to apply: its first command goes at once into an entry
// of its own, beyond maxEntriesInFlight (at most maxExpressInFlight such
// entries, shared by every such queue). Such a command thus waits only for
// the entries already proposed, of at most maxEntryCommands commands each,
// however much the other sessions send: the entries are kept small because
// every command in them is work that the command behind them waits for on
// every node.
//
// While the log is contended (contendedLocked: a session held back at its
// bound while another sends a request at a time), the express entry is
// only for the sessions not held back lately (a held-back session's queue
// empties of entries in flight after every apply, and would otherwise
// take the express entry most of the time), and the held-back sessions'
// entries are paced: the next normal entry is proposed only as long after
// the last one applied as that one took (contendedGap), so that the log
// is idle about half the time and a light session's request mostly finds
// nothing ahead of it.
//
// Taking commands from several queues in turns must not reorder two
// commands of one key (a Free and the Grant of the same key that the
// mirror projected behind it, from two sessions): a command whose key has
// a command still queued goes to that command's queue, behind it
// (pqueue.keys, cluster.pkeys), whichever session it is charged to; and
// an entry takes only the first commands of a queue.

// Bounds of the proposer.
const (
	// maxEntryCommands and maxEntryBytes bound one entry (the first
	// command of an entry is taken whatever its size).
	maxEntryCommands = 128
	maxEntryBytes    = 64 << 10
	// maxEntriesInFlight entries may be proposed and not yet applied:
	// one being committed while the next is appended.
	maxEntriesInFlight = 2
	// maxExpressInFlight more may be, of the first commands of queues
	// with none in an entry in flight.
	maxExpressInFlight = 1
	// While the log is contended (contendedLocked), entries are of at
	// most contendedEntryCommands commands, contendedEntriesInFlight at a
	// time (and the express one).
	contendedEntryCommands   = 8
	contendedEntriesInFlight = 1
	// contendedWindow is how long a session stays "held back" after its
	// reader last waited at its bound, and "light" after an express entry
	// last took its command.
	contendedWindow = int64(100 * time.Millisecond)
	// While the log is contended, the next entry that is not express is
	// proposed only contendedGap times as long after the last one applied
	// as that one took from its proposal (at most contendedWindow later):
	// the held-back sessions get about half the log's time, and a light
	// session's request mostly finds it idle.
	contendedGap = 1.0
	// admitRecheck bounds how long a session's reader waits in admitLocked
	// before it looks again at whether its session or the scheduler ended.
	admitRecheck = 100 * time.Millisecond
)

// Defaults of ClusterConfig's proposal bounds.
const (
	DefaultMaxSessionProposals = 256
	DefaultMaxProposals        = 65536
)

// pqueue is one session's share of the proposer: its commands awaiting
// their apply (n), and the commands queued for it and not yet in an entry.
type pqueue struct {
	id uint64 // the session's conn.qid; 0: the leader's own queue

	// Under cluster.mu.
	n    int           // commands charged to it, not yet applied
	slot chan struct{} // signalled when n drops below the bound (made by the first wait)

	// Under cluster.pmu.
	buf        []byte   // queued commands, encoded
	ends       []int    // end offset in buf of each
	keys       []string // key of each
	next       int      // commands of buf already taken
	rprev, rnx *pqueue  // the ring of queues with commands (non-nil while in it: ready)
	inEntries  int      // commands taken from buf into entries not yet applied
	fresh      bool     // in cluster.pfresh

	heldAt  atomic.Int64 // when its reader last waited in admitLocked (server clock; 0: never)
	waiting atomic.Bool  // its reader waits in admitLocked
}

// keyRoute is where a key's queued commands are: all in one queue.
type keyRoute struct {
	q *pqueue
	n int // its commands there, not yet taken
}

// sessionID returns c's number for the proposer (conn.qid), giving it one
// the first time; under mu. A holding keeps the number of the session that
// got it (lockcore.Acquire.By), not the session itself, whose buffers it would keep
// after the session closed.
func (cl *cluster) sessionID(c *conn) uint64 {
	if c.qid == 0 {
		cl.lastQID++
		c.qid = cl.lastQID
	}
	return c.qid
}

// queueFor returns session id's queue (the leader's own for 0); under mu.
func (cl *cluster) queueFor(id uint64) *pqueue {
	if id == 0 {
		return cl.own
	}
	q := cl.queues[id]
	if q == nil {
		q = &pqueue{id: id}
		cl.queues[id] = q
	}
	return q
}

// admitLocked reports whether c may propose: while c's session has
// MaxSessionProposals commands awaiting their apply, it waits (mu released:
// waited) for one to apply, and reads nothing more meanwhile. It reports
// false if the session or the scheduler ended while it waited (nothing to
// answer: the session is closing, or gets M).
func (cl *cluster) admitLocked(c *conn) (waited, ok bool) {
	q := cl.queues[c.qid]
	if c.qid == 0 || q == nil || q.n < cl.cfg.MaxSessionProposals {
		return false, true
	}
	cl.sessionWaits.Add(1)
	q.waiting.Store(true)
	cl.nwaiting.Add(1)
	defer func() {
		now := cl.s.now()
		q.heldAt.Store(now)
		cl.heldAt.Store(now)
		q.waiting.Store(false)
		cl.nwaiting.Add(-1)
	}()
	if q.slot == nil {
		q.slot = make(chan struct{}, 1)
	}
	slot, stint := q.slot, cl.stint
	t := time.NewTimer(admitRecheck)
	defer t.Stop()
	for {
		cl.sh.mu.Unlock()
		select {
		case <-slot:
		case <-cl.stop:
		case <-t.C:
			t.Reset(admitRecheck)
		}
		cl.sh.mu.Lock()
		if !cl.sh.serving || cl.stint != stint || c.dead.Load() {
			return true, false
		}
		if q.n < cl.cfg.MaxSessionProposals {
			return true, true
		}
	}
}

// proposeLocked queues a command (encoded by enc) for the next entries,
// charged to session by (a conn.qid; 0: the leader's own); under mu.
func (cl *cluster) proposeLocked(p *proposal, by uint64, enc func(b []byte, seq uint64) []byte) {
	cl.seq++
	seq := cl.seq
	if p.at == 0 { // (a command of the lock core carries the instant of the event that proposed it)
		p.at = cl.s.now()
	}
	cl.pending[seq] = p
	q := cl.queueFor(by)
	q.n++
	p.q = q
	key := p.key
	cl.pmu.Lock()
	// Behind a command of the same key still queued, wherever it is.
	r, ok := cl.pkeys[key]
	if ok {
		q = r.q
	}
	r.q = q
	r.n++
	cl.pkeys[key] = r
	q.buf = enc(q.buf, seq)
	q.ends = append(q.ends, len(q.buf))
	q.keys = append(q.keys, key)
	if !q.ready() {
		cl.ringAdd(q)
	}
	cl.pmu.Unlock()
	select {
	case cl.pwake <- struct{}{}:
	default:
	}
}

// appliedLocked ends p's count against its session's bound (under mu),
// waking the session's reader if it waits for that.
func (cl *cluster) appliedLocked(p *proposal) {
	q := p.q
	if q == nil {
		return
	}
	q.n--
	if q.slot != nil && q.n < cl.cfg.MaxSessionProposals {
		select {
		case q.slot <- struct{}{}:
		default:
		}
	}
	if q.n == 0 && q.id != 0 && cl.queues[q.id] == q {
		cl.pmu.Lock()
		idle := !q.ready()
		cl.pmu.Unlock()
		if idle {
			delete(cl.queues, q.id)
		}
	}
}

// entryApplied makes room for the next entry (an entry of the current
// stint was applied); under mu.
func (cl *cluster) entryApplied() {
	cl.pmu.Lock()
	if cl.pinflight > 0 {
		// Entries apply in the order proposed: this is the oldest.
		taken := cl.pents[cl.phead]
		for _, q := range taken {
			q.inEntries--
			if q.inEntries == 0 && q.ready() && !q.fresh {
				cl.addFresh(q)
			}
		}
		clear(taken)
		cl.pents[cl.phead] = taken[:0]
		if at := cl.pentAt[cl.phead]; !at.IsZero() && cl.contendedLocked(cl.s.now()) {
			// A normal entry: the next one waits (contendedGap).
			now := time.Now()
			gap := min(time.Duration(float64(now.Sub(at))*contendedGap), time.Duration(contendedWindow))
			cl.pheavyAt = now.Add(gap)
		}
		cl.pentAt[cl.phead] = time.Time{}
		cl.phead = (cl.phead + 1) % len(cl.pents)
		cl.pinflight--
	}
	more := cl.pring != nil
	cl.pmu.Unlock()
	if more {
		select {
		case cl.pwake <- struct{}{}:
		default:
		}
	}
}

// resetProposerLocked forgets every queued command and the entries in
// flight, and starts stint (0: none); under mu. Sessions waiting in
// admitLocked are woken (they find the stint changed).
func (cl *cluster) resetProposerLocked(stint uint64) {
	for _, q := range cl.queues {
		if q.slot != nil {
			select {
			case q.slot <- struct{}{}:
			default:
			}
		}
	}
	cl.queues = make(map[uint64]*pqueue)
	cl.pmu.Lock()
	cl.own = &pqueue{}
	cl.pring, cl.pqueues, cl.pkeys, cl.pinflight, cl.pstint = nil, 0, make(map[string]keyRoute), 0, stint
	cl.pfresh, cl.phead = nil, 0
	cl.pentAt, cl.pheavyAt = [len(cl.pentAt)]time.Time{}, time.Time{}
	for i := range cl.pents {
		clear(cl.pents[i])
		cl.pents[i] = cl.pents[i][:0]
	}
	cl.pmu.Unlock()
}

// ringAdd puts q, which has just got commands, at the end of the ring
// (before the queue the next entry starts with); under pmu.
func (cl *cluster) ringAdd(q *pqueue) {
	cl.pqueues++
	if cl.pring == nil {
		q.rprev, q.rnx = q, q
		cl.pring = q
	} else {
		last := cl.pring.rprev
		q.rprev, q.rnx = last, cl.pring
		last.rnx = q
		cl.pring.rprev = q
	}
	// In the ring (ready) before addFresh, whose sweep keeps only the
	// ready queues.
	if q.inEntries == 0 && !q.fresh {
		cl.addFresh(q)
	}
}

// ringRemove takes q, whose commands are all taken, out of the ring;
// under pmu.
func (cl *cluster) ringRemove(q *pqueue) {
	cl.pqueues--
	q.buf, q.ends, q.keys, q.next = q.buf[:0], q.ends[:0], q.keys[:0], 0
	if q.rnx == q {
		cl.pring = nil
	} else {
		q.rprev.rnx, q.rnx.rprev = q.rnx, q.rprev
		if cl.pring == q {
			cl.pring = q.rnx
		}
	}
	q.rprev, q.rnx = nil, nil
}

// take moves q's next command into body; under pmu. It returns false,
// taking nothing, if that would put body past maxEntryBytes (and body is
// not empty).
func (cl *cluster) take(q *pqueue, body []byte) ([]byte, bool) {
	start := 0
	if q.next > 0 {
		start = q.ends[q.next-1]
	}
	end := q.ends[q.next]
	if len(body) > 0 && len(body)+end-start > maxEntryBytes {
		return body, false
	}
	body = append(body, q.buf[start:end]...)
	key := q.keys[q.next]
	q.keys[q.next] = ""
	q.next++
	if r := cl.pkeys[key]; r.n <= 1 {
		delete(cl.pkeys, key)
	} else {
		r.n--
		cl.pkeys[key] = r
	}
	if q.next >= compactAfter && 2*q.next >= len(q.ends) && q.next < len(q.ends) {
		q.compact()
	}
	return body, true
}

// compactAfter is how many commands a queue that never empties (one
// session pipelining all the time) may have had taken before the rest is
// moved to the front of its buffers.
const compactAfter = 64

// compact drops the commands already taken from q's buffers.
func (q *pqueue) compact() {
	off := q.ends[q.next-1]
	q.buf = q.buf[:copy(q.buf, q.buf[off:])]
	k := copy(q.ends, q.ends[q.next:])
	for i := range k {
		q.ends[i] -= off
	}
	q.ends = q.ends[:k]
	copy(q.keys, q.keys[q.next:])
	clear(q.keys[k:])
	q.keys = q.keys[:k]
	q.next = 0
}

// packLocked takes the commands of the next entry from the queues, in
// turns, and returns the entry; under pmu, with commands queued
// (contended: contendedLocked(now), as nextEntryLocked found it). An
// express entry takes commands only of the fresh queues (those with
// commands, none of them in an entry in flight).
func (cl *cluster) packLocked(express, contended bool, now int64) []byte {
	body := cl.pscratch[:0]
	slot := (cl.phead + cl.pinflight) % len(cl.pents) // this entry's
	taken := cl.pents[slot][:0]
	n := 0
	limit := maxEntryCommands
	if contended {
		limit = contendedEntryCommands
	}
	var cand []*pqueue
	if express {
		// The fresh queues, in turns as below, but only they.
		cand = append(cl.pcand[:0], cl.pfresh...)
		for _, q := range cl.pfresh {
			q.fresh = false
		}
		clear(cl.pfresh)
		cl.pfresh = cl.pfresh[:0]
		fr := cand[len(cand):]
		for _, q := range cand {
			if q.ready() && q.inEntries == 0 && (!contended || !q.heavy(now)) {
				fr = append(fr, q)
			}
		}
		for len(fr) > 0 && n < limit {
			k := 0
			full := false
			for _, q := range fr {
				if n < limit && !full {
					var ok bool
					if body, ok = cl.take(q, body); ok {
						taken = append(taken, q)
						n++
					} else {
						full = true
					}
				}
				if q.ready() && q.next < len(q.ends) {
					fr[k] = q
					k++
				} else if q.ready() {
					cl.ringRemove(q)
				}
			}
			fr = fr[:k]
			if full {
				break
			}
		}
	} else {
		// One command per queue, round after round.
		for n < limit && cl.pring != nil {
			q := cl.pring
			var ok bool
			if body, ok = cl.take(q, body); !ok {
				break
			}
			taken = append(taken, q)
			n++
			if q.next == len(q.ends) {
				cl.ringRemove(q) // the ring now starts at the queue after it
			} else {
				cl.pring = q.rnx
			}
		}
	}
	for _, q := range taken {
		if q.inEntries == 0 && q.id != 0 && !q.waiting.Load() {
			// A session that had nothing in an entry in flight and
			// is not held back: it is "light" if it was not held
			// back lately either.
			if at := q.heldAt.Load(); at == 0 || now-at > contendedWindow {
				cl.lightAt = now
			}
		}
		q.inEntries++
	}
	for _, q := range cand {
		// Fresh still (the entry was full before their turn).
		if q.ready() && q.inEntries == 0 && !q.fresh {
			cl.addFresh(q)
		}
	}
	clear(cand[:cap(cand)])
	cl.pcand = cand[:0]
	cl.pents[slot] = taken
	if express {
		cl.pentAt[slot] = time.Time{}
	} else {
		cl.pentAt[slot] = time.Now()
	}
	cl.pinflight++
	cl.pscratch = body
	// Raft holds on to the bytes: each entry is a new buffer.
	return append(entryHeader(cl.pstint, n), body...)
}

// addFresh puts q, which has commands queued and none in an entry in
// flight, on pfresh; under pmu. Queues stay on it after they stop being
// fresh (a normal entry took their command, or they were emptied), until
// an express entry or freshLocked looks at them: it is swept when it gets
// much longer than the queues with commands.
func (cl *cluster) addFresh(q *pqueue) {
	q.fresh = true
	cl.pfresh = append(cl.pfresh, q)
	if len(cl.pfresh) > 2*cl.pqueues+16 {
		cl.freshLocked(false, 0)
	}
}

// freshLocked drops from pfresh the queues that are no longer fresh, and
// reports whether one is left (while contended, one not held back lately:
// heavy); under pmu.
func (cl *cluster) freshLocked(contended bool, now int64) bool {
	fr := cl.pfresh[:0]
	light := false
	for _, q := range cl.pfresh {
		if q.ready() && q.inEntries == 0 {
			fr = append(fr, q)
			light = light || !contended || !q.heavy(now)
		} else {
			q.fresh = false
		}
	}
	clear(cl.pfresh[len(fr):])
	cl.pfresh = fr
	return light
}

// ready reports whether q is in the ring (it has queued commands); under
// pmu.
func (q *pqueue) ready() bool { return q.rnx != nil }

// heavy reports whether q's session is held back at its bound, or was
// within contendedWindow.
func (q *pqueue) heavy(now int64) bool {
	if q.waiting.Load() {
		return true
	}
	at := q.heldAt.Load()
	return at != 0 && now-at <= contendedWindow
}

// nextEntryLocked returns the next entry to propose, or nil if there is
// none for now (nothing queued, or the entries in flight at their bound,
// or, while contended, the next normal entry paced: then how long until
// it may be proposed); under pmu.
func (cl *cluster) nextEntryLocked() ([]byte, time.Duration) {
	if cl.pring == nil {
		return nil, 0
	}
	f := maxEntriesInFlight
	now := cl.s.now()
	contended := cl.contendedLocked(now)
	if contended {
		f = contendedEntriesInFlight
	}
	var wait time.Duration
	if cl.pinflight < f {
		if !contended {
			return cl.packLocked(false, false, now), 0
		}
		if wait = time.Until(cl.pheavyAt); wait <= 0 {
			return cl.packLocked(false, true, now), 0
		}
	}
	if cl.pinflight < f+maxExpressInFlight && cl.freshLocked(contended, now) {
		return cl.packLocked(true, contended, now), 0
	}
	return nil, wait
}

// proposer turns the queued commands into log entries, at most
// maxEntriesInFlight at a time (and maxExpressInFlight express ones): what
// is queued while raft appends and commits them goes into the next ones,
// so that concurrent requests share one append and one fsync.
func (cl *cluster) proposer() {
	defer cl.wg.Done()
	pace := time.NewTimer(time.Hour)
	pace.Stop()
	defer pace.Stop()
	for {
		select {
		case <-cl.stop:
			return
		case <-cl.pwake:
		case <-pace.C:
		}
		for {
			cl.pmu.Lock()
			buf, wait := cl.nextEntryLocked()
			cl.pmu.Unlock()
			if buf == nil {
				if wait > 0 {
					pace.Reset(wait)
				}
				break
			}
			// Not waited for: the apply of the entry answers its
			// commands (and makes room for the next one), and a
			// leadership loss is seen on LeaderCh.
			cl.r.Apply(buf, 0)
		}
	}
}

// contendedLocked reports whether a session is held back at its bound
// while another sends a request at a time; under pmu.
func (cl *cluster) contendedLocked(now int64) bool {
	at := cl.heldAt.Load()
	return (cl.nwaiting.Load() > 0 || at != 0 && now-at < contendedWindow) && cl.lightAt != 0 && now-cl.lightAt < contendedWindow
}
