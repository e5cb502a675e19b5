package server

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// waitBoundsNs are the upper bounds of the grant-wait histogram buckets.
var waitBounds = [...]float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 255}

var waitBoundsNs = func() [len(waitBounds)]int64 {
	var ns [len(waitBounds)]int64
	for i, b := range waitBounds {
		ns[i] = int64(b * 1e9)
	}
	return ns
}()

// counters are plain atomics on the hot path; the Prometheus collector reads
// them at scrape time.
type counters struct {
	grants, timeouts, busy, released, notHeld, expired, overflows atomic.Uint64

	// Sessions and resources.
	idleTimeouts, pendingRefused, peerLimited  atomic.Uint64
	authFailures, authThrottled, logSuppressed atomic.Uint64
	protoErrs                                  [8]atomic.Uint64
	waitBuckets                                [len(waitBounds) + 1]atomic.Uint64 // last: +Inf
	waitSumNs                                  atomic.Uint64

	tokenUnavailable atomic.Uint64 // ACQUIREs answered B for want of a token
	cancelled        atomic.Uint64 // ACQUIREs answered T because of a CANCEL (also in timeouts)
	noTokenLogged    atomic.Uint64 // tokenUnavailable at the last log line
	noTokenLogAt     atomic.Int64  // server clock + 1 of the last log line; 0: none
}

func (m *counters) granted(waitedNs int64) {
	m.grants.Add(1)
	if waitedNs < 0 {
		waitedNs = 0
	}
	i := 0
	for i < len(waitBoundsNs) && waitedNs > waitBoundsNs[i] {
		i++
	}
	m.waitBuckets[i].Add(1)
	m.waitSumNs.Add(uint64(waitedNs))
}

type collector struct {
	s                                                  *Server
	sessions, held, waiters, lastToken, ceiling        *prometheus.Desc
	grants, timeouts, busy, released, notHeld, expired *prometheus.Desc
	overflows, protoErrs, wait                         *prometheus.Desc

	pending, idleTimeouts, pendingRefused, peerLimited *prometheus.Desc
	authFailures, authThrottled, logSuppressed         *prometheus.Desc
	tokenUnavailable, tokenStoreOK, cancelled          *prometheus.Desc
}

func newCollector(s *Server) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("ticketing_"+name, help, labels, nil)
	}
	return &collector{
		s:         s,
		sessions:  d("sessions", "Open sessions (HELLO completed)."),
		held:      d("held_locks", "Granted, unexpired locks."),
		waiters:   d("waiters", "ACQUIREs waiting in a queue."),
		lastToken: d("token_last", "Highest fencing token handed out."),
		ceiling:   d("token_ceiling", "Durable token ceiling."),
		grants:    d("grants_total", "Grants with a new token."),
		timeouts:  d("timeouts_total", "ACQUIREs answered T."),
		busy:      d("busy_total", "ACQUIREs answered B (a capacity limit, or no fencing token in time)."),
		released:  d("released_total", "RELEASEs answered R."),
		notHeld:   d("not_held_total", "RELEASEs answered N."),
		expired:   d("expired_total", "Leases that ran out before a release."),
		overflows: d("output_overflows_total", "Sessions dropped because their peer did not read."),
		protoErrs: d("protocol_errors_total", "E frames sent for protocol violations and internal errors, by code.", "code"),
		wait:      d("grant_wait_seconds", "Time from reading an ACQUIRE to granting it."),

		pending:        d("pending_conns", "Connections that have not completed HELLO."),
		idleTimeouts:   d("idle_timeouts_total", "Sessions dropped for sending no frame within the idle timeout while awaiting no reply."),
		pendingRefused: d("pending_refused_total", "Connections closed at accept: too many connections before HELLO."),
		peerLimited:    d("peer_session_limit_total", "HELLOs refused with E(7) by the per-peer session limit."),
		authFailures:   d("auth_failures_total", "HELLOs with a wrong client token."),
		authThrottled:  d("auth_throttled_total", "HELLOs with a wrong client token closed without a reply (too many recent failures from the address)."),
		logSuppressed:  d("log_suppressed_total", "Log lines about peers left out by the rate limit (summed up in one line per interval)."),

		tokenUnavailable: d("token_unavailable_total", "ACQUIREs answered B because no fencing token could be reserved in time (stalled disk, exhausted token space)."),
		cancelled:        d("cancelled_total", "Waiting ACQUIREs removed by a CANCEL (version 2) and answered T (included in timeouts_total)."),
		tokenStoreOK:     d("token_store_ok", "1 while the token store can reserve tokens, 0 while its last reservation failed, one has been running for over a second, or the token space is exhausted."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.sessions, c.held, c.waiters, c.lastToken, c.ceiling, c.grants, c.timeouts, c.busy, c.released, c.notHeld, c.expired, c.overflows, c.protoErrs, c.wait,
		c.pending, c.idleTimeouts, c.pendingRefused, c.peerLimited, c.authFailures, c.authThrottled, c.logSuppressed, c.tokenUnavailable, c.tokenStoreOK, c.cancelled} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	g := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	k := func(d *prometheus.Desc, v *atomic.Uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v.Load()))
	}
	g(c.sessions, float64(s.sessions.Load()))
	g(c.held, float64(s.held.Load()))
	g(c.waiters, float64(s.waiters.Load()))
	g(c.lastToken, float64(s.tokens.last.Load()))
	g(c.ceiling, float64(s.tokens.ceiling.Load()))
	k(c.grants, &s.m.grants)
	k(c.timeouts, &s.m.timeouts)
	k(c.busy, &s.m.busy)
	k(c.released, &s.m.released)
	k(c.notHeld, &s.m.notHeld)
	k(c.expired, &s.m.expired)
	k(c.overflows, &s.m.overflows)
	g(c.pending, float64(s.pending.Load()))
	k(c.idleTimeouts, &s.m.idleTimeouts)
	k(c.pendingRefused, &s.m.pendingRefused)
	k(c.peerLimited, &s.m.peerLimited)
	k(c.authFailures, &s.m.authFailures)
	k(c.authThrottled, &s.m.authThrottled)
	k(c.logSuppressed, &s.m.logSuppressed)
	k(c.tokenUnavailable, &s.m.tokenUnavailable)
	k(c.cancelled, &s.m.cancelled)
	ok := 1.0
	if s.TokenStoreErr() != nil {
		ok = 0
	}
	g(c.tokenStoreOK, ok)
	for code := 1; code <= 7; code++ {
		if code == 5 {
			continue // shutting down is not an error of the peer
		}
		ch <- prometheus.MustNewConstMetric(c.protoErrs, prometheus.CounterValue, float64(s.m.protoErrs[code].Load()), strconv.Itoa(code))
	}
	buckets := make(map[float64]uint64, len(waitBounds))
	var cum uint64
	for i, b := range waitBounds {
		cum += s.m.waitBuckets[i].Load()
		buckets[b] = cum
	}
	cum += s.m.waitBuckets[len(waitBounds)].Load()
	ch <- prometheus.MustNewConstHistogram(c.wait, cum, float64(s.m.waitSumNs.Load())/1e9, buckets)
}

// TokenStoreErr returns nil while the durable token store can reserve
// tokens, and otherwise why not: the last reservation failed (its error),
// one has been running for over a second (a stalled disk), or the token
// space is exhausted (ErrTokensExhausted). While it is non-nil, ACQUIREs
// that need a new token may get B or E(6); ticketingd's /healthz answers 503.
func (s *Server) TokenStoreErr() error {
	return s.tokens.health(tokenWait)
}
