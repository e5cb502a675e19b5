package broker

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Refresh extends the ticket's lease: it sends EXTEND (protocol version 3)
// with the ticket's key, token and owner, asking the server to keep the
// lock for at least lease from when it reads the request. lease is rounded
// up to whole seconds, as Acquire's, and must be 1..250 s, or the call
// fails with ErrInvalidArgument before anything is sent. A refresh never
// shortens a lease (the server keeps the later end) and never changes the
// token: the fencing token, and every write fenced with it, stay valid.
//
// Its error matches exactly one of:
//
//   - nil: the server answered K (kept). Deadline becomes the later of
//     the current one and t1 + lease*(1-0.01), t1 taken just before the
//     EXTEND may have been written, exactly as Acquire's deadline is
//     computed from its send time: it only moves forward.
//   - ErrNotHeld: the server answered N: the lock is no longer this
//     ticket's (its lease had ended, or it was released). The lock is
//     lost: stop the work. Deadline becomes no later than t1 (Remaining
//     is negative, so the fence refuses a write made with the ticket,
//     and no refresh confirmed afterwards moves it forward again). Also
//     returned, without sending anything, for a ticket already released
//     (Release, Close or the drop safety net ran; the message carries the
//     release's result).
//   - ErrRefreshUnconfirmed: the EXTEND may have been sent and no final
//     reply came (its session dropped or turned fatal, no reply within
//     ReplyGrace, or ctx ended after a possible send). The lease may or
//     may not have been extended: Deadline is unchanged (it is never
//     assumed extended), and the lock is still held until then. Refresh
//     again to know.
//   - ErrUnsent: nothing was sent (no ready session, or ctx ended first);
//     Deadline is unchanged. Safe to retry.
//   - ErrUnsupported: every ready session is to a node of protocol
//     version 2 or 1 (an older ticketingd), which has no EXTEND; nothing
//     was sent.
//   - ErrNotActive (*NotActiveError), *ServerError: the node answered M
//     or E: not extended, Deadline unchanged.
//   - ErrInvalidArgument, ErrClosed.
//
// A cancelled call also matches ctx's error. Refresh makes one attempt:
// it moves to another session only if nothing was sent on the first, and
// never resends after a possible send. It is safe to call concurrently
// with any method of the ticket; Deadline and Remaining read the latest
// confirmed deadline.
func (t *Ticket) Refresh(ctx context.Context, lease time.Duration) error {
	leaseS, err := validateLease(lease, refreshLease)
	if err != nil {
		return err
	}
	err = t.b.refresh(ctx, t.st, leaseS)
	runtime.KeepAlive(t) // no drop release while it runs
	return err
}

// KeepAlive keeps the ticket's lock for as long as the caller works: it
// refreshes the lease (see Refresh) once at once, returning that
// refresh's error if it fails (nothing is started then), and then in the
// background, and returns a context, derived from ctx, that is cancelled
// as soon as the ticket can no longer be sure that it holds the lock. Do
// the work under that context and stop when it is done: the work then
// stops before anyone else can be granted the key.
//
// lease is rounded up to whole seconds and must be 1..250 s
// (ErrInvalidArgument); call it L. The background refreshes keep the
// conservative deadline (Deadline) about L ahead: each is sent when the
// deadline is within 0.99·L − L/3 (a third of the lease after the last
// confirmed refresh was sent); one that fails (no ready session, no reply,
// a node of an older version, M or E; an N ends the keep-alive) is
// retried every L/30 (at least 50 ms, at most 1 s), each attempt bounded
// by the margin below.
//
// The returned context is cancelled, with context.Cause saying why:
//
//   - when the conservative deadline comes within L/3 (the margin) with
//     no confirmed refresh since: the cause matches ErrLeaseEnding, and
//     its message carries the last refresh's error. The context is then
//     cancelled at Deadline() − L/3, up to the scheduling of one
//     goroutine: before the conservative deadline, which is itself no
//     later than the server's lease end: while the server keeps its locks
//     (a standalone node loses them when it restarts, see the README's
//     limitations), nobody else can have been granted the key yet;
//   - at once when a refresh was answered N (ErrNotHeld: the lock is lost);
//   - when Release runs (ErrNotHeld), Close runs (ErrClosed) or the ticket
//     is released by the drop safety net, before the RELEASE is sent;
//   - when ctx ends (ctx's cause).
//
// The background refreshes stop with it. Cancel ctx to stop them while
// keeping the ticket (it then expires with its last deadline unless
// refreshed or released). Release, Close and the drop release wait for
// the KeepAlive's goroutine to exit. Keep the Ticket while the keep-alive
// runs: a Ticket dropped without Release is released in the background,
// which ends the keep-alive. Several KeepAlives of one ticket run
// independently. The fence (fence.CheckLease, an adapter's Run) reads
// Remaining at commit, so a kept-alive ticket commits on its latest
// confirmed deadline.
//
// Choose L well above the failover time of a cluster or pair: a refresh
// that falls due as a failover starts has about 0.32·L (0.99·L − L/3 −
// L/3), less one retry interval, before the signal fires. Take L at least
// 4× the failover time (10 s or more with the default timeouts; see
// "Refresh and KeepAlive" in the package documentation).
//
// Errors of the first refresh are Refresh's. A ticket already released is
// ErrNotHeld; after Close, ErrClosed. A cancelled call also matches ctx's
// error.
func (t *Ticket) KeepAlive(ctx context.Context, lease time.Duration) (context.Context, error) {
	b, st := t.b, t.st
	defer runtime.KeepAlive(t)
	leaseS, err := validateLease(lease, refreshLease)
	if err != nil {
		return nil, err
	}
	if err := b.refresh(ctx, st, leaseS); err != nil {
		return nil, err
	}
	lost, cancel := context.WithCancelCause(ctx)
	k := &keeper{b: b, st: st, leaseS: leaseS, ctx: lost, cancel: cancel, done: make(chan struct{})}
	st.kmu.Lock()
	if st.kstop || st.done.Load() {
		st.kmu.Unlock()
		cancel(nil)
		return nil, st.releasedErr()
	}
	if !b.spawn(k.run) {
		st.kmu.Unlock()
		cancel(ErrClosed)
		return nil, ErrClosed
	}
	k.nextK, st.keepers = st.keepers, k
	st.kmu.Unlock()
	return lost, nil
}

// Which call a lease is validated for (validateLease).
const (
	acquireLease = iota
	refreshLease
)

// validateLease checks a lease as Acquire does: 1..250 s after rounding
// up to whole seconds. Above 250 s the message says what to do instead:
// for Acquire, keep a shorter lease alive with KeepAlive; for Refresh and
// KeepAlive, each refresh extends by at most 250 s.
func validateLease(lease time.Duration, of int) (int64, error) {
	leaseS, ok := roundUp(lease)
	if !ok || leaseS < wire.MinLeaseS || leaseS > wire.MaxLeaseS {
		msg := fmt.Sprintf("lease %v: must be %d..%ds after rounding up", lease, wire.MinLeaseS, wire.MaxLeaseS)
		if ok && leaseS > wire.MaxLeaseS {
			if of == acquireLease {
				msg += fmt.Sprintf("; for work longer than %ds, acquire with a lease of a few seconds (10s, say) and keep it with Ticket.KeepAlive, which refreshes it in the background for as long as the work runs and cancels its context if the lock may be lost", wire.MaxLeaseS)
			} else {
				msg += fmt.Sprintf("; one refresh extends the lease by at most %ds: for longer work, use Ticket.KeepAlive with a lease of a few seconds (10s, say), which refreshes it again and again", wire.MaxLeaseS)
			}
		}
		return 0, newErr(ErrInvalidArgument, msg, nil)
	}
	return leaseS, nil
}

// releasedErr is the error of a refresh of a released ticket.
func (st *ticketState) releasedErr() error {
	msg := "the ticket was released (Release, Close or the drop safety net); nothing was sent"
	if st.done.Load() {
		st.relMu.Lock()
		rerr := st.err
		st.relMu.Unlock()
		if rerr == nil {
			msg += " (its release was confirmed)"
		} else {
			msg += " (its release: " + rerr.Error() + ")"
		}
	}
	return newErr(ErrNotHeld, msg, nil)
}

// pickVersion returns the next ready conn in the rotation whose protocol
// version is at least v, or nil; older reports that a ready conn of a
// lower version was passed over.
func (b *Broker) pickVersion(v uint8) (c *conn, older bool) {
	n := uint32(len(b.sessions))
	start := b.rr.Add(1)
	for i := uint32(0); i < n; i++ {
		if c := b.sessions[(start+i)%n].cur.Load(); c != nil && !c.isDead.Load() {
			if c.version >= v {
				return c, false
			}
			older = true
		}
	}
	return nil, older
}

// refresh sends one EXTEND of st for leaseS seconds (see Refresh), traced.
func (b *Broker) refresh(ctx context.Context, st *ticketState, leaseS int64) error {
	tr := b.set.Tracer
	if tr == nil {
		return b.refreshOnce(ctx, st, leaseS)
	}
	ctx = tr.TraceRefreshStart(ctx, TraceRefreshStartData{Key: st.key, Token: st.token, Lease: time.Duration(leaseS) * time.Second})
	err := b.refreshOnce(ctx, st, leaseS)
	tr.TraceRefreshEnd(ctx, TraceRefreshEndData{Key: st.key, Token: st.token, Deadline: st.currentDeadline(), Err: err})
	return err
}

// refreshOnce sends one EXTEND of st for leaseS seconds.
func (b *Broker) refreshOnce(ctx context.Context, st *ticketState, leaseS int64) error {
	if st.done.Load() {
		return st.releasedErr()
	}
	if b.closing.Load() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return newErr(ErrUnsent, "refresh cancelled before sending", err)
	}
	r := b.getReq()
	r.typ = wire.TypeExtend
	r.key = append(r.key[:0], st.key...)
	r.token, r.owner, r.leaseS = st.token, st.owner, uint8(leaseS)
	r.deadline = time.Time{}
	if err := r.encode(wire.Version3); err != nil { // a Ticket's key is valid: cannot happen
		b.putReq(r)
		return newErr(ErrInvalidArgument, "encoding EXTEND", err)
	}
	var lastCause error
	for i := range b.sessions {
		if i > 0 && ctx.Err() != nil {
			b.putReq(r)
			return newErr(ErrUnsent, "refresh cancelled before sending", ctx.Err())
		}
		c, older := b.pickVersion(wire.Version3)
		if c == nil {
			if older {
				b.putReq(r)
				return newErr(ErrUnsupported, "every ready session is to a node of protocol version 2 or 1, which has no EXTEND; nothing was sent", nil)
			}
			break
		}
		if !c.enqueue(r) {
			continue
		}
		if !b.await(ctx, r) {
			switch c.withdraw(r, false, nil) {
			case withdrawnUnsent:
				b.putReq(r)
				return newErr(ErrUnsent, "refresh cancelled before sending", ctx.Err())
			case withdrawnSent: // r now belongs to the conn, which absorbs its reply
				return newErr(ErrRefreshUnconfirmed, "refresh cancelled after a possible send; the deadline is unchanged", ctx.Err())
			}
			b.recv(r) // the result raced with the cancel: use it
		}
		res := r.res
		if b.debugOn() {
			b.debugReply(c, "EXTEND", r.id, st.key, st.token, res)
		}
		if res.typ == 0 && !res.sent {
			// The session ended before our bytes were written:
			// definitely unsent, so another session may carry it.
			lastCause = res.cause
			continue
		}
		b.putReq(r)
		return refreshOutcome(st, res, leaseS)
	}
	b.putReq(r)
	if b.closing.Load() {
		return ErrClosed
	}
	if lastCause != nil {
		return newErr(ErrUnsent, b.noSessionMsg(), lastCause)
	}
	return b.noSession()
}

// refreshOutcome turns the final result of an EXTEND into Refresh's
// error, moving st's deadline on K.
func refreshOutcome(st *ticketState, res result, leaseS int64) error {
	switch res.typ {
	case wire.TypeKept:
		// As for a grant (docs/semantics.md, "Outcomes of an acquire"), with waited_ms 0: the server's lease
		// ends no earlier than lease_s after it read the EXTEND, which was
		// after t0.
		lease := time.Duration(leaseS) * time.Second
		st.extendTo(res.t0.Add(lease * (100 - rhoPercent) / 100))
		return nil
	case wire.TypeNotHeld:
		// Not held when the server read the EXTEND, which was after t0:
		// the deadline goes back to t0 at the latest (Remaining < 0, so
		// the fence refuses a write made with this ticket now).
		st.lose(res.t0)
		return newErr(ErrNotHeld, "EXTEND answered N: the lease had ended or the lock is no longer this ticket's; the lock is lost", nil)
	case wire.TypeNotActive:
		return &NotActiveError{Hint: res.msg}
	case wire.TypeError:
		return &ServerError{Code: res.code, Message: res.msg}
	}
	return newErr(ErrRefreshUnconfirmed, "no final reply to the EXTEND; the lease may or may not have been extended, the deadline is unchanged", res.cause)
}

// keeper is one KeepAlive: a goroutine of the broker (b.bg) that refreshes
// st and cancels ctx when the lock can no longer be relied on.
type keeper struct {
	b      *Broker
	st     *ticketState // never the Ticket: a dropped Ticket is still collected
	leaseS int64
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when run has returned
	nextK  *keeper       // the ticket's next KeepAlive (ticketState.keepers)
}

// Retry bounds of a failed background refresh.
const (
	keepRetryMin = 50 * time.Millisecond
	keepRetryMax = time.Second
)

// run is the keep-alive loop (see KeepAlive). Every wait ends at the
// latest at loseAt = Deadline − L/3, where the context is cancelled
// unless a refresh has moved the deadline; a refresh in flight is bounded
// by loseAt too.
func (k *keeper) run() {
	defer close(k.done)
	defer k.remove()
	lease := time.Duration(k.leaseS) * time.Second
	margin := lease / 3
	// A refresh is due once it would move the deadline by at least a
	// third of the lease: when the deadline is within 0.99·L − L/3.
	due := lease*(100-rhoPercent)/100 - margin
	retry := min(max(lease/30, keepRetryMin), keepRetryMax)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var last error     // the latest failed refresh's error, nil after a K
	var next time.Time // after a failure: the next attempt
	for {
		dl := k.st.currentDeadline()
		loseAt := dl.Add(-margin)
		at := dl.Add(-due)
		if next.After(at) {
			at = next
		}
		now := time.Now()
		if !now.Before(loseAt) {
			msg := fmt.Sprintf("the conservative deadline is %v away, within the margin %v, and no refresh was confirmed in time", dl.Sub(now).Round(time.Millisecond), margin)
			if last != nil {
				msg += "; the last refresh"
			}
			k.cancel(newErr(ErrLeaseEnding, msg, last))
			k.lost()
			return
		}
		if now.Before(at) {
			wake := at
			if loseAt.Before(wake) {
				wake = loseAt
			}
			timer.Reset(wake.Sub(now))
			select {
			case <-timer.C:
				continue
			case <-k.ctx.Done():
				return // the cause was given by whoever cancelled
			}
		}
		rctx, cancel := context.WithDeadline(k.ctx, loseAt)
		err := k.b.refresh(rctx, k.st, k.leaseS)
		cancel()
		switch {
		case err == nil:
			last, next = nil, time.Time{}
		case k.ctx.Err() != nil:
			return
		case errors.Is(err, ErrNotHeld), errors.Is(err, ErrClosed):
			k.cancel(err)
			if errors.Is(err, ErrNotHeld) {
				k.lost()
			}
			return
		default:
			last, next = err, time.Now().Add(retry)
		}
	}
}

// lost tells the tracer, if any, that k signalled a possible loss (its
// context is cancelled, with the cause).
func (k *keeper) lost() {
	if tr := k.b.set.Tracer; tr != nil {
		tr.TraceLost(k.ctx, TraceLostData{Key: k.st.key, Token: k.st.token, Cause: context.Cause(k.ctx)})
	}
}

// remove takes k off its ticket's list of keep-alives.
func (k *keeper) remove() {
	st := k.st
	st.kmu.Lock()
	defer st.kmu.Unlock()
	for p := &st.keepers; *p != nil; p = &(*p).nextK {
		if *p == k {
			*p = k.nextK
			return
		}
	}
}

// stopKeepers ends every KeepAlive of st, and waits for their
// goroutines; no new one starts until kstop is cleared. It returns the
// cause their lost signals carry (ErrNotHeld, or ErrClosed while b
// closes), or nil if none ran: a release of a ticket never kept alive
// allocates nothing here.
func (st *ticketState) stopKeepers(b *Broker) error {
	st.kmu.Lock()
	st.kstop = true
	ks := st.keepers
	st.keepers = nil
	st.kmu.Unlock()
	if ks == nil {
		return nil
	}
	cause := newErr(ErrNotHeld, "the ticket is being released", nil)
	if b.closing.Load() {
		cause = newErr(ErrClosed, "the broker is closing; the ticket is being released", nil)
	}
	for k := ks; k != nil; k = k.nextK {
		k.cancel(cause)
	}
	for k := ks; k != nil; k = k.nextK {
		<-k.done
	}
	return cause
}
