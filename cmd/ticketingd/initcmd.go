package main

import (
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Names of the files 'ticketingd init' writes into its directory.
const (
	initConfigFile = "ticketingd.yaml"
	initTokensFile = "client-tokens"
	initDataDir    = "data"
	initCACert     = "ca.pem"
	initCAKey      = "ca-key.pem"
	initServerCert = "server.pem"
	initServerKey  = "server-key.pem"
)

type initOptions struct {
	Dir    string
	Hosts  []string
	TLS    bool
	Force  bool
	Listen string // empty: derived from Hosts and Port
	Port   int

	// --cluster: a bundle for a Raft cluster (initcluster.go).
	Cluster   bool
	Add       bool     // add Nodes to the bundle in Dir
	Nodes     []string // ID=HOST
	RaftPort  int
	AdminPort int

	// --pair: a bundle for a hot-standby pair (initpair.go), of the
	// Nodes primary and backup, on AdminPort too.
	Pair     bool
	PeerPort int
}

func newInitCmd(stdout io.Writer) *cobra.Command {
	var o initOptions
	cmd := &cobra.Command{
		Use:   "init --dir DIR [--host NAME ...] [--tls] [--port N | --listen ADDR] | init --cluster --dir DIR --node ID=HOST ... | init --pair --dir DIR --node primary=HOST --node backup=HOST",
		Short: "Write a ready deployment: config file, client token, and optionally a TLS CA and server certificate; or a cluster or pair bundle",
		Long: `Write a ready deployment into DIR:

  ticketingd.yaml    config file for 'ticketingd serve --config'
  client-tokens      one random client token (mode 0600); printed once
  data/              the data directory (token store)
  ca.pem, ca-key.pem           with --tls: a private CA (ECDSA P-256)
  server.pem, server-key.pem   with --tls: a server certificate for every --host

--host names the server as its clients reach it. Hosts that parse as IP
addresses become IP SANs, others DNS SANs; the default hosts are 127.0.0.1
and localhost. When every host is a loopback one (localhost, 127.0.0.1, ::1)
the config listens on loopback only (127.0.0.1:PORT); otherwise on all
interfaces (:PORT). --listen overrides that choice.

init then prints how a client connects: one TICKETING_URL
(ticketing://TOKEN@HOST:PORT?ca=CA.PEM) for broker.ParseURL, which carries
the address, the client token and the TLS settings, using the first host
other machines can reach. init refuses to overwrite an
existing deployment unless --force is given.

With --cluster, init writes a bundle for a Raft cluster instead, one
--node ID=HOST per node (3 or 5 of them): a client CA (ca.pem), a cluster
CA for the peer links (cluster-ca.pem), and per node a directory DIR/ID
with its config (ticketingd.yaml), server and node certificates, the
client token and a data directory. Each node listens on HOST:--port, its
Raft transport on HOST:--raft-port and its admin listener on
127.0.0.1:--admin-port; nodes that share a host get the next ports (port+1,
port+2, ...), so that a bundle of nodes all on 127.0.0.1 runs on one
machine. Every node's config has the bundle's cluster-id, a random one.
init then prints how to start each node and the TICKETING_URL listing
every node, with the client token and the cluster ID (cluster=ID).

With --pair, init writes a bundle for a hot-standby pair instead, of the
nodes --node primary=HOST and --node backup=HOST: one CA (ca.pem), and per
node a directory DIR/primary and DIR/backup with its config (pair,
pair-id, peer, peer-listen, advertise), a node certificate for its host that serves both
its client listener and the peer link, the client token and a data
directory. Each node listens on HOST:--port, its peer link on
HOST:--peer-port and its admin listener on 127.0.0.1:--admin-port; when the
two share a host the backup gets the next ports. The output is as for
--cluster, the URL's cluster= being the pair's pair-id.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Dir == "" {
				return usagef("--dir is required")
			}
			if o.Cluster && o.Pair {
				return usagef("--cluster and --pair exclude each other")
			}
			if o.Cluster {
				return initClusterCmd(cmd, &o, stdout)
			}
			if o.Pair {
				return initPairCmd(cmd, &o, stdout)
			}
			for _, f := range []struct{ name, needs string }{
				{"node", "--cluster or --pair"}, {"raft-port", "--cluster"}, {"peer-port", "--pair"},
				{"admin-port", "--cluster or --pair"}, {"add", "--cluster"},
			} {
				if cmd.Flags().Changed(f.name) {
					return usagef("--%s needs %s", f.name, f.needs)
				}
			}
			for i, h := range o.Hosts {
				h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]") // [::1]
				if !validHost(h) {
					return usagef("invalid --host %q: want a DNS name or an IP address, without a port", o.Hosts[i])
				}
				o.Hosts[i] = h
			}
			if cmd.Flags().Changed("listen") && cmd.Flags().Changed("port") {
				return usagef("--listen and --port exclude each other: put the port into --listen")
			}
			if o.Port < 1 || o.Port > 65535 {
				return usagef("invalid --port %d: want 1..65535", o.Port)
			}
			if o.Listen != "" {
				if _, port, err := net.SplitHostPort(o.Listen); err != nil {
					return usagef("invalid --listen %q: %v", o.Listen, err)
				} else if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
					return usagef("invalid --listen %q: want a port 1..65535", o.Listen)
				}
			}
			return initDeployment(&o, stdout, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Dir, "dir", "", "`directory` to write the deployment into (created if missing)")
	f.StringArrayVar(&o.Hosts, "host", nil, "host `name` or IP clients connect to: the server certificate's names with --tls (repeatable; default 127.0.0.1 and localhost)")
	f.BoolVar(&o.TLS, "tls", false, "also create a private CA and a server certificate")
	f.BoolVar(&o.Force, "force", false, "overwrite an existing deployment in --dir")
	f.IntVar(&o.Port, "port", wire.DefaultPort, "TCP `port` to listen on and to print in the client settings")
	f.StringVar(&o.Listen, "listen", "", "listen `address` to put into the config file (default: 127.0.0.1:PORT when every --host is loopback, else :PORT, all interfaces)")
	f.BoolVar(&o.Cluster, "cluster", false, "write a bundle for a Raft cluster of the --node nodes (always with TLS)")
	f.BoolVar(&o.Add, "add", false, "with --cluster: add the --node nodes to the bundle in --dir (its CAs and tokens), for 'ticketingd cluster add'")
	f.StringArrayVar(&o.Nodes, "node", nil, "with --cluster: a node as `ID=HOST`, its --node-id and the host name or IP that clients and the other nodes reach it at (repeatable, 3 or 5 times); with --pair: primary=HOST and backup=HOST, once each")
	f.IntVar(&o.RaftPort, "raft-port", defaultRaftPort, "with --cluster: TCP `port` of each node's Raft transport (nodes sharing a host: the next ones)")
	f.BoolVar(&o.Pair, "pair", false, "write a bundle for a hot-standby pair of the --node nodes primary and backup (always with TLS)")
	f.IntVar(&o.PeerPort, "peer-port", defaultPeerPort, "with --pair: TCP `port` of each node's peer link (nodes sharing a host: the next one)")
	f.IntVar(&o.AdminPort, "admin-port", defaultAdminPort, "with --cluster or --pair: TCP `port` of each node's admin listener on 127.0.0.1 (nodes sharing a host: the next ones)")
	return cmd
}

// validHost reports whether h can be both a certificate name and the host
// part of a client address: an IP address or a DNS name.
func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for _, r := range h {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return false
		}
	}
	return true
}

// loopbackIP returns the loopback address h stands for: 127.0.0.1 for
// localhost, the address itself for a loopback IP, and nil for any host
// that may be another machine's name.
func loopbackIP(h string) net.IP {
	if strings.EqualFold(strings.TrimSuffix(h, "."), "localhost") {
		return net.IPv4(127, 0, 0, 1)
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return ip
	}
	return nil
}

// initPlan is what init derives from its flags: the certificate's hosts,
// the listen address for the config file, and the address it prints for
// clients, which is always one of the hosts.
type initPlan struct {
	hosts    []string
	listen   string
	wildcard bool   // listen is on all interfaces
	client   string // host:port printed for clients
	port     string
	unserved []string // loopback hosts the loopback listen address does not serve
	unnamed  bool     // --listen is a specific address no host names
}

func planInit(o *initOptions) initPlan {
	var p initPlan
	port := strconv.Itoa(o.Port)
	var lhost string
	if o.Listen != "" {
		lhost, port, _ = net.SplitHostPort(o.Listen) // validated
	}
	lip := net.ParseIP(lhost)
	p.wildcard = lhost == "" || (lip != nil && lip.IsUnspecified())

	p.hosts = o.Hosts
	if len(p.hosts) == 0 {
		switch ip := loopbackIP(lhost); {
		case p.wildcard || ip != nil && ip.Equal(net.IPv4(127, 0, 0, 1)):
			p.hosts = []string{"127.0.0.1", "localhost"}
		case ip != nil: // ::1, say
			p.hosts = []string{lhost, "localhost"}
		default: // a specific interface: clients reach it by that name
			p.hosts = []string{lhost}
		}
	}

	// The printed host: the first one other machines can reach if there is
	// one (the user named it for remote clients), else the first.
	p.client = p.hosts[0]
	remote := false
	for _, h := range p.hosts {
		if loopbackIP(h) == nil {
			p.client, remote = h, true
			break
		}
	}

	switch {
	case o.Listen != "":
		p.listen = o.Listen
		if !p.wildcard {
			// A specific address: print the host that names it if
			// there is one, else warn.
			p.unnamed = true
			for _, h := range p.hosts {
				if strings.EqualFold(h, lhost) || lip != nil && lip.Equal(net.ParseIP(h)) {
					p.client, p.unnamed = h, false
					break
				}
			}
		}
	case remote:
		p.listen, p.wildcard = net.JoinHostPort("", port), true
	default:
		// Every host is loopback: listen on the printed host's address.
		// localhost counts as served by 127.0.0.1 and ::1 alike (it
		// normally resolves to both, and clients fall back from one to the
		// other); another loopback address is only served if it is that
		// one.
		ip := loopbackIP(p.client)
		p.listen, p.wildcard = net.JoinHostPort(ip.String(), port), false
		for _, h := range p.hosts {
			if hip := loopbackIP(h); net.ParseIP(h) != nil && !hip.Equal(ip) {
				p.unserved = append(p.unserved, h)
			}
		}
	}
	p.port = port
	p.client = net.JoinHostPort(p.client, port)
	return p
}

func initDeployment(o *initOptions, stdout, stderr io.Writer) error {
	dir := o.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return runtimef("--dir: %w", err)
	}
	files := []string{initConfigFile, initTokensFile}
	if o.TLS {
		files = append(files, initCACert, initCAKey, initServerCert, initServerKey)
	}
	if !o.Force {
		top := []string{initConfigFile, initTokensFile, initCACert, initCAKey, initServerCert, initServerKey}
		if err := refuseOverwrite(dir, bundleFiles(dir, top, nil, nil)); err != nil {
			return err
		}
	}

	token, err := randomToken()
	if err != nil {
		return err
	}

	if err := os.MkdirAll(filepath.Join(dir, initDataDir), 0o700); err != nil {
		return runtimef("data dir: %w", err)
	}
	tokensBody := "# Client tokens accepted by ticketingd: one per line, # starts a comment.\n" +
		"# Keep this file mode 0600. Add a token here to rotate, restart, then remove the old one.\n" +
		token + "\n"
	if err := writeFile(filepath.Join(dir, initTokensFile), []byte(tokensBody), 0o600); err != nil {
		return err
	}

	plan := planInit(o)
	if o.TLS {
		if err := writeTLS(dir, plan.hosts); err != nil {
			return err
		}
	}

	var cfg strings.Builder
	fmt.Fprintf(&cfg, "# ticketingd configuration, written by 'ticketingd init'.\n")
	fmt.Fprintf(&cfg, "# Keys are the flag names of 'ticketingd serve'; relative paths are relative to this file.\n")
	if plan.wildcard {
		fmt.Fprintf(&cfg, "# Clients connect to %s: listen on all interfaces.\n", strings.Join(plan.hosts, ", "))
	} else {
		fmt.Fprintf(&cfg, "# Clients connect to %s: listen on that address only.\n", strings.Join(plan.hosts, ", "))
	}
	fmt.Fprintf(&cfg, "listen: %q\n", plan.listen)
	fmt.Fprintf(&cfg, "data-dir: %s\n", initDataDir)
	fmt.Fprintf(&cfg, "client-tokens-file: %s\n", initTokensFile)
	if o.TLS {
		fmt.Fprintf(&cfg, "tls-cert: %s\ntls-key: %s\n", initServerCert, initServerKey)
		fmt.Fprintf(&cfg, "# tls-client-ca: clients-ca.pem   # require client certificates\n")
	}
	fmt.Fprintf(&cfg, "# admin-listen: \"127.0.0.1:9225\"   # /metrics, /healthz, /status\n")
	fmt.Fprintf(&cfg, "log-level: info\nlog-format: text\n")
	fmt.Fprintf(&cfg, "shutdown-timeout: 10s\n")
	fmt.Fprintf(&cfg, "# max-locks: 2000000\n# max-waiters: 1000000\n# max-key-waiters: 10000\n# max-sessions: 10000\n")
	fmt.Fprintf(&cfg, "# max-sessions-per-peer: 2500\n# max-pending-conns: 1000\n# idle-timeout: 30s\n")
	fmt.Fprintf(&cfg, "# socket-buffer: 65536\n# write-timeout: 3s\n")
	cfg.WriteString(tokenStartConfig)
	fmt.Fprintf(&cfg, "# Moving from another installation whose tokens may be above this machine's clock\n"+
		"# (its clock was ahead)? Set this to at least the highest high_water in your fence\n"+
		"# tables, for the first start:\n# initial-token: 0\n")
	cfgPath := filepath.Join(dir, initConfigFile)
	if err := writeFile(cfgPath, []byte(cfg.String()), 0o644); err != nil {
		return err
	}

	tokensPath := filepath.Join(dir, initTokensFile)
	caPath, _ := filepath.Abs(filepath.Join(dir, initCACert))
	// The URL as broker.ParseURL reads it, with everything a client needs:
	// the address, the token (base64url: nothing to escape) and the CA.
	// The CA path is query-escaped, which also makes it safe inside single
	// quotes, keeping its slashes readable.
	query := ""
	if o.TLS {
		query = caQuery(caPath)
	}
	clientURL := "ticketing://" + token + "@" + plan.client + query

	w := stdout
	fmt.Fprintf(w, "Wrote a ticketingd deployment to %s (%s).\n\n", dir, strings.Join(files, ", "))
	fmt.Fprintf(w, "Start the server:\n\n    ticketingd serve --config %s\n\n", shellQuote(cfgPath))
	switch {
	case plan.wildcard:
		fmt.Fprintf(w, "It listens on %s (all interfaces).\n\n", plan.listen)
	case isLoopbackListen(plan.listen):
		fmt.Fprintf(w, "It listens on %s only: clients on other machines cannot reach it (see --host, --listen).\n\n", plan.listen)
	default:
		fmt.Fprintf(w, "It listens on %s.\n\n", plan.listen)
	}
	fmt.Fprintf(w, "Give each client this URL through its environment: it carries the server address,\n")
	fmt.Fprintf(w, "the client token and the TLS settings (the token is shown once, here; it is also\n")
	fmt.Fprintf(w, "in %s):\n\n", tokensPath)
	fmt.Fprintf(w, "    export TICKETING_URL='%s'\n\n", clientURL)
	fmt.Fprintf(w, "The URL form is ticketing://[TOKEN@]HOST[:PORT][,HOST[:PORT]...][?ca=PATH|tls=system][&name=NAME];\n")
	fmt.Fprintf(w, "it holds the token: keep it out of code and repositories.")
	if o.TLS {
		fmt.Fprintf(w, "\nA client on another machine needs a copy of %s and its path there in ca=.", caPath)
	}
	fmt.Fprintf(w, "\n\nConnect from Go:\n\n")
	fmt.Fprintf(w, "    cfg, err := broker.ParseURL(os.Getenv(\"TICKETING_URL\"))\n")
	fmt.Fprintf(w, "    if err != nil {\n        return err\n    }\n")
	fmt.Fprintf(w, "    b, err := broker.New(cfg)\n")
	fmt.Fprintf(w, "    if err != nil {\n        return err\n    }\n")
	fmt.Fprintf(w, "    defer b.Close()\n")
	fmt.Fprintf(w, "    if err := b.WaitReady(ctx); err != nil { // sessions open in the background\n        return err\n    }\n")
	if o.TLS {
		fmt.Fprintf(w, "\nThe server certificate is valid for: %s; clients must connect with one of\nthese names. Keep %s offline if you can: it signs certificates every client trusts.\n",
			strings.Join(plan.hosts, ", "), filepath.Join(dir, initCAKey))
	}

	if len(plan.unserved) > 0 {
		fmt.Fprintf(stderr, "ticketingd init: warning: the config listens on %s, so clients of %s cannot connect; give --listen to choose\n",
			plan.listen, strings.Join(plan.unserved, ", "))
	}
	if plan.unnamed {
		fmt.Fprintf(stderr, "ticketingd init: warning: --listen %s is an address none of the hosts (%s) names: the printed settings may not reach it\n",
			plan.listen, strings.Join(plan.hosts, ", "))
	}
	if !o.TLS && !isLoopbackListen(plan.listen) {
		fmt.Fprintf(stderr, "ticketingd init: warning: the config listens on %s, reachable from other machines, without TLS:\n"+
			"the client token and lock traffic cross the network in clear, and 'ticketingd serve' will warn at each start.\n"+
			"Run init with --tls (and --force), or --listen 127.0.0.1:%s for clients on this machine only.\n", plan.listen, plan.port)
	}
	return nil
}

// tokenStartConfig is the token-start setting of every config init
// writes, with why: the protocol's start at 1 is kept for a bare serve.
const tokenStartConfig = "# A new data dir (or a new cluster) issues tokens above the wall clock in\n" +
	"# microseconds, not from 1 (the protocol's default, which a bare 'ticketingd serve'\n" +
	"# keeps): a reinstalled or wiped server must never issue tokens below those an\n" +
	"# earlier installation issued, or fenced databases refuse its writes as stale.\n" +
	"# Read once, when the data dir or cluster is created; a restart continues from\n" +
	"# the stored state. In a cluster the first leader's setting decides.\n" +
	"token-start: clock\n"

// shellQuote quotes s for sh if it holds anything but the characters of
// plain paths.
func shellQuote(s string) string {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+:,@", r)) {
			return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
	}
	return s
}

// isLoopbackListen reports whether a listen address accepts connections
// from this machine only (the rule of serve's exposure warning).
func isLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return strings.EqualFold(host, "localhost")
	}
	return ip.IsLoopback()
}

// writeFile creates path with perm (exactly: umask does not widen or narrow
// key files), replacing any existing file.
func writeFile(path string, data []byte, perm os.FileMode) error {
	_ = os.Remove(path) // --force: a fresh file gets perm, an old one might keep wider bits
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return runtimef("write %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return runtimef("chmod %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return runtimef("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return runtimef("write %s: %w", path, err)
	}
	return nil
}

func writeTLS(dir string, hosts []string) error {
	now := time.Now()
	ca, err := pki.NewCA("ticketingd private CA", now.AddDate(10, 0, 0).Sub(now))
	if err != nil {
		return runtimef("%w", err)
	}
	srv, err := ca.Issue(pki.Server, hosts, now.AddDate(2, 0, 0).Sub(now))
	if err != nil {
		return runtimef("%w", err)
	}
	return writePairs(dir, []pemFile{
		{initCACert, &ca.KeyPair, false, 0o644},
		{initCAKey, &ca.KeyPair, true, 0o600},
		{initServerCert, srv, false, 0o644},
		{initServerKey, srv, true, 0o600},
	})
}

// caQuery is the query of a client URL that names the CA file path:
// query-escaped, which also makes it safe inside single quotes, keeping its
// slashes readable.
func caQuery(caPath string) string {
	return "?ca=" + strings.ReplaceAll(url.QueryEscape(caPath), "%2F", "/")
}
