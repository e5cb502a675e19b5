package main

import (
	"crypto/tls"
	"encoding/json"
	"net"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// TestPairEndToEnd: a bundle from 'init --pair' for two nodes on
// 127.0.0.1, started as two 'ticketingd serve --config' processes: the
// 'listening' lines name the pair settings with peer TLS on, the pair
// settles (/status: the primary active and replicating, the backup a
// passive in sync that names the primary's advertise address), the
// primary is active (HELLO_OK role 2) and a broker given the printed
// URL's first address (the primary's) locks; after a kill -9 of the
// primary, a broker given the printed TICKETING_URL locks on the backup,
// which is then active, with a larger token.
//
// No client request reaches the backup before the primary is killed (its
// /status is read instead): a HELLO to a passive makes it take over once
// its peer has been silent for two heartbeats (the pattern's rule), so a
// stall of the primary of two seconds around such a HELLO would make the
// backup active and the test fail. That a passive answers M naming the
// active is checked on a fake clock, in package server.
func TestPairEndToEnd(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("runs the printed export lines with sh")
	}
	bin := buildBinary(t)
	ports := [3]int{freePortRun(t, 2), freePortRun(t, 2), freePortRun(t, 2)}
	dir := t.TempDir()
	code, out, stderr := runCapture(t, "init", "--pair", "--dir", dir, "--node", "primary=127.0.0.1", "--node", "backup=127.0.0.1",
		"--port", strconv.Itoa(ports[0]), "--peer-port", strconv.Itoa(ports[1]), "--admin-port", strconv.Itoa(ports[2]))
	if code != 0 {
		t.Fatalf("init --pair: exit %d: %s", code, stderr)
	}
	ex := clusterExports(t, out)
	cfg, err := parseURL(t, ex["TICKETING_URL"])
	if err != nil {
		t.Fatal(err)
	}
	addr := map[string]string{"primary": cfg.Addrs[0], "backup": cfg.Addrs[1]}
	nodes := map[string]*subprocess{}
	for _, role := range pairRoles {
		sp := startBinary(t, bin, "serve", "--config", filepath.Join(dir, role, initConfigFile), "--log-format", "json")
		rec := sp.stderr.waitJSON(t, "listening", sp.done)
		if rec["pair"] != role || rec["advertise"] != addr[role] || rec["peer_tls"] != true || rec["heartbeat"] != "1s" {
			t.Errorf("%s: listening line %v", role, rec)
		}
		nodes[role] = sp
	}

	pool := certPool(t, filepath.Join(dir, initCACert))
	helloV := func(role string, dial func(net.Conn, string) (*client, wire.Response, error)) wire.Response {
		t.Helper()
		c, err := tls.Dial("tcp", addr[role], &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatalf("%s: %v", role, err)
		}
		defer c.Close()
		_, r, err := dial(c, ex["TICKETING_TOKEN"])
		if err != nil {
			t.Fatalf("%s: HELLO: %v", role, err)
		}
		return r
	}
	hello := func(role string) wire.Response { t.Helper(); return helloV(role, dialRaw) }
	// The active's version-3 HELLO_OK carries the pair's identity: the
	// pair-id init wrote into both configs, the printed URL's cluster=.
	pairID := urlCluster(t, ex["TICKETING_URL"])
	helloV3 := func(role string) {
		t.Helper()
		if r := helloV(role, dialRawV3); r.Type != wire.TypeHelloOK || r.Version != wire.Version3 || r.Role != wire.RoleActive ||
			string(r.Node) != role || string(r.Cluster) != pairID {
			t.Errorf("%s answers a version-3 HELLO with %c version %d role %d node %q cluster %q, want O version 3 role %d node %s cluster %s",
				role, r.Type, r.Version, r.Role, r.Node, r.Cluster, wire.RoleActive, role, pairID)
		}
	}
	// The pair settles: read from /status, as an operator would check it
	// before relying on the pair (a HELLO would be a client request).
	status := func(role string) (int, string, *server.PairStatus) {
		t.Helper()
		port := ports[2]
		if role == "backup" {
			port++
		}
		code, body := adminDo(t, "GET", "http://127.0.0.1:"+strconv.Itoa(port)+"/status", "Bearer "+ex["TICKETING_ADMIN_TOKEN"], "")
		var st struct{ Pair *server.PairStatus }
		if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
			return code, body, nil
		}
		return code, body, st.Pair
	}
	deadline := time.Now().Add(time.Minute) // a hang guard
	for {
		_, _, ps := status("primary")
		code, body, bs := status("backup")
		if ps != nil && bs != nil && ps.State == "ACTIVE" && ps.Serving && ps.Replicating && bs.State == "PASSIVE" && bs.HasState {
			if bs.PeerAdvertise != addr["primary"] {
				t.Errorf("the passive backup names %q as the active, want the primary's advertise address %s", bs.PeerAdvertise, addr["primary"])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pair did not settle (primary %+v): backup %d %s", ps, code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := hello("primary"); r.Type != wire.TypeHelloOK || r.Role != wire.RoleActive {
		t.Errorf("primary answers HELLO with %c role %d, want O role %d", r.Type, r.Role, wire.RoleActive)
	}
	helloV3("primary")
	toPrimary := cfg
	toPrimary.Addrs = cfg.Addrs[:1]
	first := lockOnce(t, toPrimary)
	if _, _, bs := status("backup"); bs == nil || bs.State != "PASSIVE" || bs.Serving {
		t.Fatalf("the backup before the primary's kill: %+v, want PASSIVE (no client came to it)", bs)
	}
	// 'ticketingd pair status' given both admin addresses: both views,
	// and which node is active.
	admins := map[string]string{"primary": "127.0.0.1:" + strconv.Itoa(ports[2]), "backup": "127.0.0.1:" + strconv.Itoa(ports[2]+1)}
	code, out, stderr = runCapture(t, "pair", "status", "--admin", admins["backup"]+","+admins["primary"], "--admin-token", ex["TICKETING_ADMIN_TOKEN"])
	if code != 0 || !strings.Contains(out, "node at "+admins["primary"]+": primary, ACTIVE, serving clients (token epoch ") ||
		!strings.Contains(out, "node at "+admins["backup"]+": backup, PASSIVE, not serving clients") ||
		strings.Count(out, "pair "+pairID+"\n") != 2 || strings.Count(out, ": alive, state ") != 2 ||
		!strings.Contains(out, "replication: streaming to the passive") ||
		!strings.Contains(out, "active: the node at "+admins["primary"]+" (primary)") {
		t.Errorf("pair status: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCapture(t, "pair", "status", "--json", "--admin", admins["primary"], "--admin-token", ex["TICKETING_ADMIN_TOKEN"])
	var ps server.PairStatus
	if code != 0 || json.Unmarshal([]byte(out), &ps) != nil || ps.ID != pairID || ps.State != "ACTIVE" || !ps.PeerAlive {
		t.Errorf("pair status --json: exit %d\n%s%s", code, out, stderr)
	}
	if code, _, stderr = runCapture(t, "cluster", "status", "--admin", admins["primary"], "--admin-token", ex["TICKETING_ADMIN_TOKEN"]); code != 1 ||
		!strings.Contains(stderr, "use 'ticketingd pair status'") {
		t.Errorf("cluster status of a pair node: exit %d: %s", code, stderr)
	}

	if err := nodes["primary"].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-nodes["primary"].done
	// The broker comes to the backup after the primary is gone; the
	// backup, its peer silent for two heartbeats, takes over.
	defer func() {
		if t.Failed() {
			t.Logf("primary log:\n%s\nbackup log:\n%s", nodes["primary"].stderr.String(), nodes["backup"].stderr.String())
		}
	}()
	if second := lockOnce(t, cfg); second <= first {
		t.Errorf("token %d on the backup after the failover, want above the primary's %d", second, first)
	}
	if r := hello("backup"); r.Type != wire.TypeHelloOK || r.Role != wire.RoleActive {
		t.Errorf("backup after the failover answers HELLO with %c role %d, want O role %d", r.Type, r.Role, wire.RoleActive)
	}
	helloV3("backup")
	if err := nodes["backup"].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := nodes["backup"].exitCode(); code != 0 {
		t.Errorf("backup: exit %d after SIGTERM:\n%s", code, nodes["backup"].stderr.String())
	}
}
