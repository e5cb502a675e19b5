package server

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// peerOf returns the address a peer is counted under for the per-peer
// limits: its IPv4 address, or the /64 prefix of its IPv6 address (a host
// usually has a whole /64). Connections without an IP address (a pipe in a
// test) all share the zero Addr.
func peerOf(a net.Addr) netip.Addr {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip = a.AddrPort().Addr()
	default:
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			ip = ap.Addr()
		}
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			ip = p.Addr()
		}
	}
	return ip
}

// peerCounts counts connections per peer address: the open sessions (for
// Config.MaxSessionsPerPeer; at most MaxSessions entries) or the
// connections before HELLO (at most MaxPendingConns entries).
type peerCounts struct {
	mu sync.Mutex
	n  map[netip.Addr]int
}

// add counts a new session of p unless p already has max.
func (ps *peerCounts) add(p netip.Addr, max int) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	n := ps.n[p]
	if n >= max {
		return false
	}
	ps.n[p] = n + 1
	return true
}

func (ps *peerCounts) remove(p netip.Addr) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if n := ps.n[p]; n > 1 {
		ps.n[p] = n - 1
	} else {
		delete(ps.n, p)
	}
}

// Log rate limiting: lines caused by peers (protocol violations, refused
// connections, dropped sessions) are logged in full only for the first one
// of each peer in an interval, and for at most logBurst peers; the rest are
// counted per peer and summed up in one line at the end of the interval.
const (
	logInterval    = 10 * time.Second
	logBurst       = 20  // full lines per interval, over all peers
	logPeers       = 256 // peers counted one by one in a summary; the rest as "other"
	logTopPeers    = 10  // peers named in the summary line
	authFree       = 20  // recent failures of a peer answered without delay
	authBase       = 10 * time.Millisecond
	authMaxDelay   = 500 * time.Millisecond
	authMaxQueue   = time.Second // the longest wait for an E(3)
	authMaxWaiting = 16          // E(3)s of one peer waiting authMaxQueue outside the queue
	authHalfLife   = 10 * time.Second
	authMaxPeers   = 4096
)

type logLimiter struct {
	mu         sync.Mutex
	lines      int
	logged     map[netip.Addr]struct{} // at most logBurst entries
	suppressed map[netip.Addr]int      // at most logPeers entries
	other      int                     // suppressed lines of peers beyond logPeers
	total      int
}

// allow reports whether a line about peer p may be logged in full now; if
// not, the line is counted for the interval's summary.
func (l *logLimiter) allow(p netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, seen := l.logged[p]; !seen && l.lines < logBurst {
		if l.logged == nil {
			l.logged = make(map[netip.Addr]struct{})
		}
		l.logged[p] = struct{}{}
		l.lines++
		return true
	}
	l.total++
	if l.suppressed == nil {
		l.suppressed = make(map[netip.Addr]int)
	}
	if n, ok := l.suppressed[p]; ok || len(l.suppressed) < logPeers {
		l.suppressed[p] = n + 1
	} else {
		l.other++
	}
	return false
}

// flush logs the summary of the lines suppressed since the last flush, if
// any, and starts a new interval. It returns the number of lines suppressed.
func (l *logLimiter) flush(log *slog.Logger, interval time.Duration) int {
	l.mu.Lock()
	total, other := l.total, l.other
	type pc struct {
		p netip.Addr
		n int
	}
	var top []pc
	for p, n := range l.suppressed {
		top = append(top, pc{p, n})
	}
	l.lines, l.total, l.other = 0, 0, 0
	clear(l.logged)
	clear(l.suppressed)
	l.mu.Unlock()
	if total == 0 {
		return 0
	}
	slices.SortFunc(top, func(a, b pc) int {
		if c := cmp.Compare(b.n, a.n); c != 0 {
			return c
		}
		return a.p.Compare(b.p)
	})
	var sb strings.Builder
	for i, e := range top {
		if i == logTopPeers {
			break
		}
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%s=%d", e.p, e.n)
	}
	log.Warn("log lines about peers suppressed (rate limit)", "interval", interval.String(), "suppressed", total,
		"peers", len(top), "top_peers", sb.String(), "other_peers_lines", other)
	return total
}

// authThrottle slows down peers that keep failing client authentication:
// the first authFree recent failures of a peer are answered at once, then
// each E(3) waits authBase doubling per further failure, at most
// authMaxDelay, and the answers to one peer are serialised, so a peer
// gets at most about one E(3) per authMaxDelay from that queue however
// many connections it opens. A failure that would wait more than
// authMaxQueue in the queue waits authMaxQueue outside it, for at most
// authMaxWaiting connections of the peer at a time; beyond those it is
// closed without an answer (a misconfigured client, which has a few
// connections, always gets its E(3); a flood gets about
// 1/authMaxDelay + authMaxWaiting/authMaxQueue per second). "Recent" decays
// with a half-life of authHalfLife. Successful HELLOs are never delayed, and
// other peers' failures are not affected. The table holds at most
// authMaxPeers peers; beyond that the peers not in it share one entry.
type authThrottle struct {
	mu        sync.Mutex
	peers     map[netip.Addr]*authPeer
	lastPrune time.Time
}

type authPeer struct {
	score   float64   // failures, decayed
	last    time.Time // of the last failure
	next    time.Time // the earliest time of this peer's next E(3)
	waiting int       // connections waiting authMaxQueue outside the queue
}

var overflowPeer = netip.AddrFrom4([4]byte{255, 255, 255, 255})

func (a *authPeer) decayed(now time.Time) float64 {
	return a.score * math.Exp2(-float64(now.Sub(a.last))/float64(authHalfLife))
}

// failure records a failed HELLO of p at now. It returns how long to wait
// before answering E(3), or ok false if the connection is to be closed
// without an answer. A non-nil held must be passed to done once the wait is
// over.
func (t *authThrottle) failure(p netip.Addr, now time.Time) (wait time.Duration, held *authPeer, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.peers == nil {
		t.peers = make(map[netip.Addr]*authPeer)
	}
	e := t.peers[p]
	if e == nil {
		if len(t.peers) >= authMaxPeers && now.Sub(t.lastPrune) >= time.Second {
			t.pruneLocked(now)
		}
		if len(t.peers) >= authMaxPeers {
			p = overflowPeer
			e = t.peers[p]
		}
		if e == nil {
			e = &authPeer{}
			t.peers[p] = e
		}
	}
	e.score = e.decayed(now) + 1
	e.last = now
	var d time.Duration
	if x := e.score - authFree; x > 0 {
		d = time.Duration(min(float64(authBase)*math.Exp2(x), float64(authMaxDelay)))
	}
	at := now
	if e.next.After(at) {
		at = e.next
	}
	at = at.Add(d)
	if at.Sub(now) > authMaxQueue {
		if e.waiting >= authMaxWaiting {
			return 0, nil, false
		}
		e.waiting++
		return authMaxQueue, e, true
	}
	e.next = at
	return at.Sub(now), nil, true
}

// done ends a wait outside the queue.
func (t *authThrottle) done(e *authPeer) {
	t.mu.Lock()
	e.waiting--
	t.mu.Unlock()
}

// prune drops the peers whose failures are no longer recent.
func (t *authThrottle) prune(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked(now)
}

func (t *authThrottle) pruneLocked(now time.Time) {
	t.lastPrune = now
	for p, e := range t.peers {
		if e.decayed(now) < 0.5 && !e.next.After(now) && e.waiting == 0 {
			delete(t.peers, p)
		}
	}
}
