package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

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
// these). 'init --pair' writes the admin token and the node certificate
// files under the same names.
const (
	initClusterCACert  = "cluster-ca.pem"
	initClusterCAKey   = "cluster-ca-key.pem"
	initNodeCert       = "node.pem"
	initNodeKey        = "node-key.pem"
	initAdminTokenFile = "admin-token"
)

func initClusterCmd(cmd *cobra.Command, o *initOptions, stdout io.Writer) error {
	for _, name := range []string{"host", "listen"} {
		if cmd.Flags().Changed(name) {
			return usagef("--%s and --cluster exclude each other: --node ID=HOST names each node's host", name)
		}
	}
	if cmd.Flags().Changed("peer-port") {
		return usagef("--peer-port needs --pair")
	}
	if err := o.checkPortsDiffer(); err != nil {
		return err
	}
	var b *bundle
	if o.Add {
		var err error
		if b, err = loadBundle(o.Dir); err != nil {
			return err
		}
	}
	var existing []nodePlan
	if b != nil {
		existing = b.nodes
		b.basePorts(cmd.Flags(), o)
	}
	if len(o.Nodes) == 0 {
		return usagef("--cluster needs its nodes: --node ID=HOST, once per node (3 or 5 of them)")
	}
	plan, err := planNodes(o, existing)
	if err != nil {
		return err
	}
	return initCluster(o, plan, b, stdout, cmd.ErrOrStderr())
}

// bundle is the CAs, tokens and nodes of a bundle: of a new one
// (newBundle, without nodes), or what --add reads from an existing 'init
// --cluster' bundle. A pair's has no clusterCA.
type bundle struct {
	clientCA, clusterCA     *pki.CA
	clientToken, adminToken string
	groupID                 string // a cluster's cluster-id, a pair's pair-id; empty in a cluster bundle of an earlier version
	nodes                   []nodePlan
}

// basePorts sets the base ports of --add that are not given on the
// command line to the bundle's: the lowest client, Raft and admin port of
// its nodes (the bases 'init --cluster' was given, since its first node
// on every host has them).
func (b *bundle) basePorts(fs *pflag.FlagSet, o *initOptions) {
	for _, f := range []struct {
		flag string
		dst  *int
		addr func(n nodePlan) string
	}{
		{"port", &o.Port, func(n nodePlan) string { return n.listen }},
		{"raft-port", &o.RaftPort, func(n nodePlan) string { return n.link }},
		{"admin-port", &o.AdminPort, func(n nodePlan) string { return n.adminAdr }},
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
		b.nodes = append(b.nodes, nodePlan{id: so.NodeID, host: host, listen: so.Listen, link: so.RaftListen, adminAdr: so.AdminListen})
		if b.groupID == "" {
			b.groupID = so.ClusterID
		}
	}
	if len(b.nodes) == 0 {
		return nil, runtimef("--add: no node directories (ID/%s) in %s", initConfigFile, dir)
	}
	return &b, nil
}

// initCluster writes the cluster bundle of plan into o.Dir, or with b (an
// existing bundle, --add) the directories of plan's nodes, and prints how
// to use them.
func initCluster(o *initOptions, plan bundlePlan, b *bundle, stdout, stderr io.Writer) error {
	dir := o.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return runtimef("--dir: %w", err)
	}
	if !o.Force {
		var top []string
		if b == nil {
			top = []string{initCACert, initCAKey, initClusterCACert, initClusterCAKey, initAdminTokenFile, initTokensFile}
		}
		nodeFiles := []string{initConfigFile, initTokensFile, initServerCert, initServerKey, initNodeCert, initNodeKey, initClusterCACert}
		if err := refuseOverwrite(dir, bundleFiles(dir, top, plan.nodes, nodeFiles)); err != nil {
			return err
		}
	}

	var err error
	adding := false
	if b == nil {
		if b, err = newBundle(dir, true); err != nil {
			return err
		}
		b.nodes = plan.nodes
		// The identity is bound to the initial configuration: a node of
		// this bundle started with other peers refuses to bootstrap a
		// second cluster under it.
		var initial []server.Peer
		for _, n := range plan.nodes {
			initial = append(initial, server.Peer{ID: n.id, Address: n.link})
		}
		b.groupID = server.NewClusterIDFor(initial)
	} else if len(plan.nodes) > 0 {
		adding = true
	}
	clientCA, clusterCA := b.clientCA, b.clusterCA

	// The initial configuration: every node of a new bundle. A node added
	// to a running cluster has none: it waits to be added, and never
	// bootstraps (initial-cluster-state existing).
	var peers []string
	state := initialStateNew
	if adding {
		state = initialStateExisting
	} else {
		for _, n := range plan.nodes {
			peers = append(peers, n.id+"="+n.link)
		}
	}
	for _, n := range plan.nodes {
		srvPair, err := clientCA.Issue(pki.Server, []string{n.host}, certLife)
		if err != nil {
			return runtimef("%w", err)
		}
		nodePair, err := clusterCA.Issue(pki.Node, nodeCertHosts(n), certLife)
		if err != nil {
			return runtimef("%w", err)
		}
		cfg := nodeConfig{
			title:          fmt.Sprintf("ticketingd configuration of cluster node %s, written by 'ticketingd init --cluster'", n.id),
			n:              n,
			tlsCert:        initServerCert,
			tlsKey:         initServerKey,
			mode:           clusterModeConfig(n, peers, b.groupID, state),
			adminEndpoints: "/metrics, /healthz, /status, /cluster/add, /cluster/remove",
			adminToken:     b.adminToken,
		}
		if err := writeNodeDir(filepath.Join(dir, n.id), []pemFile{
			{initServerCert, srvPair, false, 0o644},
			{initServerKey, srvPair, true, 0o600},
			{initNodeCert, nodePair, false, 0o644},
			{initNodeKey, nodePair, true, 0o600},
			{initClusterCACert, &clusterCA.KeyPair, false, 0o644},
		}, clientTokensBody(b.clientToken, "cluster"), cfg.String()); err != nil {
			return err
		}
	}

	if adding {
		printAddGuide(stdout, o, plan, b)
		return nil
	}
	var ids []string
	for _, n := range plan.nodes {
		ids = append(ids, n.id)
	}
	printBundleGuide(stdout, o, plan, bundleGuide{
		group: b.group(),
		id:    b.groupID,
		wrote: fmt.Sprintf("Wrote a ticketingd cluster bundle for %d nodes (%s) to %s:\n", len(plan.nodes), strings.Join(ids, ", "), dir) +
			fmt.Sprintf("a client CA (%s), a cluster CA for the peer links (%s), the admin token (%s),\n", initCACert, initClusterCACert, initAdminTokenFile) +
			"and per node a directory with its config, certificates, client token and data directory.\n\n",
		caKeys: []string{initCAKey, initClusterCAKey},
		how: "The nodes find each other through their peers, elect a leader, and only the leader\n" +
			"serves; the others send clients to it. The client addresses: ",
		trust:  "clients and nodes",
		status: func(admin string) string { return "ticketingd cluster status --admin " + admin },
	}, b.clientToken, b.adminToken)
	if n := len(plan.nodes); n < 3 || n%2 == 0 {
		fmt.Fprintf(stderr, "ticketingd init: warning: a cluster of %d nodes survives the loss of %d of them; 3 nodes survive 1, 5 survive 2\n", n, (n-1)/2)
	}
	return nil
}

// clusterModeConfig is the cluster section of node n's ticketingd.yaml: of
// a new cluster (state new, peers every node) or added to a running one
// (state existing, no peers).
func clusterModeConfig(n nodePlan, peers []string, clusterID, state string) string {
	var c strings.Builder
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
	fmt.Fprintf(&c, "raft-listen: %q\n", n.link)
	fmt.Fprintf(&c, "# raft-advertise: %q   # default raft-listen\n", n.link)
	fmt.Fprintf(&c, "advertise: %q\n", n.listen)
	if len(peers) > 0 {
		fmt.Fprintf(&c, "peers:\n")
		for _, p := range peers {
			fmt.Fprintf(&c, "  - %q\n", p)
		}
	}
	fmt.Fprintf(&c, "peer-tls-cert: %s\npeer-tls-key: %s\npeer-tls-ca: %s\n", initNodeCert, initNodeKey, initClusterCACert)
	fmt.Fprintf(&c, "# raft-heartbeat: 500ms\n# raft-election: 500ms\n")
	return c.String()
}

// printAddGuide says how to start the nodes --add wrote and add them to
// the running cluster.
func printAddGuide(w io.Writer, o *initOptions, plan bundlePlan, b *bundle) {
	dir := o.Dir
	var ids, raft []string
	for _, n := range plan.nodes {
		ids = append(ids, n.id)
		raft = append(raft, n.id+"="+n.link)
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
	fmt.Fprintf(w, "    export TICKETING_URL='%s'\n\n", groupURL("TOKEN", addrs, caPath, b.groupID))
}
