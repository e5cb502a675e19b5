package server

import (
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// Standalone mode: the lock table is numShards lockcore.Cores, one per
// shard of the keys (by a hash of the key), each under its shard's mutex
// and applied directly (localLog: a grant's token comes from the token
// store at once, so no command is ever in flight). This file is only the
// driver: it feeds each core its events with the server's clock, carries
// out the effects (replies into sessions, counters), keeps one timer per
// shard at the core's Next instant, and sweeps every shard now and then
// for the leases nobody touches. Every decision is the core's.

const (
	numShards   = 256
	sweepPeriod = 100 * time.Millisecond
	secondNs    = int64(time.Second)
	msNs        = int64(time.Millisecond)
)

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
	// cl is the cluster whose leader runs this core (nil standalone): the
	// effects only a replicated core has (Backlog, SlowCommit, Desync)
	// are its.
	cl *cluster
	_  [64]byte
}

// mode is how the server keeps its lock table, chosen once, at New:
// standalone's shards over the token store (shards), or a Raft node
// (*cluster), whose leader runs one core fed by the applied log. Sessions
// hand their ACQUIREs and RELEASEs to it (CANCEL and a closing session's
// drops go to the core their in-flight record names); status, metrics and
// health read it.
type mode interface {
	acquire(c *conn, req *wire.Request, arrived int64)
	release(c *conn, req *wire.Request, owned bool)
	lastToken() uint64                  // the highest token handed out (standalone), or applied (Raft)
	tokenCeiling() uint64               // the durable ceiling (standalone); the committed counter (Raft)
	heldLocks() int                     // held locks: in Raft mode, the holdings of the applied log
	health() error                      // TokenStoreErr
	collectors() []prometheus.Collector // the mode's own, beside the server's
	close()                             // the end of Close and Shutdown
}

// shards is standalone's mode.
type shards struct{ s *Server }

func (t shards) lastToken() uint64                  { return t.s.tokens.last.Load() }
func (t shards) tokenCeiling() uint64               { return t.s.tokens.ceiling.Load() }
func (t shards) heldLocks() int                     { return int(t.s.capacity.Held.Load()) }
func (t shards) health() error                      { return t.s.tokens.health(tokenWait) }
func (t shards) collectors() []prometheus.Collector { return nil }

func (t shards) close() {
	for i := range t.s.shards {
		t.s.shards[i].stopTimer()
	}
	t.s.tokens.close()
}

// localLog is standalone's lockcore.Proposer: every command applies at
// once; a grant takes the next token of the store's reservation.
type localLog struct{ tokens *tokenStore }

func (l localLog) Propose(p *lockcore.Proposal) bool {
	if !p.Grants() {
		p.SetResult(lockcore.Result{Freed: true})
		return true
	}
	if tok, ok := l.tokens.take(); ok {
		p.SetResult(lockcore.Result{Freed: true, Token: tok})
		return true
	}
	// No token below the durable ceiling right now: a reservation is being
	// written (a first try is deferred until it ends), or the last one
	// failed (E(6) for a waiter's turn), or there are none left.
	err := l.tokens.failed()
	switch {
	case errors.Is(err, ErrTokensExhausted):
		p.SetResult(lockcore.Result{Freed: true, Err: err})
	case err != nil:
		p.SetResult(lockcore.Result{Freed: true, Retry: true, Fatal: true, Err: err})
	default:
		p.SetResult(lockcore.Result{Freed: true, Retry: true, Err: errTokenStall})
	}
	return true
}

func (s *Server) initShards() {
	cfg := lockcore.Config{Capacity: &s.capacity, MaxKeyWaiters: s.cfg.MaxKeyWaiters}
	for i := range s.shards {
		s.shards[i].core = lockcore.New(cfg, localLog{s.tokens})
		s.shards[i].wakeAt = lockcore.NoDeadline
	}
	s.mode = shards{s}
}

func (s *Server) shardFor(key []byte) *shard {
	return &s.shards[maphash.Bytes(s.seed, key)%numShards]
}

// tokenWait bounds how long an ACQUIRE of a free key waits, outside any
// lock, for the token store to reserve tokens when none is left below the
// durable ceiling (a slow or stalled disk); past it the ACQUIRE gets B. It
// is also how long a reservation may run before TokenStoreErr reports the
// store as stalled.
var tokenWait = time.Second

// tokenWaiter is an ACQUIRE the core deferred (no token), waiting for the
// token store off its session's reader.
type tokenWaiter struct {
	// done: decided, cancelled or dropped (under the shard mutex).
	done bool
	// counted: still counted in capacity.Waiters; whoever clears it
	// (acquireLate, or a CANCEL) uncounts it.
	counted atomic.Bool
}

// acquire handles a well-formed, in-range ACQUIRE from c's reader.
func (s *Server) acquire(c *conn, req *wire.Request, arrived int64) { s.mode.acquire(c, req, arrived) }

// release handles a well-formed, in-range RELEASE from c's reader, or with
// owned a RELEASE_OWNED (version 2), which frees the key only if its holder
// is also req.Owner.
func (s *Server) release(c *conn, req *wire.Request, owned bool) { s.mode.release(c, req, owned) }

func (t shards) acquire(c *conn, req *wire.Request, arrived int64) {
	s := t.s
	if s.capacity.Held.Load() >= int64(s.cfg.MaxLocks) {
		s.sweepForCapacity()
	}
	sh := s.shardFor(req.Key)
	a := lockcore.Acquire{S: c, ReqID: req.ReqID, Key: req.Key, Owner: req.Owner, LeaseS: req.LeaseS, WaitS: req.WaitS,
		OwnedOnly: s.ownedOnly(c), Arrived: arrived}
	sh.mu.Lock()
	// The ACQUIRE is decided as of its arrival (no second clock read on
	// the grant path), or of the shard's last event if that came later. A
	// lease counted from arrival ends no earlier than its holder's own
	// count, which starts when it sent the ACQUIRE.
	sh.last = max(sh.last, arrived)
	sh.core.Acquire(sh.last, &a)
	deferred := s.carryOut(sh, c)
	sh.mu.Unlock()
	if deferred {
		s.deferAcquire(c, req, arrived, sh)
	}
}

// deferAcquire makes an ACQUIRE that found no token wait for the
// reservation in a goroutine of its own, off the reader and without the
// shard mutex, so that the session's later requests, RELEASE, PING and
// other keys go on. It stays in the session's in-flight map meanwhile (its
// req_id may not be reused; a closing session ends it). It counts as a
// waiter (MaxWaiters) while it waits, so that pipelined ACQUIREs on a
// stalled disk cannot start goroutines without bound.
func (s *Server) deferAcquire(c *conn, req *wire.Request, arrived int64, sh *shard) {
	if !s.capacity.TakeWaiter() {
		s.m.busy.Add(1)
		c.replySimple(wire.TypeBusy, req.ReqID)
		return
	}
	tw := &tokenWaiter{}
	tw.counted.Store(true)
	gone, ok := c.addTokenWaiter(req.ReqID, flight{sh: sh, tw: tw})
	if !ok {
		s.capacity.Waiters.Add(-1)
		return // the session is closing
	}
	r := *req
	r.Key = append([]byte(nil), req.Key...) // req aliases the read buffer
	r.AuthToken, r.Name = nil, nil
	s.wg.Add(1) // the reader's own count is held: Close waits for this too
	go func() {
		defer s.wg.Done()
		s.acquireLate(c, &r, arrived, sh, tw, gone)
	}()
}

// acquireLate decides, off the reader, an ACQUIRE whose free key found no
// token: it waits up to tokenWait for the reservation (or until the
// session closes), then has the core decide it once more (Acquire.Late),
// for good. Whoever sets tw.done under the shard mutex (this, a CANCEL,
// the closing session) answers it, or nobody does.
func (s *Server) acquireLate(c *conn, req *wire.Request, arrived int64, sh *shard, tw *tokenWaiter, gone <-chan struct{}) {
	err := s.tokens.await(tokenWait, gone)
	if tw.counted.Swap(false) {
		s.capacity.Waiters.Add(-1) // from here on it is decided, or queued as a waiter of its own
	}
	if errors.Is(err, errAwaitStopped) {
		return // the session closed: nothing to answer
	}
	sh.mu.Lock()
	if tw.done || c.dead.Load() {
		tw.done = true
		sh.mu.Unlock()
		return // cancelled (answered T) or its session is closing
	}
	tw.done = true
	if err == nil {
		a := lockcore.Acquire{S: c, ReqID: req.ReqID, Key: req.Key, Owner: req.Owner, LeaseS: req.LeaseS, WaitS: req.WaitS,
			OwnedOnly: s.ownedOnly(c), Arrived: arrived, Late: true}
		sh.core.Acquire(s.shardNow(sh), &a)
		s.carryOut(sh, nil)
		sh.mu.Unlock()
		return
	}
	sh.mu.Unlock()
	if errors.Is(err, errTokenStall) || errors.Is(err, ErrTokensExhausted) {
		s.noToken(err)
		c.replySimpleQueued(wire.TypeBusy, req.ReqID)
	} else {
		s.internalErrorQueued(c, req.ReqID, err) // the disk failed: E(6)
	}
}

// ownedOnly reports whether a lock granted to an ACQUIRE of c may be freed
// only by RELEASE_OWNED: with Config.OwnedReleaseOnly, if c speaks version
// 2. (c.ver is set at HELLO, before c's first ACQUIRE is read.)
func (s *Server) ownedOnly(c *conn) bool {
	return s.cfg.OwnedReleaseOnly && c.ver >= wire.Version2
}

func (t shards) release(c *conn, req *wire.Request, owned bool) {
	s := t.s
	sh := s.shardFor(req.Key)
	r := lockcore.Release{S: c, ReqID: req.ReqID, Key: req.Key, Token: req.Token, Owner: req.Owner, Owned: owned}
	sh.mu.Lock()
	sh.core.Release(s.shardNow(sh), &r)
	s.carryOut(sh, c)
	sh.mu.Unlock()
}

// cancel handles a CANCEL (version 2) naming reqID: if that ACQUIRE of c
// is still waiting in a queue, or for a token (acquireLate: not yet
// decided), it is removed and answered T at once; the lock table is
// otherwise untouched. An ACQUIRE already granted or answered, or one being
// answered right now, and an unknown reqID, are left alone: no reply, no
// error.
func (s *Server) cancel(c *conn, reqID uint32) {
	f, ok := c.flightOf(reqID)
	if !ok || f.sh == nil {
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
	if f.sh == nil {
		return
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
				sh.cl.proposalLimited()
			case lockcore.SlowCommit:
				if e.Wait > 0 {
					sh.cl.slowCommit(e.Wait) // counted once per grant, not per retry
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
			s.m.notHeld.Add(1)
			c.send(wire.TypeNotHeld, e.ReqID, false, wake)
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
		sh.cl.resync(key) // (only a replicated core's command can fail to apply as projected)
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

// shardDue runs when sh's timer fires.
func (s *Server) shardDue(sh *shard) {
	sh.mu.Lock()
	sh.wakeAt = lockcore.NoDeadline
	sh.core.Tick(s.shardNow(sh))
	s.carryOut(sh, nil)
	sh.mu.Unlock()
}

// noToken counts an ACQUIRE answered B because no token was available,
// and logs at most once per second with the count since the last line.
func (s *Server) noToken(reason error) {
	s.m.busy.Add(1)
	n := s.m.tokenUnavailable.Add(1)
	if since, ok := s.m.noTokenLog.due(s.now(), n); ok {
		s.log.Warn("no fencing token available: ACQUIREs of free keys answered B", "reason", reason, "count", since)
	}
}

// sweepAll ends every lease that is due and forgets idle entries, in every
// shard.
func (s *Server) sweepAll() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.core.Tick(s.shardNow(sh))
		s.carryOut(sh, nil)
		sh.mu.Unlock()
	}
}

// sweepForCapacity makes the held-lock count exact before a capacity
// decision, at most once per millisecond.
func (s *Server) sweepForCapacity() {
	now := s.now()
	last := s.lastCapSweep.Load()
	if now-last < msNs || !s.lastCapSweep.CompareAndSwap(last, now) {
		return
	}
	s.sweepAll()
}

func (s *Server) sweeper() {
	defer s.bg.Done()
	t := time.NewTicker(sweepPeriod)
	defer t.Stop()
	for {
		select {
		case <-s.stopBg:
			return
		case <-t.C:
			s.sweepAll()
		}
	}
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
