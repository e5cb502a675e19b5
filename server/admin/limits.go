package admin

import (
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
)

// Defaults of ConnLimits.
const (
	// DefaultMaxConns is ConnLimits.MaxConns's default.
	DefaultMaxConns = 128
	// DefaultMaxConnsPerSource is ConnLimits.MaxConnsPerSource's default.
	DefaultMaxConnsPerSource = 16
	// DefaultLoopbackConns is ConnLimits.LoopbackConns's default.
	DefaultLoopbackConns = 16
)

// ConnLimits bound the connections an admin listener holds open
// (LimitListener). The zero value is the defaults.
type ConnLimits struct {
	// MaxConns caps the open connections from addresses other than
	// 127.0.0.1 and ::1 (and from those beyond their own LoopbackConns).
	// A connection beyond it is closed at once, unanswered. Zero means
	// DefaultMaxConns.
	MaxConns int

	// MaxConnsPerSource caps the connections of MaxConns from one source:
	// one IPv4 address, or one IPv6 /64. Zero means
	// DefaultMaxConnsPerSource.
	MaxConnsPerSource int

	// LoopbackConns are the connections that 127.0.0.1 and ::1 each may
	// hold besides MaxConns, so that a local probe or scrape is answered
	// while strangers fill the rest. Zero means DefaultLoopbackConns.
	LoopbackConns int

	// Logger gets a Warn line for refused connections, at most one a
	// second with the count of those suppressed; nil: discard.
	Logger *slog.Logger
}

// LimitListener returns ln limited by l: every connection holds a slot
// until it closes, and one for which there is none is closed at once
// (connections are counted before any request is read, so an
// unauthenticated client holds a slot too). With net/http's
// ReadHeaderTimeout, IdleTimeout and ReadTimeout, which free the slots of
// clients that send nothing or trickle, this bounds the file descriptors
// the admin port can take from the lock port, the token store and a
// cluster node's Raft log.
func LimitListener(ln net.Listener, l ConnLimits) net.Listener {
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxConnsPerSource <= 0 {
		l.MaxConnsPerSource = DefaultMaxConnsPerSource
	}
	if l.LoopbackConns <= 0 {
		l.LoopbackConns = DefaultLoopbackConns
	}
	log := l.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := connlimit.NewGate(l.MaxConns, min(l.MaxConnsPerSource, l.MaxConns), l.LoopbackConns)
	g.SetMembers(map[netip.Addr]struct{}{
		netip.MustParseAddr("127.0.0.1"): {},
		netip.IPv6Loopback():             {},
	})
	lim := connlimit.NewLimiter(time.Second)
	return connlimit.NewListener(ln, g, func(c net.Conn, why connlimit.Refusal) {
		lim.Do(func(suppressed int) {
			what := "too many admin connections"
			if why == connlimit.SourceFull {
				what = "too many admin connections from this source"
			}
			log.Warn("admin: connection refused: "+what,
				"remote", c.RemoteAddr().String(), "max_conns", l.MaxConns, "max_conns_per_source", l.MaxConnsPerSource,
				"loopback_conns", l.LoopbackConns, "suppressed", suppressed)
		})
	})
}
