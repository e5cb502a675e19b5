package connlimit

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Budget is a process's count of the file descriptors its accepted
// connections hold, over every listener: each connection takes a unit
// when it is accepted and gives it back when it is closed, and one for
// which there is no unit is closed at once. Sized at the open-file limit
// minus what the process's files, listeners and outbound connections need,
// it keeps a flood of connections, on whichever port, from taking the
// descriptors the token store and the Raft log open when they write.
//
// The last preferred units go only to connections from preferred sources
// (loopback on the admin port, the members on the peer ports), so that a
// stranger who fills the rest leaves a local health probe and the peers
// their descriptors. A nil *Budget admits everything. It is safe for
// concurrent use.
type Budget struct {
	max, preferred int64
	used           atomic.Int64
	refused        atomic.Uint64
	lim            *Limiter
	warn           func(listener string, remote net.Addr, suppressed int)
}

// NewBudget returns a budget of total units, the last preferred of them
// (at most total) for preferred sources only. warn, if not nil, is called for
// refused connections, at most once a second, with the number of those
// suppressed since the last call (see Limiter).
func NewBudget(total, preferred int, warn func(listener string, remote net.Addr, suppressed int)) *Budget {
	return &Budget{max: int64(total), preferred: int64(min(max(preferred, 0), total)),
		lim: NewLimiter(time.Second), warn: warn}
}

// Take takes a unit for a connection, from the preferred ones too if
// preferred, and reports whether there was one; a false Take counts as a
// refusal (Refused).
func (b *Budget) Take(preferred bool) bool {
	if b == nil {
		return true
	}
	limit := b.max
	if !preferred {
		limit -= b.preferred
	}
	for {
		n := b.used.Load()
		if n >= limit {
			b.refused.Add(1)
			return false
		}
		if b.used.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Give gives back a unit Take took.
func (b *Budget) Give() {
	if b != nil {
		b.used.Add(-1)
	}
}

// Max returns the budget's size and its preferred units; 0, 0 for nil.
func (b *Budget) Max() (total, preferred int) {
	if b == nil {
		return 0, 0
	}
	return int(b.max), int(b.preferred)
}

// InUse returns the units taken.
func (b *Budget) InUse() int {
	if b == nil {
		return 0
	}
	return int(b.used.Load())
}

// Refused returns the number of connections refused so far.
func (b *Budget) Refused() uint64 {
	if b == nil {
		return 0
	}
	return b.refused.Load()
}

// Listener returns ln, whose connections each take a unit of b until they
// are closed: a connection for which there is none is closed at once and
// Accept waits for the next one. preferred, if not nil, says which source
// IPs may take the preferred units. name names the listener in the warning
// about refused connections. A nil b returns ln itself.
func (b *Budget) Listener(ln net.Listener, name string, preferred func(netip.Addr) bool) net.Listener {
	if b == nil {
		return ln
	}
	return &budgetListener{Listener: ln, b: b, name: name, preferred: preferred}
}

type budgetListener struct {
	net.Listener
	b         *Budget
	name      string
	preferred func(netip.Addr) bool
}

func (l *budgetListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		pref := l.preferred != nil && l.preferred(RemoteIP(c))
		if !l.b.Take(pref) {
			if l.b.warn != nil {
				l.b.lim.Do(func(suppressed int) { l.b.warn(l.name, c.RemoteAddr(), suppressed) })
			}
			_ = c.Close()
			continue
		}
		return &budgetConn{Conn: c, b: l.b}, nil
	}
}

// budgetConn gives its unit back when it is closed (once).
type budgetConn struct {
	net.Conn
	b    *Budget
	once sync.Once
}

func (c *budgetConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.b.Give)
	return err
}

// CloseWrite half-closes the connection if it can (net/http uses it to
// let a client read an error answer before the connection closes).
func (c *budgetConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// NetConn returns the accepted connection itself (to set its socket
// options).
func (c *budgetConn) NetConn() net.Conn { return c.Conn }

// NetConnOf returns the connection under the wrappers of this package
// (budget and gate), or c itself.
func NetConnOf(c net.Conn) net.Conn {
	for {
		switch w := c.(type) {
		case *budgetConn:
			c = w.Conn
		case *gatedConn:
			c = w.Conn
		default:
			return c
		}
	}
}

// IsLoopbackHost reports whether ip is 127.0.0.1 or ::1, the addresses a
// local probe connects from.
func IsLoopbackHost(ip netip.Addr) bool {
	return ip == netip.AddrFrom4([4]byte{127, 0, 0, 1}) || ip == netip.IPv6Loopback()
}

// LoopbackHostPort reports whether addr (host:port) names this machine
// only: a loopback IP, or localhost.
func LoopbackHostPort(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
