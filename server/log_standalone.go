package server

import (
	"errors"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// Standalone mode: the lock table is numShards lock cores, one per shard
// of the keys (by a hash of the key), each applied directly: its
// replication log (localLog) is the token store (log_standalone_store.go), which gives a
// grant its token at once, so no command is ever in flight. Leases of keys
// nobody touches are ended by a sweep every sweepPeriod (and before a
// capacity decision); those with waiters by the shard's timer. An ACQUIRE
// of a free key that finds no token (the next block's fsync is late) is
// deferred: it waits for the reservation off its session's reader, then
// the core decides it once more.

const (
	numShards   = 256
	sweepPeriod = 100 * time.Millisecond
	secondNs    = int64(time.Second)
	msNs        = int64(time.Millisecond)
)

// standalone is standalone's mode: the token store and the shards, whose
// cores it feeds. It is a lockLog (lockpath.go) of numShards tables,
// every one always serving.
type standalone struct {
	s      *Server
	tokens *tokenStore
	shards [numShards]shard
}

func (t *standalone) lastToken() uint64                { return t.tokens.last.Load() }
func (t *standalone) tokenCeiling() uint64             { return t.tokens.ceiling.Load() }
func (t *standalone) heldLocks() int                   { return int(t.s.capacity.Held.Load()) }
func (t *standalone) health() error                    { return t.tokens.health(tokenWait) }
func (*standalone) hello()                             {}
func (*standalone) refusal() error                     { return nil }
func (*standalone) stopping()                          {}
func (*standalone) collectors() []prometheus.Collector { return nil }

func (t *standalone) close() {
	for i := range t.shards {
		t.shards[i].stopTimer()
	}
	t.tokens.close()
}

// The lock path's questions (lockLog): a key's shard is by a hash of the
// key; every shard serves; nothing is refused and nothing waits.

func (t *standalone) shardOf(key []byte) *shard {
	return &t.shards[maphash.Bytes(t.s.seed, key)%numShards]
}

func (t *standalone) tables() int        { return numShards }
func (t *standalone) table(i int) *shard { return &t.shards[i] }

func (*standalone) admitRequest(*shard, *conn) (uint64, bool, bool) { return 0, false, true }

// (Not reached: every shard serves.)
func (*standalone) readApplied(func(*lockcore.Machine)) string { return ViewStandalone }
func (*standalone) notServing() error                          { return nil }

// localLog is standalone's lockcore.Proposer: every command applies at
// once; a grant takes the next token of the store's reservation.
type localLog struct{ tokens *tokenStore }

func (l localLog) Propose(p *lockcore.Proposal) bool {
	if p.IsExtend() {
		p.SetResult(lockcore.Result{Kept: true}) // the projection is the state
		return true
	}
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

// newStandalone makes standalone's mode over the token store tokens.
func newStandalone(s *Server, tokens *tokenStore) *standalone {
	t := &standalone{s: s, tokens: tokens}
	cfg := lockcore.Config{Capacity: &s.capacity, MaxKeyWaiters: s.cfg.MaxKeyWaiters}
	for i := range t.shards {
		t.shards[i].core = lockcore.New(cfg, localLog{tokens})
		t.shards[i].wakeAt = lockcore.NoDeadline
		t.shards[i].serving, t.shards[i].view = true, ViewStandalone
	}
	return t
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
	err := s.mode.(*standalone).tokens.await(tokenWait, gone)
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
		a := s.acquireEvent(c, req, arrived, 0)
		a.Late = true
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
	for i := range s.mode.tables() {
		s.shardDue(s.mode.table(i))
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

// startStandalone opens the token store and starts the shards, the
// sweeper and the housekeeping: New's last step for a standalone server.
func (s *Server) startStandalone() (*Server, error) {
	tokens, err := openStore(s.cfg.DataDir, s.cfg.TokenBlock, s.cfg.InitialToken, s.cfg.TokenStart, s.now)
	if err != nil {
		return nil, err
	}
	if tokens.recovered {
		s.cfg.Logger.Warn("token store: no valid ceiling in a used data dir (tokens.ceiling, its temporary file and the copy in LOCK are all missing or corrupt); tokens continue above initial-token alone, which must be at least the highest token ever issued from this directory. Remove initial-token from the configuration once this start has succeeded: left in place, it would be trusted again if the ceiling were lost again",
			"data_dir", s.cfg.DataDir, "initial_token", s.cfg.InitialToken)
	}
	s.mode = newStandalone(s, tokens)
	if s.cfg.Registerer != nil {
		if err := s.register(s.cfg.Registerer); err != nil {
			tokens.close()
			return nil, err
		}
	}
	s.bg.Add(2)
	go s.sweeper()
	go s.housekeeping()
	return s, nil
}
