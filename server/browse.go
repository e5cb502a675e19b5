package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// The lock browser and the operator's "expire now": Server.Locks,
// Server.Lock and Server.ExpireLock. Every mode answers them through its
// mode methods (locks, lock, expire): the serving core where this node
// serves, the applied machine where it does not.

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
	// More: there are more locks after this page; Next is the After of
	// the next page (the last key of this one).
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
	view, locks, more := s.mode.locks(lockcore.LockQuery{Prefix: q.Prefix, After: q.After, Limit: q.Limit})
	pg := LockPage{View: view, More: more, Locks: make([]LockInfo, len(locks))}
	now, wall := s.now(), time.Now()
	for i := range locks {
		pg.Locks[i] = lockInfoOf(&locks[i], view, now, wall)
	}
	if more && len(locks) > 0 {
		pg.Next = locks[len(locks)-1].Key
	}
	return pg, nil
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
	view, d, ok := s.mode.lock(key)
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
// with key, token and by (who asked: for the log only).
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
	s.log.Warn("admin: expire now of a lock", "key", key, "token", token, "by", by, "result", result)
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
	if err := s.mode.expire(&lockcore.Expire{S: a, Key: []byte(key), Token: token}); err != nil {
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

// coreExpire hands an Expire to sh's core and carries out its effects
// (under sh.mu).
func (s *Server) coreExpire(sh *shard, x *lockcore.Expire) {
	sh.core.Expire(s.shardNow(sh), x)
	s.carryOut(sh, nil)
}
