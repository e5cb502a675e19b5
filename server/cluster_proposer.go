package server

import (
	"time"
)

// The leader's proposer: how the scheduler's commands become log entries,
// and how one session is kept from taking the log from the others.
//
// Every command the scheduler proposes is queued for the session it is
// charged to (the one whose ACQUIRE or RELEASE made it; the leader's own
// queue for expiries), and counts against that session until its entry is
// applied. A session with ClusterConfig.MaxSessionProposals commands
// awaiting their apply is not read from (its reader waits in admitLocked:
// the session's socket buffers fill and TCP holds its client back), so no
// session can queue more than that; an ACQUIRE that would take the
// leader's commands awaiting their apply past ClusterConfig.MaxProposals is
// answered B. The proposer keeps at most maxEntriesInFlight entries
// proposed and not yet applied, and fills each entry, of at most
// maxEntryCommands commands and maxEntryBytes bytes, in turns: one command
// from each session with commands queued, then the next round, starting
// where the previous entry stopped (the leader's own queue, of expiries,
// goes first, leaving room for one command of every other queue, so that
// expiries keep up with the grants that cause them). A session that sends one request at a time thus waits for at
// most the entries in flight and its own, however much others send.
//
// Taking commands from several queues in turns must not reorder two
// commands of one key (a Free and the Grant of the same key that the
// mirror projected behind it, from two sessions): a command whose key has
// a command still queued goes to that command's queue, behind it
// (pqueue.keys, cluster.pkeys), whichever session it is charged to.

// Bounds of the proposer.
const (
	// maxEntryCommands and maxEntryBytes bound one entry (the first
	// command of an entry is taken whatever its size).
	maxEntryCommands = 128
	maxEntryBytes    = 64 << 10
	// maxEntriesInFlight entries may be proposed and not yet applied:
	// one being committed while the next is appended.
	maxEntriesInFlight = 2
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
	c *conn // nil: the leader's own queue

	// Under cluster.mu.
	n    int           // commands charged to it, not yet applied
	slot chan struct{} // signalled when n drops below the bound (made by the first wait)

	// Under cluster.pmu.
	buf        []byte   // queued commands, encoded
	ends       []int    // end offset in buf of each
	keys       []string // key of each
	next       int      // commands of buf already taken
	ready      bool     // in the ring (it has queued commands)
	rprev, rnx *pqueue  // the ring of queues with commands
}

// keyRoute is where a key's queued commands are: all in one queue.
type keyRoute struct {
	q *pqueue
	n int // its commands there, not yet taken
}

// queueFor returns c's queue (the leader's own for nil); under mu.
func (cl *cluster) queueFor(c *conn) *pqueue {
	if c == nil {
		return cl.own
	}
	q := cl.queues[c]
	if q == nil {
		q = &pqueue{c: c}
		cl.queues[c] = q
	}
	return q
}

// admitLocked returns true when c may propose: while c's session has
// MaxSessionProposals commands awaiting their apply, it waits (mu released)
// for one to apply, and reads nothing more meanwhile. It returns false if
// the session or the scheduler ended while it waited (nothing to answer:
// the session is closing, or gets M).
func (cl *cluster) admitLocked(c *conn) bool {
	q := cl.queues[c]
	if q == nil || q.n < cl.cfg.MaxSessionProposals {
		return true
	}
	cl.sessionWaits.Add(1)
	if q.slot == nil {
		q.slot = make(chan struct{}, 1)
	}
	slot, stint := q.slot, cl.stint
	t := time.NewTimer(admitRecheck)
	defer t.Stop()
	for {
		cl.mu.Unlock()
		select {
		case <-slot:
		case <-cl.stop:
		case <-t.C:
			t.Reset(admitRecheck)
		}
		cl.mu.Lock()
		if !cl.active || cl.stint != stint || c.dead.Load() {
			return false
		}
		if q.n < cl.cfg.MaxSessionProposals {
			return true
		}
	}
}

// proposeLocked queues a command (encoded by enc) for the next entries,
// charged to the session by (nil: the leader's own); under mu.
func (cl *cluster) proposeLocked(p *proposal, by *conn, enc func(b []byte, seq uint64) []byte) {
	cl.seq++
	seq := cl.seq
	p.at = cl.s.now()
	cl.pending[seq] = p
	cl.npending.Add(1)
	q := cl.queueFor(by)
	q.n++
	p.q = q
	key := p.ck.key
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
	if !q.ready {
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
	cl.npending.Add(-1)
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
	if q.n == 0 && q.c != nil && cl.queues[q.c] == q {
		cl.pmu.Lock()
		idle := !q.ready
		cl.pmu.Unlock()
		if idle {
			delete(cl.queues, q.c)
		}
	}
}

// entryApplied makes room for the next entry (an entry of the current
// stint was applied); under mu.
func (cl *cluster) entryApplied() {
	cl.pmu.Lock()
	if cl.pinflight > 0 {
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
	cl.queues = make(map[*conn]*pqueue)
	cl.npending.Store(0)
	cl.pmu.Lock()
	cl.own = &pqueue{} // under both: packLocked reads it under pmu alone
	cl.pring, cl.pqueues, cl.pkeys, cl.pinflight, cl.pstint = nil, 0, make(map[string]keyRoute), 0, stint
	cl.pmu.Unlock()
}

// ringAdd puts q, which has just got commands, at the end of the ring
// (before the queue the next entry starts with); under pmu.
func (cl *cluster) ringAdd(q *pqueue) {
	q.ready = true
	cl.pqueues++
	if cl.pring == nil {
		q.rprev, q.rnx = q, q
		cl.pring = q
		return
	}
	last := cl.pring.rprev
	q.rprev, q.rnx = last, cl.pring
	last.rnx = q
	cl.pring.rprev = q
}

// ringRemove takes q, whose commands are all taken, out of the ring;
// under pmu.
func (cl *cluster) ringRemove(q *pqueue) {
	q.ready = false
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
// turns, and returns the entry; under pmu, with commands queued.
func (cl *cluster) packLocked() []byte {
	body := cl.pscratch[:0]
	n := 0
	full := false
	// The leader's own queue first (expiries: the debt of grants already
	// made), leaving a command's room for each other queue.
	if q := cl.own; q.ready {
		room := maxEntryCommands - (cl.pqueues - 1)
		for n < room && q.next < len(q.ends) {
			var ok bool
			if body, ok = cl.take(q, body); !ok {
				full = true
				break
			}
			n++
		}
		if q.next == len(q.ends) {
			cl.ringRemove(q)
		}
	}
	// Then one command per queue, round after round.
	for !full && n < maxEntryCommands && cl.pring != nil {
		q := cl.pring
		var ok bool
		if body, ok = cl.take(q, body); !ok {
			break
		}
		n++
		if q.next == len(q.ends) {
			cl.ringRemove(q) // the ring now starts at the queue after it
		} else {
			cl.pring = q.rnx
		}
	}
	cl.pscratch = body
	// Raft holds on to the bytes: each entry is a new buffer.
	return append(entryHeader(cl.pstint, n), body...)
}

// proposer turns the queued commands into log entries, at most
// maxEntriesInFlight at a time: what is queued while raft appends and
// commits them goes into the next ones, so that concurrent requests share
// one append and one fsync.
func (cl *cluster) proposer() {
	defer cl.wg.Done()
	for {
		select {
		case <-cl.stop:
			return
		case <-cl.pwake:
		}
		for {
			cl.pmu.Lock()
			if cl.pring == nil || cl.pinflight >= maxEntriesInFlight {
				cl.pmu.Unlock()
				break
			}
			buf := cl.packLocked()
			cl.pinflight++
			cl.pmu.Unlock()
			// Not waited for: the apply of the entry answers its
			// commands (and makes room for the next one), and a
			// leadership loss is seen on LeaderCh.
			cl.r.Apply(buf, 0)
		}
	}
}
