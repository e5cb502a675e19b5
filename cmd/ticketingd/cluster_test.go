package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/deploy"
	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/admin"
)

// adminDo makes one admin request with an optional Authorization header
// value and an optional JSON body, and returns the status code and body.
func adminDo(t *testing.T, method, url, auth, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminToken: with --admin-token, every admin request but GET /healthz
// needs the token as a Bearer credential; the 401 says whether no token,
// no Bearer token or a wrong token was sent (before, all three got the
// same text), and so does 'ticketingd cluster'; a standalone node has no
// cluster endpoints; the token is not logged.
func TestAdminToken(t *testing.T) {
	const token = "adm1n-t0ken"
	p := startInProc(t, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--admin-token", token, "--log-format", "json")
	admin := "http://" + p.stderr.waitJSON(t, "admin listening", p.done)["addr"].(string)
	p.stderr.waitJSON(t, "listening", p.done)

	for _, tc := range []struct {
		method, path, auth string
		code               int
		want               string // in the body
	}{
		{"GET", "/healthz", "", 200, "ok"},
		{"GET", "/healthz", "Bearer wrong", 200, "ok"},
		{"GET", "/status", "", 401, "no admin token was sent"},
		{"GET", "/status", "Bearer wrong", 401, "the admin token sent is not this listener's --admin-token"},
		{"GET", "/status", "Bearer " + token + "x", 401, "the admin token sent is not this listener's --admin-token"},
		{"GET", "/status", "Basic " + token, 401, `the Authorization header is not \"Bearer TOKEN\"`},
		{"GET", "/status", token, 401, `the Authorization header is not \"Bearer TOKEN\"`},
		{"GET", "/status", "Bearer " + token, 200, `"role": "standalone"`},
		{"GET", "/status", "bearer " + token, 200, `"role": "standalone"`},
		{"GET", "/metrics", "", 401, "no admin token was sent"},
		{"GET", "/metrics", "Bearer " + token, 200, "ticketing_sessions"},
		{"POST", "/cluster/add", "", 401, "no admin token was sent"},
		{"POST", "/cluster/add", "Bearer " + token, 404, ""}, // standalone: no such endpoint
		{"POST", "/cluster/remove", "Bearer " + token, 404, ""},
	} {
		code, body := adminDo(t, tc.method, admin+tc.path, tc.auth, "")
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s %s with %q: %d %q, want %d with %q", tc.method, tc.path, tc.auth, code, body, tc.code, tc.want)
		}
	}
	// A standalone /status has no cluster object.
	if _, body := adminDo(t, "GET", admin+"/status", "Bearer "+token, ""); strings.Contains(body, "cluster") {
		t.Errorf("standalone /status mentions a cluster: %s", body)
	}
	// ticketingd cluster against it: no token, the wrong one, then a
	// standalone node.
	if code, _, stderr := runCapture(t, "cluster", "status", "--admin", strings.TrimPrefix(admin, "http://")); code != 1 ||
		!strings.Contains(stderr, "no admin token was sent") || !strings.Contains(stderr, "no admin token given: give --admin-token or set TICKETING_ADMIN_TOKEN") {
		t.Errorf("cluster status without token: exit %d: %s", code, stderr)
	}
	if code, _, stderr := runCapture(t, "cluster", "status", "--admin-token", "wrong", "--admin", strings.TrimPrefix(admin, "http://")); code != 1 ||
		!strings.Contains(stderr, "the admin token sent is not this listener's --admin-token") || !strings.Contains(stderr, "is wrong: it must equal the node's --admin-token") {
		t.Errorf("cluster status with a wrong token: exit %d: %s", code, stderr)
	}
	t.Setenv(adminTokenEnv, token)
	if code, _, stderr := runCapture(t, "cluster", "status", "--admin", strings.TrimPrefix(admin, "http://")); code != 1 || !strings.Contains(stderr, "is not a cluster node (role standalone)") {
		t.Errorf("cluster status of a standalone node: exit %d: %s", code, stderr)
	}
	if code, _, stderr := runCapture(t, "cluster", "remove", "n2", "--admin", admin); code != 1 || !strings.Contains(stderr, "has no /cluster/remove endpoint: it is not a cluster node") {
		t.Errorf("cluster remove on a standalone node: exit %d: %s", code, stderr)
	}
	if code := p.stop(); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.stderr.String())
	}
	if strings.Contains(p.stderr.String(), token) {
		t.Errorf("the admin token was logged:\n%s", p.stderr.String())
	}
}

// freePortRun returns a port p such that p, p+1, ..., p+n-1 are free on
// 127.0.0.1 right now, below the ephemeral range (proctest.FreePortRun).
func freePortRun(t *testing.T, n int) int {
	t.Helper()
	p, err := proctest.FreePortRun("127.0.0.1", n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// clusterView is one node's answer to 'ticketingd cluster status --json'.
func clusterView(t *testing.T, admin string) (server.ClusterStatus, error) {
	t.Helper()
	code, out, stderr := runCapture(t, "cluster", "status", "--json", "--admin", admin)
	if code != 0 {
		return server.ClusterStatus{}, fmt.Errorf("cluster status --admin %s: exit %d: %s", admin, code, stderr)
	}
	var cs server.ClusterStatus
	if err := json.Unmarshal([]byte(out), &cs); err != nil {
		return cs, fmt.Errorf("cluster status --json: %v: %s", err, out)
	}
	return cs, nil
}

// waitCluster polls the nodes' admin listeners until cond holds for their
// views (a hang guard of 60 s, not a speed assertion), and returns them.
func waitCluster(t *testing.T, admins []string, what string, cond func([]server.ClusterStatus) bool) []server.ClusterStatus {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last []server.ClusterStatus
	var lastErr error
	for time.Now().Before(deadline) {
		last, lastErr = last[:0], nil
		for _, a := range admins {
			cs, err := clusterView(t, a)
			if err != nil {
				lastErr = err
				break
			}
			last = append(last, cs)
		}
		if lastErr == nil && cond(last) {
			return last
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("cluster never got to %s; last views %+v, error %v", what, last, lastErr)
	return nil
}

// agreedLeader returns the index of the node that leads and serves, if
// every view names it as leader, with its client address, and n servers;
// -1 otherwise.
func agreedLeader(views []server.ClusterStatus, n int) int {
	lead := -1
	for i, v := range views {
		if v.State == "Leader" && v.Serving {
			lead = i
		}
	}
	if lead < 0 {
		return -1
	}
	for _, v := range views {
		// LeaderAdvertise: the follower has applied the entry with the
		// leader's client address, its M hint.
		if v.Leader != views[lead].NodeID || len(v.Servers) != n || v.LeaderAdvertise == "" {
			return -1
		}
	}
	return lead
}

// initClusterBundle runs 'init --cluster' for n1..n3 on 127.0.0.1 with runs
// consecutive free client, Raft and admin ports each (room for nodes added
// later), sets the admin token for 'ticketingd cluster', and returns the
// bundle's directory, its printed exports and the three base ports.
func initClusterBundle(t *testing.T, runs int) (string, map[string]string, [3]int) {
	t.Helper()
	ports := [3]int{freePortRun(t, runs), freePortRun(t, runs), freePortRun(t, runs)}
	dir := t.TempDir()
	code, out, stderr := runCapture(t, "init", "--cluster", "--dir", dir, "--node", "n1=127.0.0.1", "--node", "n2=127.0.0.1", "--node", "n3=127.0.0.1",
		"--port", strconv.Itoa(ports[0]), "--raft-port", strconv.Itoa(ports[1]), "--admin-port", strconv.Itoa(ports[2]))
	if code != 0 {
		t.Fatalf("init --cluster: exit %d: %s", code, stderr)
	}
	ex := clusterExports(t, out)
	// The bundle is internal/deploy's (init is its front end, as the
	// deployment page is): it has the unit of each node beside its config.
	if _, err := os.Stat(filepath.Join(dir, "n1", deploy.NodeUnitFile("n1"))); err != nil {
		t.Errorf("init --cluster wrote no systemd unit: %v", err)
	}
	t.Setenv(adminTokenEnv, ex["TICKETING_ADMIN_TOKEN"])
	return dir, ex, ports
}

// TestClusterEndToEnd: a bundle from 'init --cluster' for three nodes on
// 127.0.0.1, started as three 'ticketingd serve --config' processes, forms
// a cluster that a broker given the printed TICKETING_URL uses; followers
// send clients to the leader; 'ticketingd cluster' shows the cluster and
// refuses a change on a follower naming the leader. Then the operations of
// docs/operations.md: a node from 'init --cluster --add' is added, a
// follower killed with -9 is removed, a full restart keeps a held lock
// and the token counter, and so does a kill -9 of the leader after it.
func TestClusterEndToEnd(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("runs the printed export lines with sh")
	}
	bin := buildBinary(t)
	dir, ex, ports := initClusterBundle(t, 4)
	clientBase, raftBase, adminBase := ports[0], ports[1], ports[2]

	before := uint64(time.Now().UnixMicro())
	var nodes []*subprocess
	var admins []string
	for i, id := range []string{"n1", "n2", "n3"} {
		nodes = append(nodes, startBinary(t, bin, "serve", "--config", filepath.Join(dir, id, initConfigFile), "--log-format", "json"))
		admins = append(admins, "127.0.0.1:"+strconv.Itoa(adminBase+i))
	}
	for _, n := range nodes {
		n.addr(t)
	}
	views := waitCluster(t, admins, "one leader that all three follow", func(v []server.ClusterStatus) bool { return agreedLeader(v, 3) >= 0 })
	lead := agreedLeader(views, 3)
	follower := (lead + 1) % 3
	// Every node shows the bundle's cluster ID, which the first leader
	// recorded in the replicated state.
	o1, err := parseServe(t, "--config", filepath.Join(dir, "n1", initConfigFile))
	if err != nil || !reBoundClusterID.MatchString(o1.ClusterID) {
		t.Fatalf("n1's config: cluster-id %q, %v", o1.ClusterID, err)
	}
	waitCluster(t, admins, "every node to show the cluster ID", func(v []server.ClusterStatus) bool {
		for _, x := range v {
			if x.ClusterID != o1.ClusterID {
				return false
			}
		}
		return true
	})
	leaderID := views[lead].NodeID
	leaderClient := "127.0.0.1:" + strconv.Itoa(clientBase+lead)
	if views[follower].LeaderAdvertise != leaderClient || views[follower].LeaderAddress != "127.0.0.1:"+strconv.Itoa(raftBase+lead) {
		t.Errorf("follower's view of the leader: %+v", views[follower])
	}

	// A broker given the printed URL (all three addresses) locks, with
	// a first token above the clock: every node's config from init says
	// token-start: clock.
	cfg, err := parseURL(t, ex["TICKETING_URL"])
	if err != nil {
		t.Fatal(err)
	}
	if id := urlCluster(t, ex["TICKETING_URL"]); id != o1.ClusterID {
		t.Errorf("the printed URL names cluster=%q, want the cluster's ID %s", id, o1.ClusterID)
	}
	if tok := lockOnce(t, cfg); tok <= before || o1.TokenStart != "clock" {
		t.Errorf("first token %d of the init --cluster bundle (token-start %q), want above the clock in µs at its start (%d)", tok, o1.TokenStart, before)
	}

	// A follower answers HELLO with M and the leader's client address.
	caPool := certPool(t, filepath.Join(dir, initCACert))
	conn, err := tls.Dial("tcp", "127.0.0.1:"+strconv.Itoa(clientBase+follower), &tls.Config{RootCAs: caPool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	_, r, err := dialRaw(conn, ex["TICKETING_TOKEN"])
	conn.Close()
	if err != nil || r.Type != wire.TypeNotActive || string(r.Hint) != leaderClient {
		t.Errorf("HELLO to follower: %q hint %q err %v; want M with %s", r.Type, r.Hint, err, leaderClient)
	}

	// Human status on a follower names the leader and lists the members.
	code, out, stderr := runCapture(t, "cluster", "status", "--admin", admins[follower])
	if code != 0 {
		t.Fatalf("cluster status: exit %d: %s", code, stderr)
	}
	for _, w := range []string{"node " + views[follower].NodeID + ": Follower, not serving clients", "cluster " + o1.ClusterID + "\n", "leader: " + leaderID + " (raft 127.0.0.1:" + strconv.Itoa(raftBase+lead),
		"clients " + leaderClient, "n1  ", "n2  ", "n3  ", "Voter", "last heard from a leader ",
		"reachability, last contact, log index and lag are the leader's view: run 'ticketingd cluster status' against " + leaderID + "'s admin listener"} {
		if !strings.Contains(out, w) {
			t.Errorf("cluster status lacks %q:\n%s", w, out)
		}
	}

	// /status has the cluster object; without the token, 401.
	code, body := adminDo(t, "GET", "http://"+admins[lead]+"/status", "Bearer "+ex["TICKETING_ADMIN_TOKEN"], "")
	var st admin.Status
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.Cluster == nil || st.Cluster.NodeID != leaderID || st.Role != "leader" {
		t.Errorf("/status of the leader: %d %v %s", code, err, body)
	}
	if code, _ := adminDo(t, "GET", "http://"+admins[lead]+"/status", "", ""); code != 401 {
		t.Errorf("/status without the token: %d", code)
	}

	// A change on a follower: 409 naming the leader, and the command says
	// where to repeat it.
	raft4 := "127.0.0.1:" + strconv.Itoa(raftBase+3)
	code, body = adminDo(t, "POST", "http://"+admins[follower]+"/cluster/add", "Bearer "+ex["TICKETING_ADMIN_TOKEN"], `{"id":"n4","address":"`+raft4+`"}`)
	var nl admin.NotLeaderResponse
	if err := json.Unmarshal([]byte(body), &nl); code != 409 || err != nil || nl.Leader != leaderID || nl.LeaderAddress != views[lead].LeaderAddress || nl.Error == "" {
		t.Errorf("add on a follower: %d %s", code, body)
	}
	code, _, stderr = runCapture(t, "cluster", "add", "n4="+raft4, "--admin", admins[follower])
	if code != 1 || !strings.Contains(stderr, "the leader is "+leaderID) {
		t.Errorf("cluster add on a follower: exit %d: %s", code, stderr)
	}

	// A fourth node from 'init --cluster --add' (the bundle's CAs and
	// tokens, the next ports, no peers) is added on the leader, then
	// removed.
	code, out, stderr = runCapture(t, "init", "--cluster", "--add", "--dir", dir, "--node", "n4=127.0.0.1",
		"--port", strconv.Itoa(clientBase), "--raft-port", strconv.Itoa(raftBase), "--admin-port", strconv.Itoa(adminBase))
	if code != 0 {
		t.Fatalf("init --cluster --add: exit %d: %s", code, stderr)
	}
	if want := "ticketingd cluster add n4=" + raft4 + " --admin " + strings.Join(admins, ","); !strings.Contains(out, want) {
		t.Errorf("init --add output lacks %q:\n%s", want, out)
	}
	if o4, err := parseServe(t, "--config", filepath.Join(dir, "n4", initConfigFile)); err != nil || o4.TokenStart != "clock" {
		t.Errorf("n4's config from init --add: token-start %q (%v), want clock as the bundle's", o4.TokenStart, err)
	}
	node4 := startBinary(t, bin, "serve", "--config", filepath.Join(dir, "n4", initConfigFile), "--log-format", "json")
	node4.stderr.waitJSON(t, "cluster: no raft state, initial-cluster-state existing: waiting to be added to a cluster", node4.done)
	node4.addr(t)
	admin4 := node4.stderr.waitJSON(t, "admin listening", node4.done)["addr"].(string)
	if admin4 != "127.0.0.1:"+strconv.Itoa(adminBase+3) {
		t.Errorf("n4's admin listener on %s, want the next port", admin4)
	}
	// As printed: every admin listener, tried in turn until the leader's.
	code, out, stderr = runCapture(t, "cluster", "add", "n4="+raft4, "--admin", admins[follower]+","+admins[lead])
	if code != 0 || !strings.Contains(out, "added n4 (raft "+raft4+") as a voter") {
		t.Fatalf("cluster add n4: exit %d: %s%s", code, out, stderr)
	}
	waitCluster(t, append(slices.Clone(admins), admin4), "n4 a voter that follows the leader", func(v []server.ClusterStatus) bool {
		return agreedLeader(v, 4) == lead
	})

	// A lock held over what follows: a raw session on the leader takes it
	// and goes away (a granted lock is not tied to its session).
	token := ex["TICKETING_TOKEN"]
	rawTo := func(addr string) *client {
		t.Helper()
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: caPool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		cl, r, err := dialRaw(conn, token)
		if err != nil || r.Type != wire.TypeHelloOK {
			t.Fatalf("HELLO to %s: %q hint %q, %v", addr, r.Type, r.Hint, err)
		}
		return cl
	}
	cl := rawTo(leaderClient)
	g, err := cl.acquire("kept", 0, 250)
	if err != nil || g.Type != wire.TypeGranted {
		t.Fatalf("acquire kept: %q %v", g.Type, err)
	}
	cl.c.Close()

	// Replace a dead node: kill -9 a follower, remove it on the leader;
	// the other original and n4 stay voters.
	dead := follower
	deadID := views[dead].NodeID
	healthyID := views[3-lead-dead].NodeID
	// Before the kill, the leader sees every member reachable.
	waitCluster(t, admins[lead:lead+1], "the leader seeing every member reachable", func(v []server.ClusterStatus) bool {
		for _, m := range v[0].Servers {
			if m.Reachable == nil || !*m.Reachable {
				return false
			}
		}
		return v[0].MembersView == "leader" && len(v[0].Servers) == 4
	})
	_ = nodes[dead].cmd.Process.Kill()
	<-nodes[dead].done
	killed := time.Now()
	// The leader's status marks the killed follower unreachable (a few
	// heartbeats: it is not a speed assertion, waitCluster's deadline is
	// a hang guard); the other follower stays reachable with a small lag.
	waitCluster(t, admins[lead:lead+1], deadID+" unreachable, "+healthyID+" reachable", func(v []server.ClusterStatus) bool {
		var d, h *server.ClusterMember
		for i, m := range v[0].Servers {
			switch m.ID {
			case deadID:
				d = &v[0].Servers[i]
			case healthyID:
				h = &v[0].Servers[i]
			}
		}
		return d != nil && h != nil && d.Reachable != nil && !*d.Reachable &&
			h.Reachable != nil && *h.Reachable && h.Lag != nil && *h.Lag <= 2 && h.LogIndex != nil
	})
	marked := time.Since(killed).Round(time.Millisecond)
	code, out, stderr = runCapture(t, "cluster", "status", "--admin", admins[lead])
	if code != 0 {
		t.Fatalf("cluster status on the leader: exit %d: %s", code, stderr)
	}
	t.Logf("the leader marked %s unreachable %v after its kill -9:\n%s", deadID, marked, out)
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == deadID && !(slices.Contains(f, "NO") && strings.HasSuffix(line, "<- UNREACHABLE")):
			t.Errorf("the killed follower's line: %q", line)
		case len(f) > 0 && f[0] == healthyID && (!slices.Contains(f, "yes") || !strings.Contains(line, " ago ")):
			t.Errorf("the healthy follower's line: %q", line)
		}
	}
	for _, w := range []string{"REACHABLE  LAST CONTACT  LOG INDEX  LAG", "! the leader cannot reach " + deadID + " (raft ", "no reply for ", "; last error: "} {
		if !strings.Contains(out, w) {
			t.Errorf("cluster status on the leader lacks %q:\n%s", w, out)
		}
	}
	code, out, stderr = runCapture(t, "cluster", "remove", deadID, "--admin", admins[lead], "--json")
	var resp admin.ClusterChangeResponse
	if err := json.Unmarshal([]byte(out), &resp); code != 0 || err != nil || resp.ID != deadID || resp.Cluster == nil {
		t.Fatalf("cluster remove %s: exit %d: %s%s", deadID, code, out, stderr)
	}
	for _, m := range resp.Cluster.Servers {
		if m.ID == deadID {
			t.Errorf("%s still in the configuration after its removal: %+v", deadID, resp.Cluster.Servers)
		}
	}
	type live struct {
		proc        *subprocess
		config      string
		admin, name string
	}
	var alive []live
	for i := range 3 {
		if i != dead {
			alive = append(alive, live{nodes[i], filepath.Join(dir, views[i].NodeID, initConfigFile), admins[i], views[i].NodeID})
		}
	}
	alive = append(alive, live{node4, filepath.Join(dir, "n4", initConfigFile), admin4, "n4"})
	liveAdmins := func() []string {
		var a []string
		for _, l := range alive {
			a = append(a, l.admin)
		}
		return a
	}
	waitCluster(t, liveAdmins(), "three voters without the dead node", func(v []server.ClusterStatus) bool {
		i := agreedLeader(v, 3)
		return i >= 0 && v[i].NodeID == leaderID
	})

	// A full restart: every node stops (SIGTERM) and starts again. The
	// held lock and the token counter survive: the new leader answers T
	// for the kept key and grants a fresh one above its token.
	for _, l := range alive {
		_ = l.proc.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, l := range alive {
		if code := l.proc.exitCode(); code != 0 {
			t.Errorf("%s: exit %d:\n%s", l.name, code, l.proc.stderr.String())
		}
		if strings.Contains(l.proc.stderr.String(), ex["TICKETING_ADMIN_TOKEN"]) || strings.Contains(l.proc.stderr.String(), token) {
			t.Errorf("%s logged a token:\n%s", l.name, l.proc.stderr.String())
		}
	}
	for i := range alive {
		alive[i].proc = startBinary(t, bin, "serve", "--config", alive[i].config, "--log-format", "json")
		alive[i].proc.addr(t)
		if alive[i].name != "n4" && !strings.Contains(alive[i].proc.stderr.String(), "cluster: raft state exists; the peers setting is ignored") {
			t.Errorf("%s, restarted with peers in its config, did not say it ignores them:\n%s", alive[i].name, alive[i].proc.stderr.String())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "n4", initDataDir, "raft", "raft.db")); err != nil {
		t.Errorf("no Raft log in the data dir: %v", err)
	}
	views = waitCluster(t, liveAdmins(), "a leader after the full restart", func(v []server.ClusterStatus) bool { return agreedLeader(v, 3) >= 0 })
	newLeader := views[agreedLeader(views, 3)]
	cl = rawTo(newLeader.LeaderAdvertise)
	if r, err := cl.acquire("kept", 0, 10); err != nil || r.Type != wire.TypeTimedOut {
		t.Errorf("acquire kept after the full restart: %q %v; want T (still held)", r.Type, err)
	}
	fresh, err := cl.acquire("fresh", 0, 10)
	if err != nil || fresh.Type != wire.TypeGranted || fresh.Token <= g.Token {
		t.Errorf("acquire fresh after the full restart: %q token %d, %v; want a grant above %d", fresh.Type, fresh.Token, err, g.Token)
	}
	cl.c.Close()

	// kill -9 the leader: the other two elect one of them; the held lock
	// and the tokens survive (no token again: the next is above all).
	var survivors []live
	for _, l := range alive {
		if l.name == newLeader.NodeID {
			_ = l.proc.cmd.Process.Kill()
			l.proc.exitCode()
		} else {
			survivors = append(survivors, l)
		}
	}
	var survAdmins []string
	for _, l := range survivors {
		survAdmins = append(survAdmins, l.admin)
	}
	views = waitCluster(t, survAdmins, "a new leader after the leader's kill -9", func(v []server.ClusterStatus) bool {
		i := agreedLeader(v, 3)
		return i >= 0 && v[i].NodeID != newLeader.NodeID
	})
	cl = rawTo(views[agreedLeader(views, 3)].LeaderAdvertise)
	if r, err := cl.acquire("kept", 0, 10); err != nil || r.Type != wire.TypeTimedOut {
		t.Errorf("acquire kept after the leader's kill -9: %q %v; want T (still held)", r.Type, err)
	}
	if r, err := cl.acquire("after-kill", 0, 10); err != nil || r.Type != wire.TypeGranted || r.Token <= fresh.Token {
		t.Errorf("acquire after the leader's kill -9: %q token %d, %v; want a grant above %d", r.Type, r.Token, err, fresh.Token)
	}
	cl.c.Close()
	alive = survivors

	for _, l := range alive {
		_ = l.proc.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, l := range alive {
		if code := l.proc.exitCode(); code != 0 {
			t.Errorf("%s: exit %d:\n%s", l.name, code, l.proc.stderr.String())
		}
	}
}

// TestClusterSingleNodeAdmin: a one-node cluster without peer TLS and
// without an admin token (its admin port on loopback) warns about the
// plain transport, leads, and its cluster endpoints check what they are
// given: the content type, a loopback Host (no token), the body, the node.
func TestClusterSingleNodeAdmin(t *testing.T) {
	raft := "127.0.0.1:" + strconv.Itoa(freePort(t, "127.0.0.1"))
	p := startInProc(t, "serve", "--cluster", "--node-id", "solo", "--listen", "127.0.0.1:0", "--raft-listen", raft, "--peers", "solo="+raft,
		"--data-dir", filepath.Join(t.TempDir(), "data"), "--admin-listen", "127.0.0.1:0", "--log-format", "json", "--admin-allowed-host", "ops.example")
	adminAddr := p.stderr.waitJSON(t, "admin listening", p.done)["addr"].(string)
	admin := "http://" + adminAddr
	listening := p.stderr.waitJSON(t, "listening", p.done)
	if listening["advertise"] != listening["addr"] || listening["node_id"] != "solo" || listening["peer_tls"] != false {
		t.Errorf("listening line %v: want advertise = the bound addr (--listen port 0)", listening)
	}
	p.stderr.waitJSON(t, "cluster: leading", p.done)
	if n := strings.Count(p.stderr.String(), "raft peer transport without TLS"); n != 1 {
		t.Errorf("%d warnings about the plain Raft transport, want 1:\n%s", n, p.stderr.String())
	}

	code, out, stderr := runCapture(t, "cluster", "status", "--admin", adminAddr)
	if code != 0 || !strings.Contains(out, "node solo: Leader, serving clients") || !strings.Contains(out, "leader: solo (raft "+raft) {
		t.Errorf("cluster status: exit %d:\n%s%s", code, out, stderr)
	}

	post := func(path, contentType, host, body string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), "POST", admin+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		name, path, ctype, host, body string
		code                          int
		want                          string
	}{
		{"form post", "/cluster/remove", "text/plain", "", `{"id":"solo"}`, 415, "application/json"},
		{"rebound host", "/cluster/remove", "application/json", "evil.example:80", `{"id":"solo"}`, 403, "not a name of this server"},
		{"allowed name, not loopback", "/cluster/remove", "application/json", "ops.example:80", `{"id":"solo"}`, 403, "not a loopback address"},
		{"localhost host", "/cluster/remove", "application/json; charset=utf-8", "localhost", `{"id":"nobody"}`, 404, `node \"nobody\" is not in the cluster configuration`},
		{"bad json", "/cluster/add", "application/json", "", `{"id":`, 400, "invalid request body"},
		{"unknown field", "/cluster/add", "application/json", "", `{"id":"n2","addr":"127.0.0.1:1"}`, 400, "unknown field"},
		{"two values", "/cluster/add", "application/json", "", `{"id":"n2","address":"127.0.0.1:1"} {}`, 400, "more than one JSON value"},
		{"bad id", "/cluster/add", "application/json", "", `{"id":"n/2","address":"127.0.0.1:1"}`, 400, "invalid id"},
		{"wildcard address", "/cluster/add", "application/json", "", `{"id":"n2","address":"0.0.0.0:7001"}`, 400, "Raft address"},
		{"too large", "/cluster/add", "application/json", "", `{"id":"` + strings.Repeat("n", 5000) + `"}`, 413, "invalid request body"},
	} {
		if code, body := post(tc.path, tc.ctype, tc.host, tc.body); code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s; want %d with %q", tc.name, code, body, tc.code, tc.want)
		}
	}
	code, _, stderr = runCapture(t, "cluster", "remove", "nobody", "--admin", adminAddr)
	if code != 1 || !strings.Contains(stderr, `node "nobody" is not in the cluster configuration`) {
		t.Errorf("cluster remove nobody: exit %d: %s", code, stderr)
	}
	if code, _ := adminDo(t, "GET", admin+"/cluster/add", "", ""); code != 405 {
		t.Errorf("GET /cluster/add: %d, want 405", code)
	}
	if code := p.stop(); code != 0 {
		t.Fatalf("exit %d:\n%s", code, p.stderr.String())
	}
}

// copyTree copies the directory src to dst (which must not exist), files
// with their modes.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(target, info.Mode().Perm())
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, info.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestClusterBackupRestore follows docs/operations.md: a backup is the
// raft directory of a stopped follower; a restore puts it into every
// node's data dir and starts every node once with --initial-token at
// least the highest token issued. The restored cluster has the backup's
// held lock and issues tokens above every earlier one, although its log
// is behind (without --initial-token it would issue a token again: the
// last check fails then).
func TestClusterBackupRestore(t *testing.T) {
	bin := buildBinary(t)
	dir, ex, ports := initClusterBundle(t, 3)
	adminBase := ports[2]
	ids := []string{"n1", "n2", "n3"}
	admins := []string{"127.0.0.1:" + strconv.Itoa(adminBase), "127.0.0.1:" + strconv.Itoa(adminBase+1), "127.0.0.1:" + strconv.Itoa(adminBase+2)}
	procs := make([]*subprocess, 3)
	start := func(i int, extra ...string) {
		procs[i] = startBinary(t, bin, append([]string{"serve", "--config", filepath.Join(dir, ids[i], initConfigFile), "--log-format", "json"}, extra...)...)
		procs[i].addr(t)
	}
	stop := func(i int) {
		_ = procs[i].cmd.Process.Signal(syscall.SIGTERM)
		if code := procs[i].exitCode(); code != 0 {
			t.Fatalf("%s: exit %d:\n%s", ids[i], code, procs[i].stderr.String())
		}
	}
	caPool := certPool(t, filepath.Join(dir, initCACert))
	// acquire takes key with wait 0 on the serving node.
	acquire := func(views []server.ClusterStatus, key string) wire.Response {
		t.Helper()
		leader := views[agreedLeader(views, 3)].LeaderAdvertise
		conn, err := tls.Dial("tcp", leader, &tls.Config{RootCAs: caPool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cl, r, err := dialRaw(conn, ex["TICKETING_TOKEN"])
		if err != nil || r.Type != wire.TypeHelloOK {
			t.Fatalf("HELLO to %s: %q %v", leader, r.Type, err)
		}
		r, err = cl.acquire(key, 0, 250)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	formed := func(v []server.ClusterStatus) bool { return agreedLeader(v, 3) >= 0 }
	for i := range 3 {
		start(i)
	}
	views := waitCluster(t, admins, "a leader", formed)
	held := acquire(views, "held-in-backup")
	if held.Type != wire.TypeGranted {
		t.Fatalf("acquire: %q", held.Type)
	}

	// The backup: stop a follower, copy its raft directory, start it again.
	// The grant committed with one follower's copy: wait until this one
	// has it too (a backup holds what its follower had).
	ldr := agreedLeader(views, 3)
	f := (ldr + 1) % 3
	committed := waitCluster(t, admins, "the grant committed", formed)[ldr].CommitIndex
	waitCluster(t, admins, "the grant on the follower", func(v []server.ClusterStatus) bool { return v[f].LastLogIndex >= committed })
	stop(f)
	backup := filepath.Join(t.TempDir(), "raft")
	copyTree(t, filepath.Join(dir, ids[f], initDataDir, "raft"), backup)
	start(f)
	views = waitCluster(t, admins, "the follower back", formed)

	// Tokens issued after the backup.
	var highest uint64
	for _, k := range []string{"after-1", "after-2"} {
		r := acquire(views, k)
		if r.Type != wire.TypeGranted {
			t.Fatalf("acquire %s: %q", k, r.Type)
		}
		highest = r.Token
	}

	// The restore: every node stopped, the backup in every data dir, one
	// start with --initial-token.
	for i := range 3 {
		stop(i)
	}
	for i := range 3 {
		raftDir := filepath.Join(dir, ids[i], initDataDir, "raft")
		if err := os.RemoveAll(raftDir); err != nil {
			t.Fatal(err)
		}
		copyTree(t, backup, raftDir)
	}
	for i := range 3 {
		start(i, "--initial-token", strconv.FormatUint(highest, 10))
	}
	views = waitCluster(t, admins, "a leader after the restore", formed)
	if r := acquire(views, "held-in-backup"); r.Type != wire.TypeTimedOut {
		t.Errorf("the backup's held lock after the restore: %q, want T (held)", r.Type)
	}
	if r := acquire(views, "after-1"); r.Type != wire.TypeGranted || r.Token <= highest {
		t.Errorf("a key granted after the backup: %q token %d, want a grant above %d", r.Type, r.Token, highest)
	}
	for i := range 3 {
		stop(i)
	}
}
