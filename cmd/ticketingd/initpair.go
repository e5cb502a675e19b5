package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/server"
)

// defaultPeerPort is the default --peer-port of 'ticketingd init --pair':
// the port of the nodes' link, as --raft-port's default is a cluster's.
const defaultPeerPort = defaultRaftPort

// The nodes of a pair bundle: their --node names, directories and
// node-name are their roles.
var pairRoles = []string{string(server.PairPrimary), string(server.PairBackup)}

func initPairCmd(cmd *cobra.Command, o *initOptions, stdout io.Writer) error {
	for _, name := range []string{"host", "listen"} {
		if cmd.Flags().Changed(name) {
			return usagef("--%s and --pair exclude each other: --node primary=HOST and --node backup=HOST name the nodes' hosts", name)
		}
	}
	for _, name := range []string{"raft-port", "add"} {
		if cmd.Flags().Changed(name) {
			return usagef("--%s needs --cluster", name)
		}
	}
	if err := o.checkPortsDiffer(); err != nil {
		return err
	}
	nodes, err := pairNodes(o.Nodes)
	if err != nil {
		return err
	}
	o.Nodes = nodes
	plan, err := planNodes(o, nil)
	if err != nil {
		return err
	}
	return initPair(o, plan, stdout)
}

// pairNodes checks the --node entries of 'init --pair': primary=HOST and
// backup=HOST, once each (planNodes checks the hosts). It returns them
// primary first, so that the primary gets the base ports when the two
// share a host.
func pairNodes(entries []string) ([]string, error) {
	byRole := map[string]string{}
	for _, e := range entries {
		role, _, ok := strings.Cut(e, "=")
		if !ok {
			return nil, usagef("invalid --node %q: want primary=HOST or backup=HOST", e)
		}
		if role != pairRoles[0] && role != pairRoles[1] {
			return nil, usagef("invalid --node %q: the nodes of a pair are primary and backup", e)
		}
		if _, dup := byRole[role]; dup {
			return nil, usagef("--node %s is given twice", role)
		}
		byRole[role] = e
	}
	for _, r := range pairRoles {
		if _, ok := byRole[r]; !ok {
			return nil, usagef("--pair needs its two nodes, --node primary=HOST and --node backup=HOST: %s is missing", r)
		}
	}
	return []string{byRole[pairRoles[0]], byRole[pairRoles[1]]}, nil
}

// initPair writes the pair bundle of plan (primary, then backup) into
// o.Dir and prints how to use it. One CA signs a node certificate per
// node, which serves both its client listener and the peer link.
func initPair(o *initOptions, plan bundlePlan, stdout io.Writer) error {
	dir := o.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return runtimef("--dir: %w", err)
	}
	if !o.Force {
		top := []string{initCACert, initCAKey, initAdminTokenFile, initTokensFile}
		nodeFiles := []string{initConfigFile, initTokensFile, initNodeCert, initNodeKey, initCACert}
		if err := refuseOverwrite(dir, bundleFiles(dir, top, plan.nodes, nodeFiles)); err != nil {
			return err
		}
	}
	b, err := newBundle(dir, false)
	if err != nil {
		return err
	}
	for i, n := range plan.nodes {
		nodePair, err := b.clientCA.Issue(pki.Node, nodeCertHosts(n), certLife)
		if err != nil {
			return runtimef("%w", err)
		}
		cfg := nodeConfig{
			title:          fmt.Sprintf("ticketingd configuration of the pair's %s, written by 'ticketingd init --pair'", n.id),
			n:              n,
			tlsCert:        initNodeCert,
			tlsKey:         initNodeKey,
			mode:           pairModeConfig(n, plan.nodes[1-i], b.groupID),
			adminEndpoints: "/metrics, /healthz, /status",
			adminToken:     b.adminToken,
		}
		if err := writeNodeDir(filepath.Join(dir, n.id), []pemFile{
			{initNodeCert, nodePair, false, 0o644},
			{initNodeKey, nodePair, true, 0o600},
			{initCACert, &b.clientCA.KeyPair, false, 0o644},
		}, clientTokensBody(b.clientToken, "pair"), cfg.String()); err != nil {
			return err
		}
	}
	printBundleGuide(stdout, o, plan, bundleGuide{
		group: b.group(),
		id:    b.groupID,
		wrote: fmt.Sprintf("Wrote a ticketingd pair bundle (%s, %s) to %s:\n", plan.nodes[0].id, plan.nodes[1].id, dir) +
			fmt.Sprintf("a CA (%s) for the client listeners and the peer link, the admin token (%s),\n", initCACert, initAdminTokenFile) +
			"and per node a directory with its config, node certificate, client token and data directory.\n\n",
		caKeys: []string{initCAKey},
		how: "The primary serves; the backup watches it over the peer link and takes over when the\n" +
			"primary has missed two heartbeats and a client then comes to it. The client addresses: ",
		trust: "clients and both nodes",
		status: func(admin string) string {
			return `curl -H "Authorization: Bearer $TICKETING_ADMIN_TOKEN" http://` + admin + "/status"
		},
	}, b.clientToken, b.adminToken)
	return nil
}

// pairModeConfig is the pair section of node n's ticketingd.yaml; peer is
// the other node, id the pair's identity (the same in both nodes').
func pairModeConfig(n, peer nodePlan, id string) string {
	var c strings.Builder
	fmt.Fprintf(&c, "\n# The hot-standby pair (Binary Star). The active node serves; the passive one\n")
	fmt.Fprintf(&c, "# answers clients with the active's advertise address. The backup becomes active\n")
	fmt.Fprintf(&c, "# only when the primary has missed two heartbeats and a client then comes to it.\n")
	fmt.Fprintf(&c, "# See docs/operations.md, \"Hot-standby pair\".\n")
	fmt.Fprintf(&c, "pair: %s\n", n.id)
	fmt.Fprintf(&c, "pair-id: %s   # the pair's identity, the same on both nodes: clients meet it in HELLO_OK\n", id)
	fmt.Fprintf(&c, "node-name: %s   # sent to clients in HELLO_OK: their logs say node=%s\n", n.id, n.id)
	fmt.Fprintf(&c, "peer: %q   # the %s's peer-listen\n", peer.link, peer.id)
	fmt.Fprintf(&c, "peer-listen: %q\n", n.link)
	fmt.Fprintf(&c, "advertise: %q\n", n.listen)
	fmt.Fprintf(&c, "# heartbeat: %v   # the same on both nodes\n", server.DefaultPairHeartbeat)
	fmt.Fprintf(&c, "peer-tls-cert: %s\npeer-tls-key: %s\npeer-tls-ca: %s\n", initNodeCert, initNodeKey, initCACert)
	return c.String()
}
