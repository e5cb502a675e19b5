package server

import (
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// waitBounds are the upper bounds of the grant-wait histogram buckets, in
// seconds; the last is the longest wait an ACQUIRE may ask for.
var waitBounds = [...]float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, wire.MaxWaitS}

// counters are plain atomics on the hot path (Stats reads them too); the
// Prometheus counter and gauge funcs read them at scrape time. The grant-wait
// histogram and the per-code protocol errors are client_golang's own types:
// Histogram.Observe is a handful of atomic adds, and a protocol error closes
// the session, so it is no hot path.
type counters struct {
	grants, timeouts, busy, released, notHeld, expired, overflows, kept atomic.Uint64

	// Sessions and resources.
	idleTimeouts, pendingRefused, peerLimited  atomic.Uint64
	authFailures, authThrottled, logSuppressed atomic.Uint64

	protoErrs       atomic.Uint64          // E frames sent for violations and internal errors (not E(5))
	protoErrsByCode *prometheus.CounterVec // the same, by code
	protoCodesMu    sync.Mutex             // guards protoCodes
	protoCodes      map[uint16]uint64      // the same, by code, for Stats
	wait            prometheus.Histogram   // ACQUIRE read to grant

	tokenUnavailable atomic.Uint64 // ACQUIREs answered B for want of a token
	cancelled        atomic.Uint64 // ACQUIREs answered T because of a CANCEL (also in timeouts)
	noTokenLog       logLimit      // the "no fencing token" lines, at most one a second
}

func (m *counters) init() {
	m.protoErrsByCode = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "ticketing",
		Name:      "protocol_errors_total",
		Help:      "E frames sent for protocol violations and internal errors, by code.",
	}, []string{"code"})
	// The codes the codec defines are exposed from the start, at 0; any
	// other code appears under its own number once sent.
	for code := wire.CodeMalformed; code <= wire.CodeTooManySession; code++ {
		if code != wire.CodeShuttingDown {
			m.protoErrsByCode.WithLabelValues(strconv.Itoa(int(code)))
		}
	}
	m.wait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "ticketing",
		Name:      "grant_wait_seconds",
		Help:      "Time from reading an ACQUIRE to granting it.",
		Buckets:   waitBounds[:],
	})
}

func (m *counters) granted(waitedNs int64) {
	m.grants.Add(1)
	m.wait.Observe(float64(max(waitedNs, 0)) / 1e9)
}

// protoError counts an E(code) sent for a protocol violation or an internal
// error. E(5), shutting down, is not the peer's error and is not counted.
func (m *counters) protoError(code uint16) {
	if code == wire.CodeShuttingDown {
		return
	}
	m.protoErrs.Add(1)
	m.protoErrsByCode.WithLabelValues(strconv.Itoa(int(code))).Inc()
	m.protoCodesMu.Lock()
	if m.protoCodes == nil {
		m.protoCodes = make(map[uint16]uint64)
	}
	m.protoCodes[code]++
	m.protoCodesMu.Unlock()
}

// protoErrorsByCode returns a copy of the protocol error counts by code;
// nil if none was sent.
func (m *counters) protoErrorsByCode() map[uint16]uint64 {
	m.protoCodesMu.Lock()
	defer m.protoCodesMu.Unlock()
	if len(m.protoCodes) == 0 {
		return nil
	}
	out := make(map[uint16]uint64, len(m.protoCodes))
	for c, n := range m.protoCodes {
		out[c] = n
	}
	return out
}

// collectors returns the server's Prometheus collectors: counter and gauge
// funcs over its atomics, the grant-wait histogram and the protocol errors.
func (s *Server) collectors() []prometheus.Collector {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "ticketing", Name: name, Help: help}, f)
	}
	counter := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ticketing", Name: name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	m := &s.m
	cs := []prometheus.Collector{
		gauge("sessions", "Open sessions (HELLO completed).", func() float64 { return float64(s.sessions.Load()) }),
		gauge("held_locks", "Granted, unexpired locks.", func() float64 { return float64(s.mode.counts().held) }),
		gauge("waiters", "ACQUIREs waiting in a queue.", func() float64 { return float64(s.capacity.Waiters.Load()) }),
		gauge("token_last", "Highest fencing token handed out.", func() float64 { return float64(s.mode.counts().last) }),
		gauge("token_ceiling", "Durable token ceiling.", func() float64 { return float64(s.mode.counts().ceiling) }),
		counter("grants_total", "Grants with a new token.", &m.grants),
		counter("timeouts_total", "ACQUIREs answered T.", &m.timeouts),
		counter("busy_total", "ACQUIREs answered B (a capacity limit, or no fencing token in time).", &m.busy),
		counter("released_total", "RELEASEs answered R.", &m.released),
		counter("kept_total", "EXTENDs answered K (protocol version 3).", &m.kept),
		counter("not_held_total", "RELEASEs and EXTENDs answered N.", &m.notHeld),
		counter("expired_total", "Leases that ran out before a release.", &m.expired),
		counter("output_overflows_total", "Sessions dropped because their peer did not read.", &m.overflows),
		m.protoErrsByCode,
		m.wait,

		gauge("pending_conns", "Connections that have not completed HELLO.", func() float64 { return float64(s.pendingConns()) }),
		counter("idle_timeouts_total", "Sessions dropped for sending no frame within the idle timeout while awaiting no reply.", &m.idleTimeouts),
		counter("pending_refused_total", "Connections closed at accept: too many connections before HELLO.", &m.pendingRefused),
		gauge("conn_budget", "The connections the server's listeners may hold open at once (the open-file limit minus the descriptors kept for files); 0: no cap.", func() float64 { n, _ := s.budget.Max(); return float64(n) }),
		gauge("conn_budget_in_use", "Connections holding a unit of the connection budget, over every listener.", func() float64 { return float64(s.budget.InUse()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ticketing", Name: "conn_budget_refused_total",
			Help: "Connections closed at accept, on any listener, because the connection budget was spent."},
			func() float64 { return float64(s.budget.Refused()) }),
		counter("peer_session_limit_total", "HELLOs refused with E(7) by the per-peer session limit.", &m.peerLimited),
		counter("auth_failures_total", "HELLOs with a wrong client token.", &m.authFailures),
		counter("auth_throttled_total", "HELLOs with a wrong client token closed without a reply (too many recent failures from the address).", &m.authThrottled),
		counter("log_suppressed_total", "Log lines about peers left out by the rate limit (summed up in one line per interval).", &m.logSuppressed),

		counter("token_unavailable_total", "ACQUIREs answered B because no fencing token could be reserved in time (stalled disk, exhausted token space).", &m.tokenUnavailable),
		counter("cancelled_total", "Waiting ACQUIREs removed by a CANCEL (version 2) and answered T (included in timeouts_total).", &m.cancelled),
		gauge("role", "The node's role: 0 standby (not serving), 1 standalone, 2 active of a pair, 3 cluster leader.", func() float64 { return float64(s.role.Load().role) }),
		gauge("token_store_ok", "1 while the token store can reserve tokens, 0 while its last reservation failed, one has been running for over a second, or the token space is exhausted.", func() float64 {
			if s.TokenStoreErr() != nil {
				return 0
			}
			return 1
		}),
	}
	return append(cs, s.mode.collectors()...)
}

// register registers the server's collectors on reg; on an error it
// unregisters those it registered and returns the error.
func (s *Server) register(reg prometheus.Registerer) error {
	cs := s.collectors()
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, r := range cs[:i] {
				reg.Unregister(r)
			}
			return err
		}
	}
	s.registered = cs
	return nil
}

// unregister undoes register, so that a new Server can register on the same
// registry (a restart in the same process).
func (s *Server) unregister(reg prometheus.Registerer) {
	for _, c := range s.registered {
		reg.Unregister(c)
	}
	s.registered = nil
}

// TokenStoreErr returns nil while the durable token store can reserve
// tokens, and otherwise why not: the last reservation failed (its error),
// one has been running for over a second (a stalled disk), or the token
// space is exhausted (ErrTokensExhausted). While it is non-nil, ACQUIREs
// that need a new token may get B or E(6); ticketingd's /healthz answers 503.
// In Raft mode it is non-nil once the node's raft has shut down (a leader
// that removed itself, or a store failure), while the node's Raft log
// cannot be written (its last append failed, e.g. its disk is full: raft
// keeps such a node running, behind its leader, until an append
// succeeds), or once the cluster's configuration no longer lists the node
// (removed); a node waiting to be added is healthy.
func (s *Server) TokenStoreErr() error { return s.mode.health() }

// logLimit lets a counted event be logged at most once per second, with
// the count since the last line: Server.noToken and the cluster leader's
// slow grants and proposal limits.
type logLimit struct {
	at     atomic.Int64  // server clock + 1 of the last line; 0: none
	logged atomic.Uint64 // the count at that line
}

// due reports whether the event counted n at now (server clock) is
// logged, and if so how many were counted since the last line.
func (l *logLimit) due(now int64, n uint64) (since uint64, ok bool) {
	now++ // 0 means never logged
	last := l.at.Load()
	if (last == 0 || now-last >= secondNs) && l.at.CompareAndSwap(last, now) {
		return n - l.logged.Swap(n), true
	}
	return 0, false
}
