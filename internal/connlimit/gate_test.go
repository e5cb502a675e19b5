package connlimit

import (
	"net/netip"
	"testing"
)

func TestGate(t *testing.T) {
	g := NewGate(4, 2, 1)
	member := netip.MustParseAddr("10.0.0.1")
	g.SetMembers(map[netip.Addr]struct{}{member: {}})
	enter := func(ip string) (Ticket, Refusal) { return g.Enter(netip.MustParseAddr(ip)) }
	steps := []struct {
		name string
		ip   string
		want Refusal
	}{
		{"stranger 1", "192.0.2.1", Admitted},
		{"stranger 1 again", "192.0.2.1", Admitted},
		{"stranger 1 beyond its share", "192.0.2.1", SourceFull},
		{"IPv6 stranger", "2001:db8:0:1::1", Admitted},
		{"same IPv6 /64, another address", "2001:db8:0:1::2", Admitted},
		{"that /64 beyond its share", "2001:db8:0:1:ffff::3", SourceFull},
		{"shared slots full", "192.0.2.2", SharedFull},
		{"member, its own slot", "10.0.0.1", Admitted},
		{"member beyond its own slots, shared full", "10.0.0.1", MemberAllFull},
	}
	var tickets []Ticket
	for _, s := range steps {
		tk, got := enter(s.ip)
		if got != s.want {
			t.Fatalf("%s: refusal %d, want %d", s.name, got, s.want)
		}
		if got == Admitted {
			tickets = append(tickets, tk)
		}
	}
	// A shared slot comes free: the member may take it, beyond its own.
	g.Leave(tickets[0])
	if tk, got := enter("10.0.0.1"); got != Admitted || tk.member {
		t.Fatalf("member with a shared slot free: refusal %d, member slot %v; want a shared slot", got, tk.member)
	} else {
		tickets = append(tickets, tk)
	}
	// No longer a member: no slot of its own, even one that is free.
	g.SetMembers(nil)
	g.Leave(tickets[4]) // the member slot of 10.0.0.1
	if _, got := enter("10.0.0.1"); got != SharedFull {
		t.Fatalf("former member: refusal %d, want SharedFull", got)
	}
	for _, tk := range append(tickets[1:4], tickets[5]) {
		g.Leave(tk)
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
		if got := SourceKey(netip.MustParseAddr(c.ip)).String(); got != c.want {
			t.Errorf("SourceKey(%s) = %s, want %s", c.ip, got, c.want)
		}
	}
}
