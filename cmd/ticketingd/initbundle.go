package main

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/server"
)

// The bundles of 'ticketingd init --cluster' (initcluster.go) and 'init
// --pair' (initpair.go) share their shape: a directory of CAs and tokens,
// and per node a directory with its config, certificates, client token and
// data directory, each node's ports planned the same way. This file holds
// what both use.

// linkPort is the base port of the nodes' link to each other: --raft-port
// of a cluster, --peer-port of a pair; flag names it, what is its name in
// messages.
func (o *initOptions) linkPort() (port int, flag, what string) {
	if o.Pair {
		return o.PeerPort, "peer-port", "peer port"
	}
	return o.RaftPort, "raft-port", "Raft port"
}

// checkPortsDiffer: the client, link and admin base ports must differ.
func (o *initOptions) checkPortsDiffer() error {
	link, flag, _ := o.linkPort()
	if o.Port == link || o.Port == o.AdminPort || link == o.AdminPort {
		return usagef("--port, --%s and --admin-port must differ", flag)
	}
	return nil
}

// nodePlan is one node of a bundle of 'init --cluster' or 'init --pair'.
type nodePlan struct {
	id, host string
	// The node's addresses (host:port): its client listener, its link to
	// the other nodes (the Raft transport of a cluster node, the peer
	// link of a pair node) and its admin listener.
	listen, link, adminAdr string
}

// bundlePlan is what 'init --cluster' or 'init --pair' derives from its
// flags.
type bundlePlan struct {
	nodes    []nodePlan
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

// planNodes parses --node ID=HOST entries and gives every node its
// addresses: the client, link (o.linkPort) and admin ports, plus k for the k-th node on
// the same host, so that nodes sharing a host do not collide. existing are
// the nodes of the bundle that --add adds to: their IDs and ports are
// taken, and a new node gets the first k whose three ports are free on its
// host.
func planNodes(o *initOptions, existing []nodePlan) (bundlePlan, error) {
	var p bundlePlan
	linkPort, linkFlag, linkWhat := o.linkPort()
	for _, name := range []struct {
		flag string
		port int
	}{{"port", o.Port}, {linkFlag, linkPort}, {"admin-port", o.AdminPort}} {
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
		for _, a := range []struct{ addr, what string }{{n.listen, "client port"}, {n.link, linkWhat}, {n.adminAdr, "admin port"}} {
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
				return p, usagef("%s: choose --port, --%s and --admin-port further apart", taken, linkFlag)
			}
			for _, a := range []struct{ addr, what string }{{n.listen, "client port"}, {n.link, linkWhat}, {n.adminAdr, "admin port"}} {
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
func placeNode(o *initOptions, id, host, key string, k int, used map[string]string) (n nodePlan, taken string, err error) {
	n = nodePlan{id: id, host: host}
	linkPort, linkFlag, linkWhat := o.linkPort()
	for _, a := range []struct {
		dst  *string
		host string
		port int
		what string
	}{
		{&n.listen, host, o.Port + k, "client port"},
		{&n.link, host, linkPort + k, linkWhat},
		{&n.adminAdr, "127.0.0.1", o.AdminPort + k, "admin port"},
	} {
		if a.port > 65535 {
			return n, "", usagef("too many nodes on %s for the ports from --port, --%s and --admin-port: %s's %s would be %d", host, linkFlag, id, a.what, a.port)
		}
		*a.dst = net.JoinHostPort(a.host, strconv.Itoa(a.port))
		if other, dup := used[key+" "+strconv.Itoa(a.port)]; dup && taken == "" {
			taken = fmt.Sprintf("%s's %s %d on %s is also %s", id, a.what, a.port, host, other)
		}
	}
	return n, taken, nil
}

// randomToken is 32 bytes from crypto/rand, base64url without padding.
func randomToken() (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", runtimef("random token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(raw[:]), nil
}

// certLife is how long init's node and server certificates are valid;
// caLife, its CAs.
const (
	certLife = 2 * 365 * 24 * time.Hour
	caLife   = 10 * 365 * 24 * time.Hour
)

// refuseOverwrite is init's refusal without --force: an error naming the
// first of paths that exists.
func refuseOverwrite(dir string, paths []string) error {
	for _, p := range paths {
		if _, err := os.Lstat(p); err == nil {
			return runtimef("%s already exists: %s holds a deployment; use --force to overwrite it", p, dir)
		}
	}
	return nil
}

// bundleFiles are the paths of a bundle in dir that init without --force
// refuses to overwrite: top in dir, nodeFiles in each node's directory.
func bundleFiles(dir string, top []string, nodes []nodePlan, nodeFiles []string) []string {
	var paths []string
	for _, name := range top {
		paths = append(paths, filepath.Join(dir, name))
	}
	for _, n := range nodes {
		for _, name := range nodeFiles {
			paths = append(paths, filepath.Join(dir, n.id, name))
		}
	}
	return paths
}

// newBundle creates the CAs and tokens of a new bundle and writes them
// into dir: the CA of the client listeners (ca.pem, ca-key.pem), the admin
// token and the client tokens, the group's identity (a cluster's
// cluster-id, a pair's pair-id), and for a cluster (cluster true) the
// cluster CA of the peer links. A pair has one CA: its node certificates
// serve both the client listener and the peer link.
func newBundle(dir string, cluster bool) (*bundle, error) {
	var b bundle
	var err error
	if b.clientToken, err = randomToken(); err != nil {
		return nil, err
	}
	if b.adminToken, err = randomToken(); err != nil {
		return nil, err
	}
	caName := "ticketingd pair CA"
	if cluster {
		caName = "ticketingd private CA"
	}
	if b.clientCA, err = pki.NewCA(caName, caLife); err != nil {
		return nil, runtimef("%w", err)
	}
	files := []pemFile{
		{initCACert, &b.clientCA.KeyPair, false, 0o644},
		{initCAKey, &b.clientCA.KeyPair, true, 0o600},
	}
	b.groupID = server.NewClusterID()
	if cluster {
		if b.clusterCA, err = pki.NewCA("ticketingd cluster CA", caLife); err != nil {
			return nil, runtimef("%w", err)
		}
		files = append(files,
			pemFile{initClusterCACert, &b.clusterCA.KeyPair, false, 0o644},
			pemFile{initClusterCAKey, &b.clusterCA.KeyPair, true, 0o600})
	}
	if err := writePairs(dir, files); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, initAdminTokenFile), []byte(b.adminToken+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, initTokensFile), []byte(clientTokensBody(b.clientToken, b.group())), 0o600); err != nil {
		return nil, err
	}
	return &b, nil
}

// group is what the bundle's nodes form, for comments: "cluster" or
// "pair".
func (b *bundle) group() string {
	if b.clusterCA != nil {
		return "cluster"
	}
	return "pair"
}

func clientTokensBody(token, group string) string {
	return "# Client tokens accepted by ticketingd: one per line, # starts a comment.\n" +
		"# Keep this file mode 0600 and the same on every node of the " + group + ".\n" + token + "\n"
}

// nodeCertHosts are the names of node n's certificates: its host, and the
// host of its link address if that differs (the one SAN peers verify
// against the address they dial).
func nodeCertHosts(n nodePlan) []string {
	hosts := []string{n.host}
	if linkHost, _, _ := net.SplitHostPort(n.link); linkHost != n.host {
		hosts = append(hosts, linkHost)
	}
	return hosts
}

// writeNodeDir writes node directory nd of a bundle: its data directory,
// its PEM files, the client tokens file and its config (mode 0600: it
// holds the admin token).
func writeNodeDir(nd string, pems []pemFile, clientTokens, config string) error {
	if err := os.MkdirAll(filepath.Join(nd, initDataDir), 0o700); err != nil {
		return runtimef("data dir: %w", err)
	}
	if err := writePairs(nd, pems); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(nd, initTokensFile), []byte(clientTokens), 0o600); err != nil {
		return err
	}
	return writeFile(filepath.Join(nd, initConfigFile), []byte(config), 0o600)
}

// nodeConfig is the ticketingd.yaml of a node of a bundle: what every such
// node has (client listener, TLS, tokens, admin listener, token-start,
// logs) around mode, the settings of its mode.
type nodeConfig struct {
	title          string // what the file is, for its first comment line
	n              nodePlan
	tlsCert        string // tls-cert; tls-key is its key file
	tlsKey         string
	mode           string // the mode's settings, comments included
	adminEndpoints string // what the admin listener serves, for its comment
	adminToken     string
}

func (nc nodeConfig) String() string {
	var c strings.Builder
	fmt.Fprintf(&c, "# %s.\n", nc.title)
	fmt.Fprintf(&c, "# Keys are the flag names of 'ticketingd serve'; relative paths are relative to this file.\n")
	fmt.Fprintf(&c, "# Mode 0600: it holds the admin token.\n")
	fmt.Fprintf(&c, "listen: %q\n", nc.n.listen)
	fmt.Fprintf(&c, "data-dir: %s\n", initDataDir)
	fmt.Fprintf(&c, "client-tokens-file: %s\n", initTokensFile)
	fmt.Fprintf(&c, "tls-cert: %s\ntls-key: %s\n", nc.tlsCert, nc.tlsKey)
	c.WriteString(nc.mode)
	fmt.Fprintf(&c, "\n# %s; every request but\n", nc.adminEndpoints)
	fmt.Fprintf(&c, "# GET /healthz needs 'Authorization: Bearer <admin-token>'.\n")
	fmt.Fprintf(&c, "admin-listen: %q\n", nc.n.adminAdr)
	fmt.Fprintf(&c, "admin-token: %q\n", nc.adminToken)
	fmt.Fprintf(&c, "\n%s", tokenStartConfig)
	fmt.Fprintf(&c, "\nlog-level: info\nlog-format: text\nshutdown-timeout: 10s\n")
	return c.String()
}

// bundleGuide is what the guide init prints after writing a bundle says of
// its mode.
type bundleGuide struct {
	group  string   // "cluster" or "pair"
	id     string   // the group's identity: the URL's cluster=
	wrote  string   // what init wrote: the guide's first paragraph
	caKeys []string // the CA key files in the bundle's directory
	how    string   // how the nodes work together, ending in "The client addresses: "
	trust  string   // whom the CA keys' certificates are trusted by
	status func(admin string) string
}

// printBundleGuide prints how to start the nodes of a new bundle, the
// TICKETING_URL listing their client addresses, with the client token, and
// the admin token with a command that asks a node's admin listener.
func printBundleGuide(w io.Writer, o *initOptions, plan bundlePlan, g bundleGuide, clientToken, adminToken string) {
	dir := o.Dir
	var addrs []string
	for _, n := range plan.nodes {
		addrs = append(addrs, n.listen)
	}
	caPath, _ := filepath.Abs(filepath.Join(dir, initCACert))
	fmt.Fprintf(w, "%s", g.wrote)
	if plan.loopback {
		fmt.Fprintf(w, "Start every node, each in its own terminal (or under a service manager):\n\n")
		for _, n := range plan.nodes {
			fmt.Fprintf(w, "    ticketingd serve --config %s\n", shellQuote(filepath.Join(dir, n.id, initConfigFile)))
		}
	} else {
		stay := strings.Join(g.caKeys, " and ") + " stay here"
		if len(g.caKeys) == 1 {
			stay = g.caKeys[0] + " stays here"
		}
		fmt.Fprintf(w, "Copy each node's directory to its machine (%s,\n", stay)
		fmt.Fprintf(w, "offline if you can), for example:\n\n")
		for _, n := range plan.nodes {
			fmt.Fprintf(w, "    scp -rp %s %s:ticketing-%s\n", shellQuote(filepath.Join(dir, n.id)), sshHost(n.host), n.id)
		}
		fmt.Fprintf(w, "\nand start each node there (paths in its config are relative to the config file):\n\n")
		for _, n := range plan.nodes {
			fmt.Fprintf(w, "    ticketingd serve --config ticketing-%s/%s    # on %s\n", n.id, initConfigFile, n.host)
		}
	}
	fmt.Fprintf(w, "\n%s%s.\n\n", g.how, strings.Join(addrs, ", "))
	fmt.Fprintf(w, "Give each client this URL: it carries every node's address, the client token, the\n")
	fmt.Fprintf(w, "TLS settings and the %s's ID (cluster=: a client uses no node of another cluster\n", g.group)
	fmt.Fprintf(w, "or pair). The token is shown once, here; it is also in each node's %s:\n\n", initTokensFile)
	fmt.Fprintf(w, "    export TICKETING_URL='%s'\n\n", groupURL(clientToken, addrs, caPath, g.id))
	if !plan.loopback {
		fmt.Fprintf(w, "A client on another machine needs a copy of %s and its path there in ca=.\n\n", caPath)
	}
	fmt.Fprintf(w, "The admin listeners are on each node's loopback (127.0.0.1). On a node's machine\n")
	fmt.Fprintf(w, "(the admin token is also in %s):\n\n", filepath.Join(dir, initAdminTokenFile))
	fmt.Fprintf(w, "    export TICKETING_ADMIN_TOKEN='%s'\n", adminToken)
	fmt.Fprintf(w, "    %s\n\n", g.status(plan.nodes[0].adminAdr))
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
	var keys []string
	for _, k := range g.caKeys {
		keys = append(keys, filepath.Join(dir, k))
	}
	it := "they sign"
	if len(keys) == 1 {
		it = "it signs"
	}
	fmt.Fprintf(w, "Keep %s offline if you can:\n%s certificates that %s trust.\n", strings.Join(keys, " and "), it, g.trust)
}

// groupURL is the TICKETING_URL of a cluster's or a pair's clients: token
// (or TOKEN, the placeholder), every node's client address, the CA file
// and the group's identity id in cluster=, which a version-3 HELLO_OK
// carries: a broker given it uses no node of another group (none without
// id, a bundle of an earlier release). The ID is hexadecimal: nothing to
// escape.
func groupURL(token string, addrs []string, caPath, id string) string {
	u := "ticketing://" + token + "@" + strings.Join(addrs, ",") + caQuery(caPath)
	if id != "" {
		u += "&cluster=" + id
	}
	return u
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
