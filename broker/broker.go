package broker

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Limits of the arguments of Acquire, after rounding up to whole seconds
// (the protocol's own, docs/protocol.md).
const (
	MaxWait   = wire.MaxWait
	MaxLease  = wire.MaxLease
	MinLease  = wire.MinLease
	MaxKeyLen = wire.MaxKeyLen
)

const ticketShards = 32

// ticketShard is one part of the registry of unreleased tickets, sharded
// by token so that concurrent acquires and releases rarely share a lock.
// Its tickets form an intrusive doubly-linked list (ticketState.prev/next):
// adding and removing one is a few pointer writes, with no hashing and no
// map growth on the acquire/release path.
type ticketShard struct {
	mu   sync.Mutex
	head *ticketState
	_    [48]byte // keep shards on separate cache lines
}

// add links st into the shard. Called under sh.mu.
func (sh *ticketShard) add(st *ticketState) {
	st.next = sh.head
	if sh.head != nil {
		sh.head.prev = st
	}
	sh.head = st
	st.linked = true
}

// remove unlinks st if it is linked. Called under sh.mu.
func (sh *ticketShard) remove(st *ticketState) {
	if !st.linked {
		return
	}
	if st.prev != nil {
		st.prev.next = st.next
	} else {
		sh.head = st.next
	}
	if st.next != nil {
		st.next.prev = st.prev
	}
	st.prev, st.next, st.linked = nil, nil, false
	st.young = nil
}

func (b *Broker) shard(st *ticketState) *ticketShard { return &b.tickets[st.token%ticketShards] }

// rho is the clock-rate drift allowance of the conservative deadline, as
// a fraction 1/100.
const rhoPercent = 1

// Broker is a client of a Ticketing server or cluster. It holds background
// sessions and spreads requests over them. Create one at application start
// and share it: all its methods are safe for concurrent use by any number of
// goroutines.
type Broker struct {
	set      *settings
	log      *slog.Logger
	sessions []*session
	pair     *pair // which addresses may be dialled (the pair rule)
	rr       atomic.Uint32
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup // session managers
	bg       sync.WaitGroup // background releases
	closing  atomic.Bool
	down     chan struct{} // closed when Close has torn everything down
	once     sync.Once
	reqs     sync.Pool
	// woken counts results delivered to callers and not yet received
	// (request.deliver adds one, Broker.consumed takes it off): callers
	// that are runnable and about to queue their next requests. While it
	// is positive, enqueue leaves the writer asleep; the caller that
	// brings it to zero wakes the writers (see consumed), so that a wave
	// of callers woken by a batch of replies is written in one Write per
	// session instead of being split over several. Every delivered result
	// is received by a goroutine that is runnable at once, so woken always
	// returns to zero without waiting on anything else.
	woken atomic.Int32
	epoch time.Time // for now
	// hintWarned: an M hint naming an address not in Addrs was logged at
	// Warn (see followHint); later ones go unlogged.
	hintWarned atomic.Bool
	// everReady: a session has been ready at least once since New. Until
	// then an Acquire's ErrUnsent says to call WaitReady at start-up.
	everReady atomic.Bool
	// ident is the group identity the broker keeps to (see checkCluster):
	// Config.Cluster, or the first non-empty one a node gave; nil until
	// then.
	ident atomic.Pointer[clusterIdent]
	// onPause, a test hook (nil otherwise), is told every pause a session
	// chooses before reopening (see pauseChosen).
	onPause atomic.Pointer[func(*session, pauseChoice)]

	mu      sync.Mutex
	tickets [ticketShards]ticketShard // unreleased tickets, for Close
	readyC  chan struct{}             // closed and replaced to wake WaitReady
	lastErr error
}

// New validates cfg and returns a Broker whose sessions open in the
// background. It never dials synchronously and never fails because a server
// is down; it fails only for an invalid configuration (matching
// ErrInvalidConfig): no address, a bad address, an unreadable or invalid CA
// file, a CAFile with a TLS mode that would ignore it, a negative duration,
// BackoffMin above BackoffMax.
func New(cfg Config) (*Broker, error) {
	set, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	b := &Broker{
		set:    set,
		log:    cfg.Logger,
		down:   make(chan struct{}),
		readyC: make(chan struct{}),
		epoch:  time.Now(),
	}
	if b.log == nil {
		b.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Cluster != "" {
		b.ident.Store(&clusterIdent{id: cfg.Cluster, configured: true})
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.reqs.New = newRequest
	nodes := map[string]*node{}
	var distinct []*node
	for i, a := range set.addrs {
		n := nodes[a]
		if n == nil {
			n = &node{p: nodePair{addr: a}}
			n.ask.Store(maxVersion)
			nodes[a] = n
			distinct = append(distinct, n)
		}
		b.sessions = append(b.sessions, &session{b: b, idx: i, addr: a, node: n, tls: set.tls[i], poke: make(chan struct{}, 1)})
	}
	b.pair = newPair(b, distinct, set.PairSettle)
	b.wg.Add(len(b.sessions))
	for _, s := range b.sessions {
		go s.run()
	}
	b.watchGC()
	return b, nil
}

// Connect is New(Config{Addrs: addrs}).
func Connect(addrs ...string) (*Broker, error) {
	return New(Config{Addrs: addrs})
}

// clusterIdent is the identity a broker keeps to.
type clusterIdent struct {
	id         string
	configured bool // Config.Cluster, not the first met
}

// Cluster returns the identity of the cluster or pair the broker keeps
// to: Config.Cluster if set, else the first non-empty identity a node
// gave in its HELLO_OK (version 3), else "" (no node with an identity
// met yet: standalone nodes, or nodes of protocol version 1 or 2).
func (b *Broker) Cluster() string {
	if id := b.ident.Load(); id != nil {
		return id.id
	}
	return ""
}

// checkCluster is the identity rule of protocol version 3, applied to a
// HELLO_OK (of protocol version ver) of s's node carrying the group
// identity id before its session is used. With Config.Cluster, only a
// node of that identity is accepted: a node without one (a standalone
// server, or a server of version 1 or 2, whose HELLO_OK carries none)
// cannot be shown to belong to the configured cluster and is refused.
// Without it, a node without an identity is accepted, and so is one whose
// identity is the first non-empty identity met (decided once, atomically,
// so that two sessions opening at once to nodes of two clusters cannot
// both be used). A refused node gets a *WrongClusterError: it is not
// used, and is no failover target.
func (b *Broker) checkCluster(s *session, nodeName, id string, ver uint8) error {
	cur := b.ident.Load()
	if id == "" {
		if cur == nil || !cur.configured {
			return nil
		}
		s.node.foreign.Store(true)
		return &WrongClusterError{Addr: s.addr, Node: nodeName, Want: cur.id, Configured: true, Version: ver}
	}
	if cur == nil {
		if b.ident.CompareAndSwap(nil, &clusterIdent{id: id}) {
			b.log.Info("broker: cluster identity learned from the first node that gave one; nodes of another cluster will not be used",
				"addr", s.addr, "node", nodeName, "cluster", id)
			return nil
		}
		cur = b.ident.Load()
	}
	if cur.id == id {
		return nil
	}
	s.node.foreign.Store(true)
	return &WrongClusterError{Addr: s.addr, Node: nodeName, Cluster: id, Want: cur.id, Configured: cur.configured}
}

// now is time.Now for release windows, with one clock read instead of
// two: time.Since of a monotonic reading reads only the monotonic clock.
// Its wall clock part is the epoch's plus the monotonic time since, so it
// is for monotonic comparisons only (the release window), never shown.
func (b *Broker) now() time.Time { return b.epoch.Add(time.Since(b.epoch)) }

func (b *Broker) setLastErr(err error) {
	if err == nil {
		return
	}
	b.mu.Lock()
	b.lastErr = err
	b.mu.Unlock()
}

// openFailed records a failed attempt of s to open a session; refused says
// that it was refused for good (see WaitReady), which wakes WaitReady.
func (b *Broker) openFailed(s *session, err error, refused bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastErr = err
	if !refused {
		s.refused = nil
		return
	}
	s.refused, s.refusedAt = err, time.Now()
	b.wakeLocked()
}

// signalReady wakes WaitReady: s is ready.
func (b *Broker) signalReady(s *session) {
	b.everReady.Store(true)
	b.mu.Lock()
	s.refused = nil
	b.wakeLocked()
	b.mu.Unlock()
}

func (b *Broker) wakeLocked() {
	close(b.readyC)
	b.readyC = make(chan struct{})
}

// sleep waits d or until the broker closes; false means closed.
func (b *Broker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-b.ctx.Done():
		return false
	}
}

// pick returns the next ready conn in the rotation, or nil.
func (b *Broker) pick() *conn {
	n := uint32(len(b.sessions))
	start := b.rr.Add(1)
	for i := uint32(0); i < n; i++ {
		if c := b.sessions[(start+i)%n].cur.Load(); c != nil && !c.isDead.Load() {
			return c
		}
	}
	return nil
}

// ReadySessions returns how many sessions are ready now (for health
// checks and tests).
func (b *Broker) ReadySessions() int {
	n := 0
	for _, s := range b.sessions {
		if c := s.cur.Load(); c != nil && !c.isDead.Load() {
			n++
		}
	}
	return n
}

// WaitReady waits until at least one session is ready, or every session
// has been refused for good, or ctx ends. It is a start-up convenience,
// never required.
//
// A session is refused for good when its latest attempt ended in a refusal
// that retrying cannot cure: the client token refused (E code 3: the error
// matches ErrUnauthorized), the protocol version refused (E code 2: a
// *ServerError), the server's TLS certificate rejected (ErrCertificate),
// a plain-TCP HELLO closed unanswered by a server that then completed a
// TLS handshake (ErrTLSRequired: configure TLS, the URL's ca= or tls=),
// a TLS handshake answered with bytes that are not TLS (ErrServerNotTLS:
// the server speaks plain TCP; start it with TLS), or a node of another cluster (a *WrongClusterError, see "Cluster
// identity" in the package documentation).
// When that holds for every session at once, WaitReady returns that
// refusal at once instead of waiting for ctx; for nodes of another
// cluster, the error matches ErrNotReady and ErrWrongCluster (which is no
// outcome of its own). The sessions keep trying,
// at the maximum backoff (BackoffMax), so that fixing the server side
// (adding the token, say) is still picked up. WaitReady reports their
// latest attempts: right after such a fix it may still return the
// refusal, until the next redial (at most BackoffMax later) succeeds.
//
// When ctx ends first, the error matches ErrNotReady and ctx's error, and
// its message carries the last session error. After Close it returns
// ErrClosed.
func (b *Broker) WaitReady(ctx context.Context) error {
	for {
		b.mu.Lock()
		ch := b.readyC
		refused := b.refusedLocked()
		b.mu.Unlock()
		if b.closing.Load() {
			return ErrClosed
		}
		if b.pick() != nil {
			return nil
		}
		if refused != nil {
			if !hasOutcome(refused) {
				// Nodes of another cluster: the refusal is a cause, no
				// outcome (ErrWrongCluster stays matchable).
				return newErr(ErrNotReady, "every session was refused for good", refused)
			}
			return &refusedError{err: refused}
		}
		select {
		case <-ch:
		case <-b.ctx.Done():
			return ErrClosed
		case <-ctx.Done():
			b.mu.Lock()
			last := b.lastCauseLocked()
			b.mu.Unlock()
			if last != nil {
				last = fmt.Errorf("last session error: %w", last)
			}
			return newCtxErr(ErrNotReady, "", ctx.Err(), last)
		}
	}
}

// refusedLocked returns the refusal of the last session to be refused
// for good if every session's latest attempt was refused for good, or nil.
// Called under b.mu.
func (b *Broker) refusedLocked() error {
	var last error
	var at time.Time
	for _, s := range b.sessions {
		if s.refused == nil {
			return nil
		}
		if last == nil || s.refusedAt.After(at) {
			last, at = s.refused, s.refusedAt
		}
	}
	return last
}

// refusedError is WaitReady's error when every session was refused for
// good: it matches what the refusal matches.
type refusedError struct{ err error }

func (e *refusedError) Error() string {
	return "broker: every session was refused for good: " + e.err.Error()
}

func (e *refusedError) Unwrap() error { return e.err }

func (b *Broker) noSession() error {
	b.mu.Lock()
	last := b.lastCauseLocked()
	b.mu.Unlock()
	return newErr(ErrUnsent, b.noSessionMsg(), last)
}

// lastCauseLocked is the cause given when no session is ready: the last
// session error, unless a session's latest attempt found a node of
// another cluster, a configuration error that the caller must see
// (ErrWrongCluster stays matchable). Called under b.mu.
func (b *Broker) lastCauseLocked() error {
	if errors.Is(b.lastErr, ErrWrongCluster) {
		return b.lastErr
	}
	for _, s := range b.sessions {
		if errors.Is(s.refused, ErrWrongCluster) {
			return s.refused
		}
	}
	return b.lastErr
}

// noSessionMsg is the message of ErrUnsent for want of a ready session:
// before any session has been ready, it says what to do at start-up.
func (b *Broker) noSessionMsg() string {
	if !b.everReady.Load() {
		return "no ready session yet (none has been ready since New): call WaitReady at start-up, before the first Acquire"
	}
	return "no ready session"
}

// roundUp converts d to whole seconds, rounding up; ok is false for d < 0.
func roundUp(d time.Duration) (int64, bool) {
	if d < 0 {
		return 0, false
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s, true
}

func validate(key string, o *AcquireOptions) (waitS, leaseS, workS int64, err error) {
	if len(key) < wire.MinKeyLen || len(key) > wire.MaxKeyLen {
		return 0, 0, 0, newErr(ErrInvalidArgument, fmt.Sprintf("key must be %d..%d bytes, got %d", wire.MinKeyLen, wire.MaxKeyLen, len(key)), nil)
	}
	if o.Lease == 0 {
		return 0, 0, 0, newErr(ErrInvalidArgument, fmt.Sprintf("AcquireOptions.Lease must be set (%d..%ds): how long the server keeps the lock if it is not released", wire.MinLeaseS, wire.MaxLeaseS), nil)
	}
	var ok bool
	if waitS, ok = roundUp(o.Wait); !ok || waitS > wire.MaxWaitS {
		return 0, 0, 0, newErr(ErrInvalidArgument, fmt.Sprintf("AcquireOptions.Wait %v: must be 0..%ds after rounding up", o.Wait, wire.MaxWaitS), nil)
	}
	if leaseS, err = validateLease(o.Lease, acquireLease); err != nil {
		return 0, 0, 0, err
	}
	if workS, ok = roundUp(o.Work); !ok || workS > leaseS {
		return 0, 0, 0, newErr(ErrInvalidArgument, fmt.Sprintf("AcquireOptions.Work %v: must be 0..Lease (%ds) after rounding up", o.Work, leaseS), nil)
	}
	return waitS, leaseS, workS, nil
}

// encode encodes r into r.frame for a session of protocol version ver,
// with req_id 0 for enqueue to set. An ACQUIRE is the same in every
// version; a RELEASE is RELEASE_OWNED (token and owner) on version 2.
func (r *request) encode(ver uint8) error {
	typ := r.typ
	if typ == wire.TypeRelease && ver >= wire.Version2 {
		typ = wire.TypeReleaseOwned
	}
	var err error
	r.frame, err = wire.AppendRequest(r.frame[:0], &wire.Request{
		Type: typ, Owner: r.owner, WaitS: r.waitS, LeaseS: r.leaseS, Key: r.key, Token: r.token,
	})
	r.frameVer = ver
	return err
}

func (b *Broker) getReq() *request { return b.reqs.Get().(*request) }

func (b *Broker) putReq(r *request) {
	r.res = result{}
	r.key = r.key[:0]
	b.reqs.Put(r)
}

// newOwner fills r.owner with 16 fresh random bytes, never used for
// another owner. They come from r's own ChaCha8 generator (requests are
// pooled per P), seeded from crypto/rand when the request was made:
// ChaCha8 is cryptographically strong (the runtime's own generator, with
// fast key erasure), so owners stay unpredictable to other clients, at a
// fraction of the cost of a crypto/rand read per acquire (about 50 ns
// here, a measurable part of a cycle).
func (r *request) newOwner() {
	binary.LittleEndian.PutUint64(r.owner[:8], r.gen.Uint64())
	binary.LittleEndian.PutUint64(r.owner[8:], r.gen.Uint64())
}

// newRequest makes a request for the pool, with a generator seeded from
// crypto/rand.
func newRequest() any {
	r := &request{ch: make(chan struct{}, 1)}
	var seed [32]byte
	crand.Read(seed[:]) // never fails
	r.gen.Seed(seed)
	return r
}

// await waits for r's result or for ctx to end; false means ctx ended
// first (r is still with c).
func (b *Broker) await(ctx context.Context, r *request) bool {
	done := ctx.Done()
	if done == nil {
		b.recv(r)
		return true
	}
	select {
	case <-r.ch:
		b.consumed()
		return true
	case <-done:
		return false
	}
}

// recv receives r's result; every result delivered is received once,
// by recv or await.
func (b *Broker) recv(r *request) {
	<-r.ch
	b.consumed()
}

// consumed accounts for one received result (see woken). The caller that
// brings woken to zero wakes every writer with queued requests: they
// were left for it by enqueue, so that one Write carries the whole wave.
func (b *Broker) consumed() {
	if b.woken.Add(-1) != 0 {
		return
	}
	for _, s := range b.sessions {
		if c := s.cur.Load(); c != nil && c.qlen.Load() > 0 {
			c.wakeWriter()
		}
	}
}

// AcquireOptions are the parameters of Acquire. They are named so that
// they cannot be swapped: write them as a keyed literal,
//
//	b.Acquire(ctx, "order-42", broker.AcquireOptions{Lease: 30 * time.Second, Wait: 5 * time.Second})
//
// (an unkeyed literal does not compile). Every duration is rounded up to
// whole seconds and never clamped: a value outside its range after
// rounding fails the call with ErrInvalidArgument before anything is sent.
type AcquireOptions struct {
	// Lease is how long the server keeps the lock if it is not released
	// (refreshed by Ticket.Refresh or Ticket.KeepAlive): 1..250 s
	// (MinLease..MaxLease). Required: the zero value fails with
	// ErrInvalidArgument ("Lease must be set"). For work longer than 250
	// s, take a lease of a few seconds and keep it with Ticket.KeepAlive.
	Lease time.Duration
	// Wait is how long the server may queue the request while another
	// holds the lock: 0..255 s (MaxWait); when it runs out, ErrTimedOut.
	// Zero, the default, is one immediate try, never queued: ErrTimedOut
	// at once if the lock is held.
	Wait time.Duration
	// Work is the work budget: the conservative remaining lease that a
	// grant must still have when it arrives, or it is released at once
	// and the call fails with ErrLeaseTooShort (a grant after a long
	// wait, say): 0..Lease. Zero, the default, is no budget: a grant is
	// returned as long as some of its lease remains.
	Work time.Duration

	_ struct{} // keyed literals only: AcquireOptions{Lease: ...}
}

// Acquire asks for the lock named key (1..255 bytes), with the lease,
// wait and work budget of opts (see AcquireOptions: Lease is required),
// and returns a Ticket only if the conservative remaining lease covers
// the work budget. A bad argument fails with ErrInvalidArgument before
// anything is sent.
//
// Errors (see the package documentation for what to do with each):
// ErrInvalidArgument, ErrTimedOut, ErrBusy, ErrIndeterminate, ErrUnsent,
// ErrLeaseTooShort, ErrNotActive, *ServerError, ErrClosed. A cancelled call
// also matches ctx's error, and returns at once. Cancelling after the
// request may have been sent is ErrIndeterminate: on a session of protocol
// version 2 the broker sends CANCEL for it (the server drops the queued
// wait) and releases a grant that still arrives, by token and owner, and
// the session and every other request on it carry on; on a version-1
// session (an older server) it closes the session, which makes the other
// ACQUIREs waiting on it Indeterminate too. Acquire never waits for a
// session: with none ready it fails at once with ErrUnsent.
func (b *Broker) Acquire(ctx context.Context, key string, opts AcquireOptions) (*Ticket, error) {
	tr := b.set.Tracer
	if tr == nil {
		return b.acquire(ctx, key, opts)
	}
	ctx = tr.TraceAcquireStart(ctx, TraceAcquireStartData{Key: key, Lease: opts.Lease, Wait: opts.Wait, Work: opts.Work})
	t, err := b.acquire(ctx, key, opts)
	d := TraceAcquireEndData{Key: key, Err: err}
	if t != nil {
		d.Token, d.Deadline = t.Token(), t.Deadline()
	}
	tr.TraceAcquireEnd(ctx, d)
	return t, err
}

func (b *Broker) acquire(ctx context.Context, key string, opts AcquireOptions) (*Ticket, error) {
	waitS, leaseS, workS, err := validate(key, &opts)
	if err != nil {
		return nil, err
	}
	if b.closing.Load() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, newErr(ErrUnsent, "cancelled before sending", err)
	}
	r := b.getReq()
	r.typ = wire.TypeAcquire
	r.key = append(r.key[:0], key...)
	r.waitS, r.leaseS = uint8(waitS), uint8(leaseS)
	r.deadline = time.Time{}
	r.newOwner() // a fresh owner for every acquire
	owner := r.owner
	if err := r.encode(wire.Version1); err != nil { // the same on version 2
		b.putReq(r)
		return nil, newErr(ErrInvalidArgument, "encoding ACQUIRE", err)
	}
	var lastCause error
	for i := range b.sessions {
		if i > 0 && ctx.Err() != nil {
			// Its session ended before a byte was written, and the caller
			// has cancelled since: moving it now would send it after the
			// cancel.
			b.putReq(r)
			return nil, newErr(ErrUnsent, "cancelled before sending", ctx.Err())
		}
		c := b.pick()
		if c == nil {
			break
		}
		if !c.enqueue(r) {
			continue
		}
		if !b.await(ctx, r) {
			switch c.withdraw(r, true, ctx.Err()) {
			case withdrawnUnsent:
				b.putReq(r)
				return nil, newErr(ErrUnsent, "cancelled before sending", ctx.Err())
			case withdrawnSent:
				b.putReq(r)
				return nil, newErr(ErrIndeterminate, "cancelled after a possible send; session closed (protocol version 1)", ctx.Err())
			case withdrawnCancelled: // r is the conn's until its final reply
				return nil, newErr(ErrIndeterminate, "cancelled after a possible send; CANCEL sent, a late grant is released", ctx.Err())
			}
			b.recv(r)
			t, err := b.cancelledOutcome(ctx, key, owner, &r.res, leaseS, workS)
			b.putReq(r)
			return t, err
		}
		// r.res is read in place (r goes back to the pool afterwards):
		// no copies of the result on the way to the Ticket.
		res := &r.res
		if b.debugOn() {
			b.debugReply(c, "ACQUIRE", r.id, key, 0, *res)
		}
		if res.typ == wire.TypeGranted && ctx.Err() != nil {
			// Cancelled while the grant was being read: never a Ticket.
			t, err := b.cancelledOutcome(ctx, key, owner, res, leaseS, workS)
			b.putReq(r)
			return t, err
		}
		if res.typ == 0 && !res.sent {
			// The session ended before our bytes were written: definitely
			// unsent, so another session may carry it.
			lastCause = res.cause
			continue
		}
		t, err := b.outcome(key, owner, res, leaseS, workS)
		b.putReq(r)
		return t, err
	}
	b.putReq(r)
	if b.closing.Load() {
		return nil, ErrClosed
	}
	if lastCause != nil {
		return nil, newErr(ErrUnsent, b.noSessionMsg(), lastCause)
	}
	return nil, b.noSession()
}

// cancelledOutcome: ctx ended, but a final reply had already been read.
// T, B, M and E stand; a grant is released (bounded, in the background) and
// the caller gets Indeterminate, never a Ticket.
func (b *Broker) cancelledOutcome(ctx context.Context, key string, owner [wire.OwnerLen]byte, res *result, leaseS, workS int64) (*Ticket, error) {
	if res.typ == wire.TypeGranted {
		b.compensate(key, res.token, owner, "grant read concurrently with cancellation")
		return nil, newErr(ErrIndeterminate, "cancelled; the concurrent grant is being released", ctx.Err())
	}
	if res.typ == 0 && res.sent {
		return nil, newCtxErr(ErrIndeterminate, "cancelled", ctx.Err(), res.cause)
	}
	if res.typ == 0 {
		return nil, newErr(ErrUnsent, "cancelled before sending", ctx.Err())
	}
	return b.outcome(key, owner, res, leaseS, workS)
}

func (b *Broker) outcome(key string, owner [wire.OwnerLen]byte, res *result, leaseS, workS int64) (*Ticket, error) {
	switch res.typ {
	case wire.TypeGranted:
		// Rule 15a: the server cannot have waited longer than the time
		// since t0, so a larger waited_ms is taken as that time, and the
		// deadline never exceeds t0 + elapsed + lease. (Reading the clock
		// here rather than at the reply only makes elapsed larger: still
		// a true bound.)
		now := time.Now()
		waited := min(time.Duration(res.waitedMS)*time.Millisecond, now.Sub(res.t0))
		total := waited + time.Duration(leaseS)*time.Second
		deadline := res.t0.Add(total * (100 - rhoPercent) / 100)
		remaining := deadline.Sub(now)
		if remaining <= 0 || remaining < time.Duration(workS)*time.Second {
			rerr := b.release(context.Background(), key, res.token, owner, time.Now(), true)
			msg := fmt.Sprintf("remaining %v < work budget %ds; compensating release: ", remaining.Round(time.Millisecond), workS)
			if rerr == nil {
				msg += "confirmed"
			} else {
				msg += rerr.Error()
			}
			return nil, newErr(ErrLeaseTooShort, msg, nil)
		}
		return b.newTicket(key, res.token, owner, deadline)
	case wire.TypeTimedOut:
		return nil, ErrTimedOut
	case wire.TypeBusy:
		return nil, ErrBusy
	case wire.TypeNotActive:
		return nil, &NotActiveError{Hint: res.msg}
	case wire.TypeError:
		return nil, &ServerError{Code: res.code, Message: res.msg}
	}
	return nil, newErr(ErrIndeterminate, "no final reply", res.cause)
}

func (b *Broker) newTicket(key string, token uint64, owner [wire.OwnerLen]byte, deadline time.Time) (*Ticket, error) {
	st := &ticketState{key: key, token: token, owner: owner, deadline: deadline}
	sh := b.shard(st)
	sh.mu.Lock()
	if b.closing.Load() { // Close has collected, or will not see, this shard
		sh.mu.Unlock()
		b.release(context.Background(), key, token, owner, time.Now(), true)
		return nil, ErrClosed
	}
	t := &Ticket{b: b, st: st}
	// The drop safety net: the registry holds t until the next
	// garbage collection, which gives it a finalizer (see promote). A
	// finalizer rather than runtime.AddCleanup: it costs no allocation
	// (AddCleanup boxes its argument and allocates a closure), and a
	// promoted Ticket is never part of a cycle that the finalizer would
	// keep alive (it refers only to the Broker, reachable from its
	// sessions' goroutines anyway, and to its ticketState, which no longer
	// refers to it).
	st.young = t
	sh.add(st)
	sh.mu.Unlock()
	return t, nil
}

// spawn runs f in a tracked background goroutine, unless Close has begun.
func (b *Broker) spawn(f func()) bool {
	b.mu.Lock()
	if b.closing.Load() {
		b.mu.Unlock()
		return false
	}
	b.bg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.bg.Done()
		f()
	}()
	return true
}

// compensate releases a grant nobody will use, in the background, within
// the release window.
func (b *Broker) compensate(key string, token uint64, owner [wire.OwnerLen]byte, why string) {
	start := time.Now()
	if !b.spawn(func() {
		err := b.release(context.Background(), key, token, owner, start, false)
		b.log.Warn("broker: compensating release", "why", why, "key", key, "token", token, "err", err)
	}) {
		b.log.Warn("broker: compensating release skipped: broker closing", "why", why, "key", key, "token", token)
	}
}

// release sends RELEASE for the exact token, retrying on any ready session
// until the window from start ends; it resends only after a session drop.
// On a version-2 session it is RELEASE_OWNED, with the owner of the
// ACQUIRE that was granted the token. fresh says that start was taken just
// now, so that the first attempt need not read the clock again to check
// the window.
//
// Its outcome is exactly one of: nil (R), ErrNotHeld (N), ErrUnsent (no
// attempt may have been sent, whether the window ended or ctx did),
// ErrReleaseUnconfirmed (an attempt may have been sent, and no final reply
// came), ErrClosed, ErrInvalidArgument. The last attempt's failure is in
// the message only (see newErr).
func (b *Broker) release(ctx context.Context, key string, token uint64, owner [wire.OwnerLen]byte, start time.Time, fresh bool) error {
	deadline := start.Add(b.set.Config.ReleaseWindow)
	r := b.getReq()
	r.typ = wire.TypeRelease
	r.key = append(r.key[:0], key...)
	r.token = token
	r.owner = owner
	r.frameVer = 0        // encoded for the session picked
	r.deadline = deadline // the conn delivers an expired result then
	var last error
	sentAny := false // an attempt may have reached the server
	// ended is the outcome when the window or ctx ends with no final reply.
	ended := func(msg string, ctxErr error) error {
		if sentAny {
			return newCtxErr(ErrReleaseUnconfirmed, msg+" (an attempt may have been sent)", ctxErr, last)
		}
		return newCtxErr(ErrUnsent, msg+" (nothing was sent)", ctxErr, last)
	}
	for {
		if fresh {
			fresh = false
		} else if !time.Now().Before(deadline) {
			b.putReq(r)
			return ended("no final reply within the release window", nil)
		}
		c := b.pick()
		if c == nil {
			select {
			case <-b.down:
				b.putReq(r)
				return ErrClosed
			default:
			}
			if last == nil {
				last = b.noSession()
			}
			wait := min(20*time.Millisecond, time.Until(deadline))
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				b.putReq(r)
				return ended("release cancelled", ctx.Err())
			}
			continue
		}
		if r.frameVer != c.version {
			if err := r.encode(c.version); err != nil { // a Ticket's key is valid: cannot happen
				b.putReq(r)
				return newErr(ErrInvalidArgument, "encoding RELEASE", err)
			}
		}
		if !c.enqueue(r) {
			continue
		}
		if !b.await(ctx, r) {
			switch c.withdraw(r, false, nil) {
			case withdrawnUnsent:
				b.putReq(r)
				return ended("release cancelled", ctx.Err())
			case withdrawnSent: // r now belongs to the conn, which absorbs its reply
				sentAny = true
				return ended("release cancelled after sending", ctx.Err())
			}
			b.recv(r) // the result raced with the cancel: use it
		}
		res := &r.res // read in place, before r is reused or pooled
		if b.debugOn() {
			b.debugReply(c, "RELEASE", r.id, key, token, *res)
		}
		sentAny = sentAny || res.sent
		if res.expired {
			if !res.sent { // a sent one stays with its conn, abandoned
				b.putReq(r)
			}
			return ended("no final reply within the release window", nil)
		}
		switch res.typ {
		case wire.TypeReleased:
			b.putReq(r)
			return nil
		case wire.TypeNotHeld:
			b.putReq(r)
			return ErrNotHeld
		case wire.TypeNotActive:
			last = &NotActiveError{Hint: res.msg}
		case wire.TypeError:
			last = &ServerError{Code: res.code, Message: res.msg}
		default:
			last = res.cause
		}
		// The session ended (or refused): resending is now safe.
	}
}

// debugOn reports whether the logger writes Debug lines: the per-request
// lines are built only then, so that they cost one level check otherwise.
func (b *Broker) debugOn() bool { return b.log.Enabled(context.Background(), slog.LevelDebug) }

// debugReply logs, at Debug, the result of one ACQUIRE or RELEASE (token:
// the one released) on c: the session, the req_id, the reply (G, T, B,
// R, N, M, E, or none: the session ended) with its token, wait, hint or
// code.
func (b *Broker) debugReply(c *conn, op string, id uint32, key string, token uint64, res result) {
	attrs := []any{"addr", c.s.addr, "session", c.s.idx, "node", c.nodeName, "req_id", id, "key", key}
	if token != 0 {
		attrs = append(attrs, "token", token)
	}
	switch {
	case res.expired:
		attrs = append(attrs, "reply", "none: release window ended")
	case res.typ == 0:
		attrs = append(attrs, "reply", "none: session ended", "sent", res.sent, "err", res.cause)
	case res.typ == wire.TypeGranted:
		attrs = append(attrs, "reply", "G", "token", res.token, "waited_ms", res.waitedMS)
	case res.typ == wire.TypeNotActive:
		attrs = append(attrs, "reply", "M", "hint", res.msg)
	case res.typ == wire.TypeError:
		attrs = append(attrs, "reply", "E", "code", res.code, "msg", res.msg)
	default:
		attrs = append(attrs, "reply", string(rune(res.typ)))
	}
	b.log.Debug("broker: "+op+" reply", attrs...)
}

// Close makes a bounded, concurrent, best-effort release of every ticket
// not yet released (within the 5 s release window), then closes every
// session and waits for the broker's goroutines. It returns within the
// release window plus teardown. Close is idempotent and always returns nil;
// after it, Acquire, WaitReady and Release of an unreleased ticket return
// ErrClosed at once.
func (b *Broker) Close() error {
	b.once.Do(func() {
		b.mu.Lock()
		b.closing.Store(true)
		b.mu.Unlock()
		var sts []*ticketState
		for i := range b.tickets {
			sh := &b.tickets[i]
			sh.mu.Lock()
			for st := sh.head; st != nil; st = st.next {
				sts = append(sts, st)
			}
			sh.mu.Unlock()
		}
		start := time.Now()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 256)
		for _, st := range sts {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				err := b.releaseStateCtx(context.Background(), st, start, false)
				if err != nil {
					b.log.Warn("broker: release at Close failed", "key", st.key, "token", st.token, "err", err)
				}
			}()
		}
		wg.Wait()
		b.bg.Wait()
		b.cancel()
		b.wg.Wait()
		close(b.down)
	})
	return nil
}
