package server_test

import (
	"fmt"
	"testing"

	"github.com/ticketing-dev/ticketing/server"
)

// member returns the member id of st, or nil.
func member(st server.ClusterStatus, id string) *server.ClusterMember {
	for i := range st.Servers {
		if st.Servers[i].ID == id {
			return &st.Servers[i]
		}
	}
	return nil
}

func showMembers(st server.ClusterStatus) string {
	s := ""
	for _, m := range st.Servers {
		s += fmt.Sprintf("{%s reachable=%v since=%v log=%v lag=%v err=%q} ", m.ID, deref(m.Reachable), deref(m.SinceContactMS), deref(m.LogIndex), deref(m.Lag), m.LastError)
	}
	return s
}

func deref[T any](p *T) any {
	if p == nil {
		return "-"
	}
	return *p
}

// TestClusterStatusReachability: the leader's ClusterStatus shows, per
// member, whether it can reach it, when it last heard from it, its log
// index and its lag; a crashed follower is marked unreachable, with the
// error, and the other stays reachable with no lag. A follower's status
// has none of it and says that it is the leader's view. (Before, every
// member of the configuration looked the same, dead or alive.)
func TestClusterStatusReachability(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	l := tc.leader()
	o := tc.others(l)
	dead, alive := o[0], o[1]
	lid, deadID, aliveID := tc.nodes[l].in.ID, tc.nodes[dead].in.ID, tc.nodes[alive].in.ID
	tc.leaderSession(l).acquireOK(1, owner(1), 0, 10, "k")

	var st server.ClusterStatus
	healthy := func(id string) bool {
		m := member(st, id)
		return m != nil && m.Reachable != nil && *m.Reachable && m.LogIndex != nil && m.Lag != nil && *m.Lag == 0 && m.LastError == ""
	}
	eventually(t, "every member reachable with no lag", func() bool {
		st, _ = tc.nodes[l].s.ClusterStatus()
		return st.MembersView == "leader" && healthy(lid) && healthy(deadID) && healthy(aliveID)
	})
	if m := member(st, aliveID); *m.LogIndex != st.LastLogIndex || m.SinceContactMS == nil || *m.SinceContactMS > 10_000 {
		t.Errorf("a healthy follower: %s (leader's last index %d)", showMembers(st), st.LastLogIndex)
	}
	if m := member(st, lid); *m.LogIndex != st.LastLogIndex || m.SinceContactMS != nil {
		t.Errorf("the leader's own entry: %s", showMembers(st))
	}

	// A follower's view: none of the leader's, and it says so.
	fs, err := tc.nodes[alive].s.ClusterStatus()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range fs.Servers {
		if m.Reachable != nil || m.LogIndex != nil || m.Lag != nil || m.SinceContactMS != nil {
			t.Errorf("a follower's status has the leader's view of %s: %s", m.ID, showMembers(fs))
		}
	}
	if fs.MembersView == "leader" || fs.SinceLeaderContactMS == nil {
		t.Errorf("a follower's members_view %q, since_leader_contact_ms %v", fs.MembersView, deref(fs.SinceLeaderContactMS))
	}

	// A follower crashes: the leader marks it, the other stays reachable.
	tc.stop(dead)
	tc.leaderSession(l).acquireOK(1, owner(2), 0, 10, "k2")
	eventually(t, "the crashed follower unreachable, the other reachable", func() bool {
		st, _ = tc.nodes[l].s.ClusterStatus()
		m := member(st, deadID)
		return m != nil && m.Reachable != nil && !*m.Reachable && m.LastError != "" && healthy(aliveID)
	})
	if m := member(st, deadID); m.SinceContactMS == nil || m.LogIndex == nil || *m.Lag == 0 {
		t.Errorf("the crashed follower: %s (leader's last index %d)", showMembers(st), st.LastLogIndex)
	}
}
