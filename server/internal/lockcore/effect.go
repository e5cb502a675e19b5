package lockcore

import "sync/atomic"

// Session is where a request came from and its reply goes. The Core keeps
// sessions only to name them in effects, and asks Live before granting a
// lock to one of its waiters: a session that is closing gets nothing more.
type Session interface {
	Live() bool
}

// Kind is what an Effect asks the driver to do.
type Kind uint8

const (
	// Granted: reply G with Token and WaitedMS.
	Granted Kind = iota + 1
	// TimedOut: reply T (Why: WaitEnded, Cancelled, Replaced, ...).
	TimedOut
	// Busy: reply B (Why says which bound; Err the token store's reason
	// for NoToken).
	Busy
	// Released: reply R.
	Released
	// NotHeld: reply N.
	NotHeld
	// Failed: the token store failed: E(6) with Err, and the session
	// closes.
	Failed
	// Queue: W waits in a key's queue: the driver records it under its
	// req_id (CANCEL names it, a closing session drops it) and, if the
	// session is already closing, calls Drop(W).
	Queue
	// Track: an ACQUIRE whose grant is proposed and not yet applied: its
	// req_id is in flight (it may not be reused; CANCEL leaves it alone).
	Track
	// Expired: a lease ended and its Free applied (a count, no reply).
	Expired
	// Desync: a command did not apply as projected (not reached: the
	// projection is the state the commands reach). The driver calls
	// Resync with the machine's holding of the key (Err, a *DesyncError).
	Desync
	// Kept: reply K (an EXTEND applied).
	Kept
	// Ended: an Expire's Free applied: the holding it named ended, and
	// its next waiter, if any, was granted in the same command.
	Ended
)

// Why qualifies a TimedOut or a Busy, and an Expire's NotHeld.
type Why uint8

const (
	_            Why = iota
	Again            // G: the holder's own ACQUIRE again (its token; the lease not extended)
	WaitEnded        // T: wait_s passed (or it had passed when its turn came)
	NoWait           // T: held by another owner and wait_s 0
	Cancelled        // T: CANCEL
	Replaced         // T: the same owner's later ACQUIRE of the key took its place
	GrantTooLate     // T: the grant applied after the waiter's wait_s
	Full             // B: MaxLocks, MaxWaiters or MaxKeyWaiters
	Backlog          // B: Config.MaxPending commands await their apply
	NoToken          // B: no token available (Err: why)
	SlowCommit       // B: the grant applied later than Config.MaxCommit after its proposal (Wait: how long; 0 for the holder's retries)
	OtherToken       // N to an Expire: the key is held, with another token
)

// Effect is one thing the driver must do after an event. (Its fields are
// ordered to fit 64 bytes: every reply passes through one.)
type Effect struct {
	S     Session
	W     *Waiter // Queue
	Err   error   // Busy (NoToken), Failed; Desync: a *DesyncError
	Token uint64  // Granted
	Wait  int64   // Granted: ns since the ACQUIRE arrived; Busy (SlowCommit): ns the commit took
	ReqID uint32
	Kind  Kind
	Why   Why
	// Queued: the reply answers an ACQUIRE the driver recorded in flight
	// (Queue or Track): it forgets that record.
	Queued bool
}

// WaitedMS is a Granted's waited_ms: whole milliseconds since the ACQUIRE
// arrived, saturated.
func (e *Effect) WaitedMS() uint32 { return WaitedMS(e.Wait, 0) }

// DesyncError names the key of a Desync effect.
type DesyncError struct{ Key string }

func (e *DesyncError) Error() string {
	return "lockcore: a command on key " + e.Key + " did not apply as projected"
}

// Result is the outcome of a proposed command, as the Machine (or the
// token store, standalone) gave it.
type Result struct {
	// Freed: a Free freed the key (false: not reached, the projection
	// said the token held it).
	Freed bool
	// Token is the granted token of a Grant or of a Free's next waiter; 0:
	// not granted.
	Token uint64
	// Retry: not granted for want of a token that may be available soon
	// (standalone: the reservation is being written): a first try of an
	// ACQUIRE is deferred.
	Retry bool
	// Fatal: not granted because the token store failed (E(6)).
	Fatal bool
	// Err says why no token was granted.
	Err error
	// Held: a Grant found the key held (not reached).
	Held bool
	// Kept: an Extend set the holding's lease_s (false: not reached, the
	// projection said the token and owner held the key).
	Kept bool
}

// Proposer makes a command durable and ordered: the replication seam as
// the Core sees it. Core.Effects hands over each command of the last
// event after the event has ended, in the order the event made them
// (Proposal.At is that event's instant); a Proposer that applies at once
// sets the outcome (p.SetResult) and returns true. One that does not
// returns false and later gives the outcome to Core.Applied, once, in the
// order the commands apply, unless the Core was demoted meanwhile. The
// commands of one key apply in the order proposed; those of different
// keys may apply in another (the Raft leader's proposer takes its
// sessions' queues in turns): the Core relies on the order per key only.
// The whole contract, and its test against every Proposer, is in package
// server (seam_contract_internal_test.go).
type Proposer interface {
	Propose(p *Proposal) bool
}

// Proposal is a command the Core has proposed and whose outcome it awaits:
// a Grant (of a free key to an ACQUIRE) or a Free (the end of a holding, by
// a RELEASE or an expiry, and the grant to the next waiter with it).
type Proposal struct {
	e      *entry
	free   bool
	extend bool  // an Extend (tok, owner, elease; rc and rid are answered K)
	elease uint8 // Extend: the lease_s the holding gets
	// The grant's recipient (a Grant's ACQUIRE, or a Free's next waiter).
	to       grantee
	hasTo    bool
	retries  []*Waiter // the holder's ACQUIREs while the grant is in flight
	tok      uint64    // Free: the token it ends
	fkind    uint8     // Free: FreeRelease, FreeReleaseOwned, FreeExpire
	owner    Owner     // Free: the releaser's owner (RELEASE_OWNED checks it)
	rc       Session   // Free by RELEASE (or a RELEASE that found the lease ended, or an Expire): answered at apply
	forced   bool      // Free by an Expire: rc is answered Ended
	rid      uint32
	late     []lateRelease // RELEASEs of tok after the Free was proposed: N once it applies
	at       int64         // proposed
	by       uint64        // the session it is charged to (Acquire.By, Release.By)
	inFlight bool
	first    bool // the Grant of an ACQUIRE's first decision (tracked if it stays in flight)
	expiry   bool // a Free no RELEASE asked for (a lease ended)
	gen      uint64
	res      Result // the outcome of a command applied at once (SetResult)
	next     *Proposal
}

type grantee struct {
	s         Session
	client    *Client
	by        uint64
	reqID     uint32
	owner     Owner
	lease     uint8
	ownedOnly bool
	arrived   int64
	deadline  int64 // past it the grant is answered T (a token waiter: B)
	tokenBy   int64 // the end of its token wait (Config.TokenWait; 0: none began)
	waitS     uint8 // the ACQUIRE's wait_s (a token waiter is decided again with it)
	queued    bool  // recorded in flight by the driver
}

// recorded reports whether the driver holds g's ACQUIRE in flight (queued,
// or a token waiter decided again): its answer is Queued.
func (g *grantee) recorded() bool { return g.queued || g.tokenBy != 0 }

type lateRelease struct {
	s   Session
	rid uint32
}

// SetResult is how a Proposer that applies p at once gives its outcome.
func (p *Proposal) SetResult(r Result) { p.res = r }

// At is the instant of the event that proposed p (the driver's now).
func (p *Proposal) At() int64 { return p.at }

// Key is the command's key.
func (p *Proposal) Key() string { return p.e.key }

// Grants reports whether applying p takes a token: a Grant, or a Free with
// the grant to the next waiter.
func (p *Proposal) Grants() bool { return p.hasTo }

// IsFree reports whether p is a Free.
func (p *Proposal) IsFree() bool { return p.free }

// IsExtend reports whether p is an Extend (neither a Free nor a Grant).
func (p *Proposal) IsExtend() bool { return p.extend }

// By is the number of the session p is charged to (Acquire.By,
// Release.By): an ACQUIRE's, a RELEASE's, or for an expiry the session's
// whose ACQUIRE made the holding (0: restored by Promote, or none given).
func (p *Proposal) By() uint64 { return p.by }

// Expiry reports whether p is a Free that no request asked for.
func (p *Proposal) Expiry() bool { return p.expiry }

// Capacity is the lock table's bounds, shared by every Core of a server
// (standalone has one per shard): held locks and waiters, counted
// projected.
type Capacity struct {
	MaxLocks, MaxWaiters int64
	Held, Waiters        atomic.Int64
}

func (c *Capacity) takeHeld() bool {
	if c.Held.Add(1) > c.MaxLocks {
		c.Held.Add(-1)
		return false
	}
	return true
}

// TakeWaiter counts one more waiter, unless MaxWaiters are counted.
func (c *Capacity) TakeWaiter() bool {
	if c.Waiters.Add(1) > c.MaxWaiters {
		c.Waiters.Add(-1)
		return false
	}
	return true
}
