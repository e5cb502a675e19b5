package main

import (
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

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

// TestPairUsageErrors: every refusal of the pair settings of serve, with
// its message and exit code.
func TestPairUsageErrors(t *testing.T) {
	noPair := writeTemp(t, "nopair.yaml", "peer-listen: 127.0.0.1:7001\n", 0o644)
	badRole := writeTemp(t, "badrole.yaml", "pair: leader\npeer: 127.0.0.1:7002\npeer-listen: 127.0.0.1:7001\n", 0o644)
	pairCluster := writeTemp(t, "paircluster.yaml", "pair: backup\ncluster: true\n", 0o644)
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
		{"pair heartbeat below minimum", pairArgs("--heartbeat", "99ms"), 2, []string{"invalid --heartbeat 99ms: must be at least 100ms"}},
		{"pair heartbeat zero", pairArgs("--heartbeat", "0s"), 2, []string{"invalid --heartbeat 0s: must be at least 100ms"}},
		{"pair heartbeat negative", pairArgs("--heartbeat", "-1s"), 2, []string{"invalid --heartbeat -1s: must be at least 100ms"}},
		{"pair peer tls incomplete", pairArgs("--peer-tls-cert", "node.pem", "--peer-tls-key", "node-key.pem"), 2, []string{"--peer-tls-cert, --peer-tls-key and --peer-tls-ca must be given together"}},
		{"pair peer tls files missing", pairArgs("--peer-tls-cert", "/nonexistent/node.pem", "--peer-tls-key", "/nonexistent/node-key.pem", "--peer-tls-ca", "/nonexistent/ca.pem"), 1, []string{"/nonexistent/node.pem"}},
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
		o, err := parseServe(t, "--pair", "primary", "--peer", "10.0.0.2:7225", "--peer-listen", "10.0.0.1:7225", "--listen", tc.listen)
		if err != nil {
			t.Fatal(err)
		}
		want := &server.PairConfig{Role: server.PairPrimary, Peer: "10.0.0.2:7225", Listen: "10.0.0.1:7225", Advertise: tc.advertise,
			Heartbeat: server.DefaultPairHeartbeat}
		if pc := pairConfig(o, bound, nil); !reflect.DeepEqual(pc, want) {
			t.Errorf("--listen %s: PairConfig\n got  %+v\n want %+v", tc.listen, pc, want)
		}
	}
}
