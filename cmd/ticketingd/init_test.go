package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/internal/deploy"
	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/internal/raftnet"
	"github.com/ticketing-dev/ticketing/server"
)

// freePort returns a TCP port that is free on host ("" for all
// interfaces) right now. init needs a port before the server starts, so
// the test cannot let the kernel pick one at listen time.
func freePort(t *testing.T, host string) int {
	t.Helper()
	p, err := proctest.FreePort(host)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// nonLoopbackIP returns an IPv4 address of this machine that is not
// loopback, the stand-in for the host name remote clients use; "" if there
// is none.
func nonLoopbackIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// printedSettings is what a user copies from init's output.
type printedSettings struct {
	url     string        // TICKETING_URL, as sh evaluates the export line
	config  broker.Config // broker.ParseURL(url)
	exports string        // the export lines verbatim
}

var reExport = regexp.MustCompile(`(?m)^    export TICKETING_[A-Z_]+=.*$`)

// parsePrinted takes the settings out of init's stdout: it runs the printed
// export lines through sh, exactly as a user pastes them, and parses the
// TICKETING_URL they set, the one client setting init prints.
func parsePrinted(t *testing.T, out string) printedSettings {
	t.Helper()
	var p printedSettings
	lines := reExport.FindAllString(out, -1)
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "    export TICKETING_URL=") {
		t.Fatalf("want 1 export line, of TICKETING_URL, got %q in:\n%s", lines, out)
	}
	p.exports = lines[0]
	p.url = shExports(t, out, "TICKETING_URL")["TICKETING_URL"]
	var err error
	if p.config, err = broker.ParseURL(p.url); err != nil {
		t.Fatalf("ParseURL(printed URL): %v", err)
	}
	if strings.Contains(out, "TICKETING_TOKEN") {
		t.Errorf("init mentions TICKETING_TOKEN, which nothing reads:\n%s", out)
	}
	return p
}

// lockOnce does what a first client does: WaitReady, Acquire, Release;
// it returns the fencing token of the Acquire.
func lockOnce(t *testing.T, cfg broker.Config) uint64 {
	t.Helper()
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a hang guard (a pair's failover included), not a speed
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatalf("WaitReady to %v: %v", cfg.Addrs, err)
	}
	tk, err := b.Acquire(ctx, "init-snippet", broker.AcquireOptions{Lease: 10 * time.Second, Work: time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := tk.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	return tk.Token()
}

// TestInitSnippetWorks runs 'init', starts 'serve --config' on the config
// it wrote, and connects with exactly the settings init printed: the
// TICKETING_URL through broker.ParseURL, and the broker.Config snippet.
//
// The only thing the test chooses is the port (init --port, a free one),
// so that it never collides with a real server on 5225; serve gets
// --log-format json besides the config so that the test can wait for its
// log lines, which changes nothing about listening, TLS or tokens.
func TestInitSnippetWorks(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("runs the printed export lines with sh")
	}
	remote := nonLoopbackIP()
	tests := []struct {
		name     string
		args     []string
		loopback bool   // the config must listen on 127.0.0.1
		host     string // the host the printed settings must use
		warn     bool   // init and serve warn: reachable without TLS
	}{
		{"tls localhost", []string{"--tls", "--host", "localhost"}, true, "localhost", false},
		{"tls 127.0.0.1", []string{"--tls", "--host", "127.0.0.1"}, true, "127.0.0.1", false},
		{"tls defaults", []string{"--tls"}, true, "127.0.0.1", false},
		{"plain localhost", []string{"--host", "localhost"}, true, "localhost", false},
		{"tls remote", []string{"--tls", "--host", "localhost", "--host", remote}, false, remote, false},
		{"plain remote", []string{"--host", remote}, false, remote, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.host == "" {
				t.Skip("no non-loopback IPv4 address on this machine")
			}
			listenHost := ""
			if tc.loopback {
				listenHost = "127.0.0.1"
			}
			port := strconv.Itoa(freePort(t, listenHost))
			// A directory name that needs escaping in the URL and quoting
			// in sh: the printed lines must still work pasted as they are.
			dir := filepath.Join(t.TempDir(), "de ploy+$HOME&'x'")
			code, out, stderr := runCapture(t, append([]string{"init", "--dir", dir, "--port", port}, tc.args...)...)
			if code != 0 {
				t.Fatalf("init: exit %d: %s", code, stderr)
			}

			// The written config listens where the hosts say.
			cfgPath := filepath.Join(dir, initConfigFile)
			o, err := parseServe(t, "--config", cfgPath)
			if err != nil {
				t.Fatal(err)
			}
			if want := net.JoinHostPort(listenHost, port); o.Listen != want {
				t.Errorf("config listens on %q, want %q", o.Listen, want)
			}
			// It shows where tokens start and the floor to set when moving
			// from another installation (commented out: no floor).
			if b, _ := os.ReadFile(cfgPath); !strings.Contains(string(b), "# initial-token: 0\n") || !strings.Contains(string(b), "high_water") || o.InitialToken != 0 {
				t.Errorf("config does not show initial-token (commented out) with what to set it to, or sets it (%d):\n%s", o.InitialToken, b)
			}
			// It starts a new data dir's tokens above the clock (not at
			// the protocol's 1), saying why.
			if b, _ := os.ReadFile(cfgPath); o.TokenStart != "clock" || !strings.Contains(string(b), "\ntoken-start: clock\n") || !strings.Contains(string(b), "reinstalled") {
				t.Errorf("config sets token-start %q, want clock with why:\n%s", o.TokenStart, b)
			}
			if got := strings.Contains(stderr, "without TLS"); got != tc.warn {
				t.Errorf("init warns about no TLS: %v, want %v; stderr:\n%s", got, tc.warn, stderr)
			}

			p := parsePrinted(t, out)
			tokens, _, err := readTokensFile(filepath.Join(dir, initTokensFile))
			if err != nil || len(tokens) != 1 || p.config.Token != tokens[0] {
				t.Fatalf("the printed URL's token is not the tokens file's %q (%v)", tokens, err)
			}
			if strings.Count(out, p.config.Token) != 1 {
				t.Errorf("token printed %d times, want once:\n%s", strings.Count(out, p.config.Token), out)
			}
			want := net.JoinHostPort(tc.host, port)
			if !slices.Equal(p.config.Addrs, []string{want}) {
				t.Errorf("printed URL's addresses %v, want %s", p.config.Addrs, want)
			}
			if isTLS := slices.Contains(tc.args, "--tls"); isTLS != (p.config.TLS.Mode == broker.TLSCAFile) ||
				isTLS && p.config.TLS.CAFile != filepath.Join(dir, initCACert) {
				t.Errorf("printed TLS %+v for init %v", p.config.TLS, tc.args)
			}

			// The printed serve command names the config, quoted for sh.
			m := regexp.MustCompile(`(?m)^    ticketingd serve --config (.+)$`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no serve command in:\n%s", out)
			}
			if got, err := exec.Command("sh", "-c", "printf %s "+m[1]).Output(); err != nil || string(got) != cfgPath {
				t.Errorf("serve command names %q (%v), want %q", got, err, cfgPath)
			}
			before := uint64(time.Now().UnixMicro())
			srv := startInProc(t, "serve", "--config", cfgPath, "--log-format", "json")
			srv.stderr.waitJSON(t, "listening", srv.done)
			if tok := lockOnce(t, p.config); tok <= before {
				t.Errorf("first token %d of the init deployment, want above the clock in µs at its start (%d): init writes token-start: clock", tok, before)
			}
			if got := strings.Contains(srv.stderr.String(), "without TLS"); got != tc.warn {
				t.Errorf("serve warns about no TLS: %v, want %v", got, tc.warn)
			}
			if code := srv.stop(); code != 0 {
				t.Errorf("serve: exit %d:\n%s", code, srv.stderr.String())
			}
		})
	}
}

// shExports runs the "export NAME=..." lines of out through sh, as a user
// pastes them, and returns the variables' values.
func shExports(t *testing.T, out string, names ...string) map[string]string {
	t.Helper()
	lines := regexp.MustCompile(`(?m)^    export TICKETING_[A-Z_]+=.*$`).FindAllString(out, -1)
	if len(lines) != len(names) {
		t.Fatalf("want %d export lines, got %q in:\n%s", len(names), lines, out)
	}
	script := strings.Join(lines, "\n")
	for _, n := range names {
		script += "\nprintf '%s\\n' \"$" + n + "\""
	}
	sh := exec.Command("sh", "-c", script)
	sh.Env = []string{"PATH=" + os.Getenv("PATH")}
	res, err := sh.Output()
	if err != nil {
		t.Fatalf("sh: %v on:\n%s", err, script)
	}
	vals := strings.Split(strings.TrimSuffix(string(res), "\n"), "\n")
	if len(vals) != len(names) {
		t.Fatalf("sh printed %q", vals)
	}
	m := map[string]string{}
	for i, n := range names {
		m[n] = vals[i]
	}
	return m
}

// reGroupID is the identity init draws for a pair (server.NewClusterID):
// 128 bits in lowercase hex.
var reGroupID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// reBoundClusterID is the identity init --cluster draws: bound to the
// bundle's initial configuration (server.NewClusterIDFor).
var reBoundClusterID = regexp.MustCompile(`^[0-9a-f]{32}\.p[0-9a-f]{12}$`)

// urlCluster returns the value of the one cluster= parameter of the
// TICKETING_URL u ("" without one), failing the test if u has it twice.
func urlCluster(t *testing.T, u string) string {
	t.Helper()
	_, query, _ := strings.Cut(u, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		t.Fatalf("TICKETING_URL query %q: %v", query, err)
	}
	if len(q["cluster"]) > 1 {
		t.Fatalf("TICKETING_URL %q has cluster= twice", u)
	}
	return q.Get("cluster")
}

// parseURL is broker.ParseURL of a TICKETING_URL that init printed; the
// broker's Config.Cluster must be the URL's cluster= (the group's
// identity).
func parseURL(t *testing.T, u string) (broker.Config, error) {
	t.Helper()
	cfg, err := broker.ParseURL(u)
	if err == nil {
		if _, query, _ := strings.Cut(u, "?"); cfg.Cluster == "" && strings.Contains(query, "cluster=") {
			t.Errorf("broker.ParseURL(%q) left Config.Cluster empty", u)
		}
	}
	return cfg, err
}

// clusterExports runs the export lines of init --cluster's out through
// sh (TICKETING_URL and TICKETING_ADMIN_TOKEN, no others) and adds
// TICKETING_TOKEN: the client token, as the printed URL carries it.
func clusterExports(t *testing.T, out string) map[string]string {
	t.Helper()
	ex := shExports(t, out, "TICKETING_URL", "TICKETING_ADMIN_TOKEN")
	u, err := parseURL(t, ex["TICKETING_URL"])
	if err != nil || u.Token == "" {
		t.Fatalf("the printed TICKETING_URL gives token %v (%v): want the client token in it", u.Token != "", err)
	}
	if strings.Contains(out, "TICKETING_TOKEN") {
		t.Errorf("init --cluster mentions TICKETING_TOKEN, which nothing reads:\n%s", out)
	}
	ex["TICKETING_TOKEN"] = u.Token
	return ex
}

// readCert reads the one certificate of a PEM file.
func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func certPool(t *testing.T, path string) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("%s: no certificate", path)
	}
	return pool
}

// TestInitCluster writes a bundle for three nodes on 127.0.0.1 and checks
// it as 'serve --config' and the peer transport will read it: each config
// parses through the loader serve uses into a cluster node with distinct
// ports and the peers of all three, its peer TLS loads (a node certificate
// of the cluster CA), the certificates verify against the right CA for the
// host with the right usages, and the printed lines, run through sh, give
// a TICKETING_URL with the three client addresses.
func TestInitCluster(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("runs the printed export lines with sh")
	}
	dir := filepath.Join(t.TempDir(), "clu ster")
	code, out, stderr := runCapture(t, "init", "--cluster", "--dir", dir, "--node", "n1=127.0.0.1", "--node", "n2=127.0.0.1", "--node", "n3=127.0.0.1",
		"--port", "16000", "--raft-port", "17000", "--admin-port", "19000")
	if code != 0 {
		t.Fatalf("init --cluster: exit %d: %s", code, stderr)
	}
	if stderr != "" {
		t.Errorf("init --cluster of 3 nodes warns:\n%s", stderr)
	}
	modes := map[string]os.FileMode{initCACert: 0o644, initCAKey: 0o600, initClusterCACert: 0o644, initClusterCAKey: 0o600, initAdminTokenFile: 0o600,
		initTokensFile: 0o600}
	for _, id := range []string{"n1", "n2", "n3"} {
		for name, perm := range map[string]os.FileMode{initConfigFile: 0o600, initTokensFile: 0o600, initServerCert: 0o644, initServerKey: 0o600,
			initNodeCert: 0o644, initNodeKey: 0o600, initClusterCACert: 0o644, initDataDir: 0o700 | os.ModeDir} {
			modes[filepath.Join(id, name)] = perm
		}
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
	for _, name := range []string{initCAKey, initClusterCAKey} {
		for _, id := range []string{"n1", "n2", "n3"} {
			if _, err := os.Stat(filepath.Join(dir, id, name)); err == nil {
				t.Errorf("%s is in node %s's directory: CA keys stay out of the nodes", name, id)
			}
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
	// The URL names the cluster's identity, the cluster-id of every
	// node's config (checked below): what a version-3 HELLO_OK carries.
	clusterID := urlCluster(t, ex["TICKETING_URL"])
	if !reBoundClusterID.MatchString(clusterID) || !strings.HasSuffix(ex["TICKETING_URL"], "&cluster="+clusterID) {
		t.Errorf("printed URL %q: cluster=%q, want the bundle's cluster ID last", ex["TICKETING_URL"], clusterID)
	}
	wantAddrs := []string{"127.0.0.1:16000", "127.0.0.1:16001", "127.0.0.1:16002"}
	if !slices.Equal(u.Addrs, wantAddrs) || u.Token != ex["TICKETING_TOKEN"] ||
		u.TLS.Mode != broker.TLSCAFile || u.TLS.CAFile != filepath.Join(dir, initCACert) {
		t.Errorf("printed URL gives %v token ok %v TLS %+v", u.Addrs, u.Token == ex["TICKETING_TOKEN"], u.TLS)
	}
	serveCmds := regexp.MustCompile(`(?m)^    ticketingd serve --config (.+)$`).FindAllStringSubmatch(out, -1)
	if len(serveCmds) != 3 {
		t.Fatalf("want 3 serve commands in:\n%s", out)
	}
	for i, m := range serveCmds {
		want := filepath.Join(dir, "n"+strconv.Itoa(i+1), initConfigFile)
		if got, err := exec.Command("sh", "-c", "printf %s "+m[1]).Output(); err != nil || string(got) != want {
			t.Errorf("serve command %d names %q (%v), want %q", i+1, got, err, want)
		}
	}

	clientCA, clusterCA := certPool(t, filepath.Join(dir, initCACert)), certPool(t, filepath.Join(dir, initClusterCACert))
	wantPeers := []server.Peer{{ID: "n1", Address: "127.0.0.1:17000"}, {ID: "n2", Address: "127.0.0.1:17001"}, {ID: "n3", Address: "127.0.0.1:17002"}}
	for i, id := range []string{"n1", "n2", "n3"} {
		nd := filepath.Join(dir, id)
		o, err := parseServe(t, "--config", filepath.Join(nd, initConfigFile))
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		port := func(base int) string { return "127.0.0.1:" + strconv.Itoa(base+i) }
		if o.NodeName != id {
			t.Errorf("%s: node-name %q, want the node's ID: clients log the node they reached by it", id, o.NodeName)
		}
		if o.ClusterID != clusterID {
			t.Errorf("%s: cluster-id %q, want the printed URL's cluster=%s", id, o.ClusterID, clusterID)
		}
		if !o.Cluster || o.NodeID != id || o.Listen != port(16000) || o.Advertise != port(16000) || o.RaftListen != port(17000) ||
			o.AdminListen != port(19000) || o.AdminToken != ex["TICKETING_ADMIN_TOKEN"] || o.DataDir != filepath.Join(nd, initDataDir) ||
			o.TLSCert != filepath.Join(nd, initServerCert) || o.TLSKey != filepath.Join(nd, initServerKey) {
			t.Errorf("%s: options %+v", id, *o)
		}
		tokens, _, err := readTokensFile(o.ClientTokensFile)
		if err != nil || !slices.Equal(tokens, []string{ex["TICKETING_TOKEN"]}) {
			t.Errorf("%s: client tokens %q (%v)", id, tokens, err)
		}
		peerTLS, err := loadPeerTLS(o)
		if err != nil || peerTLS == nil {
			t.Fatalf("%s: peer TLS: %v", id, err)
		}
		if _, err := loadTLS(o); err != nil {
			t.Errorf("%s: client TLS: %v", id, err)
		}
		cc := clusterConfig(o, nil, peerTLS)
		if !reflect.DeepEqual(cc.Peers, wantPeers) || cc.RaftAdvertise != port(17000) || cc.Advertise != port(16000) || cc.PeerCertificate == nil || cc.PeerRoots == nil {
			t.Errorf("%s: ClusterConfig %+v", id, cc)
		}

		// The node certificate: the cluster CA's, for the node's host
		// (which is its Raft address's host), server and client auth.
		node := readCert(t, filepath.Join(nd, initNodeCert))
		for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
			if _, err := node.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: clusterCA, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
				t.Errorf("%s: node certificate for usage %v: %v", id, usage, err)
			}
		}
		if _, err := node.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: clientCA}); err == nil {
			t.Errorf("%s: node certificate verifies against the client CA", id)
		}
		// The server certificate: the client CA's, for the host, server
		// auth only, so that it cannot serve as a node certificate.
		srvCert := readCert(t, filepath.Join(nd, initServerCert))
		if _, err := srvCert.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: clientCA}); err != nil {
			t.Errorf("%s: server certificate: %v", id, err)
		}
		if _, err := srvCert.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: clientCA, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
			t.Errorf("%s: server certificate is good for client auth", id)
		}
		if _, err := raftnet.LoadPeerTLS(o.TLSCert, o.TLSKey, o.PeerTLSCA); err == nil {
			t.Errorf("%s: the server certificate loads as a node certificate", id)
		}
	}

	// --add: a fourth node from the same CAs and tokens, on the next ports
	// of the shared host, without peers (it waits to be added).
	code, out, stderr = runCapture(t, "init", "--cluster", "--add", "--dir", dir, "--node", "n4=127.0.0.1",
		"--port", "16000", "--raft-port", "17000", "--admin-port", "19000")
	if code != 0 {
		t.Fatalf("init --cluster --add: exit %d: %s", code, stderr)
	}
	o4, err := parseServe(t, "--config", filepath.Join(dir, "n4", initConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if o4.NodeID != "n4" || o4.ClusterID != clusterID || o4.Listen != "127.0.0.1:16003" || o4.RaftListen != "127.0.0.1:17003" || o4.AdminListen != "127.0.0.1:19003" ||
		len(o4.Peers) != 0 || o4.AdminToken != ex["TICKETING_ADMIN_TOKEN"] {
		t.Errorf("n4: options %+v", *o4)
	}
	if tokens, _, err := readTokensFile(o4.ClientTokensFile); err != nil || !slices.Equal(tokens, []string{ex["TICKETING_TOKEN"]}) {
		t.Errorf("n4: client tokens %q (%v)", tokens, err)
	}
	if _, err := loadPeerTLS(o4); err != nil {
		t.Errorf("n4: peer TLS: %v", err)
	}
	if _, err := readCert(t, filepath.Join(dir, "n4", initNodeCert)).Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: clusterCA,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("n4: node certificate: %v", err)
	}
	for _, w := range []string{"ticketingd serve --config " + deploy.ShellQuote(filepath.Join(dir, "n4", initConfigFile)),
		"ticketingd cluster add n4=127.0.0.1:17003 --admin 127.0.0.1:19000,127.0.0.1:19001,127.0.0.1:19002", "@127.0.0.1:16000,127.0.0.1:16001,127.0.0.1:16002,127.0.0.1:16003?ca=",
		"&cluster=" + clusterID + "'\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("init --add output lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, ex["TICKETING_ADMIN_TOKEN"]) || strings.Contains(out, ex["TICKETING_TOKEN"]) || strings.Contains(out, "TICKETING_TOKEN") {
		t.Errorf("init --add printed a token, or TICKETING_TOKEN, which nothing reads:\n%s", out)
	}
	code, _, stderr = runCapture(t, "init", "--cluster", "--add", "--dir", dir, "--node", "n2=127.0.0.1")
	if code != 2 || !strings.Contains(stderr, "has a node n2 already") {
		t.Errorf("--add of an existing ID: exit %d: %s", code, stderr)
	}
	if code, _, stderr = runCapture(t, "init", "--cluster", "--add", "--dir", t.TempDir(), "--node", "n5=127.0.0.1"); code != 1 || !strings.Contains(stderr, "--add") {
		t.Errorf("--add to a directory without a bundle: exit %d: %s", code, stderr)
	}

	// No overwrite without --force; --force writes new keys and tokens.
	code, _, stderr = runCapture(t, "init", "--cluster", "--dir", dir, "--node", "n1=127.0.0.1", "--node", "n2=127.0.0.1", "--node", "n3=127.0.0.1")
	if code != 1 || !strings.Contains(stderr, "--force") {
		t.Errorf("second init: exit %d, %s", code, stderr)
	}
	code, out2, stderr := runCapture(t, "init", "--cluster", "--force", "--dir", dir, "--node", "n1=127.0.0.1", "--node", "n2=127.0.0.1", "--node", "n3=127.0.0.1")
	if code != 0 {
		t.Fatalf("init --cluster --force: exit %d: %s", code, stderr)
	}
	if strings.Contains(out2, ex["TICKETING_TOKEN"]) || strings.Contains(out2, ex["TICKETING_ADMIN_TOKEN"]) {
		t.Error("init --cluster --force reused a token")
	}
	if strings.Contains(out2, clusterID) {
		t.Error("init --cluster --force reused the cluster ID")
	}
}

// TestInitClusterRemote: nodes on separate hosts all get the base ports,
// certificates for their own host (IP or DNS name), and the printed lines
// say how to copy each node's directory to its machine.
func TestInitClusterRemote(t *testing.T) {
	dir := t.TempDir()
	code, out, stderr := runCapture(t, "init", "--cluster", "--dir", dir, "--node", "a=10.0.0.1", "--node", "b=locks-b.example.test", "--node", "c=[2001:db8::3]", "--node", "d=10.0.0.4")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, "warning: a cluster of 4 nodes survives the loss of 1 of them") {
		t.Errorf("no warning about 4 nodes:\n%s", stderr)
	}
	clusterCA := certPool(t, filepath.Join(dir, initClusterCACert))
	for _, n := range []struct{ id, host, listen string }{
		{"a", "10.0.0.1", "10.0.0.1:5225"}, {"b", "locks-b.example.test", "locks-b.example.test:5225"},
		{"c", "2001:db8::3", "[2001:db8::3]:5225"}, {"d", "10.0.0.4", "10.0.0.4:5225"},
	} {
		o, err := parseServe(t, "--config", filepath.Join(dir, n.id, initConfigFile))
		if err != nil {
			t.Fatalf("%s: %v", n.id, err)
		}
		raft := strings.TrimSuffix(n.listen, "5225") + "7225"
		if o.Listen != n.listen || o.Advertise != n.listen || o.RaftListen != raft || o.AdminListen != "127.0.0.1:9225" || len(o.Peers) != 4 {
			t.Errorf("%s: options %+v", n.id, *o)
		}
		node := readCert(t, filepath.Join(dir, n.id, initNodeCert))
		if _, err := node.Verify(x509.VerifyOptions{DNSName: n.host, Roots: clusterCA, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s: node certificate for %s: %v", n.id, n.host, err)
		}
		if _, err := node.Verify(x509.VerifyOptions{DNSName: "10.0.0.9", Roots: clusterCA}); err == nil {
			t.Errorf("%s: node certificate valid for another host", n.id)
		}
		if !strings.Contains(out, "ticketingd serve --config ticketing-"+n.id+"/"+initConfigFile+"    # on "+n.host) {
			t.Errorf("no serve line for %s in:\n%s", n.id, out)
		}
		if !strings.Contains(out, "scp -rp "+filepath.Join(dir, n.id)+" "+deploy.SSHHost(n.host)+":ticketing-"+n.id) {
			t.Errorf("no scp line for %s in:\n%s", n.id, out)
		}
	}
	if !strings.Contains(out, "@10.0.0.1:5225,locks-b.example.test:5225,[2001:db8::3]:5225,10.0.0.4:5225?ca=") {
		t.Errorf("URL lacks the four addresses:\n%s", out)
	}
}

// TestInitClusterAddKeepsBasePorts: 'init --cluster --add' without port
// flags places the new node from the bundle's base ports, not from the
// defaults (5225, 7225, 9225); the new node gets the bundle's cluster-id
// and initial-cluster-state existing, the bundle's nodes new and the same
// cluster-id.
func TestInitClusterAddKeepsBasePorts(t *testing.T) {
	dir := t.TempDir()
	code, _, stderr := runCapture(t, "init", "--cluster", "--dir", dir, "--node", "n1=127.0.0.1", "--node", "n2=127.0.0.1", "--node", "n3=127.0.0.1",
		"--port", "16000", "--raft-port", "17000", "--admin-port", "19000")
	if code != 0 {
		t.Fatalf("init --cluster: exit %d: %s", code, stderr)
	}
	code, out, stderr := runCapture(t, "init", "--cluster", "--add", "--dir", dir, "--node", "n4=127.0.0.1")
	if code != 0 {
		t.Fatalf("init --cluster --add: exit %d: %s", code, stderr)
	}
	o4, err := parseServe(t, "--config", filepath.Join(dir, "n4", initConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	if o4.Listen != "127.0.0.1:16003" || o4.RaftListen != "127.0.0.1:17003" || o4.AdminListen != "127.0.0.1:19003" {
		t.Errorf("n4 from the bundle's bases 16000/17000/19000: listen %s, raft %s, admin %s; want 127.0.0.1:16003, :17003, :19003",
			o4.Listen, o4.RaftListen, o4.AdminListen)
	}
	if !strings.Contains(out, "ticketingd cluster add n4=127.0.0.1:17003") {
		t.Errorf("init --add output lacks the add command for 127.0.0.1:17003:\n%s", out)
	}
	var id string
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		o, err := parseServe(t, "--config", filepath.Join(dir, n, initConfigFile))
		if err != nil {
			t.Fatal(err)
		}
		cc := clusterConfig(o, nil, nil)
		if id == "" {
			id = cc.ClusterID
		}
		if !reBoundClusterID.MatchString(cc.ClusterID) || cc.ClusterID != id || cc.Join != (n == "n4") || (len(cc.Peers) == 0) != (n == "n4") {
			t.Errorf("%s: cluster-id %q (want the bundle's %q), join %v, peers %v", n, cc.ClusterID, id, cc.Join, cc.Peers)
		}
	}
	// A port flag given with --add still wins (the k-th node on the host
	// gets base+k of each).
	code, _, stderr = runCapture(t, "init", "--cluster", "--add", "--dir", dir, "--node", "n5=127.0.0.1", "--raft-port", "18000")
	if code != 0 {
		t.Fatalf("init --cluster --add --raft-port: exit %d: %s", code, stderr)
	}
	if o5, err := parseServe(t, "--config", filepath.Join(dir, "n5", initConfigFile)); err != nil || o5.RaftListen != "127.0.0.1:18004" || o5.Listen != "127.0.0.1:16004" {
		t.Errorf("n5 with --raft-port 18000: %v, raft %s, listen %s", err, o5.RaftListen, o5.Listen)
	}
}

// TestInitConsoleKeys: --console-keys turns the lock browser on in every
// node's config of a cluster or a pair; without them it is not written,
// and a single server's init refuses it (it writes no admin token).
func TestInitConsoleKeys(t *testing.T) {
	for _, c := range []struct {
		args  []string
		nodes []string
	}{
		{[]string{"--cluster", "--node", "n1=127.0.0.1", "--node", "n2=127.0.0.1", "--node", "n3=127.0.0.1"}, []string{"n1", "n2", "n3"}},
		{[]string{"--pair", "--node", "primary=127.0.0.1", "--node", "backup=127.0.0.1"}, []string{"primary", "backup"}},
	} {
		for _, on := range []bool{false, true} {
			dir := t.TempDir()
			args := append([]string{"init", "--dir", dir}, c.args...)
			if on {
				args = append(args, "--console-keys")
			}
			if code, _, stderr := runCapture(t, args...); code != 0 {
				t.Fatalf("%v: exit %d: %s", args, code, stderr)
			}
			for _, id := range c.nodes {
				cfg, err := os.ReadFile(filepath.Join(dir, id, initConfigFile))
				if err != nil {
					t.Fatal(err)
				}
				if got := strings.Contains(string(cfg), "\nconsole-keys: true"); got != on {
					t.Errorf("%v: %s's config has console-keys %v:\n%s", args, id, got, cfg)
				}
			}
		}
	}
	code, _, stderr := runCapture(t, "init", "--dir", t.TempDir(), "--console-keys")
	if code != exitUsage || !strings.Contains(stderr, "--console-keys needs --cluster or --pair") {
		t.Errorf("single server: exit %d: %s", code, stderr)
	}
}

// TestInitKubernetes: --kubernetes adds the manifests in k8s/ for the
// namespace and image given (a single server gets an admin token, which
// the probes' admin listener needs); a pair, a bad namespace and the k8s
// flags without --kubernetes are usage errors.
func TestInitKubernetes(t *testing.T) {
	dir := t.TempDir()
	if code, _, stderr := runCapture(t, "init", "--dir", dir, "--kubernetes", "--k8s-namespace", "locks", "--k8s-image", "registry.example/ticketingd:2"); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	sts, err := os.ReadFile(filepath.Join(dir, "k8s", "statefulset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(sts), "image: registry.example/ticketingd:2") || !strings.Contains(string(sts), "namespace: locks") {
		t.Errorf("statefulset.yaml:\n%s", sts)
	}
	if st, err := os.Stat(filepath.Join(dir, "k8s", "secret.yaml")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("secret.yaml: %v %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(dir, initAdminTokenFile)); err != nil {
		t.Errorf("no admin token with --kubernetes: %v", err)
	}
	cdir := t.TempDir()
	if code, _, stderr := runCapture(t, "init", "--dir", cdir, "--cluster", "--kubernetes", "--node", "a=10.0.0.1", "--node", "b=10.0.0.2", "--node", "c=10.0.0.3"); code != 0 {
		t.Fatalf("cluster: exit %d: %s", code, stderr)
	}
	if _, err := os.Stat(filepath.Join(cdir, "k8s", "pdb.yaml")); err != nil {
		t.Errorf("cluster: %v", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--pair", "--node", "primary=10.0.0.1", "--node", "backup=10.0.0.2", "--kubernetes"}, "--kubernetes: a pair is not offered on Kubernetes"},
		{[]string{"--kubernetes", "--k8s-namespace", "Locks"}, `invalid --k8s-namespace "Locks"`},
		{[]string{"--k8s-image", "x"}, "--k8s-image needs --kubernetes"},
	} {
		args := append([]string{"init", "--dir", t.TempDir()}, c.args...)
		if code, _, stderr := runCapture(t, args...); code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d: %s", args, code, stderr)
		}
	}
}
