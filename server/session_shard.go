package server

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// Sessions and the lock cores: how a session's requests become a core's
// events, and the core's effects frames.
//
// Every lock decision is a lockcore.Core's (package internal/lockcore).
// A shard is one core and what drives it: the mutex every event of the
// core is under, the core's clock (never going back), and one timer at the
// core's next deadline. The server's mode (log_standalone.go: 256 shards over
// the token store; log_cluster_seam.go: a Raft leader's one core fed by the
// applied log) takes ACQUIREs and RELEASEs to its shards; CANCEL and a
// closing session's drops go to the shard their in-flight record names.
// After each event, carryOut does what the core asks: replies into the
// sessions (session.go), counters, the in-flight records of queued ACQUIREs.

// shard is one lock core and what drives it: its mutex (every event of
// the core is under it), its clock and its timer. Standalone has numShards
// of them; a cluster leader one (cluster.sh).
type shard struct {
	mu     sync.Mutex
	core   *lockcore.Core
	wake   timer // at wakeAt: the core's Next (with exact, NextExpiry too)
	wakeAt int64 // lockcore.NoDeadline: not armed
	last   int64 // the latest now given to core: its events come in time order
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

// replicated is what a replicated mode does with the effects only its
// core has.
type replicated interface {
	proposalLimited()      // an ACQUIRE answered B: Config.MaxPending commands await their apply
	slowCommit(took int64) // a grant answered B: it applied took ns after its proposal
	resync(key string)     // a command did not apply as projected: key's projection from the machine
}

// mode is how the server keeps its lock table, chosen once, at New:
// standalone's shards over the token store (shards), a Raft node
// (*cluster), whose leader runs one core fed by the applied log, or one
// node of a hot-standby pair (*pair), whose active node runs one core
// over the pair's log. Sessions hand their ACQUIREs, RELEASEs and EXTENDs
// to it (CANCEL and a closing session's drops go to the core their
// in-flight record names); HELLO, Serve, Shutdown, status, metrics and
// health ask it what only it knows. No caller asks which mode it is.
type mode interface {
	hello()         // a client's HELLO passed the token check (the pair's CLIENT_REQUEST: it may make this node active)
	refusal() error // why this node refuses to serve at all (a cluster node's refusal, log_cluster_boot.go), or nil
	stopping()      // Shutdown began (not Close): a Raft leader hands its leadership over before it stops

	acquire(c *conn, req *wire.Request, arrived int64)
	release(c *conn, req *wire.Request, owned bool)
	extend(c *conn, req *wire.Request, arrived int64) // EXTEND (version 3)
	lastToken() uint64                                // the highest token handed out (standalone), or applied (Raft)
	tokenCeiling() uint64                             // the durable ceiling (standalone); the committed counter (Raft)
	heldLocks() int                                   // held locks: in Raft mode, the holdings of the applied log
	health() error                                    // TokenStoreErr
	collectors() []prometheus.Collector               // the mode's own, beside the server's
	close()                                           // the end of Close and Shutdown

	// The lock browser (browse.go): its tables (lockSources of them, the
	// serving core's or the applied machine's), one bounded chunk of a
	// table's held locks (lockcore's Scan, under the table's mutex) and
	// one key's, with the view they come from; expire hands an operator's
	// Expire to the serving core, or refuses (NotLeaderError,
	// NotActiveError) where this node does not serve.
	lockSources() int
	lockChunk(i int, q lockcore.LockQuery, max int, page []lockcore.LockInfo) (view string, out []lockcore.LockInfo, r lockcore.ScanResult)
	lock(key string) (view string, d lockcore.LockDetail, held bool)
	expire(x *lockcore.Expire) error
}

// acquireEvent is an ACQUIRE of c, whose frame was read at arrived, as a
// core's event, charged to session by (0: none).
func (s *Server) acquireEvent(c *conn, req *wire.Request, arrived int64, by uint64) lockcore.Acquire {
	return lockcore.Acquire{S: c, By: by, ReqID: req.ReqID, Key: req.Key, Owner: req.Owner, LeaseS: req.LeaseS,
		WaitS: req.WaitS, OwnedOnly: s.ownedOnly(c), Arrived: arrived, Client: c.client}
}

// releaseEvent is a RELEASE of c (owned: RELEASE_OWNED) as a core's
// event, charged to session by (0: none).
func releaseEvent(c *conn, req *wire.Request, owned bool, by uint64) lockcore.Release {
	return lockcore.Release{S: c, By: by, ReqID: req.ReqID, Key: req.Key, Token: req.Token, Owner: req.Owner, Owned: owned}
}

// extendEvent is an EXTEND of c as a core's event, charged to session by
// (0: none).
func extendEvent(c *conn, req *wire.Request, by uint64) lockcore.Extend {
	return lockcore.Extend{S: c, By: by, ReqID: req.ReqID, Key: req.Key, Token: req.Token, Owner: req.Owner, LeaseS: req.LeaseS}
}

// coreAcquire, coreRelease and coreExtend hand a session's request to
// sh's core as its event, charged to session by, and carry out the
// effects (under sh.mu): a replicated mode's serving core.
func (s *Server) coreAcquire(sh *shard, c *conn, req *wire.Request, arrived int64, by uint64) {
	a := s.acquireEvent(c, req, arrived, by)
	sh.core.Acquire(s.shardNow(sh), &a)
	s.carryOut(sh, c)
}

func (s *Server) coreRelease(sh *shard, c *conn, req *wire.Request, owned bool, by uint64) {
	r := releaseEvent(c, req, owned, by)
	sh.core.Release(s.shardNow(sh), &r)
	s.carryOut(sh, c)
}

func (s *Server) coreExtend(sh *shard, c *conn, req *wire.Request, by uint64) {
	x := extendEvent(c, req, by)
	sh.core.Extend(s.shardNow(sh), &x)
	s.carryOut(sh, c)
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

// acquire handles a well-formed, in-range ACQUIRE from c's reader.
func (s *Server) acquire(c *conn, req *wire.Request, arrived int64) { s.mode.acquire(c, req, arrived) }

// extend handles a well-formed, in-range EXTEND (version 3) from c's
// reader, whose frame was read at arrived: the lease counts from then.
func (s *Server) extend(c *conn, req *wire.Request, arrived int64) { s.mode.extend(c, req, arrived) }

// release handles a well-formed, in-range RELEASE from c's reader, or with
// owned a RELEASE_OWNED (version 2), which frees the key only if its holder
// is also req.Owner.
func (s *Server) release(c *conn, req *wire.Request, owned bool) { s.mode.release(c, req, owned) }

// cancel handles a CANCEL (version 2) naming reqID: if that ACQUIRE of c
// is still waiting in a queue, or for a token (acquireLate: not yet
// decided), it is removed and answered T at once; the lock table is
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
	switch {
	case f.w != nil:
		sh.core.Cancel(s.shardNow(sh), f.w)
		s.carryOut(sh, c)
	case f.tw != nil && !f.tw.done:
		f.tw.done = true // acquireLate will not decide it
		if f.tw.counted.Swap(false) {
			s.capacity.Waiters.Add(-1)
		}
		s.m.timeouts.Add(1)
		s.m.cancelled.Add(1)
		c.replySimpleQueued(wire.TypeTimedOut, reqID)
	}
}

// dropFlight removes f, an ACQUIRE of a closing session, from its queue,
// or ends its wait for a token.
func (s *Server) dropFlight(f flight) {
	if f.w == nil && f.tw == nil {
		return // its grant is in flight: nothing to drop
	}
	f.sh.mu.Lock()
	if f.w != nil {
		f.sh.core.Drop(f.w)
	} else if f.tw != nil {
		f.tw.done = true
	}
	f.sh.mu.Unlock()
}

// carryOut does what the last event of sh's core asks (under sh.mu):
// replies (caller is the session whose reader sent the event, if any: it
// flushes its own replies, the others' writers are woken), counters, the
// in-flight records of queued ACQUIREs; then it sets the shard's timer. It
// reports whether the core deferred the caller's ACQUIRE (Defer).
func (s *Server) carryOut(sh *shard, caller *conn) (deferred bool) {
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
		case lockcore.Defer:
			deferred = true
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
	return deferred
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
