package broker

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Ticket is a granted lock: its key, its fencing token and its conservative
// deadline. Fence the protected write with Token in the same database
// transaction, then Release. Refresh extends its lease, KeepAlive does so
// in the background and signals its loss. Its methods are safe for
// concurrent use.
//
// A Ticket dropped without Release is released in the background, best
// effort, when the garbage collector finds it (the second collection after
// its grant at the earliest; with a warning in the log); do not rely on it.
type Ticket struct {
	b  *Broker
	st *ticketState
}

// ticketState is what the release machinery needs; it never refers to the
// Ticket (a dropped Ticket is finalized, then collected).
type ticketState struct {
	key      string
	token    uint64
	owner    [wire.OwnerLen]byte // released with it on a version-2 session
	deadline time.Time           // the conservative deadline of the grant
	// ext is the conservative deadline moved by the latest confirmed
	// refresh (see extendTo); nil: never refreshed. Only ever later than
	// deadline and than every earlier value.
	ext atomic.Pointer[time.Time]
	// lost is the earliest instant from which the lock may no longer be
	// this ticket's, as the broker learned it (see lose): a RELEASE sent
	// (answered R or N, or unconfirmed), an EXTEND answered N; kept as
	// its offset from deadline (no allocation, and the monotonic clock
	// reading is kept), stored with its sign bit flipped (see lostEnc) so
	// that the zero value is "nothing learned" (notLost) and a new state
	// needs no atomic store. The conservative deadline is never later
	// than it.
	lost atomic.Int64

	// The running KeepAlives (see keeper), a list through keeper.nextK,
	// guarded by kmu with kstop below.
	kmu     sync.Mutex
	keepers *keeper

	// The registry of unreleased tickets (see ticketShard), guarded by the
	// shard's mu.
	prev, next *ticketState
	// young holds the Ticket strongly from its grant until the first
	// garbage collection after it (see Broker.promote), which then gives it
	// the drop finalizer and drops this reference.
	young *Ticket

	relMu sync.Mutex // held for the whole of a release
	done  atomic.Bool
	// kstop (guarded by kmu): a release has begun (no new KeepAlive),
	// cleared again if it sent nothing (ErrUnsent: the ticket is still
	// held). linked (the shard's mu): in the registry. promoted (the
	// shard's mu): young was dropped and the drop finalizer set; a Ticket
	// released before that collection never costs a finalizer. (Packed
	// beside done: a Ticket and its state are allocated at every grant.)
	kstop, linked, promoted bool
	err                     error // the first release's result, guarded by relMu
}

// notLost is the offset that stands for "nothing learned"; stored in
// ticketState.lost as 0 (see lostEnc).
const notLost = math.MinInt64

// lostEnc maps an offset to its stored form in ticketState.lost and back
// (its own inverse): notLost is stored as 0, the zero value.
func lostEnc(v int64) int64 { return v ^ notLost }

// Key returns the lock's key.
func (t *Ticket) Key() string { return t.st.key }

// Token returns the fencing token: strictly increasing across every grant of
// the server or cluster.
func (t *Ticket) Token() uint64 { return t.st.token }

// Deadline returns the conservative deadline of docs/protocol.md: t0 + (waited_ms
// + lease_s*1000)*(1-0.01), where t0 was taken just before the ACQUIRE may
// have been written, and waited_ms is at most the broker's own time from t0
// to the reply's handling (a larger value is taken as that time: the server's word is bounded).
// After a confirmed refresh (Refresh answered K, also in KeepAlive) it is
// the later of that and t1 + lease_s*1000*(1-0.01), t1 taken just before
// the EXTEND may have been written: it moves forward only on a confirmed
// refresh. It moves back once the broker knows that the lock may no
// longer be this ticket's: after an EXTEND answered N, or a RELEASE sent
// (answered R or N, or unconfirmed), it is no later than when that
// request was sent, so Remaining is negative and the fence refuses a
// write made with the ticket; no refresh confirmed afterwards moves it
// forward again. The server's expiry is no earlier. It carries a
// monotonic clock reading. It is safe to call concurrently with Refresh.
func (t *Ticket) Deadline() time.Time { return t.st.currentDeadline() }

// Remaining returns the conservative remaining lease, Deadline minus now
// (negative once passed).
func (t *Ticket) Remaining() time.Duration { return time.Until(t.st.currentDeadline()) }

// Released reports whether the ticket was released: Release returned its
// final result (anything but ErrUnsent, after which the ticket is still
// held), or Close or the drop safety net released it. A released ticket
// fences nothing: the fence (fence.CheckLease, an adapter's Run) refuses
// it with fence.ErrReleased. Acquire a new ticket for the next write.
func (t *Ticket) Released() bool { return t.st.done.Load() }

// currentDeadline is the ticket's conservative deadline now.
func (st *ticketState) currentDeadline() time.Time {
	d := st.deadline
	if p := st.ext.Load(); p != nil {
		d = *p
	}
	if off := lostEnc(st.lost.Load()); off != notLost {
		if l := st.deadline.Add(time.Duration(off)); l.Before(d) {
			return l
		}
	}
	return d
}

// lose records that the lock may not be this ticket's from at on: the
// conservative deadline becomes no later than at, whatever refresh is
// confirmed afterwards (a K can be handled after an N that the server
// sent later, on another session).
func (st *ticketState) lose(at time.Time) {
	off := int64(at.Sub(st.deadline))
	if off == notLost {
		off++ // (at is 292 years before the deadline: as good)
	}
	for {
		cur := st.lost.Load()
		if cur != 0 && lostEnc(cur) <= off || st.lost.CompareAndSwap(cur, lostEnc(off)) {
			return
		}
	}
}

// extendTo moves the conservative deadline to d if d is later (a
// confirmed refresh); it never moves it back, whatever the order in which
// concurrent refreshes are confirmed.
func (st *ticketState) extendTo(d time.Time) {
	for {
		p := st.ext.Load()
		cur := st.deadline
		if p != nil {
			cur = *p
		}
		if !d.After(cur) || st.ext.CompareAndSwap(p, &d) {
			return
		}
	}
}

// Release releases the lock by its exact token (on a version-2 session,
// RELEASE_OWNED: by its token and its acquire's owner). It retries on any ready
// session only within 5 s of the call, and resends only after a session
// dropped. Its error matches exactly one of: nil for R (released),
// ErrNotHeld for N (the lock had expired or is no longer this token's),
// ErrReleaseUnconfirmed when an attempt may have been sent and no final
// reply came within the window (never assumed success), ErrUnsent when
// nothing was sent within the window (no ready session all along, or ctx
// ended first), ErrClosed if the Broker was closed first. If ctx ended
// first, the error also matches ctx's error.
//
// After ErrUnsent the ticket is still held: Release may be called again
// (and Close or a drop still release it). Calling Release again after any
// other result returns that result without sending anything; concurrent
// calls wait for the first.
//
// Before anything is sent, Release ends every KeepAlive of the ticket:
// their contexts are cancelled (cause: ErrNotHeld) and their goroutines
// have exited, whatever the result (after ErrUnsent, KeepAlive may be
// called again). A ctx that this ends (a KeepAlive's context, or one
// derived from it, as in defer t.Release(held)) does not cancel the
// release itself.
func (t *Ticket) Release(ctx context.Context) error {
	tr := t.b.set.Tracer
	if tr == nil {
		return t.release(ctx)
	}
	ctx = tr.TraceReleaseStart(ctx, TraceReleaseStartData{Key: t.st.key, Token: t.st.token})
	err := t.release(ctx)
	tr.TraceReleaseEnd(ctx, TraceReleaseEndData{Key: t.st.key, Token: t.st.token, Err: err})
	return err
}

func (t *Ticket) release(ctx context.Context) error {
	b, st := t.b, t.st
	if st.done.Load() {
		st.relMu.Lock()
		defer st.relMu.Unlock()
		return st.err
	}
	if b.closing.Load() {
		return ErrClosed
	}
	err := b.releaseStateCtx(ctx, st, b.now(), true)
	if st.done.Load() && st.promoted {
		// Only a final result removes the drop finalizer: after an
		// unsent, cancelled Release the ticket is still held, and
		// dropping it must still release it. (promoted is stable once
		// done: the state has left the registry, under the shard's lock,
		// before done was set under relMu, which releaseStateCtx took.)
		runtime.SetFinalizer(t, nil)
	}
	runtime.KeepAlive(t)
	return err
}

// releaseStateCtx releases st once; later callers get the first result.
// start and fresh are release's.
func (b *Broker) releaseStateCtx(ctx context.Context, st *ticketState, start time.Time, fresh bool) error {
	st.relMu.Lock()
	defer st.relMu.Unlock()
	if st.done.Load() {
		return st.err
	}
	// The KeepAlives' lost signals fire before the RELEASE is sent: work
	// that watches them stops before the lock can be another's.
	live := ctx.Err() == nil
	if cause := st.stopKeepers(b); cause != nil && live && context.Cause(ctx) == cause {
		// ctx is a KeepAlive's context (or derived from one), which the
		// release itself just ended: the release must still be made.
		ctx = context.WithoutCancel(ctx)
	}
	err := b.release(ctx, st.key, st.token, st.owner, start, fresh)
	if err == nil || errors.Is(err, ErrNotHeld) || errors.Is(err, ErrReleaseUnconfirmed) {
		// Released, not held, or maybe released: from when the RELEASE
		// may have been sent, the lock is not surely this ticket's, so a
		// fenced write made with it now is refused (Remaining < 0).
		st.lose(start)
	}
	if errors.Is(err, ErrUnsent) {
		// Nothing sent: still held, the caller may try again (and may
		// keep it alive again).
		st.kmu.Lock()
		st.kstop = false
		st.kmu.Unlock()
		return err
	}
	st.err = err
	st.done.Store(true)
	sh := b.shard(st)
	sh.mu.Lock()
	sh.remove(st)
	sh.mu.Unlock()
	return err
}

// finalizeTicket is the finalizer of a Ticket dropped without a final
// Release.
func finalizeTicket(t *Ticket) { t.b.dropped(t.st) }

// gcWatch is a sentinel whose finalizer runs once after every garbage
// collection (it re-arms itself) until the broker closes, to promote the
// young tickets.
type gcWatch struct{ b *Broker }

func (b *Broker) watchGC() { runtime.SetFinalizer(&gcWatch{b: b}, onGC) }

func onGC(w *gcWatch) {
	if w.b.closing.Load() {
		return
	}
	w.b.promote()
	runtime.SetFinalizer(w, onGC)
}

// promote gives every young ticket (granted since the last collection and
// not yet released) the drop finalizer, and drops the registry's strong
// reference to it, so that the next collection finds it if the caller has
// dropped it. Young tickets are a prefix of each shard's list (new ones
// are added at the head), so this walks only them.
//
// The two-step scheme keeps runtime.SetFinalizer off the acquire/release
// path, where it cost about a tenth of a cycle's CPU (a global runtime
// lock and a walk of the span's specials): a ticket released within one
// GC cycle, the common case, never has one. A dropped ticket is released
// after two collections instead of one.
func (b *Broker) promote() {
	for i := range b.tickets {
		sh := &b.tickets[i]
		sh.mu.Lock()
		for st := sh.head; st != nil && st.young != nil; st = st.next {
			t := st.young
			st.young = nil
			st.promoted = true
			runtime.SetFinalizer(t, finalizeTicket)
		}
		sh.mu.Unlock()
	}
}

// dropped releases the state of a Ticket collected without Release.
func (b *Broker) dropped(st *ticketState) {
	if st.done.Load() {
		return
	}
	start := time.Now()
	b.spawn(func() {
		err := b.releaseStateCtx(context.Background(), st, start, false)
		b.log.Warn("broker: ticket dropped without Release; released in the background",
			"key", st.key, "token", st.token, "err", err)
	})
}
