package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/deploy"
	"github.com/ticketing-dev/ticketing/internal/raftnet"
	"github.com/ticketing-dev/ticketing/server"
)

// unwritable is a data directory or init --dir that cannot be created,
// not even by root: a case that were let through by a bug ends at once
// (exit 1) instead of serving until the test times out, or writing a
// deployment.
const unwritable = "/dev/null/never"

// serveArgs is 'serve' on a port the kernel picks and an unwritable data
// directory, then extra (where the last flag given wins).
func serveArgs(extra ...string) []string {
	return append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", unwritable}, extra...)
}

// pairArgs is a valid 'serve --pair' command line, to which a case adds
// or overrides flags.
func pairArgs(extra ...string) []string {
	return serveArgs(append([]string{"--pair", "primary", "--peer", "127.0.0.1:7002", "--peer-listen", "127.0.0.1:7001"}, extra...)...)
}

// TestPairUsageErrors: every refusal of the pair settings of serve and
// init, with its message and exit code.
func TestPairUsageErrors(t *testing.T) {
	noPair := writeTemp(t, "nopair.yaml", "peer-listen: 127.0.0.1:7001\n", 0o644)
	badRole := writeTemp(t, "badrole.yaml", "pair: leader\npeer: 127.0.0.1:7002\npeer-listen: 127.0.0.1:7001\n", 0o644)
	pairCluster := writeTemp(t, "paircluster.yaml", "pair: backup\ncluster: true\n", 0o644)
	plainOff := writeTemp(t, "plain.yaml", "pair: primary\npeer: 10.0.0.2:7002\npeer-listen: 127.0.0.1:7001\n", 0o644)
	shortBeat := writeTemp(t, "beat.yaml", "pair: backup\npeer: 127.0.0.1:7002\npeer-listen: 127.0.0.1:7001\nheartbeat: 20ms\n", 0o644)
	runUsageCases(t, []usageCase{
		// serve --pair.
		{"pair bad role", pairArgs("--pair", "leader"), 2, []string{`invalid --pair "leader": want primary or backup`}},
		{"pair without peer", serveArgs("--pair", "primary", "--peer-listen", "127.0.0.1:7001"), 2, []string{"--pair needs --peer,"}},
		{"pair without peer listen", serveArgs("--pair", "backup", "--peer", "127.0.0.1:7002"), 2, []string{"--pair needs --peer-listen,"}},
		{"pair peer no port", pairArgs("--peer", "127.0.0.1"), 2, []string{`invalid --peer "127.0.0.1": want HOST:PORT`}},
		{"pair peer port 0", pairArgs("--peer", "127.0.0.1:0"), 2, []string{`invalid --peer "127.0.0.1:0": want a port 1..65535`}},
		{"pair peer wildcard", pairArgs("--peer", "0.0.0.0:7002"), 2, []string{`invalid --peer "0.0.0.0:7002": want a specific host`}},
		{"pair peer listen no port", pairArgs("--peer-listen", "127.0.0.1"), 2, []string{`invalid --peer-listen "127.0.0.1": want HOST:PORT`}},
		{"pair peer listen port 0", pairArgs("--peer-listen", "127.0.0.1:0"), 2, []string{`invalid --peer-listen "127.0.0.1:0": want a port 1..65535`}},
		{"pair peer is itself", pairArgs("--peer", "127.0.0.1:7001"), 2, []string{`--peer "127.0.0.1:7001" is this node's own --peer-listen`}},
		{"pair advertise required", pairArgs("--listen", "0.0.0.0:5225"), 2, []string{"--pair needs --advertise", `--listen "0.0.0.0:5225" is not a specific address`}},
		{"pair advertise required for ::", pairArgs("--listen", "[::]:5225"), 2, []string{"--pair needs --advertise"}},
		{"pair advertise wildcard", pairArgs("--advertise", ":5225"), 2, []string{`invalid --advertise ":5225"`}},
		{"pair advertise too long", pairArgs("--advertise", strings.Repeat("h", 250)+".test:5225"), 2, []string{"--advertise is longer than 255 bytes"}},
		{"pair id invalid", pairArgs("--pair-id", "a/b"), 2, []string{`invalid --pair-id "a/b": want 1 to 64 letters, digits, '.', '_' or '-'`}},
		{"pair id too long", pairArgs("--pair-id", strings.Repeat("a", 65)), 2, []string{"invalid --pair-id", "want 1 to 64 letters"}},
		{"pair id without pair", serveArgs("--pair-id", "p1"), 2, []string{"--pair-id needs --pair (it is a pair node's setting)"}},
		{"peer max conns without pair", serveArgs("--peer-max-conns", "8"), 2, []string{"--peer-max-conns needs --pair"}},
		{"negative peer max conns", pairArgs("--peer-max-conns-per-source", "-1"), 2, []string{"--peer-max-conns-per-source", ">= 0"}},
		{"pair id with cluster", serveArgs("--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--pair-id", "p1"), 2, []string{"--pair-id needs --pair"}},
		{"pair heartbeat below minimum", pairArgs("--heartbeat", "99ms"), 2, []string{"invalid --heartbeat 99ms: must be at least 100ms"}},
		{"pair heartbeat zero", pairArgs("--heartbeat", "0s"), 2, []string{"invalid --heartbeat 0s: must be at least 100ms"}},
		{"pair heartbeat negative", pairArgs("--heartbeat", "-1s"), 2, []string{"invalid --heartbeat -1s: must be at least 100ms"}},
		{"pair peer tls incomplete", pairArgs("--peer-tls-cert", "node.pem", "--peer-tls-key", "node-key.pem"), 2, []string{"--peer-tls-cert, --peer-tls-key and --peer-tls-ca must be given together"}},
		{"pair peer tls files missing", pairArgs("--peer-tls-cert", "/nonexistent/node.pem", "--peer-tls-key", "/nonexistent/node-key.pem", "--peer-tls-ca", "/nonexistent/ca.pem"), 1, []string{"/nonexistent/node.pem"}},
		{"pair plaintext, peer off loopback", pairArgs("--peer", "10.0.0.2:7002"), 2, []string{`--peer "10.0.0.2:7002" is not a loopback address and the peer link is plain TCP`, "--peer-plaintext"}},
		{"pair plaintext, peer listen off loopback", pairArgs("--peer-listen", "0.0.0.0:7001"), 2, []string{`--peer-listen "0.0.0.0:7001" is not a loopback address and the peer link is plain TCP`}},
		{"pair plaintext with peer tls", pairArgs("--peer-plaintext", "--peer-tls-cert", "node.pem", "--peer-tls-key", "node-key.pem", "--peer-tls-ca", "ca.pem"), 2, []string{"--peer-plaintext and --peer-tls-cert exclude each other"}},
		{"config plaintext off loopback", serveArgs("--config", plainOff), 2, []string{`peer in config file ` + plainOff + ` "10.0.0.2:7002" is not a loopback address`}},
		{"peer plaintext without pair", serveArgs("--peer-plaintext"), 2, []string{"--peer-plaintext needs --pair"}},
		{"pair and cluster", pairArgs("--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7003"), 2, []string{"--pair and --cluster exclude each other"}},
		{"pair and standby", pairArgs("--standby"), 2, []string{"--standby and --pair exclude each other"}},
		{"pair and standby hint", pairArgs("--standby-hint", "x:1"), 2, []string{"--standby-hint and --pair exclude each other"}},
		{"pair with a cluster setting", pairArgs("--raft-listen", "127.0.0.1:7003"), 2, []string{"--raft-listen needs --cluster"}},
		{"pair with peers", pairArgs("--peers", "n1=127.0.0.1:7003"), 2, []string{"--peers needs --cluster"}},
		{"peer without pair", serveArgs("--peer", "127.0.0.1:7002"), 2, []string{"--peer needs --pair (it is a pair node's setting)"}},
		{"peer listen without pair", serveArgs("--peer-listen", "127.0.0.1:7001"), 2, []string{"--peer-listen needs --pair"}},
		{"heartbeat without pair", serveArgs("--heartbeat", "2s"), 2, []string{"--heartbeat needs --pair"}},
		{"peer with cluster", serveArgs("--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peer", "127.0.0.1:7002"), 2, []string{"--peer needs --pair"}},
		{"heartbeat with cluster", serveArgs("--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--heartbeat", "2s"), 2, []string{"--heartbeat needs --pair"}},
		{"advertise without a mode", serveArgs("--advertise", "127.0.0.1:5225"), 2, []string{"--advertise needs --cluster or --pair"}},
		{"peer tls without a mode", serveArgs("--peer-tls-cert", "node.pem"), 2, []string{"--peer-tls-cert needs --cluster or --pair"}},
		{"config pair key without pair", serveArgs("--config", noPair), 2, []string{"peer-listen in config file " + noPair + " needs --pair"}},
		{"config bad role", serveArgs("--config", badRole), 2, []string{"invalid pair in config file " + badRole + ` "leader": want primary or backup`}},
		{"config pair and cluster", serveArgs("--config", pairCluster), 2, []string{"pair in config file " + pairCluster + " and cluster in config file " + pairCluster + " exclude each other"}},
		{"config short heartbeat", serveArgs("--config", shortBeat), 2, []string{"invalid heartbeat in config file " + shortBeat + " 20ms: must be at least 100ms"}},

		// init --pair.
		{"init pair without nodes", []string{"init", "--pair", "--dir", "/dev/null/d"}, 2, []string{"--pair needs its two nodes, --node primary=HOST and --node backup=HOST: primary is missing"}},
		{"init pair without backup", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=127.0.0.1"}, 2, []string{"backup is missing"}},
		{"init pair other name", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=127.0.0.1", "--node", "n2=127.0.0.1"}, 2, []string{`invalid --node "n2=127.0.0.1": the nodes of a pair are primary and backup`}},
		{"init pair no equals", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary"}, 2, []string{`invalid --node "primary": want primary=HOST or backup=HOST`}},
		{"init pair twice", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=127.0.0.1", "--node", "primary=127.0.0.2"}, 2, []string{"--node primary is given twice"}},
		{"init pair three nodes", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=h1", "--node", "backup=h2", "--node", "backup=h3"}, 2, []string{"--node backup is given twice"}},
		{"init pair host with port", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=127.0.0.1:5225", "--node", "backup=127.0.0.1"}, 2, []string{`invalid --node "primary=127.0.0.1:5225"`}},
		{"init pair mixed hosts", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=127.0.0.1", "--node", "backup=10.0.0.2"}, 2, []string{"mix loopback"}},
		{"init pair and cluster", []string{"init", "--pair", "--cluster", "--dir", "/dev/null/d", "--node", "primary=h1", "--node", "backup=h2"}, 2, []string{"--cluster and --pair exclude each other"}},
		{"init pair and host", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=h1", "--node", "backup=h2", "--host", "x"}, 2, []string{"--host and --pair exclude each other"}},
		{"init pair and listen", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=h1", "--node", "backup=h2", "--listen", "h1:5225"}, 2, []string{"--listen and --pair exclude each other"}},
		{"init pair raft port", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=h1", "--node", "backup=h2", "--raft-port", "7000"}, 2, []string{"--raft-port needs --cluster"}},
		{"init pair add", []string{"init", "--pair", "--add", "--dir", "/dev/null/d", "--node", "primary=h1", "--node", "backup=h2"}, 2, []string{"--add needs --cluster"}},
		{"init pair same ports", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=h1", "--node", "backup=h2", "--port", "7000", "--peer-port", "7000"}, 2, []string{"--port, --peer-port and --admin-port must differ"}},
		{"init pair bad peer port", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=h1", "--node", "backup=h2", "--peer-port", "70000"}, 2, []string{"invalid --peer-port 70000: want 1..65535"}},
		{"init pair port clash", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=127.0.0.1", "--node", "backup=127.0.0.1", "--port", "7000", "--peer-port", "7001"}, 2, []string{"backup's client port 7001 on 127.0.0.1 is also primary's peer port", "choose --port, --peer-port and --admin-port further apart"}},
		{"init pair port overflow", []string{"init", "--pair", "--dir", "/dev/null/d", "--node", "primary=h", "--node", "backup=h", "--peer-port", "65535"}, 2, []string{"too many nodes on h for the ports from --port, --peer-port and --admin-port: backup's peer port would be 65536"}},
		{"init peer port without pair", []string{"init", "--dir", "/dev/null/d", "--peer-port", "7000"}, 2, []string{"--peer-port needs --pair"}},
		{"init cluster peer port", []string{"init", "--cluster", "--dir", "/dev/null/d", "--node", "n1=h", "--peer-port", "7000"}, 2, []string{"--peer-port needs --pair"}},
		{"init admin port without a mode", []string{"init", "--dir", "/dev/null/d", "--admin-port", "9000"}, 2, []string{"--admin-port needs --cluster or --pair"}},
	})
}

// TestPairConfigFile: the pair settings from a config file (paths
// relative to the file) and flags over them, and the server.PairConfig
// serve builds from them.
func TestPairConfigFile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "backup.yaml")
	content := `listen: "127.0.0.1:0"
pair: backup
peer: "locks-a.test:7225"
peer-listen: "0.0.0.0:7225"
heartbeat: 250ms
pair-id: locks.pair-1_A
advertise: "locks-b.test:5225"
peer-tls-cert: node.pem
peer-tls-key: node-key.pem
peer-tls-ca: /etc/ticketing/ca.pem
`
	if err := os.WriteFile(cfg, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseServe(t, "--config", cfg, "--heartbeat", "400ms")
	if err != nil {
		t.Fatal(err)
	}
	if o.PeerTLSCert != filepath.Join(dir, "node.pem") || o.PeerTLSKey != filepath.Join(dir, "node-key.pem") || o.PeerTLSCA != "/etc/ticketing/ca.pem" {
		t.Errorf("peer TLS paths: %q %q %q", o.PeerTLSCert, o.PeerTLSKey, o.PeerTLSCA)
	}
	bound := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 43210}
	want := &server.PairConfig{
		Role:      server.PairBackup,
		ID:        "locks.pair-1_A",
		Peer:      "locks-a.test:7225",
		Listen:    "0.0.0.0:7225",
		Advertise: "locks-b.test:5225",
		Heartbeat: 400 * time.Millisecond, // the flag wins
	}
	if pc := pairConfig(o, bound, nil); !reflect.DeepEqual(pc, want) {
		t.Errorf("PairConfig\n got  %+v\n want %+v", pc, want)
	}

	// Defaults: --advertise is --listen as given (with port 0, the bound
	// address), --heartbeat the server's default.
	for _, tc := range []struct{ listen, advertise string }{
		{"locks-a.test:5225", "locks-a.test:5225"},
		{"127.0.0.1:0", "127.0.0.1:43210"},
	} {
		o, err := parseServe(t, "--pair", "primary", "--peer", "10.0.0.2:7225", "--peer-listen", "10.0.0.1:7225", "--listen", tc.listen, "--peer-plaintext")
		if err != nil {
			t.Fatal(err)
		}
		want := &server.PairConfig{Role: server.PairPrimary, Peer: "10.0.0.2:7225", Listen: "10.0.0.1:7225", Advertise: tc.advertise,
			Heartbeat: server.DefaultPairHeartbeat, PeerPlaintext: true}
		if pc := pairConfig(o, bound, nil); !reflect.DeepEqual(pc, want) {
			t.Errorf("--listen %s: PairConfig\n got  %+v\n want %+v", tc.listen, pc, want)
		}
	}
}

// TestPairStartLogAttrs: the "listening" line of a pair node names its
// settings, and of its peer TLS only whether it is on.
func TestPairStartLogAttrs(t *testing.T) {
	dir := t.TempDir()
	if code, _, stderr := runCapture(t, "init", "--pair", "--dir", dir, "--node", "primary=127.0.0.1", "--node", "backup=127.0.0.1"); code != 0 {
		t.Fatalf("init --pair: exit %d: %s", code, stderr)
	}
	o, err := parseServe(t, "--config", filepath.Join(dir, "backup", initConfigFile), "--heartbeat", "300ms")
	if err != nil {
		t.Fatal(err)
	}
	pt, err := loadPeerTLS(o)
	if err != nil || pt == nil {
		t.Fatalf("peer TLS %v: %v", pt, err)
	}
	cfg := server.Config{Pair: pairConfig(o, nil, pt)}
	got := map[string]any{}
	attrs := modeAttrs(&cfg)
	for i := 0; i+1 < len(attrs); i += 2 {
		got[attrs[i].(string)] = attrs[i+1]
	}
	want := map[string]any{"pair": "backup", "peer": "127.0.0.1:7225", "peer_listen": "127.0.0.1:7226", "advertise": "127.0.0.1:5226",
		"heartbeat": "300ms", "peer_tls": true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("listening attributes of a pair node %v, want %v", got, want)
	}
	if attrs := modeAttrs(&server.Config{}); len(attrs) != 0 {
		t.Errorf("a standalone node's listening line has mode attributes %v", attrs)
	}
}

// TestInitPair writes a pair bundle on one host (the backup named first)
// and checks it as 'serve --config' and the peer link will read it: the
// files and their modes, each config parsed through the loader serve uses
// and mapped to the PairConfig of its role (the peer of each is the
// other's peer-listen; the primary has the base ports), its client and
// peer TLS load, the certificates verify for the host with both usages, a
// TLS handshake of the peer link between the two nodes' files succeeds,
// and the printed lines, run through sh, give a TICKETING_URL with the
// primary's and the backup's client addresses.
func TestInitPair(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("runs the printed export lines with sh")
	}
	dir := filepath.Join(t.TempDir(), "pa ir")
	code, out, stderr := runCapture(t, "init", "--pair", "--dir", dir, "--node", "backup=127.0.0.1", "--node", "primary=127.0.0.1",
		"--port", "16000", "--peer-port", "17000", "--admin-port", "19000")
	if code != 0 {
		t.Fatalf("init --pair: exit %d: %s", code, stderr)
	}
	if stderr != "" {
		t.Errorf("init --pair warns:\n%s", stderr)
	}
	modes := map[string]os.FileMode{initCACert: 0o644, initCAKey: 0o600, initAdminTokenFile: 0o600, initTokensFile: 0o600,
		// The files for service managers (internal/deploy).
		deploy.ReadmeFile: 0o644, deploy.DockerfileFile: 0o644, deploy.DockerIgnore: 0o644, deploy.ComposeFile: 0o644}
	for _, id := range pairRoles {
		for name, perm := range map[string]os.FileMode{initConfigFile: 0o600, initTokensFile: 0o600, initNodeCert: 0o644, initNodeKey: 0o600,
			initCACert: 0o644, initDataDir: 0o700 | os.ModeDir, deploy.NodeUnitFile(id): 0o644} {
			modes[filepath.Join(id, name)] = perm
		}
	}
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var wantFiles []string
	for name, perm := range modes {
		if !perm.IsDir() {
			wantFiles = append(wantFiles, name)
		}
	}
	slices.Sort(wantFiles)
	if !slices.Equal(files, wantFiles) {
		t.Errorf("bundle files %v, want %v", files, wantFiles)
	}
	for name, perm := range modes {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
			continue
		}
		if st.Mode() != perm {
			t.Errorf("%s: mode %v, want %v", name, st.Mode(), perm)
		}
	}

	ex := clusterExports(t, out)
	adminToken, err := os.ReadFile(filepath.Join(dir, initAdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if ex["TICKETING_ADMIN_TOKEN"] != strings.TrimSpace(string(adminToken)) {
		t.Errorf("printed admin token %q, file %q", ex["TICKETING_ADMIN_TOKEN"], adminToken)
	}
	if strings.Count(out, ex["TICKETING_TOKEN"]) != 1 {
		t.Errorf("client token printed %d times, want once:\n%s", strings.Count(out, ex["TICKETING_TOKEN"]), out)
	}
	u, err := parseURL(t, ex["TICKETING_URL"])
	if err != nil {
		t.Fatalf("ParseURL(printed URL %q): %v", ex["TICKETING_URL"], err)
	}
	// The URL names the pair's identity, the pair-id of both nodes'
	// configs (checked below): what a version-3 HELLO_OK carries.
	pairID := urlCluster(t, ex["TICKETING_URL"])
	if !reGroupID.MatchString(pairID) || !strings.HasSuffix(ex["TICKETING_URL"], "&cluster="+pairID) {
		t.Errorf("printed URL %q: cluster=%q, want the bundle's pair ID last", ex["TICKETING_URL"], pairID)
	}
	if !slices.Equal(u.Addrs, []string{"127.0.0.1:16000", "127.0.0.1:16001"}) || u.Token != ex["TICKETING_TOKEN"] ||
		u.TLS.Mode != broker.TLSCAFile || u.TLS.CAFile != filepath.Join(dir, initCACert) {
		t.Errorf("printed URL gives %v token ok %v TLS %+v", u.Addrs, u.Token == ex["TICKETING_TOKEN"], u.TLS)
	}
	serveCmds := regexp.MustCompile(`(?m)^    ticketingd serve --config (.+)$`).FindAllStringSubmatch(out, -1)
	if len(serveCmds) != 2 {
		t.Fatalf("want 2 serve commands in:\n%s", out)
	}
	for i, m := range serveCmds {
		want := filepath.Join(dir, pairRoles[i], initConfigFile)
		if got, err := exec.Command("sh", "-c", "printf %s "+m[1]).Output(); err != nil || string(got) != want {
			t.Errorf("serve command %d names %q (%v), want %q", i+1, got, err, want)
		}
	}
	if !strings.Contains(out, "/status") || strings.Contains(out, "cluster status") {
		t.Errorf("the admin line of a pair bundle is not a /status request:\n%s", out)
	}

	ca := certPool(t, filepath.Join(dir, initCACert))
	wantPC := map[string]*server.PairConfig{
		"primary": {Role: server.PairPrimary, ID: pairID, Peer: "127.0.0.1:17001", Listen: "127.0.0.1:17000", Advertise: "127.0.0.1:16000", Heartbeat: server.DefaultPairHeartbeat},
		"backup":  {Role: server.PairBackup, ID: pairID, Peer: "127.0.0.1:17000", Listen: "127.0.0.1:17001", Advertise: "127.0.0.1:16001", Heartbeat: server.DefaultPairHeartbeat},
	}
	peerTLS := map[string]*raftnet.PeerTLS{}
	for i, id := range pairRoles {
		nd := filepath.Join(dir, id)
		cfgText, err := os.ReadFile(filepath.Join(nd, initConfigFile))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(cfgText), deploy.TokenStartComment+"token-start: clock\n") {
			t.Errorf("%s: the config lacks token-start: clock with init's comment:\n%s", id, cfgText)
		}
		o, err := parseServe(t, "--config", filepath.Join(nd, initConfigFile))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if o.Pair != id || o.Cluster || o.NodeName != id || o.Listen != fmt.Sprintf("127.0.0.1:%d", 16000+i) || o.AdminListen != fmt.Sprintf("127.0.0.1:%d", 19000+i) ||
			o.AdminToken != ex["TICKETING_ADMIN_TOKEN"] || o.DataDir != filepath.Join(nd, initDataDir) || o.TokenStart != "clock" ||
			o.TLSCert != filepath.Join(nd, initNodeCert) || o.TLSKey != filepath.Join(nd, initNodeKey) ||
			o.PeerTLSCert != filepath.Join(nd, initNodeCert) || o.PeerTLSKey != filepath.Join(nd, initNodeKey) || o.PeerTLSCA != filepath.Join(nd, initCACert) {
			t.Errorf("%s: options %+v", id, *o)
		}
		tokens, _, err := readTokensFile(o.ClientTokensFile)
		if err != nil || !slices.Equal(tokens, []string{ex["TICKETING_TOKEN"]}) {
			t.Errorf("%s: client tokens %q (%v)", id, tokens, err)
		}
		if _, err := loadTLS(o); err != nil {
			t.Errorf("%s: client TLS: %v", id, err)
		}
		pt, err := loadPeerTLS(o)
		if err != nil || pt == nil {
			t.Fatalf("%s: peer TLS %v: %v", id, pt, err)
		}
		pc := pairConfig(o, nil, pt)
		if pc.PeerCertificate == nil || pc.PeerRoots == nil {
			t.Errorf("%s: PairConfig without peer TLS", id)
		}
		pc.PeerCertificate, pc.PeerRoots = nil, nil
		if !reflect.DeepEqual(pc, wantPC[id]) {
			t.Errorf("%s: PairConfig\n got  %+v\n want %+v", id, pc, wantPC[id])
		}
		if peerTLS[id], err = raftnet.LoadPeerTLS(o.PeerTLSCert, o.PeerTLSKey, o.PeerTLSCA); err != nil {
			t.Fatalf("%s: %v", id, err)
		}

		// The node certificate: the CA's, for the node's host, good for
		// the client listener (server auth) and the peer link (both).
		node := readCert(t, filepath.Join(nd, initNodeCert))
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := node.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: ca, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("%s: node certificate for usage %v: %v", id, usage, err)
			}
		}
		if _, err := node.Verify(x509.VerifyOptions{DNSName: "127.0.0.2", Roots: ca}); err == nil {
			t.Errorf("%s: node certificate valid for another host", id)
		}
		for _, name := range []string{initCAKey, initClusterCACert, initServerCert} {
			if _, err := os.Stat(filepath.Join(nd, name)); err == nil {
				t.Errorf("%s is in %s's directory", name, id)
			}
		}
	}

	// The peer link, as the nodes make it: each dials the other, checking
	// its certificate names the host of --peer, and each presents its
	// node certificate.
	for _, dial := range [][2]string{{"primary", "backup"}, {"backup", "primary"}} {
		if err := peerHandshake(peerTLS[dial[0]], peerTLS[dial[1]], "127.0.0.1"); err != nil {
			t.Errorf("%s dialling %s: %v", dial[0], dial[1], err)
		}
	}
	if err := peerHandshake(peerTLS["primary"], peerTLS["backup"], "127.0.0.2"); err == nil {
		t.Error("peer link to 127.0.0.2 accepts a certificate for 127.0.0.1")
	}

	// No overwrite without --force; --force writes new keys and tokens.
	args := []string{"init", "--pair", "--dir", dir, "--node", "primary=127.0.0.1", "--node", "backup=127.0.0.1"}
	if code, _, stderr = runCapture(t, args...); code != 1 || !strings.Contains(stderr, "--force") {
		t.Errorf("second init: exit %d, %s", code, stderr)
	}
	code, out2, stderr := runCapture(t, append(args, "--force")...)
	if code != 0 {
		t.Fatalf("init --pair --force: exit %d: %s", code, stderr)
	}
	if strings.Contains(out2, ex["TICKETING_TOKEN"]) || strings.Contains(out2, ex["TICKETING_ADMIN_TOKEN"]) {
		t.Error("init --pair --force reused a token")
	}
	if strings.Contains(out2, pairID) {
		t.Error("init --pair --force reused the pair ID")
	}
	if _, err := readCert(t, filepath.Join(dir, "primary", initNodeCert)).Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: ca}); err == nil {
		t.Error("init --pair --force kept the CA")
	}
}

// peerHandshake runs the TLS handshake of the peer link from client to
// server over a loopback TCP connection, the client dialling host; the
// error is the client's, else the server's.
func peerHandshake(client, server *raftnet.PeerTLS, host string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // used at once
	if err != nil {
		return err
	}
	defer ln.Close()
	srvErr := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer c.Close()
		srvErr <- tls.Server(c, server.ServerConfig()).Handshake()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	cerr := tls.Client(c, client.ClientConfig(host)).Handshake()
	if cerr != nil {
		c.Close() // the server's handshake ends too
	}
	serr := <-srvErr
	if cerr != nil {
		return cerr
	}
	return serr
}

// TestInitPairRemote: nodes on separate hosts both get the base ports and
// certificates for their own host, and the printed lines say how to copy
// each node's directory to its machine.
func TestInitPairRemote(t *testing.T) {
	dir := t.TempDir()
	code, out, stderr := runCapture(t, "init", "--pair", "--dir", dir, "--node", "primary=10.0.0.1", "--node", "backup=locks-b.example.test")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	ca := certPool(t, filepath.Join(dir, initCACert))
	nodes := []struct{ id, host, listen, peer string }{
		{"primary", "10.0.0.1", "10.0.0.1:5225", "locks-b.example.test:7225"},
		{"backup", "locks-b.example.test", "locks-b.example.test:5225", "10.0.0.1:7225"},
	}
	for _, n := range nodes {
		o, err := parseServe(t, "--config", filepath.Join(dir, n.id, initConfigFile))
		if err != nil {
			t.Fatalf("%s: %v", n.id, err)
		}
		if o.Listen != n.listen || o.Advertise != n.listen || o.PeerListen != strings.TrimSuffix(n.listen, "5225")+"7225" || o.Peer != n.peer ||
			o.AdminListen != "127.0.0.1:9225" {
			t.Errorf("%s: options %+v", n.id, *o)
		}
		node := readCert(t, filepath.Join(dir, n.id, initNodeCert))
		if _, err := node.Verify(x509.VerifyOptions{DNSName: n.host, Roots: ca, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s: node certificate for %s: %v", n.id, n.host, err)
		}
		if !strings.Contains(out, "ticketingd serve --config ticketing-"+n.id+"/"+initConfigFile+"    # on "+n.host) {
			t.Errorf("no serve line for %s in:\n%s", n.id, out)
		}
		if !strings.Contains(out, "scp -rp "+filepath.Join(dir, n.id)+" "+n.host+":ticketing-"+n.id) {
			t.Errorf("no scp line for %s in:\n%s", n.id, out)
		}
	}
	for _, w := range []string{"@10.0.0.1:5225,locks-b.example.test:5225?ca=", "(ca-key.pem stays here,", "A client on another machine needs a copy of"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}
