package main

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/server"
)

// Default ports of 'ticketingd init --cluster' (the client port is
// wire.DefaultPort).
const (
	defaultRaftPort  = 7225
	defaultAdminPort = 9225
)

// Names of the files 'ticketingd init --cluster' writes: in DIR, the two
// CAs; in DIR/ID, a node's files (initConfigFile, initTokensFile,
// initDataDir, initServerCert and initServerKey as for a single node, and
// these).
const (
	initClusterCACert  = "cluster-ca.pem"
	initClusterCAKey   = "cluster-ca-key.pem"
	initNodeCert       = "node.pem"
	initNodeKey        = "node-key.pem"
	initAdminTokenFile = "admin-token"
)

// clusterNodePlan is one node of a cluster bundle.
type clusterNodePlan struct {
	id, host               string
	listen, raft, adminAdr string // host:port
}

// clusterPlan is what 'init --cluster' derives from its flags.
type clusterPlan struct {
	nodes    []clusterNodePlan
	loopback bool // every host is a loopback one
}

// hostKey is the normalized host of a node: an IP address in its
// canonical form, a name in lower case.
func hostKey(host string) string {
	if ip := net.ParseIP(host); ip != nil {
		return ip.String()
	}
	return strings.ToLower(host)
}

// planCluster parses --node ID=HOST entries and gives every node its
// addresses: the client, Raft and admin ports, plus k for the k-th node on
// the same host, so that nodes sharing a host do not collide. existing are
// the nodes of the bundle that --add adds to: their IDs and ports are
// taken, and a new node gets the first k whose three ports are free on its
// host.
func planCluster(o *initOptions, existing []clusterNodePlan) (clusterPlan, error) {
	var p clusterPlan
	if len(o.Nodes) == 0 {
		return p, usagef("--cluster needs its nodes: --node ID=HOST, once per node (3 or 5 of them)")
	}
	for _, name := range []struct {
		flag string
		port int
	}{{"port", o.Port}, {"raft-port", o.RaftPort}, {"admin-port", o.AdminPort}} {
		if name.port < 1 || name.port > 65535 {
			return p, usagef("invalid --%s %d: want 1..65535", name.flag, name.port)
		}
	}
	ids := map[string]bool{}
	onHost := map[string]int{} // host key -> nodes so far
	loopbacks := 0
	used := map[string]string{} // host key + port -> what uses it
	for _, n := range existing {
		ids[n.id] = true
		if loopbackIP(n.host) != nil {
			loopbacks++
		}
		for _, a := range []struct{ addr, what string }{{n.listen, "client port"}, {n.raft, "Raft port"}, {n.adminAdr, "admin port"}} {
			if _, port, err := net.SplitHostPort(a.addr); err == nil {
				used[hostKey(n.host)+" "+port] = n.id + "'s " + a.what
			}
		}
	}
	for _, e := range o.Nodes {
		id, host, ok := strings.Cut(e, "=")
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		if !ok {
			return p, usagef("invalid --node %q: want ID=HOST", e)
		}
		if !validNodeID(id) {
			return p, usagef("invalid --node %q: the ID must be 1 to %d letters, digits, '.', '_' or '-'", e, maxNodeIDLen)
		}
		if !validHost(host) {
			return p, usagef("invalid --node %q: want a DNS name or an IP address as HOST, without a port", e)
		}
		if ids[id] {
			if len(existing) > 0 {
				return p, usagef("--node %s: the bundle in %s has a node %s already (node IDs are never reused)", id, o.Dir, id)
			}
			return p, usagef("--node %s is given twice", id)
		}
		ids[id] = true
		key := hostKey(host)
		k := onHost[key]
		onHost[key]++
		if loopbackIP(host) != nil {
			loopbacks++
		}
		for {
			n, taken, err := placeNode(o, id, host, key, k, used)
			if err != nil {
				return p, err
			}
			if taken != "" && len(existing) > 0 {
				k++ // --add: the next ports
				continue
			}
			if taken != "" {
				return p, usagef("%s: choose --port, --raft-port and --admin-port further apart", taken)
			}
			for _, a := range []struct{ addr, what string }{{n.listen, "client port"}, {n.raft, "Raft port"}, {n.adminAdr, "admin port"}} {
				_, port, _ := net.SplitHostPort(a.addr)
				used[key+" "+port] = id + "'s " + a.what
			}
			p.nodes = append(p.nodes, n)
			break
		}
	}
	if loopbacks != 0 && loopbacks != len(p.nodes)+len(existing) {
		return p, usagef("--node hosts mix loopback and other addresses: nodes on other machines cannot reach a node on loopback")
	}
	p.loopback = loopbacks != 0
	return p, nil
}

// placeNode gives node id on host its addresses with the base ports plus
// k. taken, if not empty, says which of them another node has already
// (used: host key + port -> what). Admin listeners are on each node's own
// loopback: they collide only with nodes on the same host.
func placeNode(o *initOptions, id, host, key string, k int, used map[string]string) (n clusterNodePlan, taken string, err error) {
	n = clusterNodePlan{id: id, host: host}
	for _, a := range []struct {
		dst  *string
		host string
		port int
		what string
	}{
		{&n.listen, host, o.Port + k, "client port"},
		{&n.raft, host, o.RaftPort + k, "Raft port"},
		{&n.adminAdr, "127.0.0.1", o.AdminPort + k, "admin port"},
	} {
		if a.port > 65535 {
			return n, "", usagef("too many nodes on %s for the ports from --port, --raft-port and --admin-port: %s's %s would be %d", host, id, a.what, a.port)
		}
		*a.dst = net.JoinHostPort(a.host, strconv.Itoa(a.port))
		if other, dup := used[key+" "+strconv.Itoa(a.port)]; dup && taken == "" {
			taken = fmt.Sprintf("%s's %s %d on %s is also %s", id, a.what, a.port, host, other)
		}
	}
	return n, taken, nil
}

func initClusterCmd(cmd *cobra.Command, o *initOptions, stdout io.Writer) error {
	for _, name := range []string{"host", "listen"} {
		if cmd.Flags().Changed(name) {
			return usagef("--%s and --cluster exclude each other: --node ID=HOST names each node's host", name)
		}
	}
	if o.Port == o.RaftPort || o.Port == o.AdminPort || o.RaftPort == o.AdminPort {
		return usagef("--port, --raft-port and --admin-port must differ")
	}
	var b *bundle
	if o.Add {
		var err error
		if b, err = loadBundle(o.Dir); err != nil {
			return err
		}
	}
	var existing []clusterNodePlan
	if b != nil {
		existing = b.nodes
		b.basePorts(cmd.Flags(), o)
	}
	plan, err := planCluster(o, existing)
	if err != nil {
		return err
	}
	return initCluster(o, plan, b, stdout, cmd.ErrOrStderr())
}

// bundle is what --add reads from an existing 'init --cluster' bundle.
type bundle struct {
	clientCA, clusterCA     *pki.CA
	clientToken, adminToken string
	clusterID               string // empty in a bundle of an earlier version
	nodes                   []clusterNodePlan
}

// basePorts sets the base ports of --add that are not given on the
// command line to the bundle's: the lowest client, Raft and admin port of
// its nodes (the bases 'init --cluster' was given, since its first node
// on every host has them).
func (b *bundle) basePorts(fs *pflag.FlagSet, o *initOptions) {
	for _, f := range []struct {
		flag string
		dst  *int
		addr func(n clusterNodePlan) string
	}{
		{"port", &o.Port, func(n clusterNodePlan) string { return n.listen }},
		{"raft-port", &o.RaftPort, func(n clusterNodePlan) string { return n.raft }},
		{"admin-port", &o.AdminPort, func(n clusterNodePlan) string { return n.adminAdr }},
	} {
		if fs.Changed(f.flag) {
			continue
		}
		low := 0
		for _, n := range b.nodes {
			if _, port, err := net.SplitHostPort(f.addr(n)); err == nil {
				if p, err := strconv.Atoi(port); err == nil && p > 0 && (low == 0 || p < low) {
					low = p
				}
			}
		}
		if low != 0 {
			*f.dst = low
		}
	}
}

// loadBundle reads the CAs, tokens and node configs of the bundle in dir.
// The node configs are read by the loader of 'serve --config'.
func loadBundle(dir string) (*bundle, error) {
	var b bundle
	loadCA := func(cert, key string) (*pki.CA, error) {
		c, err := os.ReadFile(filepath.Join(dir, cert))
		if err != nil {
			return nil, runtimef("--add: %w (is %s a bundle of 'init --cluster'?)", err, dir)
		}
		k, err := os.ReadFile(filepath.Join(dir, key))
		if err != nil {
			return nil, runtimef("--add: %w", err)
		}
		ca, err := pki.LoadCA(c, k)
		if err != nil {
			return nil, runtimef("--add: %s: %w", filepath.Join(dir, cert), err)
		}
		return ca, nil
	}
	var err error
	if b.clientCA, err = loadCA(initCACert, initCAKey); err != nil {
		return nil, err
	}
	if b.clusterCA, err = loadCA(initClusterCACert, initClusterCAKey); err != nil {
		return nil, err
	}
	tokens, _, err := readTokensFile(filepath.Join(dir, initTokensFile))
	if err != nil {
		return nil, err
	}
	b.clientToken = tokens[0]
	adm, err := os.ReadFile(filepath.Join(dir, initAdminTokenFile))
	if err != nil {
		return nil, runtimef("--add: %w", err)
	}
	b.adminToken = strings.TrimSpace(string(adm))
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, runtimef("--add: %w", err)
	}
	for _, e := range entries {
		cfg := filepath.Join(dir, e.Name(), initConfigFile)
		if !e.IsDir() {
			continue
		}
		if _, err := os.Stat(cfg); err != nil {
			continue
		}
		var so serveOptions
		fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		so.register(fs)
		so.Config = cfg
		if err := so.applyConfigFile(fs); err != nil {
			return nil, err
		}
		host, _, err := net.SplitHostPort(so.Listen)
		if err != nil || so.NodeID == "" {
			return nil, usagef("--add: %s is not the config of a cluster node", cfg)
		}
		b.nodes = append(b.nodes, clusterNodePlan{id: so.NodeID, host: host, listen: so.Listen, raft: so.RaftListen, adminAdr: so.AdminListen})
		if b.clusterID == "" {
			b.clusterID = so.ClusterID
		}
	}
	if len(b.nodes) == 0 {
		return nil, runtimef("--add: no node directories (ID/%s) in %s", initConfigFile, dir)
	}
	return &b, nil
}

// randomToken is 32 bytes from crypto/rand, base64url without padding.
func randomToken() (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", runtimef("random token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(raw[:]), nil
}

// initCluster writes the cluster bundle of plan into o.Dir, or with b (an
// existing bundle, --add) the directories of plan's nodes, and prints how
// to use them.
func initCluster(o *initOptions, plan clusterPlan, b *bundle, stdout, stderr io.Writer) error {
	dir := o.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return runtimef("--dir: %w", err)
	}
	nodeFiles := []string{initConfigFile, initTokensFile, initServerCert, initServerKey, initNodeCert, initNodeKey, initClusterCACert}
	if !o.Force {
		var check []string
		if b == nil {
			check = []string{filepath.Join(dir, initCACert), filepath.Join(dir, initCAKey), filepath.Join(dir, initClusterCACert),
				filepath.Join(dir, initClusterCAKey), filepath.Join(dir, initAdminTokenFile), filepath.Join(dir, initTokensFile)}
		}
		for _, n := range plan.nodes {
			for _, name := range nodeFiles {
				check = append(check, filepath.Join(dir, n.id, name))
			}
		}
		for _, p := range check {
			if _, err := os.Lstat(p); err == nil {
				return runtimef("%s already exists: %s holds a deployment; use --force to overwrite it", p, dir)
			}
		}
	}

	var err error
	adding := false
	if b == nil {
		if b, err = newBundle(dir); err != nil {
			return err
		}
		b.nodes = plan.nodes
	} else if len(plan.nodes) > 0 {
		adding = true
	}
	clientCA, clusterCA, clientToken, adminToken := b.clientCA, b.clusterCA, b.clientToken, b.adminToken
	certLife := 2 * 365 * 24 * time.Hour

	// The initial configuration: every node of a new bundle. A node added
	// to a running cluster has none: it waits to be added, and never
	// bootstraps (initial-cluster-state existing).
	var peers []string
	state := initialStateNew
	if adding {
		state = initialStateExisting
	} else {
		for _, n := range plan.nodes {
			peers = append(peers, n.id+"="+n.raft)
		}
	}
	for _, n := range plan.nodes {
		nd := filepath.Join(dir, n.id)
		if err := os.MkdirAll(filepath.Join(nd, initDataDir), 0o700); err != nil {
			return runtimef("data dir: %w", err)
		}
		srvPair, err := clientCA.Issue(pki.Server, []string{n.host}, certLife)
		if err != nil {
			return runtimef("%w", err)
		}
		// The Raft address's host is the node's host: the one SAN peers
		// verify against the address they dial.
		raftHost, _, _ := net.SplitHostPort(n.raft)
		nodeHosts := []string{n.host}
		if raftHost != n.host {
			nodeHosts = append(nodeHosts, raftHost)
		}
		nodePair, err := clusterCA.Issue(pki.Node, nodeHosts, certLife)
		if err != nil {
			return runtimef("%w", err)
		}
		if err := writePairs(nd, []pemFile{
			{initServerCert, srvPair, false, 0o644},
			{initServerKey, srvPair, true, 0o600},
			{initNodeCert, nodePair, false, 0o644},
			{initNodeKey, nodePair, true, 0o600},
			{initClusterCACert, &clusterCA.KeyPair, false, 0o644},
		}); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(nd, initTokensFile), []byte(clientTokensBody(clientToken)), 0o600); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(nd, initConfigFile), []byte(clusterNodeConfig(n, peers, adminToken, b.clusterID, state)), 0o600); err != nil {
			return err
		}
	}

	if adding {
		printAddGuide(stdout, o, plan, b)
		return nil
	}
	printClusterGuide(stdout, o, plan, clientToken, adminToken)
	if n := len(plan.nodes); n < 3 || n%2 == 0 {
		fmt.Fprintf(stderr, "ticketingd init: warning: a cluster of %d nodes survives the loss of %d of them; 3 nodes survive 1, 5 survive 2\n", n, (n-1)/2)
	}
	return nil
}

// newBundle creates the CAs and tokens of a new bundle and writes them
// into dir.
func newBundle(dir string) (*bundle, error) {
	var b bundle
	var err error
	b.clusterID = server.NewClusterID()
	if b.clientToken, err = randomToken(); err != nil {
		return nil, err
	}
	if b.adminToken, err = randomToken(); err != nil {
		return nil, err
	}
	caLife := 10 * 365 * 24 * time.Hour
	if b.clientCA, err = pki.NewCA("ticketingd private CA", caLife); err != nil {
		return nil, runtimef("%w", err)
	}
	if b.clusterCA, err = pki.NewCA("ticketingd cluster CA", caLife); err != nil {
		return nil, runtimef("%w", err)
	}
	if err := writePairs(dir, []pemFile{
		{initCACert, &b.clientCA.KeyPair, false, 0o644},
		{initCAKey, &b.clientCA.KeyPair, true, 0o600},
		{initClusterCACert, &b.clusterCA.KeyPair, false, 0o644},
		{initClusterCAKey, &b.clusterCA.KeyPair, true, 0o600},
	}); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, initAdminTokenFile), []byte(b.adminToken+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, initTokensFile), []byte(clientTokensBody(b.clientToken)), 0o600); err != nil {
		return nil, err
	}
	return &b, nil
}

func clientTokensBody(token string) string {
	return "# Client tokens accepted by ticketingd: one per line, # starts a comment.\n" +
		"# Keep this file mode 0600 and the same on every node of the cluster.\n" + token + "\n"
}

// clusterNodeConfig is the ticketingd.yaml of node n: of a new cluster
// (state new, peers every node) or added to a running one (state
// existing, no peers).
func clusterNodeConfig(n clusterNodePlan, peers []string, adminToken, clusterID, state string) string {
	var c strings.Builder
	fmt.Fprintf(&c, "# ticketingd configuration of cluster node %s, written by 'ticketingd init --cluster'.\n", n.id)
	fmt.Fprintf(&c, "# Keys are the flag names of 'ticketingd serve'; relative paths are relative to this file.\n")
	fmt.Fprintf(&c, "# Mode 0600: it holds the admin token.\n")
	fmt.Fprintf(&c, "listen: %q\n", n.listen)
	fmt.Fprintf(&c, "data-dir: %s\n", initDataDir)
	fmt.Fprintf(&c, "client-tokens-file: %s\n", initTokensFile)
	fmt.Fprintf(&c, "tls-cert: %s\ntls-key: %s\n", initServerCert, initServerKey)
	fmt.Fprintf(&c, "\n# The cluster. A node with Raft state (data/raft) ignores initial-cluster-state\n")
	fmt.Fprintf(&c, "# and peers. Without state: 'new' bootstraps from peers once every peer has\n")
	fmt.Fprintf(&c, "# answered that it starts this same new cluster (a node whose data dir was wiped\n")
	fmt.Fprintf(&c, "# refuses: see docs/operations.md, \"Refusals at start\"); 'existing' waits to be\n")
	fmt.Fprintf(&c, "# added to the running cluster ('ticketingd cluster add') and never bootstraps.\n")
	fmt.Fprintf(&c, "cluster: true\n")
	if clusterID != "" {
		fmt.Fprintf(&c, "cluster-id: %s\n", clusterID)
	}
	fmt.Fprintf(&c, "initial-cluster-state: %s\n", state)
	fmt.Fprintf(&c, "node-id: %s\n", n.id)
	fmt.Fprintf(&c, "node-name: %s   # sent to clients in HELLO_OK: their logs say node=%s\n", n.id, n.id)
	fmt.Fprintf(&c, "raft-listen: %q\n", n.raft)
	fmt.Fprintf(&c, "# raft-advertise: %q   # default raft-listen\n", n.raft)
	fmt.Fprintf(&c, "advertise: %q\n", n.listen)
	if len(peers) > 0 {
		fmt.Fprintf(&c, "peers:\n")
		for _, p := range peers {
			fmt.Fprintf(&c, "  - %q\n", p)
		}
	}
	fmt.Fprintf(&c, "peer-tls-cert: %s\npeer-tls-key: %s\npeer-tls-ca: %s\n", initNodeCert, initNodeKey, initClusterCACert)
	fmt.Fprintf(&c, "# raft-heartbeat: 500ms\n# raft-election: 500ms\n")
	fmt.Fprintf(&c, "\n# /metrics, /healthz, /status, /cluster/add, /cluster/remove; every request but\n")
	fmt.Fprintf(&c, "# GET /healthz needs 'Authorization: Bearer <admin-token>'.\n")
	fmt.Fprintf(&c, "admin-listen: %q\n", n.adminAdr)
	fmt.Fprintf(&c, "admin-token: %q\n", adminToken)
	fmt.Fprintf(&c, "\n%s", tokenStartConfig)
	fmt.Fprintf(&c, "\nlog-level: info\nlog-format: text\nshutdown-timeout: 10s\n")
	return c.String()
}

func printClusterGuide(w io.Writer, o *initOptions, plan clusterPlan, clientToken, adminToken string) {
	dir := o.Dir
	var ids, addrs []string
	for _, n := range plan.nodes {
		ids = append(ids, n.id)
		addrs = append(addrs, n.listen)
	}
	caPath, _ := filepath.Abs(filepath.Join(dir, initCACert))
	fmt.Fprintf(w, "Wrote a ticketingd cluster bundle for %d nodes (%s) to %s:\n", len(plan.nodes), strings.Join(ids, ", "), dir)
	fmt.Fprintf(w, "a client CA (%s), a cluster CA for the peer links (%s), the admin token (%s),\n", initCACert, initClusterCACert, initAdminTokenFile)
	fmt.Fprintf(w, "and per node a directory with its config, certificates, client token and data directory.\n\n")
	if plan.loopback {
		fmt.Fprintf(w, "Start every node, each in its own terminal (or under a service manager):\n\n")
		for _, n := range plan.nodes {
			fmt.Fprintf(w, "    ticketingd serve --config %s\n", shellQuote(filepath.Join(dir, n.id, initConfigFile)))
		}
	} else {
		fmt.Fprintf(w, "Copy each node's directory to its machine (%s and %s stay here,\n", initCAKey, initClusterCAKey)
		fmt.Fprintf(w, "offline if you can), for example:\n\n")
		for _, n := range plan.nodes {
			fmt.Fprintf(w, "    scp -rp %s %s:ticketing-%s\n", shellQuote(filepath.Join(dir, n.id)), sshHost(n.host), n.id)
		}
		fmt.Fprintf(w, "\nand start each node there (paths in its config are relative to the config file):\n\n")
		for _, n := range plan.nodes {
			fmt.Fprintf(w, "    ticketingd serve --config ticketing-%s/%s    # on %s\n", n.id, initConfigFile, n.host)
		}
	}
	fmt.Fprintf(w, "\nThe nodes find each other through their peers, elect a leader, and only the leader\n")
	fmt.Fprintf(w, "serves; the others send clients to it. The client addresses: %s.\n\n", strings.Join(addrs, ", "))
	fmt.Fprintf(w, "Give each client this URL: it carries every node's address, the client token and the\n")
	fmt.Fprintf(w, "TLS settings (the token is shown once, here; it is also in each node's %s):\n\n", initTokensFile)
	query := caQuery(caPath)
	fmt.Fprintf(w, "    export TICKETING_URL='ticketing://%s@%s%s'\n\n", clientToken, strings.Join(addrs, ","), query)
	if !plan.loopback {
		fmt.Fprintf(w, "A client on another machine needs a copy of %s and its path there in ca=.\n\n", caPath)
	}
	fmt.Fprintf(w, "The admin listeners are on each node's loopback (127.0.0.1). On a node's machine\n")
	fmt.Fprintf(w, "(the admin token is also in %s):\n\n", filepath.Join(dir, initAdminTokenFile))
	fmt.Fprintf(w, "    export TICKETING_ADMIN_TOKEN='%s'\n", adminToken)
	fmt.Fprintf(w, "    ticketingd cluster status --admin %s\n\n", plan.nodes[0].adminAdr)
	if plan.loopback {
		fmt.Fprintf(w, "The admin ports: ")
		for i, n := range plan.nodes {
			if i > 0 {
				fmt.Fprintf(w, ", ")
			}
			fmt.Fprintf(w, "%s %s", n.id, n.adminAdr)
		}
		fmt.Fprintf(w, ".\n")
	}
	fmt.Fprintf(w, "Keep %s and %s offline if you can:\nthey sign certificates that clients and nodes trust.\n",
		filepath.Join(dir, initCAKey), filepath.Join(dir, initClusterCAKey))
}

// sshHost is host as scp wants it: an IPv6 address in brackets.
func sshHost(host string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]"
	}
	return host
}

// pemFile is a certificate or key file of a KeyPair.
type pemFile struct {
	name string
	pair *pki.KeyPair
	key  bool // the private key, else the certificate
	perm os.FileMode
}

// writePairs writes PEM files into dir.
func writePairs(dir string, files []pemFile) error {
	for _, f := range files {
		data := f.pair.CertPEM()
		if f.key {
			var err error
			if data, err = f.pair.KeyPEM(); err != nil {
				return runtimef("%s: %w", f.name, err)
			}
		}
		if err := writeFile(filepath.Join(dir, f.name), data, f.perm); err != nil {
			return err
		}
	}
	return nil
}

// printAddGuide says how to start the nodes --add wrote and add them to
// the running cluster.
func printAddGuide(w io.Writer, o *initOptions, plan clusterPlan, b *bundle) {
	dir := o.Dir
	var ids, raft []string
	for _, n := range plan.nodes {
		ids = append(ids, n.id)
		raft = append(raft, n.id+"="+n.raft)
	}
	fmt.Fprintf(w, "Added %s to the bundle in %s (a directory per node with its config, certificates,\n", strings.Join(ids, ", "), dir)
	fmt.Fprintf(w, "client token and data directory). Their configs have initial-cluster-state existing\n")
	fmt.Fprintf(w, "and no peers: such a node waits to be added, and never bootstraps a cluster of its own.\n\n")
	them := "it"
	if len(plan.nodes) > 1 {
		them = "them"
	}
	if plan.loopback {
		fmt.Fprintf(w, "Start %s:\n\n", them)
		for _, n := range plan.nodes {
			fmt.Fprintf(w, "    ticketingd serve --config %s\n", shellQuote(filepath.Join(dir, n.id, initConfigFile)))
		}
	} else {
		fmt.Fprintf(w, "Copy each new node's directory to its machine and start it there:\n\n")
		for _, n := range plan.nodes {
			fmt.Fprintf(w, "    scp -rp %s %s:ticketing-%s\n", shellQuote(filepath.Join(dir, n.id)), sshHost(n.host), n.id)
		}
		fmt.Fprintf(w, "\n")
		for _, n := range plan.nodes {
			fmt.Fprintf(w, "    ticketingd serve --config ticketing-%s/%s    # on %s\n", n.id, initConfigFile, n.host)
		}
	}
	fmt.Fprintf(w, "\nThen add %s on the leader, one node at a time (on the leader's machine: the admin\n", them)
	fmt.Fprintf(w, "listeners are on loopback; 'ticketingd cluster status' on any node names the leader):\n\n")
	fmt.Fprintf(w, "    export TICKETING_ADMIN_TOKEN=\"$(cat %s)\"\n", shellQuote(filepath.Join(dir, initAdminTokenFile)))
	admin := b.nodes[0].adminAdr
	if plan.loopback { // every node's admin listener is on this machine: ask them in turn
		var all []string
		for _, n := range b.nodes {
			all = append(all, n.adminAdr)
		}
		admin = strings.Join(all, ",")
	}
	for _, r := range raft {
		fmt.Fprintf(w, "    ticketingd cluster add %s --admin %s\n", r, admin)
	}
	if plan.loopback {
		fmt.Fprintf(w, "\n(the command tries the admin listeners in turn until it reaches the leader).")
	} else {
		fmt.Fprintf(w, "\nIf the node at %s is not the leader, the command names the one that is.", admin)
	}
	var addrs []string
	for _, n := range append(slices.Clone(b.nodes), plan.nodes...) {
		addrs = append(addrs, n.listen)
	}
	caPath, _ := filepath.Abs(filepath.Join(dir, initCACert))
	fmt.Fprintf(w, "\n\nClients must list the new address too (the broker follows hints only to listed addresses; a removed node's address can go),\n")
	fmt.Fprintf(w, "with TOKEN the client token of their URL now (it is in %s):\n\n", filepath.Join(dir, initTokensFile))
	fmt.Fprintf(w, "    export TICKETING_URL='ticketing://TOKEN@%s%s'\n\n", strings.Join(addrs, ","), caQuery(caPath))
}
