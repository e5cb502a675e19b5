package lockcore

import (
	"flag"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
)

// TestRandom drives a Core with random events (seeded, with a fake now)
// against both log flavours. The harness checks every event (see harness):
// the log's checks of every applied command (never a Grant of a held key,
// never a Free of a token that does not hold its key), tokens strictly
// increasing per grant, the capacity counters against the Core's own
// counts, the projection against the Machine, Next and NextExpiry, one
// final answer per request and none after a Drop, no G to a closing
// session. At the end every request of a live session must have had its
// final answer. A failure prints the events as a script for testdata.
var (
	randomSeeds  = flag.Int("seeds", 300, "TestRandom: seeds per log flavour")
	randomEvents = flag.Int("events", 400, "TestRandom: events per seed")
)

func TestRandom(t *testing.T) {
	seeds, events := *randomSeeds, *randomEvents
	if testing.Short() {
		seeds = 30
	}
	for _, async := range []bool{false, true} {
		for seed := 1; seed <= seeds; seed++ {
			if !runRandom(t, int64(seed), async, events) {
				return
			}
		}
	}
}

type randomRun struct {
	*harness
	rng    *rand.Rand
	async  bool
	script []string
	nextID map[string]uint32
	live   []string
	dead   []string
	nsess  int
}

func runRandom(t *testing.T, seed int64, async bool, events int) bool {
	rng := rand.New(rand.NewSource(seed))
	cfg := Config{
		Capacity:      &Capacity{MaxLocks: 1 + rng.Int63n(5), MaxWaiters: 1 + rng.Int63n(8)},
		MaxKeyWaiters: 1 + rng.Intn(4),
	}
	mode := "sync"
	if async {
		mode = "async"
		if rng.Intn(2) == 0 {
			cfg.MaxPending = 1 + rng.Intn(4)
		}
		if rng.Intn(2) == 0 {
			cfg.MaxCommit = (1 + rng.Int63n(3)) * secondNs / 2
		}
	}
	cfg.EarlyRelease = rng.Intn(3) == 0
	if rng.Intn(2) == 0 {
		cfg.TokenWait = (1 + rng.Int63n(4)) * secondNs / 2
	}
	r := &randomRun{harness: newHarness(cfg, async), rng: rng, async: async, nextID: map[string]uint32{}}
	conf := fmt.Sprintf("config log=%s max-locks=%d max-waiters=%d max-key-waiters=%d max-pending=%d max-commit=%s",
		mode, cfg.Capacity.MaxLocks, cfg.Capacity.MaxWaiters, cfg.MaxKeyWaiters, cfg.MaxPending, fmtTime(cfg.MaxCommit))
	if cfg.EarlyRelease {
		conf += " early-release"
	}
	if cfg.TokenWait > 0 {
		conf += " token-wait=" + fmtTime(cfg.TokenWait)
	}
	r.script = append(r.script, conf)
	fail := func(what string) bool {
		n := len(r.script)
		from := max(0, n-80)
		t.Errorf("seed %d, %s log, %s:\n%s\nlast events (of %d; first: %s):\n%s", seed, mode, what,
			strings.Join(r.errs, "\n"), n, r.script[0], strings.Join(r.script[from:], "\n"))
		return false
	}
	for range events {
		r.step()
		if len(r.errs) > 0 {
			return fail("an invariant broke")
		}
	}
	// Drain: every token waiter is decided again, everything in flight
	// applies, and time runs past every wait and lease.
	for range 20 {
		r.do("tokens-ready t=%s", fmtTime(r.now))
		r.tokensReady()
		r.applyAll()
		r.advance(300 * secondNs)
		r.do("tick")
		r.tick()
		r.applyAll()
		if len(r.errs) > 0 {
			return fail("an invariant broke while draining")
		}
		if len(r.log.flight) == 0 && len(r.core.waits) == 0 && r.core.Len() == 0 && r.core.TokenWaiters() == 0 {
			break
		}
	}
	if o := r.open(); len(o) > 0 {
		r.errorf("requests never answered: %s", strings.Join(o, " "))
		return fail("drained")
	}
	if r.core.Len() != 0 || len(r.log.held) != 0 || r.core.Pending() != 0 {
		r.errorf("drained: Len %d, Machine %d holdings, Pending %d", r.core.Len(), len(r.log.held), r.core.Pending())
		return fail("drained")
	}
	return true
}

func (r *randomRun) do(line string, args ...any) {
	r.script = append(r.script, fmt.Sprintf(line, args...))
}

func (r *randomRun) advance(d int64) {
	r.now += d
}

func (r *randomRun) session() string {
	if len(r.live) < 2 || r.rng.Intn(40) == 0 {
		r.nsess++
		r.live = append(r.live, fmt.Sprintf("S%d", r.nsess))
	}
	return r.live[r.rng.Intn(len(r.live))]
}

func (r *randomRun) reqID(s string) uint32 {
	r.nextID[s]++
	return r.nextID[s]
}

var randomKeys = []string{"a", "b", "c", "d"}

func (r *randomRun) step() {
	r.advance(r.rng.Int63n(300) * msNs)
	t := fmtTime(r.now)
	switch n := r.rng.Intn(100); {
	case n < 30:
		s := r.session()
		id := r.reqID(s)
		key := randomKeys[r.rng.Intn(len(randomKeys))]
		owner := fmt.Sprintf("o%d", r.rng.Intn(6))
		lease := uint8(1 + r.rng.Intn(4))
		wait := uint8(r.rng.Intn(5))
		owned := r.rng.Intn(5) == 0
		r.do("acquire t=%s s=%s req=%d key=%s owner=%s lease=%d wait=%d%s", t, s, id, key, owner, lease, wait, flagIf(owned, " owned-only"))
		r.acquire(s, id, key, ownerOfString(owner), lease, wait, owned, r.now)
	case n < 50 && r.rng.Intn(3) == 0:
		// An EXTEND: mostly by the holder, sometimes with a wrong token
		// or owner.
		s := r.session()
		id := r.reqID(s)
		key := randomKeys[r.rng.Intn(len(randomKeys))]
		token, owner := uint64(r.rng.Int63n(int64(r.log.last)+2)), ownerOfString(fmt.Sprintf("o%d", r.rng.Intn(6)))
		if x, ok := r.log.held[key]; ok && r.rng.Intn(4) > 0 {
			token, owner = x.token, x.owner
		}
		lease := uint8(1 + r.rng.Intn(4))
		r.do("extend t=%s s=%s req=%d key=%s token=%d owner=%s lease=%d", t, s, id, key, token, ownerString(owner), lease)
		r.extend(s, id, key, token, owner, lease)
	case n < 50 && r.rng.Intn(6) == 0:
		// An operator's expire now: mostly of the holding's token.
		id := r.reqID("admin")
		key := randomKeys[r.rng.Intn(len(randomKeys))]
		token := uint64(r.rng.Int63n(int64(r.log.last) + 2))
		if x, ok := r.log.held[key]; ok && r.rng.Intn(3) > 0 {
			token = x.token
		}
		r.do("expire t=%s s=admin req=%d key=%s token=%d", t, id, key, token)
		r.expire("admin", id, key, token)
	case n < 50:
		s := r.session()
		id := r.reqID(s)
		key := randomKeys[r.rng.Intn(len(randomKeys))]
		var token uint64
		var owner Owner
		if x, ok := r.log.held[key]; ok && r.rng.Intn(3) > 0 {
			token, owner = x.token, x.owner
		} else {
			token = uint64(r.rng.Int63n(int64(r.log.last) + 2))
		}
		if r.rng.Intn(4) == 0 {
			owner = ownerOfString(fmt.Sprintf("o%d", r.rng.Intn(6)))
		}
		owned := r.rng.Intn(2) == 0
		r.do("release t=%s s=%s req=%d key=%s token=%d owner=%s%s", t, s, id, key, token, ownerString(owner), flagIf(owned, " owned"))
		r.release(s, id, key, token, owner, owned)
	case n < 56:
		if k, ok := r.pick(func(q *request) bool { return q.w != nil && q.state == reqOpen }); ok {
			r.do("cancel t=%s s=%s req=%d", t, k.s, k.id)
			r.cancel(k.s, k.id)
		}
	case n < 58:
		// A session closes: the driver drops its waiters at once or later.
		if len(r.live) > 0 {
			i := r.rng.Intn(len(r.live))
			s := r.live[i]
			r.live = append(r.live[:i], r.live[i+1:]...)
			r.do("kill s=%s", s)
			r.kill(s)
			r.dead = append(r.dead, s)
		}
	case n < 61:
		if len(r.dead) > 0 {
			s := r.dead[0]
			r.dead = r.dead[1:]
			for _, k := range r.keysOf(s) {
				if q := r.reqs[k]; q.w != nil && (q.state == reqOpen || q.state == reqAbandoned) {
					r.do("drop s=%s req=%d", k.s, k.id)
					r.drop(k.s, k.id)
				}
			}
		}
	case n < 76:
		r.advance(r.rng.Int63n(1500) * msNs)
		r.do("tick t=%s", fmtTime(r.now))
		r.tick()
	case n < 93:
		if r.async {
			k := 1 + r.rng.Intn(3)
			r.do("apply t=%s n=%d", t, k)
			r.apply(k)
		} else {
			r.tokensReadySome()
		}
	case n < 96:
		mode := []string{"retry", "fatal", "exhausted"}[r.rng.Intn(3)]
		r.do("nexttoken-fails %s", mode)
		if err := r.log.failNext(mode); err != nil {
			r.errorf("%v", err)
		}
	case n < 97:
		// A failover: this Core is deposed, the log applies what it had
		// (outcomes ignored), the sessions close, and it is promoted again
		// with the Machine's holdings.
		r.do("demote")
		r.demote()
		r.applyAll()
		for _, s := range r.live {
			r.do("kill s=%s", s)
			r.kill(s)
		}
		r.live = nil
		margin := r.rng.Int63n(2000) * msNs
		r.do("promote t=%s margin=%s", t, fmtTime(margin))
		r.promote(nil, margin)
	default:
		r.tokensReadySome()
	}
}

func flagIf(b bool, s string) string {
	if b {
		return s
	}
	return ""
}

func (r *randomRun) applyAll() {
	if r.async && len(r.log.flight) > 0 {
		r.do("apply t=%s n=all", fmtTime(r.now))
		r.apply(-1)
	}
}

// keysOf returns s's requests, sorted (map order is random: the script
// must not be).
func (r *randomRun) keysOf(s string) []reqKey {
	var ks []reqKey
	for k := range r.reqs {
		if k.s == s {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].id < ks[j].id })
	return ks
}

func (r *randomRun) sortedKeys(f func(*request) bool) []reqKey {
	var ks []reqKey
	for k, q := range r.reqs {
		if f(q) {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].s != ks[j].s {
			return ks[i].s < ks[j].s
		}
		return ks[i].id < ks[j].id
	})
	return ks
}

func (r *randomRun) pick(f func(*request) bool) (reqKey, bool) {
	ks := r.sortedKeys(f)
	if len(ks) == 0 {
		return reqKey{}, false
	}
	return ks[r.rng.Intn(len(ks))], true
}

// tokensReadySome ends the token store's reservation now and then, as a
// store does once its write is done.
func (r *randomRun) tokensReadySome() {
	if r.rng.Intn(2) == 0 {
		r.do("tokens-ready t=%s", fmtTime(r.now))
		r.tokensReady()
	}
}
