package raftnet

import (
	"net/netip"
	"testing"
)

func TestGate(t *testing.T) {
	g := newGate(4, 2, 1)
	member := netip.MustParseAddr("10.0.0.1")
	g.setMembers(map[netip.Addr]struct{}{member: {}})
	enter := func(ip string) (ticket, refusal) { return g.enter(netip.MustParseAddr(ip)) }
	steps := []struct {
		name string
		ip   string
		want refusal
	}{
		{"stranger 1", "192.0.2.1", admitted},
		{"stranger 1 again", "192.0.2.1", admitted},
		{"stranger 1 beyond its share", "192.0.2.1", sourceFull},
		{"IPv6 stranger", "2001:db8:0:1::1", admitted},
		{"same IPv6 /64, another address", "2001:db8:0:1::2", admitted},
		{"that /64 beyond its share", "2001:db8:0:1:ffff::3", sourceFull},
		{"shared slots full", "192.0.2.2", sharedFull},
		{"member, its own slot", "10.0.0.1", admitted},
		{"member beyond its own slots, shared full", "10.0.0.1", memberAllFull},
	}
	var tickets []ticket
	for _, s := range steps {
		tk, got := enter(s.ip)
		if got != s.want {
			t.Fatalf("%s: refusal %d, want %d", s.name, got, s.want)
		}
		if got == admitted {
			tickets = append(tickets, tk)
		}
	}
	// A shared slot comes free: the member may take it, beyond its own.
	g.leave(tickets[0])
	if tk, got := enter("10.0.0.1"); got != admitted || tk.member {
		t.Fatalf("member with a shared slot free: refusal %d, member slot %v; want a shared slot", got, tk.member)
	} else {
		tickets = append(tickets, tk)
	}
	// No longer a member: no slot of its own, even one that is free.
	g.setMembers(nil)
	g.leave(tickets[4]) // the member slot of 10.0.0.1
	if _, got := enter("10.0.0.1"); got != sharedFull {
		t.Fatalf("former member: refusal %d, want sharedFull", got)
	}
	for _, tk := range append(tickets[1:4], tickets[5]) {
		g.leave(tk)
	}
	if g.shared != 0 || len(g.bySource) != 0 || len(g.byMember) != 0 {
		t.Fatalf("slots left after every leave: shared %d, by source %v, by member %v", g.shared, g.bySource, g.byMember)
	}
}

func TestSourceKey(t *testing.T) {
	for _, c := range []struct{ ip, want string }{
		{"192.0.2.7", "192.0.2.7/32"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
	} {
		if got := sourceKey(netip.MustParseAddr(c.ip)).String(); got != c.want {
			t.Errorf("sourceKey(%s) = %s, want %s", c.ip, got, c.want)
		}
	}
}
