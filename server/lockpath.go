package server

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// The lock path: how a session's requests become a core's events, and
// the core's effects frames. It is written once, for every mode.
//
// Every lock decision is a lockcore.Core's (package internal/lockcore).
// A shard is one core and what drives it: the mutex every event of the
// core is under, the core's clock (never going back), its log (the
// mode's lockcore.Proposer) and one timer at the core's next deadline.
// The mode (type mode, below) says which shard decides a key (standalone:
// one of numShards by a hash of the key; a replicated mode: its one),
// whether a shard serves now, and whether a session's request is taken;
// CANCEL and a closing session's drops go to the shard their in-flight
// record names. After each event, carryOut does what the core asks:
// replies into the sessions (session.go), counters, the in-flight records
// of queued ACQUIREs.

// shard is one lock core and what drives it: its mutex (every event of
// the core is under it), its clock and its timer. Standalone has numShards
// of them; a cluster leader and a pair's active one each.
type shard struct {
	mu     sync.Mutex
	core   *lockcore.Core
	wake   timer // at wakeAt: the core's Next (with exact, NextExpiry too)
	wakeAt int64 // lockcore.NoDeadline: not armed
	last   int64 // the latest now given to core: its events come in time order
	// serving: this core takes requests now (a cluster's leader, a pair's
	// active, always standalone); otherwise the node is stepping down or
	// does not lead, and requests are not taken (the session gets M).
	serving bool
	view    string // the lock browser's name for the serving core's view
	// exact: every lease ends on time (a replicated core: the followers'
	// state, a takeover's restart); otherwise the leases of keys without
	// waiters end when touched or swept.
	exact bool
	// rep is the replicated mode whose serving node runs this core (a
	// cluster's leader, a pair's active; nil standalone): the effects only
	// a replicated core has (Backlog, SlowCommit, Desync) are its.
	rep replicated
	_   [64]byte
}

// mode is how the server keeps its lock table, chosen once, at New:
// standalone (log_standalone.go: numShards cores over the token store),
// a Raft node (*cluster, log_cluster*.go: its leader runs one core fed
// by the applied log) or one node of a hot-standby pair (*pair,
// log_pair*.go: its active runs one core over the pair's log). The lock
// path itself (acquire, release, extend, cancel, the lock browser,
// expire: below) is written once, here; a mode supplies only its lockLog
// and what the server reports of it (modeStatus). No caller asks which
// mode it is.
type mode interface {
	lockLog
	modeStatus
}

// lockLog is what a mode gives the lock path: its shards (each a core,
// the mutex every event of that core is under, and the core's Proposer:
// the replication log), whether a shard serves now (shard.serving, under
// its mutex), the mode's word on a session's request, and the applied
// state that answers the lock browser where no core serves.
type lockLog interface {
	// shardOf is the shard whose core decides key.
	shardOf(key []byte) *shard
	// tables is the number of shards; table(i) the i-th (the lock
	// browser pages through each).
	tables() int
	table(i int) *shard
	// admitRequest is the mode's word, under sh.mu on a serving shard, on a
	// request of c: the session its commands are charged to (by; 0:
	// none), and false if it is not taken (c is closing, or sh stopped
	// serving while it waited; nothing is answered). waited: the mutex
	// was released meanwhile (the event time is read again).
	admitRequest(sh *shard, c *conn) (by uint64, waited, ok bool)
	// readApplied calls f with the applied machine, under what guards it,
	// where no core serves (a follower, a passive), and returns its view
	// name; notServing is why an operator's Expire is refused here. Both
	// are called without sh.mu.
	readApplied(f func(m *lockcore.Machine)) string
	notServing() error
}

// modeStatus is what the server reports of its mode, and its lifecycle.
type modeStatus interface {
	hello()         // a client's HELLO passed the token check (the pair's CLIENT_REQUEST: it may make this node active)
	refusal() error // why this node refuses to serve at all (a cluster node's refusal, log_cluster_boot.go), or nil
	stopping()      // Shutdown began (not Close): a Raft leader hands its leadership over before it stops

	counts() modeCounts                 // its tokens and held locks (Stats, the metrics)
	health() error                      // TokenStoreErr
	collectors() []prometheus.Collector // the mode's own, beside the server's
	close()                             // the end of Close and Shutdown
}

// modeCounts is what a mode counts of its tokens and locks.
type modeCounts struct {
	last    uint64 // the highest token handed out (standalone), or applied (a replicated log)
	ceiling uint64 // the durable ceiling (standalone); the committed counter (a replicated log)
	held    int    // held locks: in a replicated log, the holdings it applied
}

// acquireEvent is an ACQUIRE of c, whose frame was read at arrived, as a
// core's event, charged to session by (0: none).
func (s *Server) acquireEvent(c *conn, req *wire.Request, arrived int64, by uint64) lockcore.Acquire {
	return lockcore.Acquire{S: c, By: by, ReqID: req.ReqID, Key: req.Key, Owner: req.Owner, LeaseS: req.LeaseS,
		WaitS: req.WaitS, OwnedOnly: s.ownedOnly(c), Arrived: arrived, Client: c.client}
}

// enter takes a request of c, read at arrived (0: its time is not
// known), to sh's core (under sh.mu): the session it is charged to and
// the event's time, or false if sh does not serve (its node is stepping
// down: the session gets M and closes) or the mode does not take it.
//
// The event's time is taken once, here: the request's arrival (no second
// clock read on the grant path; a lease counted from arrival ends no
// earlier than its holder's own count, which starts when it sent the
// request), or the clock if the arrival is not known or the request
// waited for its turn; never before an instant the core was already
// given.
func (s *Server) enter(sh *shard, c *conn, arrived int64) (by uint64, now int64, ok bool) {
	if !sh.serving {
		return 0, 0, false
	}
	by, waited, ok := s.mode.admitRequest(sh, c)
	if !ok {
		return 0, 0, false
	}
	if waited || arrived == 0 {
		return by, s.shardNow(sh), true
	}
	sh.last = max(sh.last, arrived)
	return by, sh.last, true
}

// acquire handles a well-formed, in-range ACQUIRE from c's reader, whose
// frame was read at arrived.
func (s *Server) acquire(c *conn, req *wire.Request, arrived int64) {
	sh := s.mode.shardOf(req.Key)
	if !sh.exact && s.capacity.Held.Load() >= int64(s.cfg.MaxLocks) {
		s.sweepForCapacity() // leases that end when touched: count them out first
	}
	sh.mu.Lock()
	by, now, ok := s.enter(sh, c, arrived)
	if !ok {
		sh.mu.Unlock()
		return
	}
	a := s.acquireEvent(c, req, arrived, by)
	sh.core.Acquire(now, &a)
	s.carryOut(sh, c)
	sh.mu.Unlock()
}

// release handles a well-formed, in-range RELEASE from c's reader, or with
// owned a RELEASE_OWNED (version 2), which frees the key only if its holder
// is also req.Owner.
func (s *Server) release(c *conn, req *wire.Request, owned bool) {
	sh := s.mode.shardOf(req.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	by, now, ok := s.enter(sh, c, 0)
	if !ok {
		return
	}
	r := lockcore.Release{S: c, By: by, ReqID: req.ReqID, Key: req.Key, Token: req.Token, Owner: req.Owner, Owned: owned}
	sh.core.Release(now, &r)
	s.carryOut(sh, c)
}

// extend handles a well-formed, in-range EXTEND (version 3) from c's
// reader, whose frame was read at arrived: the lease counts from then
// (PROTOCOL: "after the server received the EXTEND"), no later.
func (s *Server) extend(c *conn, req *wire.Request, arrived int64) {
	sh := s.mode.shardOf(req.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	by, now, ok := s.enter(sh, c, arrived)
	if !ok {
		return
	}
	x := lockcore.Extend{S: c, By: by, ReqID: req.ReqID, Key: req.Key, Token: req.Token, Owner: req.Owner, LeaseS: req.LeaseS}
	sh.core.Extend(now, &x)
	s.carryOut(sh, c)
}

// expire hands an operator's Expire to the core that serves its key (a
// Free of kind expire, answered once it applies); a node whose core does
// not serve refuses with the mode's reason (NotLeaderError,
// NotActiveError).
func (s *Server) expire(x *lockcore.Expire) error {
	sh := s.mode.shardOf(x.Key)
	sh.mu.Lock()
	if !sh.serving {
		sh.mu.Unlock()
		return s.mode.notServing() // (not under sh.mu: a pair takes its own mutex, and takes sh.mu under it)
	}
	sh.core.Expire(s.shardNow(sh), x)
	s.carryOut(sh, nil)
	sh.mu.Unlock()
	return nil
}

// lockChunk is one bounded chunk of table i's held locks for the lock
// browser (lockcore's Scan, under the table's mutex), with the view it
// comes from: the serving core's, or the applied machine's.
func (s *Server) lockChunk(i int, q lockcore.LockQuery, max int, page []lockcore.LockInfo) (string, []lockcore.LockInfo, lockcore.ScanResult) {
	sh := s.mode.table(i)
	sh.mu.Lock()
	if sh.serving {
		defer sh.mu.Unlock()
		page, r := sh.core.Scan(s.shardNow(sh), q, max, page)
		return sh.view, page, r
	}
	sh.mu.Unlock()
	var r lockcore.ScanResult
	view := s.mode.readApplied(func(m *lockcore.Machine) { page, r = m.Scan(q, max, page) })
	return view, page, r
}

// lock is one key's holding for the lock browser, with its view.
func (s *Server) lock(key string) (string, lockcore.LockDetail, bool) {
	sh := s.mode.shardOf([]byte(key))
	sh.mu.Lock()
	if sh.serving {
		defer sh.mu.Unlock()
		d, ok := sh.core.Lock(s.shardNow(sh), key)
		return sh.view, d, ok
	}
	sh.mu.Unlock()
	var d lockcore.LockDetail
	var ok bool
	view := s.mode.readApplied(func(m *lockcore.Machine) { d, ok = m.Lock(key) })
	return view, d, ok
}

// applied gives sh's core the outcome r of p, a command of its in
// flight, and carries out the effects (under sh.mu; now is the event's
// time): how a replicating log hands back what it applied.
func (s *Server) applied(sh *shard, now int64, p *lockcore.Proposal, r lockcore.Result) {
	sh.core.Applied(now, p, r)
	s.carryOut(sh, nil)
}

// resyncKey sets key's projection in sh's core to the holding (h, held)
// its mode's machine has, after a command that did not apply as projected
// (under sh.mu; what names the mode in the log line).
func (s *Server) resyncKey(sh *shard, what, key string, h lockcore.Holding, held bool) {
	var hp *lockcore.Holding
	if held {
		hp = &h
	}
	s.log.Error(what+": a command the scheduler proposed did not apply as projected; resynchronising the key", "key", key)
	sh.core.Resync(s.shardNow(sh), key, hp)
	s.carryOut(sh, nil)
}

// cancel handles a CANCEL (version 2) naming reqID: if that ACQUIRE of c
// is still waiting in a queue, or for a token (a token waiter of the
// core), it is removed and answered T at once; the lock table is
// otherwise untouched. An ACQUIRE already granted or answered, or one being
// answered right now, and an unknown reqID, are left alone: no reply, no
// error.
func (s *Server) cancel(c *conn, reqID uint32) {
	f, ok := c.flightOf(reqID)
	if !ok {
		return
	}
	sh := f.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// Again under the shard mutex, which every change of a waiter's state
	// holds: a token waiter may have been queued meanwhile, or answered.
	if f, ok = c.flightOf(reqID); !ok || f.sh != sh {
		return
	}
	if f.w != nil {
		sh.core.Cancel(s.shardNow(sh), f.w)
		s.carryOut(sh, c)
	}
}

// dropFlight removes f, an ACQUIRE of a closing session, from its queue
// or from the token waiters.
func (s *Server) dropFlight(f flight) {
	if f.w == nil {
		return // its grant is in flight: nothing to drop
	}
	f.sh.mu.Lock()
	f.sh.core.Drop(f.w)
	f.sh.mu.Unlock()
}

// carryOut does what the last event of sh's core asks (under sh.mu):
// replies (caller is the session whose reader sent the event, if any: it
// flushes its own replies, the others' writers are woken), counters, the
// in-flight records of queued ACQUIREs; then it sets the shard's timer.
func (s *Server) carryOut(sh *shard, caller *conn) {
	var desync []string
	fx := sh.core.Effects()
	for i := range fx {
		e := &fx[i]
		c, _ := e.S.(*conn)
		wake := c != caller
		switch e.Kind {
		case lockcore.Granted:
			if e.Why != lockcore.Again {
				s.m.granted(e.Wait)
			}
			c.sendGranted(e.ReqID, e.Token, e.WaitedMS(), e.Queued, wake)
		case lockcore.TimedOut:
			s.m.timeouts.Add(1)
			if e.Why == lockcore.Cancelled {
				s.m.cancelled.Add(1)
			}
			c.send(wire.TypeTimedOut, e.ReqID, e.Queued, wake)
		case lockcore.Busy:
			switch e.Why {
			case lockcore.NoToken:
				s.noToken(e.Err)
			case lockcore.Backlog:
				sh.rep.proposalLimited()
			case lockcore.SlowCommit:
				if e.Wait > 0 {
					sh.rep.slowCommit(e.Wait) // counted once per grant, not per retry
				} else {
					s.m.busy.Add(1)
				}
			default:
				s.m.busy.Add(1)
			}
			c.send(wire.TypeBusy, e.ReqID, e.Queued, wake)
		case lockcore.Released:
			s.m.released.Add(1)
			c.send(wire.TypeReleased, e.ReqID, false, wake)
		case lockcore.NotHeld:
			if answerAdmin(e) {
				break
			}
			s.m.notHeld.Add(1)
			c.send(wire.TypeNotHeld, e.ReqID, false, wake)
		case lockcore.Ended:
			answerAdmin(e)
		case lockcore.Kept:
			s.m.kept.Add(1)
			c.send(wire.TypeKept, e.ReqID, false, wake)
		case lockcore.Failed:
			if e.Queued {
				s.internalErrorQueued(c, e.ReqID, e.Err)
			} else {
				s.internalError(c, e.ReqID, e.Err)
			}
		case lockcore.Queue:
			if !c.addInflight(e.ReqID, flight{sh: sh, w: e.W}) {
				sh.core.Drop(e.W) // the session is closing
			}
		case lockcore.Track:
			c.addInflight(e.ReqID, flight{sh: sh})
		case lockcore.Expired:
			s.m.expired.Add(1)
		case lockcore.Desync:
			desync = append(desync, e.Err.(*lockcore.DesyncError).Key)
		}
	}
	s.rearm(sh)
	for _, key := range desync {
		sh.rep.resync(key) // (only a replicated core's command can fail to apply as projected)
	}
}

// rearm keeps sh's timer at its core's Next instant (under sh.mu). A timer
// that fires early finds nothing due and is set again.
func (s *Server) rearm(sh *shard) {
	n := sh.core.Next()
	if sh.exact {
		n = min(n, sh.core.NextExpiry())
	}
	if n >= sh.wakeAt {
		return
	}
	sh.wakeAt = n
	d := time.Duration(max(n-s.now(), 0))
	if sh.wake == nil {
		sh.wake = s.afterFunc(d, func() { s.shardDue(sh) })
	} else {
		sh.wake.Reset(d)
	}
}

// shardNow is now for sh's core (under sh.mu): the server's clock, and
// never before an instant the core was already given.
func (s *Server) shardNow(sh *shard) int64 {
	sh.last = max(sh.last, s.now())
	return sh.last
}

// shardDue does what is due in sh: when its timer fires, and at a sweep
// (standalone). The timer is set again for what comes next.
func (s *Server) shardDue(sh *shard) {
	sh.mu.Lock()
	sh.wakeAt = lockcore.NoDeadline
	sh.core.Tick(s.shardNow(sh))
	s.carryOut(sh, nil)
	sh.mu.Unlock()
}

// stopTimer stops sh's timer (Close).
func (sh *shard) stopTimer() {
	sh.mu.Lock()
	if sh.wake != nil {
		sh.wake.Stop()
	}
	sh.wakeAt = lockcore.NoDeadline
	sh.mu.Unlock()
}
