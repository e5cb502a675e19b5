package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// The lock browser and the operator's "expire now": Server.Locks,
// Server.Lock and Server.ExpireLock. The lock path answers them in every
// mode alike (lockpath.go: lockChunk, lock, expire): the serving core
// where this node serves, the mode's applied machine where it does not.

// Page sizes of Server.Locks.
const (
	DefaultLockPage = 100  // LockQuery.Limit 0
	MaxLockPage     = 1000 // the most one page holds
)

// Views of a LockPage (LockPage.View): where its locks come from.
const (
	// ViewStandalone, ViewLeader and ViewActive: this node's serving lock
	// core (standalone's shards, a cluster leader's, a pair active's):
	// lease ends, waiters and holders' sessions are known.
	ViewStandalone = "standalone"
	ViewLeader     = "leader"
	ViewActive     = "active"
	// ViewFollowerApplied and ViewPassiveApplied: a cluster follower's or
	// a pair passive's applied state machine: the holdings (key, token,
	// owner, lease_s) as of its last applied command, without lease ends,
	// waiters or sessions, which only the serving node knows.
	ViewFollowerApplied = "follower-applied"
	ViewPassiveApplied  = "passive-applied"
)

// Errors of the lock browser and ExpireLock.
var (
	// ErrLockNotFound: the key is not held (never, no longer, or its
	// lease has ended).
	ErrLockNotFound = errors.New("server: lock not held")
	// ErrLockToken: ExpireLock's key is held, with another token (the
	// lock changed hands since the token was read).
	ErrLockToken = errors.New("server: lock held with another token")
	// ErrBadKey: a key that is not 1..255 bytes.
	ErrBadKey = errors.New("server: a key is 1 to 255 bytes")
	// ErrNotActive matches a NotActiveError.
	ErrNotActive = errors.New("server: not the pair's active node")
)

// NotActiveError is returned by ExpireLock on a node of a hot-standby
// pair that does not serve (the passive). errors.Is(err, ErrNotActive).
type NotActiveError struct {
	Active string // the active's client address as this node knows it (the peer's Advertise); "" if unknown
}

func (e *NotActiveError) Error() string {
	if e.Active == "" {
		return "server: not the pair's active node (no active known)"
	}
	return "server: not the pair's active node (the active is at " + e.Active + ")"
}

// Is makes errors.Is(err, ErrNotActive) true.
func (e *NotActiveError) Is(target error) bool { return target == ErrNotActive }

// LockQuery selects a page of held locks (Server.Locks). Keys are opaque
// bytes, compared bytewise.
type LockQuery struct {
	Prefix string // only keys that start with it ("": all)
	After  string // only keys after it: the previous page's Next ("": from the first)
	Limit  int    // at most this many (0: DefaultLockPage; capped at MaxLockPage)
}

// Session is a holder's or waiter's session as the lock browser shows it.
type Session struct {
	Name string // the client name of its HELLO (may be empty)
	Addr string // its remote address, host:port
}

// LockInfo is one held lock.
type LockInfo struct {
	Key       string
	Token     uint64
	Owner     [wire.OwnerLen]byte
	LeaseS    int  // the holding's lease_s
	OwnedOnly bool // only RELEASE_OWNED may free it
	// LeaseLeft is how long until the lease ends, and LeaseEnd when (on
	// this node's wall clock); both zero in an applied view, which keeps
	// no lease ends.
	LeaseLeft time.Duration
	LeaseEnd  time.Time
	Waiters   int // queued ACQUIREs (0 in an applied view)
	// Holder is the session whose ACQUIRE was granted, kept after it
	// closes; nil when unknown (a holding restored by a takeover, or an
	// applied view).
	Holder *Session
}

// LockPage is a page of held locks, sorted by key.
type LockPage struct {
	View  string // ViewStandalone, ViewLeader, ViewActive, ViewFollowerApplied or ViewPassiveApplied
	Locks []LockInfo
	// More: there are more locks after this page, or there may be: the
	// search of this one ran out of visits before it was full (see
	// Locks). Next is the After of the next page: the last key of this
	// one, or, after a search that ran out, the last key it went
	// through (the page may then have no lock at all).
	More bool
	Next string
}

// LockWaiter is an ACQUIRE waiting in a key's queue.
type LockWaiter struct {
	Owner     [wire.OwnerLen]byte
	LeaseS    int // the lease it asked for
	OwnedOnly bool
	Waited    time.Duration // since its ACQUIRE was read
	WaitLeft  time.Duration // until its wait_s ends (T then)
	WaitEnd   time.Time     // when, on this node's wall clock
	Session   *Session      // nil: unknown
}

// LockDetail is one held key and its waiters in FIFO order (the order in
// which they will be granted).
type LockDetail struct {
	View string
	LockInfo
	Queue []LockWaiter // none in an applied view
}

// Locks returns a page of the held locks that q selects, sorted by key
// (see LockPage.View for what a node that does not serve shows). Locks
// whose lease has ended, and grants not yet committed, are left out.
//
// Its work is bounded, whatever the table's size: it seeks to q's first
// key in each table's ordered index and visits only keys of q.Prefix,
// at most maxLockVisits of them, in chunks of at most lockChunkVisits
// under the table's mutex, which it releases between chunks. A page whose
// search ran out of visits before it was full (a prefix of many keys
// being granted, or free keys kept for reuse) has fewer locks than the
// limit, maybe none, with More and Next (the last key it visited): the
// next page goes on from there. One scan runs at a time, and its answer
// serves the same query for lockPollShare (lease left recomputed, ended
// leases left out): pollers of the same page cost one scan.
func (s *Server) Locks(ctx context.Context, q LockQuery) (LockPage, error) {
	if err := ctx.Err(); err != nil {
		return LockPage{}, err
	}
	switch {
	case q.Limit <= 0:
		q.Limit = DefaultLockPage
	case q.Limit > MaxLockPage:
		q.Limit = MaxLockPage
	}
	lq := lockcore.LockQuery{Prefix: q.Prefix, After: q.After, Limit: q.Limit}
	cp, err := s.browse.page(ctx, s, lq)
	if err != nil {
		return LockPage{}, err
	}
	pg := LockPage{View: cp.view, More: cp.more, Next: cp.next, Locks: make([]LockInfo, 0, len(cp.locks))}
	now, wall := s.now(), time.Now()
	for i := range cp.locks {
		l := &cp.locks[i]
		if !applied(cp.view) && l.LeaseEnd <= now {
			continue // ended since the scan (a page served again)
		}
		pg.Locks = append(pg.Locks, lockInfoOf(l, cp.view, now, wall))
	}
	return pg, nil
}

// The lock browser's bounds (Server.Locks).
const (
	// lockChunkVisits: the most keys one chunk visits under a table's
	// mutex.
	lockChunkVisits = 256
	// maxLockVisits: the most keys one page visits (in every table).
	maxLockVisits = 10 * MaxLockPage
	// lockPollShare: how long a page's answer serves the same query (the
	// console polls every 2 s, per tab).
	lockPollShare = time.Second
	// lockCacheSize: the most queries whose answers are kept.
	lockCacheSize = 32
)

// errRoleChanged: the node's role changed while a page was searched (the
// view of its chunks changed), twice.
var errRoleChanged = errors.New("server: this node's role changed while the lock browser searched: try again")

// browser is the lock browser's shared state: one scan at a time, and the
// answers of recent queries.
type browser struct {
	sem   chan struct{} // one scan at a time
	mu    sync.Mutex
	gen   uint64 // ExpireLock's count: an answer from before one is not kept
	cache map[lockcore.LockQuery]*lockAnswer

	// The work done, for tests: scans, chunks (each one hold of a
	// table's mutex), keys visited, and the most keys one chunk visited.
	scans, chunks, visits, maxChunk atomic.Int64
}

func newBrowser() *browser {
	return &browser{sem: make(chan struct{}, 1), cache: make(map[lockcore.LockQuery]*lockAnswer)}
}

// lockAnswer is a page as scanned at at (the server's clock).
type lockAnswer struct {
	at    int64
	view  string
	locks []lockcore.LockInfo
	more  bool
	next  string
}

func (b *browser) cached(q lockcore.LockQuery, now int64) *lockAnswer {
	b.mu.Lock()
	defer b.mu.Unlock()
	if a := b.cache[q]; a != nil && now-a.at < int64(lockPollShare) {
		return a
	}
	return nil
}

// forget drops every answer: the locks changed (ExpireLock).
func (b *browser) forget() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gen++
	clear(b.cache)
}

// page is q's answer: a recent one, or a new scan.
func (b *browser) page(ctx context.Context, s *Server, q lockcore.LockQuery) (*lockAnswer, error) {
	if a := b.cached(q, s.now()); a != nil {
		return a, nil
	}
	select {
	case b.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.closingCh:
		return nil, ErrServerClosed
	}
	defer func() { <-b.sem }()
	// Another poller of q may have scanned while this one waited.
	if a := b.cached(q, s.now()); a != nil {
		return a, nil
	}
	b.mu.Lock()
	gen := b.gen
	b.mu.Unlock()
	a, err := b.scan(s, q)
	if err != nil {
		return nil, err
	}
	a.at = s.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gen == gen {
		for k, old := range b.cache {
			if a.at-old.at >= int64(lockPollShare) {
				delete(b.cache, k)
			}
		}
		for k := range b.cache { // still full: any one goes
			if len(b.cache) < lockCacheSize {
				break
			}
			delete(b.cache, k)
		}
		b.cache[q] = a
	}
	return a, nil
}

// scan searches the mode's tables for q's page; if the view changes
// meanwhile (this node began or stopped serving), it starts again, once.
func (b *browser) scan(s *Server, q lockcore.LockQuery) (*lockAnswer, error) {
	b.scans.Add(1)
	for range 2 {
		if a, ok := b.merge(s, q); ok {
			return a, nil
		}
	}
	return nil, errRoleChanged
}

// lockSource is one table's part of a scan: the locks found and not yet
// in the page, and where its next chunk starts.
type lockSource struct {
	buf   []lockcore.LockInfo
	after string // the last key visited
	done  bool
}

// merge merges the tables' pages in key order (a table's chunks give its
// selected locks in order, from its cursor on): a lock goes into the page
// once every table whose locks are not all known has searched past it.
// It reports false if the view changed.
func (b *browser) merge(s *Server, q lockcore.LockQuery) (*lockAnswer, bool) {
	n := s.mode.tables()
	srcs := make([]lockSource, n)
	for i := range srcs {
		srcs[i].after = q.After
	}
	need := q.Limit + 1 // one more than the page: is there more?
	// A refill's visits: a share of what the page needs, so that every
	// table has its first chunk within the budget.
	refill := min(max(2*((need+n-1)/n), 4), lockChunkVisits, maxLockVisits/n)
	budget := maxLockVisits
	var page []lockcore.LockInfo
	view := ""
	stopped := false
	// bound is the lowest cursor of the tables with nothing found and not
	// done: no lock after it is known of them; ok false if there is none.
	bound := func() (k string, ok bool) {
		for i := range srcs {
			if sr := &srcs[i]; len(sr.buf) == 0 && !sr.done && (!ok || sr.after < k) {
				k, ok = sr.after, true
			}
		}
		return k, ok
	}
	// drain moves into the page the lowest lock found while it is below
	// bound.
	drain := func() {
		for len(page) < need {
			best := -1
			for i := range srcs {
				if len(srcs[i].buf) > 0 && (best < 0 || srcs[i].buf[0].Key < srcs[best].buf[0].Key) {
					best = i
				}
			}
			if best < 0 {
				return
			}
			if k, ok := bound(); ok && srcs[best].buf[0].Key > k {
				return
			}
			page = append(page, srcs[best].buf[0])
			srcs[best].buf = srcs[best].buf[1:]
		}
	}
	for {
		// A chunk for every table with nothing found that is not done.
		for i := range srcs {
			sr := &srcs[i]
			if len(sr.buf) > 0 || sr.done {
				continue
			}
			if budget <= 0 {
				stopped = true
				break
			}
			cq := lockcore.LockQuery{Prefix: q.Prefix, After: sr.after, Limit: need - len(page)}
			v, buf, r := s.lockChunk(i, cq, min(refill, budget), nil)
			if view == "" {
				view = v
			} else if v != view {
				return nil, false
			}
			budget -= r.Visited
			b.chunks.Add(1)
			b.visits.Add(int64(r.Visited))
			for c := b.maxChunk.Load(); int64(r.Visited) > c && !b.maxChunk.CompareAndSwap(c, int64(r.Visited)); c = b.maxChunk.Load() {
			}
			sr.buf, sr.done = buf, r.Done
			if r.Visited > 0 {
				sr.after = r.Last
			}
		}
		drain()
		if len(page) >= need || stopped || !slices.ContainsFunc(srcs, func(sr lockSource) bool { return len(sr.buf) > 0 || !sr.done }) {
			break
		}
	}
	a := &lockAnswer{view: view}
	switch {
	case len(page) >= need:
		a.locks, a.more, a.next = page[:q.Limit], true, page[q.Limit-1].Key
	case stopped:
		// Out of visits: the page has every lock up to bound; the next
		// goes on after it.
		k, _ := bound()
		a.locks, a.more, a.next = page, true, k
	default:
		a.locks = page
	}
	return a, true
}

// applied reports whether view is a machine's (no lease ends, waiters or
// sessions).
func applied(view string) bool { return view == ViewFollowerApplied || view == ViewPassiveApplied }

func lockInfoOf(l *lockcore.LockInfo, view string, now int64, wall time.Time) LockInfo {
	li := LockInfo{Key: l.Key, Token: l.Token, Owner: l.Owner, LeaseS: int(l.LeaseS), OwnedOnly: l.OwnedOnly,
		Waiters: l.Waiters, Holder: sessionOf(l.Client)}
	if !applied(view) {
		li.LeaseLeft = time.Duration(max(l.LeaseEnd-now, 0))
		li.LeaseEnd = wall.Add(li.LeaseLeft)
	}
	return li
}

func sessionOf(c *lockcore.Client) *Session {
	if c == nil {
		return nil
	}
	return &Session{Name: c.Name, Addr: c.Addr}
}

// Lock returns key's holding and its queue: ErrLockNotFound if it is not
// held, ErrBadKey if it is not a key.
func (s *Server) Lock(ctx context.Context, key string) (LockDetail, error) {
	if err := ctx.Err(); err != nil {
		return LockDetail{}, err
	}
	if err := checkKey(key); err != nil {
		return LockDetail{}, err
	}
	view, d, ok := s.lock(key)
	if !ok {
		return LockDetail{}, fmt.Errorf("%w: %q", ErrLockNotFound, key)
	}
	now, wall := s.now(), time.Now()
	ld := LockDetail{View: view, LockInfo: lockInfoOf(&d.LockInfo, view, now, wall)}
	for _, w := range d.Queue {
		left := time.Duration(max(w.Deadline-now, 0))
		ld.Queue = append(ld.Queue, LockWaiter{Owner: w.Owner, LeaseS: int(w.LeaseS), OwnedOnly: w.OwnedOnly,
			Waited: time.Duration(max(now-w.Arrived, 0)), WaitLeft: left, WaitEnd: wall.Add(left),
			Session: sessionOf(w.Client)})
	}
	return ld, nil
}

func checkKey(key string) error {
	if len(key) < wire.MinKeyLen || len(key) > wire.MaxKeyLen {
		return ErrBadKey
	}
	return nil
}

// expireTimeout bounds ExpireLock when ctx has no deadline.
const expireTimeout = 10 * time.Second

// ExpireLock is an operator's "expire now": if key is held with token,
// its lease ends at once, exactly as when it runs out: the oldest waiter
// whose session is open is granted with a new token, above token (so the
// old holder's fenced writes are rejected once the new holder has
// written), and the old holder's RELEASE
// and EXTEND get N. It returns once that end is applied (committed, in a
// cluster; acknowledged by the passive, in a pair). It is logged at Warn
// with key, token and by (who asked: for the log only); refused by a node
// that does not serve (a follower, a passive), at Debug.
//
// Errors: ErrLockToken if key is held with another token; ErrLockNotFound
// if it is not held (or its lease had already ended); ErrBadKey; on a
// cluster node that does not lead, a NotLeaderError naming the leader; on
// a pair's passive, a NotActiveError naming the active; ctx's error (or,
// without a deadline, one after 10 s) if no answer came in time, in which
// case the end may still apply.
func (s *Server) ExpireLock(ctx context.Context, key string, token uint64, by string) error {
	err := s.expireLock(ctx, key, token)
	result := "expired"
	if err != nil {
		result = err.Error()
	}
	s.browse.forget()
	level := slog.LevelWarn
	var nle *NotLeaderError
	var nae *NotActiveError
	if errors.As(err, &nle) || errors.As(err, &nae) {
		// Nothing changed, and the operator's tool asks the next node:
		// 'ticketingd locks expire' tries the --admin nodes in turn until
		// the leader or the active answers.
		level = slog.LevelDebug
	}
	s.log.Log(context.Background(), level, "admin: expire now of a lock", "key", key, "token", token, "by", by, "result", result)
	return err
}

func (s *Server) expireLock(ctx context.Context, key string, token uint64) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, expireTimeout)
		defer cancel()
	}
	a := &adminCall{done: make(chan lockcore.Effect, 1)}
	if err := s.expire(&lockcore.Expire{S: a, Key: []byte(key), Token: token}); err != nil {
		return err
	}
	select {
	case e := <-a.done:
		switch {
		case e.Kind == lockcore.Ended:
			return nil
		case e.Why == lockcore.OtherToken:
			return fmt.Errorf("%w: %q is not held with token %d", ErrLockToken, key, token)
		}
		return fmt.Errorf("%w: %q", ErrLockNotFound, key)
	case <-ctx.Done():
		return fmt.Errorf("server: expire of %q not answered (it may still apply): %w", key, ctx.Err())
	case <-s.closingCh:
		return fmt.Errorf("server: expire of %q not answered (it may still apply): %w", key, ErrServerClosed)
	}
}

// adminCall is an admin request (ExpireLock) as a lock core's session:
// always live; its one answer comes on done.
type adminCall struct{ done chan lockcore.Effect }

// Live: an admin call is answered whenever its answer comes.
func (*adminCall) Live() bool { return true }

// answer is an answer of the core for an admin call, from carryOut; it
// reports false if e is not one.
func answerAdmin(e *lockcore.Effect) bool {
	a, ok := e.S.(*adminCall)
	if ok {
		select {
		case a.done <- *e:
		default:
		}
	}
	return ok
}
