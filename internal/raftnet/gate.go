package raftnet

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// gate admits inbound connections to a TLS handshake. Connections from a
// member's IP take one of that IP's own perMember slots first; every other
// connection (and a member's beyond its own slots) takes one of the
// maxShared slots shared by all sources, of which one source (an IPv4
// address or an IPv6 /64) holds at most perSource. A stranger who fills the
// shared slots from many addresses therefore never takes a member's.
type gate struct {
	maxShared, perSource, perMember int

	members atomic.Pointer[map[netip.Addr]struct{}]

	mu       sync.Mutex
	shared   int
	bySource map[netip.Prefix]int // shared slots in use per source
	byMember map[netip.Addr]int   // member slots in use per member IP
}

func newGate(maxShared, perSource, perMember int) *gate {
	return &gate{maxShared: maxShared, perSource: perSource, perMember: perMember,
		bySource: make(map[netip.Prefix]int), byMember: make(map[netip.Addr]int)}
}

// setMembers replaces the set of member IPs. Handshakes in progress keep the
// slots they hold.
func (g *gate) setMembers(ips map[netip.Addr]struct{}) { g.members.Store(&ips) }

// isMember reports whether ip is a member's.
func (g *gate) isMember(ip netip.Addr) bool {
	m := g.members.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[ip]
	return ok
}

// refusal says why the gate refused a connection.
type refusal int

const (
	admitted      refusal = iota
	sharedFull            // every shared slot is taken
	sourceFull            // the source holds perSource shared slots
	memberAllFull         // a member's own slots and the shared ones it may use are taken
)

// ticket is an admitted connection's slot, for leave.
type ticket struct {
	member bool         // a member slot of ip, else a shared slot of src
	ip     netip.Addr   // the source IP
	src    netip.Prefix // the source's key for shared slots
}

// enter takes a slot for a connection from ip, or says why there is none.
func (g *gate) enter(ip netip.Addr) (ticket, refusal) {
	member := g.isMember(ip)
	t := ticket{ip: ip, src: sourceKey(ip)}
	g.mu.Lock()
	defer g.mu.Unlock()
	if member && g.byMember[ip] < g.perMember {
		g.byMember[ip]++
		t.member = true
		return t, admitted
	}
	var why refusal
	switch {
	case g.bySource[t.src] >= g.perSource:
		why = sourceFull
	case g.shared >= g.maxShared:
		why = sharedFull
	default:
		g.shared++
		g.bySource[t.src]++
		return t, admitted
	}
	if member {
		why = memberAllFull
	}
	return t, why
}

// leave frees the slot of t.
func (g *gate) leave(t ticket) {
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

// sourceKey is the unit of the per-source limit: an IPv4 address, or the
// /64 of an IPv6 address (one host usually has a whole /64 to choose from).
func sourceKey(ip netip.Addr) netip.Prefix {
	if ip.Is4() {
		return netip.PrefixFrom(ip, 32)
	}
	p, _ := ip.Prefix(64) // the zero Prefix for the zero Addr
	return p
}

// remoteIP is the IP of a connection's remote address (IPv4-mapped IPv6
// addresses as IPv4), or the zero Addr if it has none.
func remoteIP(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}
