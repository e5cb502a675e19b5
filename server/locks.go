package server

import (
	"errors"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Lock table layout.
//
// The table is split into numShards shards by a hash of the key; each shard
// is a mutex and a map from key to *lockState. Everything about one key
// (holder, lease, queue) is changed only under its shard's mutex.
//
// Expiry is exact without polling: every access (ACQUIRE, RELEASE) checks the
// lease first, a key with waiters has a timer at its expiry instant that
// grants the next waiter, and a sweeper frees expired keys nobody touches.
// The sweeper is cheap because every shard keeps its entries on intrusive
// lists, one per lease length (wire.MinLeaseS..wire.MaxLeaseS s): entries are appended at grant time
// under the shard mutex with a monotonic clock, so each list is sorted by
// expiry and the sweeper only looks at list heads. List 0 holds free
// entries, kept idleTTL for reuse so that acquiring and releasing the same
// key again allocates nothing.

const (
	numShards   = 256
	numLists    = wire.MaxLeaseS + 1 // 0: idle entries; wire.MinLeaseS..wire.MaxLeaseS: held, by lease_s
	idleTTL     = int64(2 * time.Second)
	sweepPeriod = 100 * time.Millisecond
	secondNs    = int64(time.Second)
	msNs        = int64(time.Millisecond)
)

type lockState struct {
	key        string
	owner      [wire.OwnerLen]byte
	token      uint64 // 0 = free (an idle entry)
	expires    int64  // held: lease end; idle: when the entry may be deleted
	prev, next *lockState
	q          *waitQueue // non-nil only while the key has waiters (and so is held)
	lease      uint8      // lease_s of the holding (the machine's)
	list       uint8
	linked     bool
	// ownedOnly: the holding may be freed only by RELEASE_OWNED (set at
	// grant: Config.OwnedReleaseOnly and an ACQUIRE of a version-2 session).
	ownedOnly bool
}

type waitQueue struct {
	head, tail *waiter
	n          int
	byOwner    map[[wire.OwnerLen]byte]*waiter
	timer      timer // fires at the holder's lease end
}

// waiter is an ACQUIRE waiting in a key's queue or, with ls nil, one
// waiting for a token (acquireLate): a placeholder in no queue.
type waiter struct {
	c          *conn
	sh         *shard
	ls         *lockState
	reqID      uint32
	owner      [wire.OwnerLen]byte
	lease      uint8
	arrived    int64
	deadline   int64 // arrived + wait_s: past it the waiter gets T, never G
	prev, next *waiter
	timer      timer // wait_s deadline
	done       bool  // granted, timed out or dropped (under sh.mu)
	ownedOnly  bool  // a grant to it sets lockState.ownedOnly
	// counted: a token waiter (acquireLate) still counted in s.waiters;
	// whoever clears it (acquireLate, or a CANCEL) uncounts it.
	counted atomic.Bool
	// Raft mode (cluster.go): the key, and whether the waiter's grant is
	// proposed (being committed: a CANCEL leaves it alone).
	ck       *ckey
	proposed bool
}

type expList struct{ head, tail *lockState }

type shard struct {
	mu       sync.Mutex
	machine  // this shard's keys; applied to only under mu
	lists    [numLists]expList
	nonempty [4]uint64
	_        [64]byte // keep neighbouring shards' mutexes off one cache line
}

func (sh *shard) link(ls *lockState, list uint8) {
	l := &sh.lists[list]
	ls.list, ls.linked, ls.next = list, true, nil
	ls.prev = l.tail
	if l.tail != nil {
		l.tail.next = ls
	} else {
		l.head = ls
		sh.nonempty[list>>6] |= 1 << (list & 63)
	}
	l.tail = ls
}

func (sh *shard) unlink(ls *lockState) {
	if !ls.linked {
		return
	}
	l := &sh.lists[ls.list]
	if ls.prev != nil {
		ls.prev.next = ls.next
	} else {
		l.head = ls.next
	}
	if ls.next != nil {
		ls.next.prev = ls.prev
	} else {
		l.tail = ls.prev
	}
	if l.head == nil {
		sh.nonempty[ls.list>>6] &^= 1 << (ls.list & 63)
	}
	ls.prev, ls.next, ls.linked = nil, nil, false
}

func (q *waitQueue) push(w *waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n++
	q.byOwner[w.owner] = w
}

func (q *waitQueue) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	q.n--
	if q.byOwner[w.owner] == w {
		delete(q.byOwner, w.owner)
	}
}

// enqueue queues w at the end of q or, when old (the same owner's earlier
// ACQUIRE of the key, a deliberate retry, perhaps on another session) is
// waiting, in old's place; old is answered T. Under the key's lock.
func (s *Server) enqueue(q *waitQueue, w, old *waiter) {
	if old == nil {
		q.push(w)
		return
	}
	q.replace(old, w)
	old.done = true
	old.timer.Stop()
	s.m.timeouts.Add(1)
	old.c.replySimpleQueued(wire.TypeTimedOut, old.reqID)
}

// replace puts nw in old's place in the queue.
func (q *waitQueue) replace(old, nw *waiter) {
	nw.prev, nw.next = old.prev, old.next
	if old.prev != nil {
		old.prev.next = nw
	} else {
		q.head = nw
	}
	if old.next != nil {
		old.next.prev = nw
	} else {
		q.tail = nw
	}
	old.prev, old.next = nil, nil
	q.byOwner[nw.owner] = nw
}

func (s *Server) shardFor(key []byte) *shard {
	return &s.shards[maphash.Bytes(s.seed, key)%numShards]
}

func waitedMS(now, arrived int64) uint32 {
	if now <= arrived {
		return 0
	}
	// Rounded down, and saturated rather than wrapped (a wait is at most
	// wire.MaxWaitS seconds, but a stalled process must not turn 49.7 days into 0).
	return uint32(min((now-arrived)/msNs, math.MaxUint32))
}

// tokenWait bounds how long an ACQUIRE of a free key waits, outside any
// lock, for the token store to reserve tokens when none is left below the
// durable ceiling (a slow or stalled disk); past it the ACQUIRE gets B. It
// is also how long a reservation may run before TokenStoreErr reports the
// store as stalled.
var tokenWait = time.Second

// acquire handles a well-formed, in-range ACQUIRE from c's reader.
func (s *Server) acquire(c *conn, req *wire.Request, arrived int64) {
	if s.cl != nil {
		s.cl.acquire(c, req, arrived)
		return
	}
	if s.held.Load() >= int64(s.cfg.MaxLocks) {
		s.sweepForCapacity()
	}
	sh := s.shardFor(req.Key)
	if s.acquireOnce(c, req, arrived, sh, nil) {
		return
	}
	// A free key and no token (the rare path): the ACQUIRE waits for the
	// reservation in a goroutine of its own, off the reader and without
	// the shard mutex, so that the session's later requests, RELEASE, PING
	// and other keys go on. It stays in the session's in-flight map
	// meanwhile (its req_id may not be reused; a closing session ends it).
	// It counts as a waiter (MaxWaiters) while it waits, so that pipelined
	// ACQUIREs on a stalled disk cannot start goroutines without bound.
	if s.waiters.Add(1) > int64(s.cfg.MaxWaiters) {
		s.waiters.Add(-1)
		s.m.busy.Add(1)
		c.replySimple(wire.TypeBusy, req.ReqID)
		return
	}
	tw := &waiter{c: c, sh: sh, reqID: req.ReqID}
	tw.counted.Store(true)
	gone, ok := c.addTokenWaiter(tw)
	if !ok {
		s.waiters.Add(-1)
		return // the session is closing
	}
	r := *req
	r.Key = append([]byte(nil), req.Key...) // req aliases the read buffer
	r.AuthToken, r.Name = nil, nil
	s.wg.Add(1) // the reader's own count is held: Close waits for this too
	go func() {
		defer s.wg.Done()
		s.acquireLate(c, &r, arrived, tw, gone)
	}()
}

// acquireLate decides, off the reader, an ACQUIRE whose free key found no
// token: it waits up to tokenWait for the reservation (or until the
// session closes), then decides again from scratch, once. tw is its
// placeholder in the in-flight map; whoever sets tw.done under the shard
// mutex (this, a CANCEL, the closing session) answers it, or nobody does.
func (s *Server) acquireLate(c *conn, req *wire.Request, arrived int64, tw *waiter, gone <-chan struct{}) {
	err := s.tokens.await(tokenWait, gone)
	if tw.counted.Swap(false) {
		s.waiters.Add(-1) // from here on it is decided, or queued as a waiter of its own
	}
	if errors.Is(err, errAwaitStopped) {
		return // the session closed: nothing to answer
	}
	if err == nil {
		s.acquireOnce(c, req, arrived, tw.sh, tw)
		return
	}
	sh := tw.sh
	sh.mu.Lock()
	if tw.done {
		sh.mu.Unlock()
		return
	}
	tw.done = true
	sh.mu.Unlock()
	if errors.Is(err, errTokenStall) || errors.Is(err, ErrTokensExhausted) {
		s.noToken(err)
		c.replySimpleQueued(wire.TypeBusy, req.ReqID)
	} else {
		s.internalErrorQueued(c, req.ReqID, err) // the disk failed: E(6)
	}
}

// acquireOnce decides an ACQUIRE under the shard mutex. On the reader's
// first try (tw nil) it returns false, having answered nothing, when the
// key is free but no token is available. With tw, the placeholder of an
// ACQUIRE that waited for a token (acquireLate), it always decides (unless
// tw was cancelled or dropped meanwhile), answers through the queued-reply
// path, and returns true.
func (s *Server) acquireOnce(c *conn, req *wire.Request, arrived int64, sh *shard, tw *waiter) bool {
	late := tw != nil
	sh.mu.Lock()
	if late {
		if tw.done || c.dead.Load() {
			tw.done = true
			sh.mu.Unlock()
			return true // cancelled (answered T) or its session is closing
		}
		tw.done = true // decided now, under sh.mu: a CANCEL finds it done
	}
	now := s.now()
	ls := sh.m[string(req.Key)]
	if ls != nil && ls.token != 0 && now >= ls.expires {
		s.expireLocked(sh, ls, now)
	}
	switch sh.decide(ls, &req.Owner) {
	case grantNew:
		// Free key: a new held lock.
		if s.held.Add(1) > int64(s.cfg.MaxLocks) {
			s.held.Add(-1)
			sh.mu.Unlock()
			s.m.busy.Add(1)
			c.answer(late, wire.TypeBusy, req.ReqID)
			return true
		}
		tok, ok := s.tokens.take()
		if !ok {
			s.held.Add(-1)
			sh.mu.Unlock()
			if !late {
				return false
			}
			// The reservation ended but others took its tokens first.
			s.noToken(errTokenStall)
			c.answer(late, wire.TypeBusy, req.ReqID)
			return true
		}
		if ls != nil {
			sh.unlink(ls)
			ls = sh.applyGrant(ls, ls.key, req.Owner, req.LeaseS, s.ownedOnly(c), tok)
		} else {
			ls = sh.applyGrant(nil, string(req.Key), req.Owner, req.LeaseS, s.ownedOnly(c), tok)
		}
		ls.expires = now + int64(req.LeaseS)*secondNs
		sh.link(ls, req.LeaseS)
		sh.mu.Unlock()
		s.m.granted(now - arrived)
		c.answerGranted(late, req.ReqID, tok, waitedMS(now, arrived))
		return true
	case grantRetry:
		// Idempotent retry by the holder: same token, lease not extended.
		tok := ls.token
		sh.mu.Unlock()
		c.answerGranted(late, req.ReqID, tok, 0)
		return true
	}
	if req.WaitS == 0 {
		sh.mu.Unlock()
		s.m.timeouts.Add(1)
		c.answer(late, wire.TypeTimedOut, req.ReqID)
		return true
	}
	q := ls.q
	var old *waiter
	if q != nil {
		old = q.byOwner[req.Owner]
	}
	if old == nil {
		if q != nil && q.n >= s.cfg.MaxKeyWaiters {
			sh.mu.Unlock()
			s.m.busy.Add(1)
			c.answer(late, wire.TypeBusy, req.ReqID)
			return true
		}
		if s.waiters.Add(1) > int64(s.cfg.MaxWaiters) {
			s.waiters.Add(-1)
			sh.mu.Unlock()
			s.m.busy.Add(1)
			c.answer(late, wire.TypeBusy, req.ReqID)
			return true
		}
	}
	w := &waiter{c: c, sh: sh, ls: ls, reqID: req.ReqID, owner: req.Owner, lease: req.LeaseS, arrived: arrived,
		deadline: arrived + int64(req.WaitS)*secondNs, ownedOnly: s.ownedOnly(c)}
	if !c.addInflight(w) { // replaces tw, if any
		// The session is closing; its waits are dropped anyway.
		if old == nil {
			s.waiters.Add(-1)
		}
		sh.mu.Unlock()
		return true
	}
	if q == nil {
		q = &waitQueue{byOwner: make(map[[wire.OwnerLen]byte]*waiter, 1)}
		ls.q = q
		q.timer = s.afterFunc(time.Duration(ls.expires-now), func() { s.keyTimer(sh, ls) })
	}
	s.enqueue(q, w, old)
	// wait_s counts from the ACQUIRE's arrival, not from now: a capacity
	// sweep or a contended shard in between must not lengthen the wait.
	w.timer = s.afterFunc(time.Duration(w.deadline-now), func() { s.waitTimeout(w) })
	sh.mu.Unlock()
	return true
}

// ownedOnly reports whether a lock granted to an ACQUIRE of c may be freed
// only by RELEASE_OWNED: with Config.OwnedReleaseOnly, if c speaks version
// 2. (c.ver is set at HELLO, before c's first ACQUIRE is read.)
func (s *Server) ownedOnly(c *conn) bool {
	return s.cfg.OwnedReleaseOnly && c.ver >= wire.Version2
}

// release handles a well-formed, in-range RELEASE from c's reader, or with
// owned a RELEASE_OWNED (version 2), which frees the key only if its holder
// is also req.Owner. A plain RELEASE does not free a holding that only
// RELEASE_OWNED may free (ls.ownedOnly): N, the lock stays held.
func (s *Server) release(c *conn, req *wire.Request, owned bool) {
	if s.cl != nil {
		s.cl.release(c, req, owned)
		return
	}
	sh := s.shardFor(req.Key)
	sh.mu.Lock()
	now := s.now()
	ls := sh.m[string(req.Key)]
	ok := false
	if ls != nil && ls.token != 0 {
		if now >= ls.expires {
			s.expireLocked(sh, ls, now) // the lease ended: N
		} else if sh.mayRelease(ls, req.Token, &req.Owner, owned) {
			s.freeLocked(sh, ls, now)
			ok = true
		}
	}
	sh.mu.Unlock()
	if ok {
		s.m.released.Add(1)
		c.replySimple(wire.TypeReleased, req.ReqID)
	} else {
		s.m.notHeld.Add(1)
		c.replySimple(wire.TypeNotHeld, req.ReqID)
	}
}

// cancel handles a CANCEL (version 2) naming reqID: if that ACQUIRE of c
// is still waiting in a queue, or for a token (acquireLate: not yet
// decided), it is removed and answered T at once; the lock table is
// otherwise untouched. An ACQUIRE already granted or answered, or one being
// answered right now, and an unknown reqID, are left alone: no reply, no
// error.
func (s *Server) cancel(c *conn, reqID uint32) {
	if s.cl != nil {
		s.cl.cancel(c, reqID)
		return
	}
	if c.nInflight.Load() == 0 {
		return
	}
	c.mu.Lock()
	w := c.inflight[reqID]
	c.mu.Unlock()
	if w == nil {
		return
	}
	sh := w.sh
	sh.mu.Lock()
	// Again under the shard mutex, which every change of a waiter's state
	// holds: a token waiter may have been queued meanwhile (as another
	// *waiter of the same key), or answered.
	c.mu.Lock()
	w = c.inflight[reqID]
	c.mu.Unlock()
	if w == nil || w.sh != sh || w.done {
		sh.mu.Unlock()
		return
	}
	if w.ls == nil {
		w.done = true // waiting for a token: acquireLate will not decide it
		if w.counted.Swap(false) {
			s.waiters.Add(-1)
		}
	} else {
		s.dropWaiterLocked(w)
	}
	sh.mu.Unlock()
	s.m.timeouts.Add(1)
	s.m.cancelled.Add(1)
	c.replySimpleQueued(wire.TypeTimedOut, reqID)
}

func (s *Server) expireLocked(sh *shard, ls *lockState, now int64) {
	s.m.expired.Add(1)
	s.freeLocked(sh, ls, now)
}

// freeLocked ends the current holding of ls and grants the key to the
// oldest live waiter whose wait has not run out, if any; otherwise ls
// becomes an idle entry. It never waits: a waiter whose turn comes while no
// token is available below the durable ceiling gets B (or E(6) if the last
// reservation failed), and the next waiter is tried.
func (s *Server) freeLocked(sh *shard, ls *lockState, now int64) {
	sh.free(ls) // Release or Expire: the scheduler decided which, and that ls.token holds
	sh.unlink(ls)
	s.held.Add(-1)
	if q := ls.q; q != nil {
		for q.head != nil {
			w := q.head
			q.remove(w)
			s.waiters.Add(-1)
			w.done = true
			w.timer.Stop()
			if w.c.dead.Load() {
				continue // not live: its session is closing
			}
			if now >= w.deadline {
				// Its wait ran out before its timer could run (a stalled
				// process, a late timer): it was not granted in time, and
				// its client has given up. T, never a grant nobody uses.
				s.m.timeouts.Add(1)
				w.c.replySimpleQueued(wire.TypeTimedOut, w.reqID)
				continue
			}
			tok, ok := s.tokens.take()
			if !ok {
				if err := s.tokens.failed(); err != nil && !errors.Is(err, ErrTokensExhausted) {
					s.internalErrorQueued(w.c, w.reqID, err)
				} else {
					if err == nil {
						err = errTokenStall
					}
					s.noToken(err)
					w.c.replySimpleQueued(wire.TypeBusy, w.reqID)
				}
				continue
			}
			s.held.Add(1)
			sh.applyGrant(ls, ls.key, w.owner, w.lease, w.ownedOnly, tok)
			ls.expires = now + int64(w.lease)*secondNs
			sh.link(ls, w.lease)
			if q.head == nil {
				q.timer.Stop()
				ls.q = nil
			} else {
				q.timer.Reset(time.Duration(ls.expires - now))
			}
			s.m.granted(now - w.arrived)
			w.c.replyGrantedQueued(w.reqID, tok, waitedMS(now, w.arrived))
			return
		}
		q.timer.Stop()
		ls.q = nil
	}
	ls.expires = now + idleTTL
	sh.link(ls, 0)
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

// keyTimer runs at the lease end of a key with waiters.
func (s *Server) keyTimer(sh *shard, ls *lockState) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ls.q == nil || ls.token == 0 {
		return // stale
	}
	now := s.now()
	if now < ls.expires {
		ls.q.timer.Reset(time.Duration(ls.expires - now))
		return
	}
	s.expireLocked(sh, ls, now)
}

// waitTimeout runs when a waiter's wait_s has passed.
func (s *Server) waitTimeout(w *waiter) {
	sh := w.sh
	sh.mu.Lock()
	if w.done {
		sh.mu.Unlock()
		return
	}
	s.dropWaiterLocked(w)
	sh.mu.Unlock()
	s.m.timeouts.Add(1)
	w.c.replySimpleQueued(wire.TypeTimedOut, w.reqID)
}

func (s *Server) dropWaiterLocked(w *waiter) {
	ls := w.ls
	q := ls.q
	q.remove(w)
	s.waiters.Add(-1)
	w.done = true
	w.timer.Stop()
	if q.head == nil {
		q.timer.Stop()
		ls.q = nil
	}
}

// dropWaiter removes w (of a closing session) from its queue, if it is
// still there.
func (s *Server) dropWaiter(w *waiter) {
	if w.ck != nil {
		s.cl.dropWaiter(w)
		return
	}
	w.sh.mu.Lock()
	if !w.done {
		if w.ls == nil {
			w.done = true // waiting for a token (acquireLate), in no queue
		} else {
			s.dropWaiterLocked(w)
		}
	}
	w.sh.mu.Unlock()
}

// sweepShard frees expired held entries and deletes idle ones past idleTTL.
func (s *Server) sweepShard(sh *shard) {
	sh.mu.Lock()
	now := s.now()
	for i := 0; i < numLists; i++ {
		if sh.nonempty[i>>6]&(1<<(i&63)) == 0 {
			if sh.nonempty[i>>6]>>(i&63) == 0 {
				i |= 63 // no more bits in this word
			}
			continue
		}
		l := &sh.lists[i]
		for ls := l.head; ls != nil && ls.expires <= now; ls = l.head {
			if i == 0 {
				sh.unlink(ls)
				sh.forget(ls)
			} else {
				s.expireLocked(sh, ls, now)
			}
		}
	}
	sh.mu.Unlock()
}

func (s *Server) sweepAll() {
	for i := range s.shards {
		s.sweepShard(&s.shards[i])
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
