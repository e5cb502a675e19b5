package lockcore

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// harness drives a Core over a memLog as a server would, with a fake now,
// and checks after every event what must always hold: the log's checks of
// every applied command, the capacity counters against the Core's own
// counts, the projection against the Machine, Next and NextExpiry against
// the Core's entries, and, for every reply, that it answers a request that
// awaits it (one final answer per request; none after a Drop removed it; no
// G to a session that is not live; G tokens the Machine issued, new ones
// strictly increasing; no free key with waiters). Where nothing is in
// flight on a request's key it also works out from the Machine's state
// what the rules say the first answer must be (the oracle) and checks it.
// The script runner and the property test share it.
type harness struct {
	cfg      Config
	cap      *Capacity
	core     *Core
	log      *memLog
	now      int64
	sessions map[string]*fakeSession
	reqs     map[reqKey]*request
	// stale is how many of the commands in the log's flight were proposed
	// before the last Demote (their outcomes are not awaited).
	stale   int
	demoted bool // between Demote and Promote: the Core schedules nothing
	// desynced keys had a Desync and await their Resync.
	desynced map[string]bool
	maxToken uint64
	issued   map[uint64]issue // every token a G carried
	// leaseEnd is when each token's lease ends, as the Machine's holdings
	// show it: from the event that made the holding (or Promote).
	leaseEnd map[uint64]int64
	// errs are the broken invariants; out the formatted effects.
	errs []string
	out  []string
}

type fakeSession struct {
	name   string
	live   bool
	num    uint64  // Acquire.By
	client *Client // Acquire.Client: name, and addr "10.0.0.<num>:5000"
}

func (s *fakeSession) Live() bool { return s.live }

func (s *fakeSession) String() string { return s.name }

type reqKey struct {
	s  string
	id uint32
}

func (k reqKey) String() string { return fmt.Sprintf("%s#%d", k.s, k.id) }

type reqState uint8

const (
	reqOpen      reqState = iota
	reqAnswered           // its final answer came
	reqDropped            // Drop removed it: no answer may come
	reqAbandoned          // its session closed (kill in the property test, Demote): an answer may or may not come, but no G
)

type request struct {
	acquire  bool
	extend   bool // an EXTEND (token, owner, lease; arrived: when it was read)
	expire   bool // an operator's Expire (token)
	key      string
	owner    Owner
	token    uint64 // RELEASE
	arrived  int64
	lease    uint8 // ACQUIRE, EXTEND: the lease asked for
	wait     uint8
	owned    bool
	expect   expectation
	expTok   uint64 // expectRetry: the holder's token
	recorded bool   // the driver holds it in flight (Queue, Track)
	w        *Waiter
	state    reqState
	answer   string
}

// expectation is what the rules say a request's first answer must be,
// worked out from the Machine's state when nothing is in flight on the key
// (the oracle: the Core's projection is checked against it).
type expectation uint8

const (
	expectAny    expectation = iota // commands on the key in flight: not worked out
	expectFree                      // a free key (or a lease ended): G new, B, failed or a token waiter; never T or queued
	expectRetry                     // the holder's own: G with its token
	expectNoWait                    // held by another, wait_s 0: T (no-wait)
	expectWait                      // held by another, wait_s > 0: queued, or B (full)
	expectR                         // R
	expectN                         // N
	expectK                         // K
	expectEnded                     // Ended (an Expire)
	expectOther                     // N (other token: an Expire)
)

// live returns the Machine's holding of key if its lease has not ended.
func (h *harness) live(key string) (memHolding, bool) {
	x, ok := h.log.held[key]
	if !ok {
		return x, false
	}
	end, known := h.leaseEnd[x.token]
	return x, !known || h.now < end
}

func (h *harness) worked(key string) bool {
	return !h.demoted && !h.log.inFlight(key) && !h.log.diverged[key]
}

// waiting reports whether an ACQUIRE waits in key's queue.
func (h *harness) waiting(key string) bool {
	for _, r := range h.reqs {
		if r.acquire && r.key == key && r.w != nil && !r.w.done && !r.w.proposed {
			return true
		}
	}
	return false
}

func (h *harness) expectAcquire(key string, owner Owner, wait uint8) (expectation, uint64) {
	if !h.worked(key) {
		return expectAny, 0
	}
	x, live := h.live(key)
	switch {
	case !live && h.waiting(key):
		return expectAny, 0 // the lease end hands it to a waiter first
	case !live:
		return expectFree, 0
	case x.owner == owner:
		return expectRetry, x.token
	case wait == 0:
		return expectNoWait, 0
	}
	return expectWait, 0
}

func (h *harness) expectRelease(key string, token uint64, owner Owner, owned bool) expectation {
	if !h.worked(key) {
		return expectAny
	}
	x, live := h.live(key)
	if live && x.token == token && (owned && x.owner == owner || !owned && !x.owned) {
		return expectR
	}
	return expectN
}

func (h *harness) expectExpire(key string, token uint64) expectation {
	if !h.worked(key) {
		return expectAny
	}
	x, live := h.live(key)
	switch {
	case live && x.token == token:
		return expectEnded
	case live:
		return expectOther
	}
	return expectN
}

func (h *harness) expectExtend(key string, token uint64, owner Owner) expectation {
	if !h.worked(key) {
		return expectAny
	}
	if x, live := h.live(key); live && x.token == token && x.owner == owner {
		return expectK
	}
	return expectN
}

// oracle checks a request's first answer s (of kind k) against its
// expectation.
func (h *harness) oracle(key reqKey, r *request, f Effect) {
	e := r.expect
	if e == expectAny || h.log.diverged[r.key] {
		return
	}
	r.expect = expectAny // only the first answer is worked out
	ok := true
	switch e {
	case expectFree:
		ok = f.Kind == Track || f.Kind == Failed || f.Kind == Busy ||
			f.Kind == Granted && h.issued[f.Token] == issue{} ||
			f.Kind == Queue && f.W != nil && f.W.tok // a token waiter (Config.TokenWait)
	case expectRetry:
		ok = f.Kind == Granted && f.Token == r.expTok
	case expectNoWait:
		ok = f.Kind == TimedOut && f.Why == NoWait
	case expectWait:
		ok = f.Kind == Queue || f.Kind == Busy && f.Why == Full
	case expectR:
		ok = f.Kind == Released
	case expectN:
		ok = f.Kind == NotHeld && f.Why != OtherToken
	case expectK:
		ok = f.Kind == Kept
	case expectEnded:
		ok = f.Kind == Ended
	case expectOther:
		ok = f.Kind == NotHeld && f.Why == OtherToken
	}
	if !ok {
		h.errorf("%v: %s (%s), the rules say %s", key, kindName(f.Kind), whyName(f.Why),
			[]string{"", "a free key's answer", fmt.Sprintf("G token=%d (the holder's retry)", r.expTok),
				"T (no-wait)", "queued or B (full)", "R", "N", "K", "ended", "N (other-token)"}[e])
	}
}

type issue struct {
	key   string
	owner Owner
}

func newHarness(cfg Config, async bool) *harness {
	if cfg.Capacity == nil {
		cfg.Capacity = &Capacity{MaxLocks: 100, MaxWaiters: 100}
	}
	h := &harness{
		cfg:      cfg,
		cap:      cfg.Capacity,
		log:      newMemLog(async),
		sessions: make(map[string]*fakeSession),
		reqs:     make(map[reqKey]*request),
		issued:   make(map[uint64]issue),
		leaseEnd: make(map[uint64]int64),
		desynced: make(map[string]bool),
	}
	h.core = New(cfg, h.log)
	h.log.name = func(by uint64) string {
		for name, s := range h.sessions {
			if s.num == by {
				return name
			}
		}
		return fmt.Sprint(by)
	}
	return h
}

func (h *harness) errorf(format string, args ...any) {
	h.errs = append(h.errs, fmt.Sprintf(format, args...))
}

func (h *harness) session(name string) *fakeSession {
	s := h.sessions[name]
	if s == nil {
		s = &fakeSession{name: name, live: true, num: uint64(len(h.sessions) + 1)}
		s.client = &Client{Name: name, Addr: fmt.Sprintf("10.0.0.%d:5000", s.num)}
		h.sessions[name] = s
	}
	return s
}

func sessionName(s Session) string {
	if f, ok := s.(*fakeSession); ok {
		return f.name
	}
	return fmt.Sprintf("%v", s)
}

// acquire submits an ACQUIRE (arrived: when it was read).
func (h *harness) acquire(s string, id uint32, key string, owner Owner, lease, wait uint8, ownedOnly bool, arrived int64) {
	k := reqKey{s, id}
	if r := h.reqs[k]; r != nil && r.state == reqOpen {
		h.errorf("%v: req_id reused while it awaits its reply", k)
	}
	r := &request{acquire: true, key: key, owner: owner, arrived: arrived, lease: lease, wait: wait, owned: ownedOnly}
	r.expect, r.expTok = h.expectAcquire(key, owner, wait)
	h.reqs[k] = r
	h.core.Acquire(h.now, &Acquire{S: h.session(s), By: h.session(s).num, ReqID: id, Key: []byte(key), Owner: owner,
		LeaseS: lease, WaitS: wait, OwnedOnly: ownedOnly, Arrived: arrived, Client: h.session(s).client})
	h.effects()
}

// tokensReady is the token store's word that its reservation ended.
func (h *harness) tokensReady() {
	h.core.TokensReady(h.now)
	h.effects()
}

func (h *harness) release(s string, id uint32, key string, token uint64, owner Owner, owned bool) {
	k := reqKey{s, id}
	if r := h.reqs[k]; r != nil && r.state == reqOpen {
		h.errorf("%v: req_id reused while it awaits its reply", k)
	}
	h.reqs[k] = &request{key: key, owner: owner, token: token, expect: h.expectRelease(key, token, owner, owned)}
	h.core.Release(h.now, &Release{S: h.session(s), By: h.session(s).num, ReqID: id, Key: []byte(key), Token: token, Owner: owner, Owned: owned})
	h.effects()
}

// extend submits an EXTEND.
func (h *harness) extend(s string, id uint32, key string, token uint64, owner Owner, lease uint8) {
	k := reqKey{s, id}
	if r := h.reqs[k]; r != nil && r.state == reqOpen {
		h.errorf("%v: req_id reused while it awaits its reply", k)
	}
	h.reqs[k] = &request{extend: true, key: key, owner: owner, token: token, lease: lease, arrived: h.now,
		expect: h.expectExtend(key, token, owner)}
	h.core.Extend(h.now, &Extend{S: h.session(s), By: h.session(s).num, ReqID: id, Key: []byte(key), Token: token, Owner: owner, LeaseS: lease})
	h.effects()
}

// expire submits an operator's Expire, answered to s (the admin's
// session) under id.
func (h *harness) expire(s string, id uint32, key string, token uint64) {
	k := reqKey{s, id}
	if r := h.reqs[k]; r != nil && r.state == reqOpen {
		h.errorf("%v: req_id reused while it awaits its reply", k)
	}
	h.reqs[k] = &request{expire: true, key: key, token: token, expect: h.expectExpire(key, token)}
	h.core.Expire(h.now, &Expire{S: h.session(s), ReqID: id, Key: []byte(key), Token: token})
	h.effects()
}

// cancel is a CANCEL of s's ACQUIRE id: the driver looks up its record.
func (h *harness) cancel(s string, id uint32) {
	r := h.reqs[reqKey{s, id}]
	if r == nil || !r.acquire || r.w == nil || r.state != reqOpen && r.state != reqAbandoned {
		h.out = append(h.out, "(not waiting)")
		return
	}
	if !h.core.Cancel(h.now, r.w) {
		h.out = append(h.out, "(not cancelled)")
	}
	h.effects()
}

// drop is a closing session's Drop of its waiting ACQUIRE id.
func (h *harness) drop(s string, id uint32) {
	r := h.reqs[reqKey{s, id}]
	if r == nil || !r.acquire || r.w == nil || r.state != reqOpen && r.state != reqAbandoned {
		h.out = append(h.out, "(not waiting)")
		return
	}
	removed := !r.w.done && !r.w.proposed
	h.core.Drop(r.w)
	if removed {
		r.state = reqDropped
	} else {
		h.out = append(h.out, "(not dropped)")
	}
	h.check()
}

// kill makes s not live: it is closing, and its requests need no answer.
// Its waiters are not dropped: a driver drops them when it gets round to
// it (drop), and until then the Core must skip them.
func (h *harness) kill(s string) {
	h.session(s).live = false
	for k, r := range h.reqs {
		if k.s == s && r.state == reqOpen {
			r.state = reqAbandoned
		}
	}
	h.check()
}

func (h *harness) tick() {
	h.core.Tick(h.now)
	h.effects()
	if n := h.core.Next(); n <= h.now {
		h.errorf("after Tick(%s), Next is %s", fmtTime(h.now), fmtTime(n))
	}
	if n := h.core.NextExpiry(); n <= h.now {
		h.errorf("after Tick(%s), NextExpiry is %s", fmtTime(h.now), fmtTime(n))
	}
}

// apply delivers the results of the n oldest commands in flight (n < 0:
// all, including those proposed while applying).
func (h *harness) apply(n int) {
	for i := 0; n < 0 || i < n; i++ {
		p, r, ok := h.log.Step()
		if !ok {
			break
		}
		if h.stale > 0 {
			h.stale--
		}
		h.core.Applied(h.now, p, r)
		h.effects()
	}
}

func (h *harness) demote() {
	h.core.Demote()
	h.stale, h.demoted = len(h.log.flight), true
	for _, r := range h.reqs {
		if r.state == reqOpen {
			r.state = reqAbandoned
		}
	}
	h.effects()
}

func (h *harness) promote(hs []Holding, margin int64) {
	if hs == nil {
		hs = h.log.holdings()
	} else {
		h.log.restore(hs)
	}
	h.stale, h.demoted = len(h.log.flight), false
	for _, r := range h.reqs {
		if r.state == reqOpen {
			r.state = reqAbandoned
		}
	}
	h.core.Promote(h.now, hs, margin)
	for _, x := range hs {
		h.leaseEnd[x.Token] = h.now + int64(x.LeaseS)*secondNs + margin
	}
	for _, x := range hs {
		h.maxToken = max(h.maxToken, x.Token)
		h.issued[x.Token] = issue{x.Key, x.Owner}
	}
	h.effects()
}

func (h *harness) resync(key string) {
	var hp *Holding
	if x, ok := h.log.held[key]; ok {
		hp = &Holding{Key: key, Owner: x.owner, Token: x.token, LeaseS: x.lease, OwnedOnly: x.owned}
	}
	delete(h.desynced, key)
	h.core.Resync(h.now, key, hp)
	h.effects()
}

// effects takes the log's trace and the Core's effects of the last event,
// checks and formats them, then checks the invariants.
func (h *harness) effects() {
	fx := h.core.Effects() // (hands the event's commands to the log first)
	h.out = append(h.out, h.log.takeTrace()...)
	for _, f := range fx {
		h.out = append(h.out, h.effect(f))
	}
	h.check()
}

func (h *harness) effect(f Effect) string {
	switch f.Kind {
	case Expired:
		return "expired"
	case Desync:
		key := f.Err.(*DesyncError).Key
		h.desynced[key] = true
		return "desync " + key
	}
	k := reqKey{sessionName(f.S), f.ReqID}
	r := h.reqs[k]
	acq := f.Kind != Released && f.Kind != NotHeld && f.Kind != Kept && f.Kind != Ended
	switch {
	case r == nil:
		h.errorf("%v: %s for a request never made", k, kindName(f.Kind))
		r = &request{acquire: acq}
	case r.acquire != acq, f.Kind == Kept && !r.extend, f.Kind == Ended && !r.expire, f.Kind == Released && r.expire:
		h.errorf("%v: %s for the wrong kind of request", k, kindName(f.Kind))
	case r.state == reqDropped:
		h.errorf("%v: %s after Drop removed it", k, kindName(f.Kind))
	case r.state == reqAnswered:
		h.errorf("%v: %s after its final answer %s", k, kindName(f.Kind), r.answer)
	}
	if f.Kind != Granted {
		h.oracle(k, r, f)
	}
	final := func(s string) string {
		if f.Queued != r.recorded {
			h.errorf("%v: %s with Queued %v, recorded %v", k, s, f.Queued, r.recorded)
		}
		if r.state != reqAbandoned {
			r.state = reqAnswered
		}
		r.answer = s
		r.recorded, r.w = false, nil
		return k.String() + " " + s
	}
	if f.Kind == Granted {
		// (before granted() records a new token as issued)
		h.oracle(k, r, f)
	}
	switch f.Kind {
	case Queue, Track:
		if r.state != reqOpen {
			h.errorf("%v: %s of a request not open", k, kindName(f.Kind))
		}
		if f.Kind == Queue {
			if f.W == nil || f.W.ReqID() != f.ReqID || f.W.Session() != f.S {
				h.errorf("%v: Queue with a waiter that is not its own", k)
			}
			r.w = f.W
		}
		r.recorded = true
		return kindName(f.Kind) + " " + k.String()
	case Granted:
		h.granted(k, r, f)
		return final(fmt.Sprintf("G token=%d waited=%dms", f.Token, f.WaitedMS()))
	case TimedOut:
		return final("T (" + whyName(f.Why) + ")")
	case Busy:
		s := "B (" + whyName(f.Why)
		if f.Err != nil {
			s += ": " + f.Err.Error()
		}
		return final(s + ")")
	case Failed:
		return final(fmt.Sprintf("failed (%v)", f.Err))
	case Released:
		if !h.cfg.EarlyRelease {
			if x, ok := h.log.held[r.key]; ok && x.token == r.token && !h.log.diverged[r.key] {
				h.errorf("%v: R while the Machine still holds %s with token %d", k, r.key, r.token)
			}
		}
		return final("R")
	case NotHeld:
		if f.Why != 0 {
			if !r.expire {
				h.errorf("%v: N (%s) to a request that is not an Expire", k, whyName(f.Why))
			}
			return final("N (" + whyName(f.Why) + ")")
		}
		return final("N")
	case Ended:
		if x, ok := h.log.held[r.key]; ok && x.token == r.token && !h.log.diverged[r.key] {
			h.errorf("%v: ended while the Machine still holds %s with token %d", k, r.key, r.token)
		}
		return final("ended")
	case Kept:
		h.kept(k, r)
		return final("K")
	}
	h.errorf("%v: unknown effect kind %d", k, f.Kind)
	return fmt.Sprintf("%v kind=%d", k, f.Kind)
}

func (h *harness) granted(k reqKey, r *request, f Effect) {
	if !f.S.Live() {
		h.errorf("%v: G to a session that is not live", k)
	}
	if f.WaitedMS() != uint32(f.Wait/msNs) {
		h.errorf("%v: waited_ms %d, Wait %s", k, f.WaitedMS(), time.Duration(f.Wait))
	}
	x, ok := h.log.held[r.key]
	if !h.log.diverged[r.key] && (!ok || x.token != f.Token || x.owner != r.owner) {
		h.errorf("%v: G token %d to %s for %s, the Machine's holding: %v %+v", k, f.Token, ownerString(r.owner), r.key, ok, x)
	}
	if is, ok := h.issued[f.Token]; ok {
		// The holder's retry: its token again, waited_ms 0.
		if is.key != r.key || is.owner != r.owner {
			h.errorf("%v: G token %d, issued before to %s for %s", k, f.Token, ownerString(is.owner), is.key)
		}
		if f.WaitedMS() != 0 {
			h.errorf("%v: a retry's G with waited_ms %d", k, f.WaitedMS())
		}
		return
	}
	if f.Token <= h.maxToken {
		h.errorf("%v: new token %d not above %d", k, f.Token, h.maxToken)
	}
	h.maxToken = f.Token
	h.issued[f.Token] = issue{r.key, r.owner}
	if f.Wait != h.now-r.arrived {
		h.errorf("%v: G Wait %s, the ACQUIRE arrived %s before", k, time.Duration(f.Wait), time.Duration(h.now-r.arrived))
	}
}

// kept checks a K: the Machine's holding is the EXTEND's (token, owner),
// and the Core's lease ends no earlier than lease_s after the EXTEND was
// read, nor earlier than before (never shortened); the model's lease end
// moves to the later of the two.
func (h *harness) kept(k reqKey, r *request) {
	x, ok := h.log.held[r.key]
	if !h.log.diverged[r.key] && (!ok || x.token != r.token || x.owner != r.owner) {
		h.errorf("%v: K for %s token %d, the Machine's holding: %v %+v", k, r.key, r.token, ok, x)
	}
	end := max(h.leaseEnd[r.token], r.arrived+int64(r.lease)*secondNs)
	h.leaseEnd[r.token] = end
	if e := h.core.m[r.key]; e != nil && e.held && e.token == r.token && e.end < end {
		h.errorf("%v: K, but the Core ends the lease at %s, before %s", k, fmtTime(e.end), fmtTime(end))
	}
}

// check verifies what must hold between events.
func (h *harness) check() {
	for _, v := range h.log.violations {
		h.errorf("log: %s", v)
	}
	h.log.violations = nil
	for _, x := range h.log.held {
		if _, ok := h.leaseEnd[x.token]; !ok {
			h.leaseEnd[x.token] = h.now + int64(x.lease)*secondNs
		}
	}
	c := h.core
	var held, waiters, queued int64
	next, nextExp := int64(NoDeadline), int64(NoDeadline)
	for k, e := range c.m {
		if e.key != k {
			h.errorf("entry %q under %q", e.key, k)
		}
		if e.held {
			held++
			if end, ok := h.leaseEnd[e.token]; ok && e.token != 0 && e.end < end && !h.log.diverged[k] {
				h.errorf("%s: the Core ends token %d's lease at %s, before %s (a lease shortened)", k, e.token, fmtTime(e.end), fmtTime(end))
			}
			if e.token != 0 {
				nextExp = min(nextExp, e.end)
				if e.q != nil {
					next = min(next, e.end)
				}
			} else if e.pending() == nil {
				h.errorf("%s: held, no token, nothing in flight", k)
			}
		} else if e.linked {
			if e.list != idleList {
				h.errorf("%s: free, in lease list %d", k, e.list)
			}
			nextExp = min(nextExp, e.end)
		}
		if e.q != nil {
			if e.q.n == 0 || e.q.head == nil {
				h.errorf("%s: an empty queue", k)
			}
			if !e.held && !h.desynced[k] {
				h.errorf("%s: free, with waiters", k)
			}
			n := 0
			for w := e.q.head; w != nil; w = w.next {
				n++
				next = min(next, w.g.deadline)
				if w.done || w.proposed || w.e != e || e.q.byOwner[w.g.owner] != w {
					h.errorf("%s: queued waiter %s#%d done %v proposed %v", k, sessionName(w.g.s), w.g.reqID, w.done, w.proposed)
				}
			}
			if n != e.q.n || len(e.q.byOwner) != n {
				h.errorf("%s: queue of %d counts %d, %d owners", k, n, e.q.n, len(e.q.byOwner))
			}
			waiters += int64(n)
		}
	}
	for _, w := range c.tokenq {
		// Token waiters: in the waits heap, in no key's queue.
		waiters++
		next = min(next, w.g.deadline)
		if w.done || !w.tok || w.g.deadline != w.g.tokenBy {
			h.errorf("token waiter %s#%d done %v tok %v", sessionName(w.g.s), w.g.reqID, w.done, w.tok)
		}
	}
	for _, w := range c.waits {
		if !w.done {
			queued++
		}
	}
	if held != int64(c.Len()) || h.cap.Held.Load() != held {
		h.errorf("held: %d entries, Len %d, Capacity.Held %d", held, c.Len(), h.cap.Held.Load())
	}
	if waiters != c.nwait || h.cap.Waiters.Load() != waiters || int64(len(c.waits)) != waiters || queued != waiters {
		h.errorf("waiters: %d queued, nwait %d, Capacity.Waiters %d, heap %d", waiters, c.nwait, h.cap.Waiters.Load(), len(c.waits))
	}
	if got := c.Next(); got != next {
		h.errorf("Next %s, want %s", fmtTime(got), fmtTime(next))
	}
	if got := c.NextExpiry(); got != nextExp {
		h.errorf("NextExpiry %s, want %s", fmtTime(got), fmtTime(nextExp))
	}
	if want := len(h.log.flight) - h.stale; c.Pending() != want {
		h.errorf("Pending %d, the log has %d in flight", c.Pending(), want)
	}
	// The projection, where nothing is in flight, is the Machine's state.
	mine := map[string]Holding{}
	for _, x := range c.Holdings() {
		mine[x.Key] = x
	}
	if h.stale == 0 && !h.demoted {
		for _, x := range h.log.holdings() {
			if y, ok := mine[x.Key]; !h.log.inFlight(x.Key) && !h.log.diverged[x.Key] && (!ok || y != x) {
				h.errorf("%s: the Machine holds %+v, the Core %+v", x.Key, x, y)
			}
		}
		for k, y := range mine {
			if _, ok := h.log.held[k]; !ok && !h.log.inFlight(k) && !h.log.diverged[k] {
				h.errorf("%s: the Core holds %+v, the Machine nothing", k, y)
			}
		}
	}
}

// open returns the requests still awaiting an answer a live session must
// get, sorted.
func (h *harness) open() []string {
	var ks []string
	for k, r := range h.reqs {
		if r.state == reqOpen {
			ks = append(ks, k.String())
		}
	}
	sort.Strings(ks)
	return ks
}

// state formats the Core's keys and counters.
func (h *harness) state() []string {
	c := h.core
	keys := make([]string, 0, len(c.m))
	for k := range c.m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		e := c.m[k]
		var sb strings.Builder
		sb.WriteString(k + ":")
		switch {
		case e.held && e.token != 0:
			fmt.Fprintf(&sb, " held by %s token=%d lease=%ds end=%s", ownerString(e.owner), e.token, e.lease, fmtTime(e.end))
		case e.held:
			fmt.Fprintf(&sb, " held by %s (grant in flight) lease=%ds", ownerString(e.owner), e.lease)
		default:
			sb.WriteString(" free")
			if e.linked {
				fmt.Fprintf(&sb, " idle until %s", fmtTime(e.end))
			}
		}
		if e.held && e.ownedOnly {
			sb.WriteString(" owned-only")
		}
		if e.freeingOf() != nil {
			fmt.Fprintf(&sb, " (free of token %d in flight)", e.freeingOf().tok)
		}
		if e.q != nil {
			var ws []string
			for w := e.q.head; w != nil; w = w.next {
				ws = append(ws, fmt.Sprintf("%s#%d", sessionName(w.g.s), w.g.reqID))
			}
			sb.WriteString(" queue=" + strings.Join(ws, ","))
		}
		out = append(out, sb.String())
	}
	out = append(out, fmt.Sprintf("len=%d pending=%d capacity: held=%d waiters=%d",
		c.Len(), c.Pending(), h.cap.Held.Load(), h.cap.Waiters.Load()))
	return out
}

func fmtTime(t int64) string {
	if t == NoDeadline {
		return "none"
	}
	return strconv.FormatFloat(float64(t)/float64(time.Second), 'f', -1, 64) + "s"
}

func kindName(k Kind) string {
	names := map[Kind]string{Granted: "G", TimedOut: "T", Busy: "B", Released: "R", NotHeld: "N", Failed: "failed",
		Queue: "queue", Track: "track", Expired: "expired", Desync: "desync", Kept: "K", Ended: "ended"}
	if n, ok := names[k]; ok {
		return n
	}
	return fmt.Sprintf("kind(%d)", k)
}

func whyName(w Why) string {
	names := map[Why]string{WaitEnded: "wait-ended", NoWait: "no-wait", Cancelled: "cancelled", Replaced: "replaced",
		GrantTooLate: "grant-too-late", Full: "full", Backlog: "backlog", NoToken: "no-token", SlowCommit: "slow-commit", OtherToken: "other-token"}
	if n, ok := names[w]; ok {
		return n
	}
	return fmt.Sprintf("why(%d)", w)
}
