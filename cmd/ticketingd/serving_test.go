package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin"
)

// fakeClusterNode is an admin listener over a real socket that answers
// /status and the lock browser as a cluster node in state (Leader or
// Follower) that knows leader ("" for none) would: a follower lists its
// applied holdings, without holders.
func fakeClusterNode(t *testing.T, id, state, leader string) string {
	t.Helper()
	mux := http.NewServeMux()
	write := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		write(w, admin.Status{Stats: server.Stats{Role: strings.ToLower(state)}, Cluster: &server.ClusterStatus{
			NodeID: id, ClusterID: "c1", State: state, Serving: state == "Leader", Leader: leader,
			Servers: []server.ClusterMember{{ID: id, Address: "127.0.0.1:1", Suffrage: "Voter", Leader: id == leader}}}})
	})
	view, holder := server.ViewFollowerApplied, (*admin.Session)(nil)
	if state == "Leader" {
		view, holder = server.ViewLeader, &admin.Session{Name: "worker-7", Addr: "10.0.0.7:5000"}
	}
	lock := admin.Lock{Key: "jobs/a", KeyB64: "am9icy9h", Token: 42, LeaseS: 30, Holder: holder}
	mux.HandleFunc("GET /v1/locks", func(w http.ResponseWriter, r *http.Request) {
		write(w, admin.LocksResponse{View: view, Locks: []admin.Lock{lock}})
	})
	mux.HandleFunc("GET /v1/locks/{key}", func(w http.ResponseWriter, r *http.Request) {
		write(w, admin.LockResponse{View: view, Lock: lock})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestAdminCommandsAskTheLeader: given several --admin nodes, cluster
// status and locks list|show answer from the leader, not from the first
// node that answers (a follower, whose locks have no holder); with no
// leader among them they show the first answer, with a note that says
// there is no leader, or that the leader was not among them.
func TestAdminCommandsAskTheLeader(t *testing.T) {
	f1 := fakeClusterNode(t, "n2", "Follower", "n1")
	lead := fakeClusterNode(t, "n1", "Leader", "n1")
	admins := f1 + "," + lead

	code, out, stderr := runCapture(t, "cluster", "status", "--admin", admins)
	if code != 0 || !strings.Contains(out, "node n1: Leader, serving clients") || stderr != "" {
		t.Errorf("cluster status --admin follower,leader: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCapture(t, "locks", "list", "--admin", admins, "--admin-token", "t")
	if code != 0 || !strings.Contains(out, "view leader") || !strings.Contains(out, "worker-7@10.0.0.7:5000") || stderr != "" {
		t.Errorf("locks list --admin follower,leader: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCapture(t, "locks", "show", "jobs/a", "--admin", admins, "--admin-token", "t")
	if code != 0 || !strings.Contains(out, "holder worker-7@10.0.0.7:5000") || stderr != "" {
		t.Errorf("locks show --admin follower,leader: exit %d\n%s%s", code, out, stderr)
	}

	// The leader is not among them: the follower's view, and why.
	f3 := fakeClusterNode(t, "n3", "Follower", "n1")
	code, out, stderr = runCapture(t, "cluster", "status", "--admin", f1+","+f3)
	if code != 0 || !strings.Contains(out, "node n2: Follower") || !strings.Contains(stderr, "the leader, n1, is not among the --admin nodes") {
		t.Errorf("cluster status, leader not given: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCapture(t, "locks", "list", "--admin", f1+","+f3, "--admin-token", "t")
	if code != 0 || !strings.Contains(out, "view follower") || !strings.Contains(stderr, "none of the --admin nodes serves") {
		t.Errorf("locks list, leader not given: exit %d\n%s%s", code, out, stderr)
	}

	// No leader at all.
	n4, n5 := fakeClusterNode(t, "n4", "Candidate", ""), fakeClusterNode(t, "n5", "Follower", "")
	code, out, stderr = runCapture(t, "cluster", "status", "--admin", n4+","+n5)
	if code != 0 || !strings.Contains(out, "node n4: Candidate") || !strings.Contains(out, "leader: none known") ||
		!strings.Contains(stderr, "no leader: none of the --admin nodes leads") {
		t.Errorf("cluster status, no leader: exit %d\n%s%s", code, out, stderr)
	}
	code, _, stderr = runCapture(t, "cluster", "status", "--admin", n5)
	if code != 0 || !strings.Contains(stderr, "no leader") {
		t.Errorf("cluster status of one node without a leader: exit %d\n%s", code, stderr)
	}
	// --json stays JSON on stdout: the note is on stderr.
	code, out, stderr = runCapture(t, "cluster", "status", "--json", "--admin", n4+","+n5)
	var cs server.ClusterStatus
	if code != 0 || json.Unmarshal([]byte(out), &cs) != nil || cs.NodeID != "n4" || !strings.Contains(stderr, "no leader") {
		t.Errorf("cluster status --json, no leader: exit %d\n%s%s", code, out, stderr)
	}
}
