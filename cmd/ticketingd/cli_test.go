package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/ticketing-dev/ticketing/server"
)

func runCapture(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(t.Context(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersion(t *testing.T) {
	code, out, _ := runCapture(t, "version")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.HasPrefix(out, "ticketingd ") || !strings.Contains(out, "\nrevision: ") || !strings.Contains(out, runtime.Version()) {
		t.Errorf("version output:\n%s", out)
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"serve", "--help"}, {"init", "--help"}, {"version", "--help"},
		{"cluster", "--help"}, {"cluster", "status", "--help"}, {"cluster", "add", "--help"}, {"cluster", "remove", "--help"},
		{"locks", "--help"}, {"locks", "list", "--help"}, {"locks", "show", "--help"}, {"locks", "expire", "--help"},
		{"pair", "--help"}, {"pair", "status", "--help"}} {
		code, out, _ := runCapture(t, args...)
		if code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("%v: exit %d, output:\n%s", args, code, out)
		}
	}
	_, out, _ := runCapture(t, "serve", "--help")
	for _, flag := range []string{"--listen", "--data-dir", "--client-token", "--client-tokens-file", "--tls-cert", "--tls-key",
		"--tls-client-ca", "--max-locks", "--max-waiters", "--max-key-waiters", "--max-sessions", "--max-sessions-per-peer", "--max-pending-conns", "--idle-timeout", "--socket-buffer", "--write-timeout", "--admin-listen",
		"--log-level", "--log-format", "--config", "--node-name", "--standby", "--standby-hint", "--shutdown-timeout", "--token-block", "--initial-token", "--token-start", "--owned-release-only",
		"--admin-token", "--console-keys", "--cluster", "--node-id", "--raft-listen", "--raft-advertise", "--advertise", "--peers", "--peer-tls-cert", "--peer-tls-key", "--peer-tls-ca",
		"--raft-heartbeat", "--raft-election", "--early-release", "--committed-release", "--max-session-proposals", "--max-proposals",
		"--pair primary|backup", "--peer address", "--peer-listen address", "--heartbeat duration", "at least 100ms", "--peer-plaintext"} {
		if !strings.Contains(out, flag) {
			t.Errorf("serve --help lacks %s", flag)
		}
	}
	_, out, _ = runCapture(t, "init", "--help")
	for _, flag := range []string{"--cluster", "--node", "--raft-port", "--admin-port", "--pair", "--peer-port", "--node primary=HOST --node backup=HOST"} {
		if !strings.Contains(out, flag) {
			t.Errorf("init --help lacks %s", flag)
		}
	}
}

func writeTemp(t *testing.T, name, content string, perm os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestUsageErrors(t *testing.T) {
	unknownKey := writeTemp(t, "unknown.yaml", "listen: 127.0.0.1:0\nmax-lockz: 3\n", 0o644)
	badType := writeTemp(t, "badtype.yaml", "max-locks: lots\n", 0o644)
	badDur := writeTemp(t, "baddur.yaml", "shutdown-timeout: soon\n", 0o644)
	badLevel := writeTemp(t, "badlevel.yaml", "log-level: loud\n", 0o644)
	badYAML := writeTemp(t, "bad.yaml", "listen: [\n", 0o644)
	emptyTokens := writeTemp(t, "tokens", "# nothing here\n\n", 0o600)
	zeroWrite := writeTemp(t, "zerowrite.yaml", "write-timeout: 0s\n", 0o644)
	clusterNoFlag := writeTemp(t, "nocluster.yaml", "raft-listen: 127.0.0.1:7001\n", 0o644)
	runUsageCases(t, []usageCase{
		{"no command", nil, 2, []string{"missing command"}},
		{"unknown command", []string{"serv"}, 2, []string{"unknown command"}},
		{"unknown flag", []string{"serve", "--listne", "x"}, 2, []string{"--listne"}},
		{"bad int flag", []string{"serve", "--max-locks", "many"}, 2, []string{"--max-locks"}},
		{"negative limit", []string{"serve", "--max-waiters", "-1"}, 2, []string{"--max-waiters"}},
		{"bad log level", []string{"serve", "--log-level", "loud"}, 2, []string{"--log-level", "loud"}},
		{"bad log format", []string{"serve", "--log-format", "xml"}, 2, []string{"--log-format"}},
		{"bad token start", []string{"serve", "--token-start", "wall"}, 2, []string{"--token-start", "want one or clock"}},
		{"extra args", []string{"serve", "now"}, 2, []string{"no arguments"}},
		{"cert without key", []string{"serve", "--tls-cert", "c.pem"}, 2, []string{"--tls-key"}},
		{"client ca without cert", []string{"serve", "--tls-client-ca", "ca.pem"}, 2, []string{"--tls-client-ca"}},
		{"bad shutdown timeout", []string{"serve", "--shutdown-timeout", "0s"}, 2, []string{"--shutdown-timeout"}},
		{"negative socket buffer", []string{"serve", "--socket-buffer", "-1"}, 2, []string{"--socket-buffer", "at least 16384"}},
		{"tiny socket buffer", []string{"serve", "--socket-buffer", "100"}, 2, []string{"--socket-buffer", "at least 16384"}},
		{"zero write timeout", []string{"serve", "--write-timeout", "0s"}, 2, []string{"--write-timeout", "> 0"}},
		{"negative admin max conns", []string{"serve", "--admin-max-conns", "-1"}, 2, []string{"--admin-max-conns", ">= 0"}},
		{"negative admin max conns per source", []string{"serve", "--admin-max-conns-per-source", "-1"}, 2, []string{"--admin-max-conns-per-source", ">= 0"}},
		{"zero admin header timeout", []string{"serve", "--admin-header-timeout", "0s"}, 2, []string{"--admin-header-timeout", "> 0"}},
		{"bad admin allowed host", []string{"serve", "--admin-allowed-host", "a b"}, 2, []string{"--admin-allowed-host #1", "want a host name"}},
		{"config zero write timeout", []string{"serve", "--config", zeroWrite}, 2, []string{"write-timeout in config file " + zeroWrite}},
		{"config unknown key", []string{"serve", "--config", unknownKey}, 2, []string{unknownKey, `unknown key "max-lockz"`, "line 2"}},
		{"config bad type", []string{"serve", "--config", badType}, 2, []string{badType, "lots"}},
		{"config bad duration", []string{"serve", "--config", badDur}, 2, []string{badDur, "soon"}},
		{"config bad level", []string{"serve", "--config", badLevel}, 2, []string{"log-level in config file " + badLevel}},
		{"config bad yaml", []string{"serve", "--config", badYAML}, 2, []string{badYAML}},
		{"config missing", []string{"serve", "--config", "/nonexistent/t.yaml"}, 1, []string{"/nonexistent/t.yaml"}},
		{"tokens file missing", []string{"serve", "--client-tokens-file", "/nonexistent/tokens", "--listen", "127.0.0.1:0"}, 1, []string{"/nonexistent/tokens"}},
		{"tokens file empty", []string{"serve", "--client-tokens-file", emptyTokens, "--listen", "127.0.0.1:0"}, 2, []string{emptyTokens, "no tokens"}},
		{"tls files missing", []string{"serve", "--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"}, 1, []string{"/nonexistent/c.pem"}},
		{"init without dir", []string{"init"}, 2, []string{"--dir"}},
		{"init bad host", []string{"init", "--dir", "/nonexistent/d", "--host", "locks:5225"}, 2, []string{`invalid --host "locks:5225"`}},
		{"init port and listen", []string{"init", "--dir", "/nonexistent/d", "--port", "6000", "--listen", "127.0.0.1:6000"}, 2, []string{"--listen and --port"}},
		{"init bad port", []string{"init", "--dir", "/nonexistent/d", "--port", "0"}, 2, []string{"--port"}},
		{"version args", []string{"version", "x"}, 2, []string{"no arguments"}},

		// Cluster mode.
		{"cluster without node id", []string{"serve", "--cluster", "--raft-listen", "127.0.0.1:7001"}, 2, []string{"--cluster needs --node-id"}},
		{"cluster without raft listen", []string{"serve", "--cluster", "--node-id", "n1"}, 2, []string{"--cluster needs --raft-listen"}},
		{"bad node id", []string{"serve", "--cluster", "--node-id", "n 1", "--raft-listen", "127.0.0.1:7001"}, 2, []string{`invalid --node-id "n 1"`}},
		{"long node id", []string{"serve", "--cluster", "--node-id", strings.Repeat("n", 65), "--raft-listen", "127.0.0.1:7001"}, 2, []string{"invalid --node-id"}},
		{"raft listen no port", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1"}, 2, []string{`invalid --raft-listen "127.0.0.1": want HOST:PORT`}},
		{"raft listen port 0", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:0"}, 2, []string{`invalid --raft-listen "127.0.0.1:0": want a port 1..65535`}},
		{"raft listen wildcard", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", ":7001"}, 2, []string{"--raft-listen", "give --raft-advertise"}},
		{"raft advertise wildcard", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", ":7001", "--raft-advertise", "0.0.0.0:7001"}, 2, []string{"invalid --raft-advertise", "wildcard"}},
		{"advertise required", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--listen", "0.0.0.0:5225"}, 2, []string{"--cluster needs --advertise", `--listen "0.0.0.0:5225"`}},
		{"advertise required for ::", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--listen", "[::]:5225"}, 2, []string{"--cluster needs --advertise"}},
		{"advertise wildcard", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--advertise", ":5225"}, 2, []string{"invalid --advertise"}},
		{"advertise too long", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--advertise", strings.Repeat("h", 250) + ".test:5225"}, 2, []string{"--advertise is longer than 255 bytes"}},
		{"peers no equals", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peers", "n1=127.0.0.1:7001,127.0.0.1:7002"}, 2, []string{`invalid --peers entry "127.0.0.1:7002": want ID=HOST:PORT`}},
		{"peers no port", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peers", "n1=127.0.0.1:7001,n2=127.0.0.2"}, 2, []string{`invalid --peers entry n2 "127.0.0.2"`}},
		{"peers bad id", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peers", "n1=127.0.0.1:7001,n/2=127.0.0.1:7002"}, 2, []string{`invalid --peers entry "n/2=127.0.0.1:7002"`}},
		{"peers empty entry", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peers", "n1=127.0.0.1:7001,,n2=127.0.0.1:7002"}, 2, []string{`invalid --peers entry ""`}},
		{"peers duplicate id", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peers", "n1=127.0.0.1:7001", "--peers", "n1=127.0.0.1:7002"}, 2, []string{"node n1 is listed twice"}},
		{"peers duplicate address", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peers", "n1=127.0.0.1:7001,n2=127.0.0.1:7001"}, 2, []string{"nodes n1 and n2 have the same address 127.0.0.1:7001"}},
		{"peers without self", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peers", "n2=127.0.0.1:7002,n3=127.0.0.1:7003"}, 2, []string{"does not list this node (n1)"}},
		{"peers other self address", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peers", "n1=127.0.0.1:7009,n2=127.0.0.1:7002"}, 2, []string{"gives this node (n1) the address 127.0.0.1:7009", "is 127.0.0.1:7001"}},
		{"peer tls incomplete", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peer-tls-cert", "node.pem", "--peer-tls-key", "node-key.pem"}, 2, []string{"--peer-tls-cert, --peer-tls-key and --peer-tls-ca must be given together"}},
		{"peer tls files missing", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--peer-tls-cert", "/nonexistent/node.pem", "--peer-tls-key", "/nonexistent/node-key.pem", "--peer-tls-ca", "/nonexistent/ca.pem"}, 1, []string{"/nonexistent/node.pem"}},
		{"raft heartbeat tiny", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--raft-heartbeat", "1ms"}, 2, []string{"invalid --raft-heartbeat 1ms: must be at least 5ms"}},
		{"raft election below heartbeat", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--raft-heartbeat", "1s", "--raft-election", "500ms"}, 2, []string{"invalid --raft-election 500ms: must be at least --raft-heartbeat (1s)"}},
		{"cluster and standby", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--standby"}, 2, []string{"--standby and --cluster exclude each other"}},
		{"cluster and standby hint", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--standby-hint", "x:1"}, 2, []string{"--standby-hint and --cluster exclude each other"}},
		{"node id without cluster", []string{"serve", "--node-id", "n1"}, 2, []string{"--node-id needs --cluster"}},
		{"peers without cluster", []string{"serve", "--peers", "n1=127.0.0.1:7001"}, 2, []string{"--peers needs --cluster"}},
		{"raft election without cluster", []string{"serve", "--raft-election", "2s"}, 2, []string{"--raft-election needs --cluster"}},
		{"committed release without cluster", []string{"serve", "--committed-release"}, 2, []string{"--committed-release needs --cluster"}},
		{"early release without cluster", []string{"serve", "--early-release"}, 2, []string{"--early-release needs --cluster"}},
		{"max proposals without cluster", []string{"serve", "--max-proposals", "10"}, 2, []string{"--max-proposals needs --cluster"}},
		{"max session proposals negative", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--max-session-proposals", "-1"}, 2, []string{"invalid --max-session-proposals -1"}},
		{"early and committed release", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--early-release", "--committed-release"}, 2, []string{"--early-release and --committed-release exclude each other"}},
		{"peer tls without cluster", []string{"serve", "--peer-tls-ca", "ca.pem"}, 2, []string{"--peer-tls-ca needs --cluster or --pair"}},
		{"config cluster key without cluster", []string{"serve", "--config", clusterNoFlag}, 2, []string{"raft-listen in config file " + clusterNoFlag + " needs --cluster"}},
		{"admin token with blank", []string{"serve", "--admin-token", "a b"}, 2, []string{"invalid --admin-token"}},
		{"admin token too long", []string{"serve", "--admin-token", strings.Repeat("t", 257)}, 2, []string{"--admin-token is longer than 256 bytes"}},
		{"admin non-loopback cluster no token", []string{"serve", "--cluster", "--node-id", "n1", "--raft-listen", "127.0.0.1:7001", "--listen", "127.0.0.1:0", "--admin-listen", ":0", "--data-dir", "/nonexistent/never"}, 2, []string{"--admin-listen :0 is not a loopback address", "--admin-token"}},

		// ticketingd cluster.
		{"cluster no subcommand", []string{"cluster"}, 2, []string{"missing cluster command"}},
		{"cluster status no admin", []string{"cluster", "status"}, 2, []string{"--admin is required"}},
		{"cluster status bad admin", []string{"cluster", "status", "--admin", "localhost"}, 2, []string{`invalid --admin "localhost"`}},
		{"cluster add no arg", []string{"cluster", "add", "--admin", "127.0.0.1:9"}, 2, []string{"one argument"}},
		{"cluster add bad arg", []string{"cluster", "add", "n4", "--admin", "127.0.0.1:9"}, 2, []string{`invalid node entry "n4"`}},
		{"cluster add two nodes", []string{"cluster", "add", "n4=127.0.0.1:7004,n5=127.0.0.1:7005", "--admin", "127.0.0.1:9"}, 2, []string{"adds one node"}},
		{"cluster remove bad id", []string{"cluster", "remove", "n 4", "--admin", "127.0.0.1:9"}, 2, []string{`invalid node ID "n 4"`}},
		{"cluster status unreachable", []string{"cluster", "status", "--admin", "127.0.0.1:" + strconv.Itoa(freePort(t, "127.0.0.1"))}, 1, []string{"admin listener 127.0.0.1:", "connection refused"}},

		// ticketingd init --cluster.
		{"init cluster without nodes", []string{"init", "--cluster", "--dir", "/nonexistent/d"}, 2, []string{"--cluster needs its nodes"}},
		{"init node without cluster", []string{"init", "--dir", "/nonexistent/d", "--node", "n1=127.0.0.1"}, 2, []string{"--node needs --cluster or --pair"}},
		{"init cluster and host", []string{"init", "--cluster", "--dir", "/nonexistent/d", "--node", "n1=127.0.0.1", "--host", "x"}, 2, []string{"--host and --cluster exclude each other"}},
		{"init cluster bad node", []string{"init", "--cluster", "--dir", "/nonexistent/d", "--node", "n1"}, 2, []string{`invalid --node "n1": want ID=HOST`}},
		{"init cluster node with port", []string{"init", "--cluster", "--dir", "/nonexistent/d", "--node", "n1=127.0.0.1:5225"}, 2, []string{`invalid --node "n1=127.0.0.1:5225"`}},
		{"init cluster duplicate node", []string{"init", "--cluster", "--dir", "/nonexistent/d", "--node", "n1=127.0.0.1", "--node", "n1=127.0.0.2"}, 2, []string{"--node n1 is given twice"}},
		{"init cluster mixed hosts", []string{"init", "--cluster", "--dir", "/nonexistent/d", "--node", "n1=127.0.0.1", "--node", "n2=10.0.0.2", "--node", "n3=10.0.0.3"}, 2, []string{"mix loopback"}},
		{"init cluster port clash", []string{"init", "--cluster", "--dir", "/nonexistent/d", "--node", "n1=127.0.0.1", "--node", "n2=127.0.0.1", "--port", "7000", "--raft-port", "7001"}, 2, []string{"n2's client port 7001 on 127.0.0.1 is also n1's Raft port"}},
		{"init add without cluster", []string{"init", "--add", "--dir", "/nonexistent/d"}, 2, []string{"--add needs --cluster"}},
		{"init cluster same ports", []string{"init", "--cluster", "--dir", "/nonexistent/d", "--node", "n1=h", "--port", "7000", "--raft-port", "7000"}, 2, []string{"--port, --raft-port and --admin-port must differ"}},
		{"init cluster port overflow", []string{"init", "--cluster", "--dir", "/nonexistent/d", "--node", "n1=h", "--node", "n2=h", "--port", "65535"}, 2, []string{"too many nodes on h"}},
	})
}

// usageCase is a command line that fails: its exit code and substrings of
// its stderr.
type usageCase struct {
	name string
	args []string
	code int
	want []string // substrings of stderr
}

// runUsageCases runs each case as a subtest.
func runUsageCases(t *testing.T, cases []usageCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCapture(t, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// parseServe resolves serve options the way 'ticketingd serve' does.
func parseServe(t *testing.T, args ...string) (*serveOptions, error) {
	t.Helper()
	var o serveOptions
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return &o, o.finish(fs)
}

func TestConfigFileAndFlagOverride(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "t.yaml")
	content := `# comment
listen: "127.0.0.1:6000"
data-dir: data
client-token: [a, b]
client-tokens-file: /etc/ticketing/tokens
tls-cert: server.pem
tls-key: /abs/server-key.pem
tls-client-ca: ca.pem
max-locks: 10
max-waiters: 20
max-key-waiters: 30
max-sessions: 40
max-sessions-per-peer: 50
max-pending-conns: 60
idle-timeout: 45s
socket-buffer: 32768
write-timeout: 750ms
admin-listen: 127.0.0.1:9225
log-level: debug
log-format: json
node-name: n1
standby: true
standby-hint: other:5225
shutdown-timeout: 3s
token-block: 500
initial-token: 7000
token-start: clock
owned-release-only: true
admin-token: s3cret
admin-max-conns: 70
admin-max-conns-per-source: 7
admin-header-timeout: 2s
admin-allowed-host: [ops.example, "*.example"]
`
	if err := os.WriteFile(cfg, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseServe(t, "--config", cfg, "--listen", "127.0.0.1:7000", "--max-locks", "11", "--client-token", "c")
	if err != nil {
		t.Fatal(err)
	}
	want := serveOptions{
		Config:                 cfg,
		Listen:                 "127.0.0.1:7000", // flag wins
		DataDir:                filepath.Join(dir, "data"),
		ClientTokens:           []string{"c"}, // flag wins, replaces the list
		ClientTokensFile:       "/etc/ticketing/tokens",
		TLSCert:                filepath.Join(dir, "server.pem"),
		TLSKey:                 "/abs/server-key.pem",
		TLSClientCA:            filepath.Join(dir, "ca.pem"),
		MaxLocks:               11,
		MaxWaiters:             20,
		MaxKeyWaiters:          30,
		MaxSessions:            40,
		MaxPerPeer:             50,
		MaxPending:             60,
		IdleTimeout:            45 * time.Second,
		SocketBuffer:           32768,
		WriteTimeout:           750 * time.Millisecond,
		AdminListen:            "127.0.0.1:9225",
		LogLevel:               "debug",
		LogFormat:              "json",
		NodeName:               "n1",
		Standby:                true,
		StandbyHint:            "other:5225",
		ShutdownTimeout:        3 * time.Second,
		TokenBlock:             500,
		InitialToken:           7000,
		TokenStart:             "clock",
		OwnedRelease:           true,
		AdminToken:             "s3cret",
		AdminMaxConns:          70,
		AdminMaxConnsPerSource: 7,
		AdminHeaderTimeout:     2 * time.Second,
		AdminAllowedHosts:      []string{"ops.example", "*.example"},
		RaftHeartbeat:          server.DefaultRaftHeartbeat,
		RaftElection:           server.DefaultRaftElection,
		InitialState:           initialStateNew,
		Heartbeat:              server.DefaultPairHeartbeat,
	}
	if !reflect.DeepEqual(*o, want) {
		t.Errorf("got  %+v\nwant %+v", *o, want)
	}

	// Defaults without a config file.
	o, err = parseServe(t)
	if err != nil {
		t.Fatal(err)
	}
	if o.Listen != "127.0.0.1:5225" || o.DataDir != "./ticketing-data" || o.ShutdownTimeout != 10*time.Second ||
		o.LogLevel != "info" || o.LogFormat != "text" {
		t.Errorf("defaults: %+v", *o)
	}

	// An empty config file is fine.
	empty := writeTemp(t, "empty.yaml", "", 0o644)
	if _, err := parseServe(t, "--config", empty); err != nil {
		t.Errorf("empty config: %v", err)
	}
}

// TestClusterConfigFile: the cluster settings from a config file (peers a
// YAML list, each element possibly a comma-separated list too, paths
// relative to the file) and flags over them, and the server.ClusterConfig
// serve builds from them.
func TestClusterConfigFile(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "node.yaml")
	content := `listen: "127.0.0.1:0"
cluster: true
node-id: n1
raft-listen: "0.0.0.0:7001"
raft-advertise: "127.0.0.1:7001"
peers:
  - n1=127.0.0.1:7001
  - n2=127.0.0.1:7002, n3=127.0.0.1:7003
peer-tls-cert: node.pem
peer-tls-key: node-key.pem
peer-tls-ca: /etc/ticketing/cluster-ca.pem
raft-heartbeat: 200ms
raft-election: 1s
early-release: true
max-session-proposals: 64
max-proposals: 4096
admin-token: tok
`
	if err := os.WriteFile(cfg, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseServe(t, "--config", cfg, "--raft-election", "2s")
	if err != nil {
		t.Fatal(err)
	}
	if o.PeerTLSCert != filepath.Join(dir, "node.pem") || o.PeerTLSKey != filepath.Join(dir, "node-key.pem") || o.PeerTLSCA != "/etc/ticketing/cluster-ca.pem" {
		t.Errorf("peer TLS paths: %q %q %q", o.PeerTLSCert, o.PeerTLSKey, o.PeerTLSCA)
	}
	bound := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 43210}
	cc := clusterConfig(o, bound, nil)
	want := &server.ClusterConfig{
		NodeID:        "n1",
		RaftListen:    "0.0.0.0:7001",
		RaftAdvertise: "127.0.0.1:7001",
		Advertise:     "127.0.0.1:43210", // --listen's port 0: the bound address
		Peers: []server.Peer{{ID: "n1", Address: "127.0.0.1:7001"}, {ID: "n2", Address: "127.0.0.1:7002"},
			{ID: "n3", Address: "127.0.0.1:7003"}},
		HeartbeatTimeout: 200 * time.Millisecond,
		ElectionTimeout:  2 * time.Second, // the flag wins
		EarlyRelease:     true,

		MaxSessionProposals: 64,
		MaxProposals:        4096,
	}
	if !reflect.DeepEqual(cc, want) {
		t.Errorf("ClusterConfig\n got  %+v\n want %+v", cc, want)
	}
	if o.AdminToken != "tok" {
		t.Errorf("admin token %q", o.AdminToken)
	}

	// Defaults: --advertise is --listen as given, --raft-advertise is
	// --raft-listen, Raft timeouts the server's defaults, no peers.
	o, err = parseServe(t, "--cluster", "--node-id", "a.b_c-1", "--listen", "locks-a.test:5225", "--raft-listen", "10.0.0.1:7001")
	if err != nil {
		t.Fatal(err)
	}
	cc = clusterConfig(o, bound, nil)
	if cc.Advertise != "locks-a.test:5225" || cc.RaftAdvertise != "10.0.0.1:7001" || cc.Peers != nil ||
		cc.HeartbeatTimeout != server.DefaultRaftHeartbeat || cc.ElectionTimeout != server.DefaultRaftElection || cc.EarlyRelease || cc.CommittedRelease {
		t.Errorf("defaults: %+v", cc)
	}

	// The deprecated committed-release is accepted and changes nothing:
	// the committed release is the default.
	o, err = parseServe(t, "--cluster", "--node-id", "n1", "--listen", "127.0.0.1:5225", "--raft-listen", "127.0.0.1:7001", "--committed-release")
	if err != nil {
		t.Fatal(err)
	}
	if cc = clusterConfig(o, bound, nil); cc.EarlyRelease || cc.CommittedRelease {
		t.Errorf("--committed-release: %+v", cc)
	}
}

// Every serve flag but --config is a config file key and vice versa (both
// come from serveOptions.options), and each key sets what its flag sets:
// "--name V" and a file with "name: V" give the same options, unlike the
// defaults.
func TestConfigKeysMatchFlags(t *testing.T) {
	var o serveOptions
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	o.register(fs)
	var flags, keys []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "config" {
			flags = append(flags, f.Name)
		}
	})
	for _, op := range o.options() {
		keys = append(keys, op.name)
	}
	slices.Sort(flags)
	slices.Sort(keys)
	if !slices.Equal(flags, keys) {
		t.Errorf("flags %v\nkeys  %v", flags, keys)
	}

	var defaults serveOptions
	defaults.register(pflag.NewFlagSet("serve", pflag.ContinueOnError))
	dir := t.TempDir()
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name == "config" {
			return
		}
		// A value unlike the default; paths absolute, so kept as given.
		var flagVal, fileVal string
		switch f.Value.Type() {
		case "string":
			flagVal, fileVal = "/v/x", "/v/x"
		case "stringArray":
			flagVal, fileVal = "/v/x", "[/v/x]"
		case "int", "uint64":
			flagVal, fileVal = "123456", "123456"
		case "bool":
			flagVal = strconv.FormatBool(f.DefValue != "true")
			fileVal = flagVal
		case "duration":
			flagVal, fileVal = "7s", "7s"
		default:
			t.Fatalf("--%s: no test value for type %s", f.Name, f.Value.Type())
		}
		var fromFlag serveOptions
		ffs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		fromFlag.register(ffs)
		if err := ffs.Parse([]string{"--" + f.Name + "=" + flagVal}); err != nil {
			t.Fatalf("--%s=%s: %v", f.Name, flagVal, err)
		}
		cfg := filepath.Join(dir, f.Name+".yaml")
		if err := os.WriteFile(cfg, []byte(f.Name+": "+fileVal+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		var fromFile serveOptions
		cfs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		fromFile.register(cfs)
		if err := cfs.Parse([]string{"--config", cfg}); err != nil {
			t.Fatal(err)
		}
		if err := fromFile.applyConfigFile(cfs); err != nil {
			t.Fatalf("key %s: %v", f.Name, err)
		}
		fromFile.Config = ""
		if !reflect.DeepEqual(fromFile, fromFlag) {
			t.Errorf("%s: %s in the file gives %+v\n--%s=%s gives %+v", f.Name, fileVal, fromFile, f.Name, flagVal, fromFlag)
		}
		if reflect.DeepEqual(fromFile, defaults) {
			t.Errorf("%s: %s in the file changes no option", f.Name, fileVal)
		}
	})

	// --config itself is no key.
	cfg := writeTemp(t, "config.yaml", "config: other.yaml\n", 0o644)
	if _, err := parseServe(t, "--config", cfg); err == nil || !strings.Contains(err.Error(), `line 1: unknown key "config"`) {
		t.Errorf("config key in the file: %v", err)
	}
}

// TestConfigFileYAML pins how the config file's YAML is read: null is as
// if the key were absent, YAML's integer forms and anchors work, a key
// given twice is an error, and every problem of a file is reported at once
// with its line.
func TestConfigFileYAML(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		args []string
		want func(o *serveOptions) bool // nil: an error containing err
		err  string
	}{
		{yaml: "listen: ~\nmax-locks: ~\nclient-token: ~\nstandby: ~\nidle-timeout: ~\ndata-dir:\n", want: func(o *serveOptions) bool {
			return o.Listen == defaultListen && o.DataDir == defaultDataDir && o.MaxLocks == 0 && o.ClientTokens == nil && !o.Standby && o.IdleTimeout == server.DefaultIdleTimeout
		}},
		{yaml: "~\n", want: func(o *serveOptions) bool { return o.Listen == defaultListen }},
		{yaml: "max-locks: 0x10\nstandby: yes\nlisten: 5225\n", want: func(o *serveOptions) bool {
			return o.MaxLocks == 16 && o.Standby && o.Listen == "5225"
		}},
		{yaml: "listen: &l 127.0.0.1:9\nadmin-listen: *l\n", want: func(o *serveOptions) bool { return o.AdminListen == "127.0.0.1:9" }},
		{yaml: "client-token:\n  - a\n  - 3\n", want: func(o *serveOptions) bool { return slices.Equal(o.ClientTokens, []string{"a", "3"}) }},
		{yaml: "client-token: [x]\nmax-locks: -3\n", args: []string{"--client-token", "y", "--client-token", "z", "--max-locks", "4"},
			want: func(o *serveOptions) bool { return slices.Equal(o.ClientTokens, []string{"y", "z"}) && o.MaxLocks == 4 }},
		{yaml: "listen: a\nlisten: b\n", err: `line 2: mapping key "listen" already defined at line 1`},
		{yaml: "a: 1\nmax-locks: x\nb:\n  - 1\nshutdown-timeout: soon\n",
			err: "line 1: unknown key \"a\"; line 2: cannot unmarshal !!str `x` into int; line 3: unknown key \"b\"; line 5: cannot unmarshal !!str `soon` into duration (like 10s)"},
		{yaml: "client-token: abc\n", err: "line 1: cannot unmarshal !!str `abc` into []string"},
		{yaml: "token-block: -1\n", err: "line 1: cannot unmarshal !!int `-1` into uint64"},
		{yaml: "standby: maybe\n", err: "line 1: cannot unmarshal !!str `maybe` into bool"},
		{yaml: "LISTEN: x\n", err: `line 1: unknown key "LISTEN"`},
		{yaml: "- a\n- b\n", err: "line 1: "},
	} {
		cfg := writeTemp(t, "t.yaml", tc.yaml, 0o644)
		o, err := parseServe(t, append([]string{"--config", cfg}, tc.args...)...)
		switch {
		case tc.want == nil && (err == nil || !strings.Contains(err.Error(), "config file "+cfg+": "+tc.err)):
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.err)
		case tc.want != nil && err != nil:
			t.Errorf("%q: %v", tc.yaml, err)
		case tc.want != nil && !tc.want(o):
			t.Errorf("%q %q: got %+v", tc.yaml, tc.args, *o)
		}
	}
}

func TestReadTokensFile(t *testing.T) {
	p := writeTemp(t, "tokens", "# comment\n\n  tok-1  \n\t# indented comment\ntok#2\n", 0o644)
	tokens, loose, err := readTokensFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tokens, []string{"tok-1", "tok#2"}) {
		t.Errorf("tokens %q", tokens)
	}
	if loose != 0o044 {
		t.Errorf("loose mode %#o, want 044", loose)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, loose, _ = readTokensFile(p); loose != 0 {
		t.Errorf("loose mode %#o for 0600", loose)
	}
	long := writeTemp(t, "long", strings.Repeat("x", 256)+"\n", 0o600)
	if _, _, err := readTokensFile(long); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("long token: %v", err)
	}
}

func TestInit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "deploy")
	code, out, stderr := runCapture(t, "init", "--dir", dir, "--tls", "--host", "127.0.0.1", "--host", "locks.example.test", "--host", "::1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for name, perm := range map[string]os.FileMode{
		initConfigFile: 0o644, initTokensFile: 0o600, initCACert: 0o644, initCAKey: 0o600,
		initServerCert: 0o644, initServerKey: 0o600, initDataDir: 0o700 | os.ModeDir,
	} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != perm {
			t.Errorf("%s: mode %v, want %v", name, st.Mode(), perm)
		}
	}
	tokens, _, err := readTokensFile(filepath.Join(dir, initTokensFile))
	if err != nil || len(tokens) != 1 || len(tokens[0]) != 43 {
		t.Fatalf("tokens %q, %v", tokens, err)
	}
	if strings.Count(out, tokens[0]) != 1 {
		t.Errorf("token should be printed exactly once:\n%s", out)
	}
	for _, w := range []string{"ticketingd serve --config " + filepath.Join(dir, initConfigFile), "broker.ParseURL(os.Getenv(\"TICKETING_URL\"))",
		"export TICKETING_URL='ticketing://" + tokens[0] + "@locks.example.test:5225?ca=" + filepath.Join(dir, initCACert) + "'"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}

	// The server certificate verifies against the CA for every host.
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(filepath.Join(dir, initCACert))
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("bad CA PEM")
	}
	srvPEM, _ := os.ReadFile(filepath.Join(dir, initServerCert))
	blk, _ := pem.Decode(srvPEM)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"127.0.0.1", "locks.example.test", "::1"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: h, Roots: pool}); err != nil {
			t.Errorf("verify for %s: %v", h, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "other.example.test", Roots: pool}); err == nil {
		t.Error("certificate valid for a host it was not made for")
	}

	// The config file is valid for serve.
	o, err := parseServe(t, "--config", filepath.Join(dir, initConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if o.DataDir != filepath.Join(dir, "data") || o.TLSCert != filepath.Join(dir, initServerCert) ||
		o.ClientTokensFile != filepath.Join(dir, initTokensFile) {
		t.Errorf("config from init: %+v", *o)
	}

	// No overwrite without --force.
	code, _, stderr = runCapture(t, "init", "--dir", dir)
	if code != 1 || !strings.Contains(stderr, "--force") {
		t.Errorf("second init: exit %d, %s", code, stderr)
	}
	code, out2, stderr := runCapture(t, "init", "--dir", dir, "--force")
	if code != 0 {
		t.Fatalf("init --force: exit %d: %s", code, stderr)
	}
	if strings.Contains(out2, tokens[0]) {
		t.Error("init --force reused the old token")
	}
}
