// Package connlimit admits inbound connections before they are
// authenticated: a Gate of slots by source address, which the Raft peer
// transport, a pair's peer listener and the admin listener share, a
// Listener that applies a Gate to a net.Listener, a Watch that keeps a
// Gate's preferred addresses current from host names, and a Limiter for
// the log lines that strangers can provoke at will.
//
// A Gate hands out slots: connections from a member's IP (the cluster's
// other nodes, a pair's peer, loopback for the admin port) take one of that
// IP's own perMember slots first; every other connection (and a member's
// beyond its own slots) takes one of the maxShared slots shared by all
// sources, of which one source (an IPv4 address or an IPv6 /64) holds at
// most perSource. A stranger who fills the shared slots from many
// addresses therefore never takes a member's, and one who connects from a
// single address holds at most perSource. The caps bound the file
// descriptors connections before authentication can hold, which the token
// store, the Raft log and the lock port's sessions need too.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Gate admits connections by source address (see the package
// documentation). It is safe for concurrent use.
type Gate struct {
	maxShared, perSource, perMember int

	members atomic.Pointer[map[netip.Addr]struct{}]

	mu       sync.Mutex
	shared   int
	bySource map[netip.Prefix]int // shared slots in use per source
	byMember map[netip.Addr]int   // member slots in use per member IP
}

// NewGate returns a gate of maxShared shared slots, at most perSource of
// them per source, and perMember slots of its own for each member IP
// (SetMembers).
func NewGate(maxShared, perSource, perMember int) *Gate {
	return &Gate{maxShared: maxShared, perSource: perSource, perMember: perMember,
		bySource: make(map[netip.Prefix]int), byMember: make(map[netip.Addr]int)}
}

// Limits returns the gate's maxShared, perSource and perMember.
func (g *Gate) Limits() (maxShared, perSource, perMember int) {
	return g.maxShared, g.perSource, g.perMember
}

// SetMembers replaces the set of member IPs. Connections admitted keep the
// slots they hold.
func (g *Gate) SetMembers(ips map[netip.Addr]struct{}) { g.members.Store(&ips) }

// IsMember reports whether ip is a member's.
func (g *Gate) IsMember(ip netip.Addr) bool {
	m := g.members.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[ip]
	return ok
}

// Refusal says why the gate refused a connection.
type Refusal int

const (
	Admitted      Refusal = iota
	SharedFull            // every shared slot is taken
	SourceFull            // the source holds perSource shared slots
	MemberAllFull         // a member's own slots and the shared ones it may use are taken
)

// Ticket is an admitted connection's slot, for Leave.
type Ticket struct {
	member bool         // a member slot of ip, else a shared slot of src
	ip     netip.Addr   // the source IP
	src    netip.Prefix // the source's key for shared slots
}

// IP is the source IP the ticket was given to.
func (t Ticket) IP() netip.Addr { return t.ip }

// Enter takes a slot for a connection from ip, or says why there is none.
func (g *Gate) Enter(ip netip.Addr) (Ticket, Refusal) {
	member := g.IsMember(ip)
	t := Ticket{ip: ip, src: SourceKey(ip)}
	g.mu.Lock()
	defer g.mu.Unlock()
	if member && g.byMember[ip] < g.perMember {
		g.byMember[ip]++
		t.member = true
		return t, Admitted
	}
	var why Refusal
	switch {
	case g.bySource[t.src] >= g.perSource:
		why = SourceFull
	case g.shared >= g.maxShared:
		why = SharedFull
	default:
		g.shared++
		g.bySource[t.src]++
		return t, Admitted
	}
	if member {
		why = MemberAllFull
	}
	return t, why
}

// Leave frees the slot of t.
func (g *Gate) Leave(t Ticket) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.member {
		if g.byMember[t.ip]--; g.byMember[t.ip] <= 0 {
			delete(g.byMember, t.ip)
		}
		return
	}
	g.shared--
	if g.bySource[t.src]--; g.bySource[t.src] <= 0 {
		delete(g.bySource, t.src)
	}
}

// InUse returns the slots taken: shared, and members' own.
func (g *Gate) InUse() (shared, member int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range g.byMember {
		member += n
	}
	return g.shared, member
}

// SourceKey is the unit of the per-source limit: an IPv4 address, or the
// /64 of an IPv6 address (one host usually has a whole /64 to choose from).
func SourceKey(ip netip.Addr) netip.Prefix {
	if ip.Is4() {
		return netip.PrefixFrom(ip, 32)
	}
	p, _ := ip.Prefix(64) // the zero Prefix for the zero Addr
	return p
}

// RemoteIP is the IP of a connection's remote address (IPv4-mapped IPv6
// addresses as IPv4), or the zero Addr if it has none.
func RemoteIP(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
