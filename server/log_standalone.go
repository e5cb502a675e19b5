package server

import (
	"errors"
	"hash/maphash"
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
// of a free key that finds no token (the next block's fsync is late)
// waits in its core as a token waiter (lockcore.Config.TokenWait), which
// decides it again when the reservation ends (tokensReserved).

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

func (t *standalone) counts() modeCounts {
	return modeCounts{last: t.tokens.last.Load(), ceiling: t.tokens.ceiling.Load(), held: int(t.s.capacity.Held.Load())}
}
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
	cfg := lockcore.Config{Capacity: &s.capacity, MaxKeyWaiters: s.cfg.MaxKeyWaiters, TokenWait: int64(tokenWait)}
	for i := range t.shards {
		t.shards[i].core = lockcore.New(cfg, localLog{tokens})
		t.shards[i].wakeAt = lockcore.NoDeadline
		t.shards[i].serving, t.shards[i].view = true, ViewStandalone
	}
	f := t.tokensReserved
	tokens.reserved.Store(&f)
	return t
}

// tokenWait bounds how long an ACQUIRE of a free key waits, as a token
// waiter of its core (lockcore.Config.TokenWait), for the token store to
// reserve tokens when none is left below the durable ceiling (a slow or
// stalled disk); past it the ACQUIRE gets B. It is also how long a
// reservation may run before TokenStoreErr reports the store as stalled.
var tokenWait = time.Second

// tokensReserved is the token store's word that a reservation ended (it
// raised the ceiling, or failed): every shard's token waiters are decided
// again. Each shard is looked at under its mutex, so that a waiter made
// just before cannot be missed (one made after finds the new ceiling).
func (t *standalone) tokensReserved() {
	select {
	case <-t.s.closingCh:
		return // the sessions close; no timer may start again
	default:
	}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		if sh.core.TokenWaiters() > 0 {
			sh.core.TokensReady(t.s.shardNow(sh))
			t.s.carryOut(sh, nil)
		}
		sh.mu.Unlock()
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
