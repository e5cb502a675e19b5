package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/ticketing-dev/ticketing/internal/pki"
)

// Existing is a cluster bundle of 'ticketingd init --cluster' (or of the
// deployment page) read by LoadCluster: its CAs, tokens and nodes, to add
// nodes to (Spec.Existing). It holds private keys and tokens: never log
// it.
type Existing struct {
	// ClientCA signs the client listeners' certificates (nil when the
	// bundle's nodes serve plain TCP or their own certificates: OwnTLS),
	// ClusterCA the node certificates of the peer links (nil without
	// peer TLS).
	ClientCA, ClusterCA *pki.CA
	// OwnTLS are the nodes' own certificate files, if theirs are.
	OwnTLS *OwnTLS
	// ClientToken is the first token of its client tokens file;
	// AdminToken its admin token ("" without).
	ClientToken, AdminToken string
	// ClusterID is its nodes' cluster-id ("" in a bundle of an earlier
	// release); TokenStart their token-start.
	ClusterID, TokenStart string
	nodes                 []placedNode
}

// has reports whether the bundle has a node id.
func (e *Existing) has(id string) bool {
	for _, n := range e.nodes {
		if n.id == id {
			return true
		}
	}
	return false
}

// BasePorts are the lowest client, Raft and admin ports of the bundle's
// nodes: the bases 'init --cluster' was given, since its first node on
// every host has them (0 where none is found).
func (e *Existing) BasePorts() (port, raftPort, adminPort int) {
	low := func(addr func(n placedNode) string) int {
		l := 0
		for _, n := range e.nodes {
			if p, err := strconv.Atoi(portOf(addr(n))); err == nil && p > 0 && (l == 0 || p < l) {
				l = p
			}
		}
		return l
	}
	return low(func(n placedNode) string { return n.listen }), low(func(n placedNode) string { return n.link }),
		low(func(n placedNode) string { return n.admin })
}

// LoadCluster reads the cluster bundle in dir: the configs of its node
// directories (ID/ticketingd.yaml), its client tokens, and the CAs and
// admin token they use. A directory without node directories or client
// tokens is ErrNotBundle.
func LoadCluster(dir string) (*Existing, error) {
	var e Existing
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	var first Config
	for _, d := range entries {
		cfgPath := filepath.Join(dir, d.Name(), ConfigFile)
		if !d.IsDir() {
			continue
		}
		data, err := os.ReadFile(cfgPath)
		if err != nil {
			continue
		}
		var c Config
		if err := yaml.Unmarshal(data, &c); err != nil {
			return nil, fmt.Errorf("deploy: %s: %w", cfgPath, err)
		}
		host, _, err := net.SplitHostPort(c.Listen)
		if err != nil || c.NodeID == "" {
			return nil, fmt.Errorf("deploy: %s is not the config of a cluster node", cfgPath)
		}
		e.nodes = append(e.nodes, placedNode{id: c.NodeID, host: host, listen: c.Listen, link: c.RaftListen, admin: c.AdminListen})
		if len(e.nodes) == 1 {
			first = c
		}
	}
	if len(e.nodes) == 0 {
		return nil, fmt.Errorf("%w: no node directories (ID/%s) in %s (is it a bundle of 'init --cluster'?)", ErrNotBundle, ConfigFile, dir)
	}
	e.ClusterID, e.TokenStart = first.ClusterID, first.TokenStart
	if e.ClientToken, err = firstToken(filepath.Join(dir, TokensFile)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotBundle, err)
	}
	loadCA := func(cert, key string) (*pki.CA, error) {
		c, err := os.ReadFile(filepath.Join(dir, cert))
		if err != nil {
			return nil, fmt.Errorf("deploy: %w", err)
		}
		k, err := os.ReadFile(filepath.Join(dir, key))
		if err != nil {
			return nil, fmt.Errorf("deploy: %w", err)
		}
		ca, err := pki.LoadCA(c, k)
		if err != nil {
			return nil, fmt.Errorf("deploy: %s: %w", filepath.Join(dir, cert), err)
		}
		return ca, nil
	}
	switch {
	case first.TLSCert == "":
	case filepath.IsAbs(first.TLSCert):
		e.OwnTLS = &OwnTLS{CertFile: first.TLSCert, KeyFile: first.TLSKey}
	default:
		if e.ClientCA, err = loadCA(CACert, CAKey); err != nil {
			return nil, err
		}
	}
	if first.PeerTLSCA != "" {
		if e.ClusterCA, err = loadCA(ClusterCACert, ClusterCAKey); err != nil {
			return nil, err
		}
	}
	if first.AdminToken != "" {
		adm, err := os.ReadFile(filepath.Join(dir, AdminTokenFile))
		if err != nil {
			return nil, fmt.Errorf("deploy: %w", err)
		}
		e.AdminToken = strings.TrimSpace(string(adm))
	}
	return &e, nil
}

// firstToken is the first token of a client tokens file.
func firstToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("deploy: client tokens file: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" && !strings.HasPrefix(t, "#") {
			return t, nil
		}
	}
	return "", fmt.Errorf("deploy: client tokens file %s contains no tokens", path)
}

// add plans the directories of nodes added to the bundle s.Existing.
func (p *planner) add() error {
	ex := p.s.Existing
	p.tok, p.adm = []string{ex.ClientToken}, ex.AdminToken
	for _, n := range p.l.nodes {
		if err := p.nodeDir(n, groupCAs{clientCA: ex.ClientCA, clusterCA: ex.ClusterCA}, nil, nil, "existing", "cluster"); err != nil {
			return err
		}
	}
	for _, r := range p.node {
		if err := p.unit(r); err != nil {
			return err
		}
	}
	p.b.GroupID = ex.ClusterID
	all := append(append([]placedNode(nil), ex.nodes...), p.l.nodes...)
	p.b.URL = p.groupURL(ex.ClientToken, all, absPath(p.s.Dir, CACert), ex.ClusterID)
	p.b.Guide = p.addGuide(p.groupURL("TOKEN", all, absPath(p.s.Dir, CACert), ex.ClusterID))
	return nil
}

// addGuide says how to start the nodes added to a bundle and add them to
// the running cluster; url is the client URL with TOKEN for the token.
func (p *planner) addGuide(url string) string {
	dir := p.s.Dir
	ex := p.s.Existing
	nodes := p.l.nodes
	var w strings.Builder
	var ids, raft []string
	for _, n := range nodes {
		ids = append(ids, n.id)
		raft = append(raft, n.id+"="+n.link)
	}
	fmt.Fprintf(&w, "Added %s to the bundle in %s (a directory per node with its config, certificates,\n", strings.Join(ids, ", "), dir)
	fmt.Fprintf(&w, "client token and data directory). Their configs have initial-cluster-state existing\n")
	fmt.Fprintf(&w, "and no peers: such a node waits to be added, and never bootstraps a cluster of its own.\n\n")
	them := "it"
	if len(nodes) > 1 {
		them = "them"
	}
	p.startLines(&w, nodes, nil, true, fmt.Sprintf("Start %s:\n\n", them))
	fmt.Fprintf(&w, "\nThen add %s on the leader, one node at a time (on the leader's machine: the admin\n", them)
	fmt.Fprintf(&w, "listeners are on loopback; 'ticketingd cluster status' on any node names the leader):\n\n")
	fmt.Fprintf(&w, "    export TICKETING_ADMIN_TOKEN=\"$(cat %s)\"\n", ShellQuote(filepath.Join(dir, AdminTokenFile)))
	admin := ex.nodes[0].admin
	if p.l.loopback { // every node's admin listener is on this machine: ask them in turn
		var all []string
		for _, n := range ex.nodes {
			all = append(all, n.admin)
		}
		admin = strings.Join(all, ",")
	}
	for _, r := range raft {
		fmt.Fprintf(&w, "    ticketingd cluster add %s --admin %s\n", r, admin)
	}
	if p.l.loopback {
		fmt.Fprintf(&w, "\n(the command tries the admin listeners in turn until it reaches the leader).")
	} else {
		fmt.Fprintf(&w, "\nIf the node at %s is not the leader, the command names the one that is.", admin)
	}
	fmt.Fprintf(&w, "\n\nClients must list the new address too (the broker follows hints only to listed addresses; a removed node's address can go),\n")
	fmt.Fprintf(&w, "with TOKEN the client token of their URL now (it is in %s):\n\n", filepath.Join(dir, TokensFile))
	fmt.Fprintf(&w, "    export TICKETING_URL='%s'\n\n", url)
	return w.String()
}
