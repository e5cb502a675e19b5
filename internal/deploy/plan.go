package deploy

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ticketing-dev/ticketing/internal/pki"
	"github.com/ticketing-dev/ticketing/server"
)

// Names of a bundle's files. A single server's are in the bundle's
// directory; a pair's or cluster's node files in a directory per node
// (its ID), beside the CAs, the admin token and the client tokens.
const (
	ConfigFile      = "ticketingd.yaml"
	TokensFile      = "client-tokens"
	DataDir         = "data"
	CACert          = "ca.pem"
	CAKey           = "ca-key.pem"
	ServerCert      = "server.pem"
	ServerKey       = "server-key.pem"
	ClusterCACert   = "cluster-ca.pem"
	ClusterCAKey    = "cluster-ca-key.pem"
	NodeCert        = "node.pem"
	NodeKey         = "node-key.pem"
	AdminTokenFile  = "admin-token"
	ReadmeFile      = "README.md"
	DockerfileFile  = "Dockerfile"
	DockerIgnore    = ".dockerignore"
	ComposeFile     = "compose.yaml"
	SingleUnitFile  = "ticketingd.service"
	BinaryName      = "ticketingd"
	InstallBinary   = "/usr/local/bin/ticketingd"
	InstallConfig   = "/etc/ticketingd"
	InstallState    = "/var/lib/ticketingd"
	ServiceUser     = "ticketingd"
	containerConfig = "/etc/ticketingd"
	containerData   = "/var/lib/ticketingd"
)

// NodeUnitFile is the name of node id's systemd unit, in its directory.
func NodeUnitFile(id string) string { return "ticketingd-" + id + ".service" }

// Lifetimes of a bundle's certificates.
const (
	certLife = 2 * 365 * 24 * time.Hour
	caLife   = 10 * 365 * 24 * time.Hour
)

// File is a file or a directory of a bundle.
type File struct {
	// Path is slash-separated and relative to the bundle's directory.
	Path string
	// Mode is the permission bits, with fs.ModeDir for a directory.
	Mode fs.FileMode
	// Data is the content of a file.
	Data []byte
	// Secret marks a private key, a token or a config holding a token:
	// mode 0600, not to be shown or logged.
	Secret bool
}

// Bundle is a planned deployment: its files, and the guide that says how
// to start it and connect.
type Bundle struct {
	// Dir is the Spec's Dir, which the guide and URL name.
	Dir string
	// Files are the files and directories, a directory before its
	// content.
	Files []File
	// Guide is what 'ticketingd init' prints: how to start the servers,
	// the client URL (with the first client token) and, for a pair or
	// cluster with an admin token, the admin token.
	Guide string
	// URL is the TICKETING_URL of the clients, for broker.ParseURL; it
	// holds the first client token.
	URL string
	// GroupID is a pair's pair-id or a cluster's cluster-id, the URL's
	// cluster= ("" for a single server).
	GroupID string
	// Warnings are what the deployment will lack (no TLS on a network,
	// an even cluster size, ...), one sentence each.
	Warnings []string

	// tokens are the bundle's client and admin tokens, for Mask.
	tokens []string
}

// Hidden is what Mask and Preview show in place of a secret.
const Hidden = "•••hidden•••"

// Mask returns text with every client and admin token of the bundle
// replaced by Hidden: the guide, the URL or a file shown where secrets
// must not be.
func (b *Bundle) Mask(text string) string {
	for _, t := range b.tokens {
		text = strings.ReplaceAll(text, t, Hidden)
	}
	return text
}

// Preview returns the text of a file for a preview without secrets: a
// private key is replaced by a line that says what it is, tokens (in a
// tokens file, a config, the README) by Hidden.
func (b *Bundle) Preview(f File) string {
	if f.Secret && bytes.Contains(f.Data, []byte("PRIVATE KEY-----")) {
		return fmt.Sprintf("%s (a private key, %d bytes, mode %04o)\n", Hidden, len(f.Data), f.Mode.Perm())
	}
	return b.Mask(string(f.Data))
}

// Plan checks s (errors as Validate) and plans its bundle, with new keys
// and tokens from crypto/rand, different for every call.
func Plan(s Spec) (*Bundle, error) {
	l, errs := place(s)
	if len(errs) > 0 {
		return nil, errs
	}
	p := &planner{l: l, s: l.s, b: &Bundle{Dir: l.s.Dir}}
	var err error
	switch {
	case l.s.Existing != nil:
		err = p.add()
	case l.s.Topology == Single:
		err = p.single()
	default:
		err = p.group()
	}
	if err != nil {
		return nil, err
	}
	p.b.tokens = p.tok
	if p.adm != "" {
		p.b.tokens = append(p.b.tokens, p.adm)
	}
	return p.b, nil
}

// planner builds a Bundle.
type planner struct {
	l    *layout
	s    Spec
	b    *Bundle
	tok  []string // client tokens
	adm  string   // admin token, "" without
	node []nodeRun
	cas  groupCAs // the bundle's CAs, for the Kubernetes manifests
	// kubeURL is the clients' URL inside the Kubernetes cluster, TOKEN
	// for the token ("" without Spec.Kubernetes).
	kubeURL string
}

// nodeRun is what the systemd unit, compose.yaml and README of a bundle
// say of one server: its directory in the bundle ("" for a single
// server's, the bundle's own) and the files its config names there.
type nodeRun struct {
	id    string // "" for a single server
	dir   string
	files []string
	admin string // admin address, "" without
	ports []int  // ports it listens on
}

func (p *planner) file(name string, mode fs.FileMode, data []byte, secret bool) {
	p.b.Files = append(p.b.Files, File{Path: name, Mode: mode, Data: data, Secret: secret})
}

func (p *planner) dir(name string, mode fs.FileMode) {
	p.b.Files = append(p.b.Files, File{Path: name, Mode: fs.ModeDir | mode})
}

// pem adds a key pair's certificate or key file.
func (p *planner) pem(name string, kp *pki.KeyPair, key bool) error {
	if !key {
		p.file(name, 0o644, kp.CertPEM(), false)
		return nil
	}
	data, err := kp.KeyPEM()
	if err != nil {
		return err
	}
	p.file(name, 0o600, data, true)
	return nil
}

// newCA creates a CA named name and adds its certificate and key files.
func (p *planner) newCA(name, cert, key string) (*pki.CA, error) {
	ca, err := pki.NewCA(name, caLife)
	if err != nil {
		return nil, err
	}
	if err := p.pem(cert, &ca.KeyPair, false); err != nil {
		return nil, err
	}
	return ca, p.pem(key, &ca.KeyPair, true)
}

// RandomToken is 32 bytes from crypto/rand, base64url without padding:
// a client or admin token.
func RandomToken() (string, error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("deploy: random token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(raw[:]), nil
}

// tokens draws the client tokens and the admin token.
func (p *planner) tokens() error {
	for range p.s.ClientTokens {
		t, err := RandomToken()
		if err != nil {
			return err
		}
		p.tok = append(p.tok, t)
	}
	if p.s.AdminToken {
		var err error
		if p.adm, err = RandomToken(); err != nil {
			return err
		}
	}
	return nil
}

// tokensBody is the client tokens file; group is "" for a single server,
// else "cluster" or "pair".
func tokensBody(tokens []string, group string) []byte {
	keep := "# Keep this file mode 0600. Add a token here to rotate, restart, then remove the old one.\n"
	if group != "" {
		keep = "# Keep this file mode 0600 and the same on every node of the " + group + ".\n"
	}
	return []byte("# Client tokens accepted by ticketingd: one per line, # starts a comment.\n" + keep + strings.Join(tokens, "\n") + "\n")
}

// TokenStartComment is what a bundle's config says above token-start:
// clock.
const TokenStartComment = "# A new data dir (or a new cluster) issues tokens above the wall clock in\n" +
	"# microseconds, not from 1 (the protocol's default, which a bare 'ticketingd serve'\n" +
	"# keeps): a reinstalled or wiped server must never issue tokens below those an\n" +
	"# earlier installation issued, or fenced databases refuse its writes as stale.\n" +
	"# Read once, when the data dir or cluster is created; a restart continues from\n" +
	"# the stored state. In a cluster the first leader's setting decides.\n"

// tokenStartOneComment is its counterpart for token-start: one.
const tokenStartOneComment = "# A new data dir (or a new cluster) issues tokens from 1, as the protocol says.\n" +
	"# 'clock' would start above the wall clock in microseconds, so that a reinstalled\n" +
	"# or wiped server never issues tokens below an earlier installation's.\n"

func (p *planner) tokenStartComment() string {
	if p.s.TokenStart == "one" {
		return tokenStartOneComment
	}
	return TokenStartComment
}

// clientQuery is the query of the client URL for the TLS of the client
// listeners, with caPath the bundle's ca.pem: "" without TLS.
func (p *planner) clientQuery(caPath string) string {
	switch p.s.TLS {
	case TLSPrivateCA:
		return caQuery(caPath)
	case TLSOwn:
		if p.s.OwnTLS.CAFile != "" {
			return caQuery(p.s.OwnTLS.CAFile)
		}
		return "?tls=system"
	}
	return ""
}

// caQuery is the query of a client URL that names the CA file path:
// query-escaped, which also makes it safe inside single quotes, keeping
// its slashes readable.
func caQuery(caPath string) string {
	return "?ca=" + strings.ReplaceAll(url.QueryEscape(caPath), "%2F", "/")
}

// tlsFiles are the tls-cert and tls-key of a server whose generated
// certificate files are cert and key.
func (p *planner) tlsFiles(cert, key string) (string, string) {
	switch p.s.TLS {
	case TLSPrivateCA:
		return cert, key
	case TLSOwn:
		return p.s.OwnTLS.CertFile, p.s.OwnTLS.KeyFile
	}
	return "", ""
}

// single plans the bundle of a single server.
func (p *planner) single() error {
	a := p.l.single
	if err := p.tokens(); err != nil {
		return err
	}
	p.dir(DataDir, 0o700)
	p.file(TokensFile, 0o600, tokensBody(p.tok, ""), true)
	run := nodeRun{files: []string{ConfigFile, TokensFile}}
	listed := []string{ConfigFile, TokensFile}
	if p.s.TLS == TLSPrivateCA {
		ca, err := p.newCA("ticketingd private CA", CACert, CAKey)
		if err != nil {
			return err
		}
		p.cas.clientCA = ca
		srv, err := ca.Issue(pki.Server, a.hosts, certLife)
		if err != nil {
			return err
		}
		if err := p.pem(ServerCert, srv, false); err != nil {
			return err
		}
		if err := p.pem(ServerKey, srv, true); err != nil {
			return err
		}
		listed = append(listed, CACert, CAKey, ServerCert, ServerKey)
		run.files = append(run.files, ServerCert, ServerKey)
	}
	if p.adm != "" {
		p.file(AdminTokenFile, 0o600, []byte(p.adm+"\n"), true)
		listed = append(listed, AdminTokenFile)
		run.admin = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.s.AdminPort))
	}

	cfg := Config{Listen: a.listen, DataDir: DataDir, ClientTokensFile: TokensFile, LogLevel: "info", LogFormat: "text",
		ShutdownTimeout: 10 * time.Second, TokenStart: p.s.TokenStart, AdminListen: run.admin, AdminToken: p.adm,
		ConsoleKeys: p.s.ConsoleKeys}
	cfg.TLSCert, cfg.TLSKey = p.tlsFiles(ServerCert, ServerKey)
	where := "that address only"
	if a.wildcard {
		where = "all interfaces"
	}
	head := "# ticketingd configuration, written by " + p.writtenBy("") + ".\n" +
		"# Keys are the flag names of 'ticketingd serve'; relative paths are relative to this file.\n"
	if p.adm != "" {
		head += "# Mode 0600: it holds the admin token.\n"
	}
	head += fmt.Sprintf("# Clients connect to %s: listen on %s.", strings.Join(a.hosts, ", "), where)
	var before string
	if p.s.TLS != TLSOff {
		before += "# tls-client-ca: clients-ca.pem   # require client certificates\n"
	}
	comments := map[string]comment{}
	if p.adm == "" {
		before += fmt.Sprintf("# admin-listen: \"127.0.0.1:%d\"   # /metrics, /healthz, /status\n", p.s.AdminPort)
	} else {
		comments["admin-listen"] = comment{head: "# /metrics, /healthz, /status; every request but\n# GET /healthz needs 'Authorization: Bearer <admin-token>'."}
		comments["console-keys"] = comment{line: consoleKeysComment}
		if !p.s.ConsoleKeys {
			before = consoleKeysOff + "\n" + before
		}
	}
	comments["log-level"] = comment{head: strings.TrimSuffix(before, "\n")}
	comments["token-start"] = comment{head: "# max-locks: 2000000\n# max-waiters: 1000000\n# max-key-waiters: 10000\n# max-sessions: 10000\n" +
		"# max-sessions-per-peer: 2500\n# max-pending-conns: 1000\n# idle-timeout: 30s\n" +
		"# socket-buffer: 65536\n# write-timeout: 3s\n" + strings.TrimSuffix(p.tokenStartComment(), "\n")}
	data, err := configDoc{cfg: cfg, head: head, comments: comments, last: []string{"token-start"},
		foot: "# Moving from another installation whose tokens may be above this machine's clock\n" +
			"# (its clock was ahead)? Set this to at least the highest high_water in your fence\n" +
			"# tables, for the first start:\n# initial-token: 0"}.render()
	if err != nil {
		return err
	}
	mode := fs.FileMode(0o644)
	if p.adm != "" {
		mode = 0o600
	}
	p.file(ConfigFile, mode, data, p.adm != "")
	for _, port := range []string{a.port} {
		n, _ := strconv.Atoi(port)
		run.ports = append(run.ports, n)
	}
	p.node = []nodeRun{run}

	caPath := absPath(p.s.Dir, CACert)
	p.b.URL = "ticketing://" + p.tok[0] + "@" + a.client + p.clientQuery(caPath)
	p.b.Guide = p.singleGuide(listed, caPath)
	if len(a.unserved) > 0 {
		p.b.Warnings = append(p.b.Warnings, fmt.Sprintf("the config listens on %s, so clients of %s cannot connect; give --listen to choose",
			a.listen, strings.Join(a.unserved, ", ")))
	}
	if a.unnamed {
		p.b.Warnings = append(p.b.Warnings, fmt.Sprintf("--listen %s is an address none of the hosts (%s) names: the printed settings may not reach it",
			a.listen, strings.Join(a.hosts, ", ")))
	}
	if p.s.TLS == TLSOff && !IsLoopbackListen(a.listen) {
		p.b.Warnings = append(p.b.Warnings, fmt.Sprintf("the config listens on %s, reachable from other machines, without TLS:\n"+
			"the client token and lock traffic cross the network in clear, and 'ticketingd serve' will warn at each start.\n"+
			"Run init with --tls (and --force), or --listen 127.0.0.1:%s for clients on this machine only.", a.listen, a.port))
	}
	return p.extras()
}

// groupCAs are the CAs of a pair or cluster bundle: clientCA signs the
// client listeners' certificates (and a pair's node certificates),
// clusterCA a cluster's node certificates of the peer links.
type groupCAs struct {
	clientCA, clusterCA *pki.CA
}

// group plans the bundle of a new pair or cluster.
func (p *planner) group() error {
	cluster := p.s.Topology == Cluster
	if err := p.tokens(); err != nil {
		return err
	}
	var cas groupCAs
	var err error
	var caKeys []string
	if p.s.TLS == TLSPrivateCA || !cluster && p.s.PeerTLS {
		name := "ticketingd pair CA"
		if cluster {
			name = "ticketingd private CA"
		}
		if cas.clientCA, err = p.newCA(name, CACert, CAKey); err != nil {
			return err
		}
		caKeys = append(caKeys, CAKey)
	}
	if cluster && p.s.PeerTLS {
		if cas.clusterCA, err = p.newCA("ticketingd cluster CA", ClusterCACert, ClusterCAKey); err != nil {
			return err
		}
		caKeys = append(caKeys, ClusterCAKey)
	}
	p.cas = cas
	if p.adm != "" {
		p.file(AdminTokenFile, 0o600, []byte(p.adm+"\n"), true)
	}
	group := string(p.s.Topology)
	p.file(TokensFile, 0o600, tokensBody(p.tok, group), true)
	var peers []string
	var initial []server.Peer
	for _, n := range p.l.nodes {
		peers = append(peers, n.id+"="+n.link)
		initial = append(initial, server.Peer{ID: n.id, Address: n.link})
	}
	if cluster {
		// Bound to the initial configuration: a node of this bundle
		// started with other peers refuses to bootstrap a second cluster
		// under this identity (server.NewClusterIDFor).
		p.b.GroupID = server.NewClusterIDFor(initial)
	} else {
		p.b.GroupID = server.NewClusterID()
	}
	for i, n := range p.l.nodes {
		var peer *placedNode
		if !cluster {
			peer = &p.l.nodes[1-i]
		}
		if err := p.nodeDir(n, cas, peers, peer, "new", group); err != nil {
			return err
		}
	}
	p.b.URL = p.groupURL(p.tok[0], p.l.nodes, absPath(p.s.Dir, CACert), p.b.GroupID)
	if err := p.extras(); err != nil {
		return err
	}
	p.b.Guide = p.groupGuide(caKeys)
	if n := len(p.l.nodes); cluster && (n < 3 || n%2 == 0) {
		p.b.Warnings = append(p.b.Warnings, fmt.Sprintf("a cluster of %d nodes survives the loss of %d of them; 3 nodes survive 1, 5 survive 2", n, (n-1)/2))
	}
	return nil
}

// groupURL is the TICKETING_URL of a pair's or cluster's clients: token
// (or TOKEN, a placeholder), every node's client address, the TLS query
// and the group's identity id in cluster=, which a version-3 HELLO_OK
// carries. The ID is hexadecimal: nothing to escape.
func (p *planner) groupURL(token string, nodes []placedNode, caPath, id string) string {
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.listen)
	}
	u := "ticketing://" + token + "@" + strings.Join(addrs, ",") + p.clientQuery(caPath)
	if id != "" {
		if strings.Contains(u, "?") {
			u += "&cluster=" + id
		} else {
			u += "?cluster=" + id
		}
	}
	return u
}

// nodeCertHosts are the names of node n's certificates: its host, and the
// host of its link address if that differs (the one SAN peers verify
// against the address they dial).
func nodeCertHosts(n placedNode) []string {
	hosts := []string{n.host}
	if linkHost, _, _ := net.SplitHostPort(n.link); linkHost != n.host {
		hosts = append(hosts, linkHost)
	}
	return hosts
}

// nodeDir plans the directory of node n of a pair (peer, the other node)
// or a cluster (peers, the initial configuration; none when added to a
// running cluster, state existing).
func (p *planner) nodeDir(n placedNode, cas groupCAs, peers []string, peer *placedNode, state, group string) error {
	cluster := peer == nil
	d := n.id
	p.dir(d, 0o700)
	p.dir(path.Join(d, DataDir), 0o700)
	run := nodeRun{id: n.id, dir: d, files: []string{ConfigFile, TokensFile}, admin: n.admin}
	for _, a := range []string{n.listen, n.link} {
		port, _ := strconv.Atoi(portOf(a))
		run.ports = append(run.ports, port)
	}
	cfg := Config{Listen: n.listen, DataDir: DataDir, ClientTokensFile: TokensFile, NodeName: n.id, Advertise: n.listen,
		AdminListen: n.admin, AdminToken: p.adm, ConsoleKeys: p.s.ConsoleKeys, TokenStart: p.s.TokenStart, LogLevel: "info", LogFormat: "text", ShutdownTimeout: 10 * time.Second}
	add := func(name string, kp *pki.KeyPair, key bool) error {
		run.files = append(run.files, name)
		return p.pem(path.Join(d, name), kp, key)
	}
	b := commentBuilder{comments: map[string]comment{}}
	var title string
	if cluster {
		title = fmt.Sprintf("ticketingd configuration of cluster node %s, written by %s", n.id, p.writtenBy(" --cluster"))
		if cas.clientCA != nil {
			srv, err := cas.clientCA.Issue(pki.Server, []string{n.host}, certLife)
			if err != nil {
				return err
			}
			if err := add(ServerCert, srv, false); err != nil {
				return err
			}
			if err := add(ServerKey, srv, true); err != nil {
				return err
			}
		}
		cfg.TLSCert, cfg.TLSKey = p.tlsFiles(ServerCert, ServerKey)
		if cas.clusterCA != nil {
			kp, err := cas.clusterCA.Issue(pki.Node, nodeCertHosts(n), certLife)
			if err != nil {
				return err
			}
			for _, f := range []struct {
				name string
				kp   *pki.KeyPair
				key  bool
			}{{NodeCert, kp, false}, {NodeKey, kp, true}, {ClusterCACert, &cas.clusterCA.KeyPair, false}} {
				if err := add(f.name, f.kp, f.key); err != nil {
					return err
				}
			}
			cfg.PeerTLSCert, cfg.PeerTLSKey, cfg.PeerTLSCA = NodeCert, NodeKey, ClusterCACert
		}
		cfg.Cluster, cfg.ClusterID, cfg.InitialState, cfg.NodeID, cfg.RaftListen, cfg.Peers = true, p.groupID(), state, n.id, n.link, peers
		b.note("\n# The cluster. A node with Raft state (data/raft) ignores initial-cluster-state\n" +
			"# and peers. Without state: 'new' bootstraps from peers once every peer has\n" +
			"# answered that it starts this same new cluster (a node whose data dir was wiped\n" +
			"# refuses: see docs/operations.md, \"Refusals at start\"); 'existing' waits to be\n" +
			"# added to the running cluster ('ticketingd cluster add') and never bootstraps.")
		b.key("cluster", "")
		b.key("node-name", "# sent to clients in HELLO_OK: their logs say node="+n.id)
		b.note(fmt.Sprintf("# raft-advertise: %q   # default raft-listen", n.link))
		b.key("advertise", "")
		b.note("# raft-heartbeat: 500ms\n# raft-election: 500ms")
	} else {
		title = fmt.Sprintf("ticketingd configuration of the pair's %s, written by %s", n.id, p.writtenBy(" --pair"))
		if cas.clientCA != nil {
			kp, err := cas.clientCA.Issue(pki.Node, nodeCertHosts(n), certLife)
			if err != nil {
				return err
			}
			if err := add(NodeCert, kp, false); err != nil {
				return err
			}
			if err := add(NodeKey, kp, true); err != nil {
				return err
			}
			if err := add(CACert, &cas.clientCA.KeyPair, false); err != nil {
				return err
			}
			if p.s.PeerTLS {
				cfg.PeerTLSCert, cfg.PeerTLSKey, cfg.PeerTLSCA = NodeCert, NodeKey, CACert
			}
		}
		cfg.TLSCert, cfg.TLSKey = p.tlsFiles(NodeCert, NodeKey)
		cfg.Pair, cfg.PairID, cfg.Peer, cfg.PeerListen = n.id, p.b.GroupID, peer.link, n.link
		b.note("\n# The hot-standby pair (Binary Star). The active node serves; the passive one\n" +
			"# answers clients with the active's advertise address. The backup becomes active\n" +
			"# only when the primary has missed two heartbeats and a client then comes to it.\n" +
			"# See docs/operations.md, \"Hot-standby pair\".")
		b.key("pair", "")
		b.key("pair-id", "# the pair's identity, the same on both nodes: clients meet it in HELLO_OK")
		b.key("node-name", "# sent to clients in HELLO_OK: their logs say node="+n.id)
		b.key("peer", "# the "+peer.id+"'s peer-listen")
		b.note(fmt.Sprintf("# heartbeat: %v   # the same on both nodes", server.DefaultPairHeartbeat))
		if cfg.PeerTLSCert != "" {
			b.key("peer-tls-cert", "")
		} else if !IsLoopbackListen(n.link) || !IsLoopbackListen(peer.link) {
			cfg.PeerPlaintext = true
			b.key("peer-plaintext", "# no peer TLS off loopback: anyone who reaches peer-listen can pose as the peer")
		}
	}
	endpoints := "/metrics, /healthz, /status"
	if cluster {
		endpoints += ", /cluster/add, /cluster/remove"
	}
	if p.adm != "" {
		b.note(fmt.Sprintf("\n# %s; every request but\n# GET /healthz needs 'Authorization: Bearer <admin-token>'.", endpoints))
	} else {
		b.note(fmt.Sprintf("\n# %s; on loopback, without an admin token.", endpoints))
	}
	b.key("admin-listen", "")
	if p.s.ConsoleKeys {
		b.key("console-keys", consoleKeysComment)
	} else if p.adm != "" {
		b.note(consoleKeysOff)
	}
	b.note("\n" + strings.TrimSuffix(p.tokenStartComment(), "\n"))
	b.key("token-start", "")
	b.note("\n")
	b.key("log-level", "")

	head := fmt.Sprintf("# %s.\n# Keys are the flag names of 'ticketingd serve'; relative paths are relative to this file.", title)
	mode := fs.FileMode(0o644)
	if p.adm != "" {
		head += "\n# Mode 0600: it holds the admin token."
		mode = 0o600
	}
	data, err := configDoc{cfg: cfg, head: head, comments: b.comments}.render()
	if err != nil {
		return err
	}
	p.file(path.Join(d, TokensFile), 0o600, tokensBody(p.tok, group), true)
	p.file(path.Join(d, ConfigFile), mode, data, p.adm != "")
	p.node = append(p.node, run)
	return nil
}

// groupID is the cluster-id of a new cluster or of the bundle nodes are
// added to.
func (p *planner) groupID() string {
	if p.s.Existing != nil {
		return p.s.Existing.ClusterID
	}
	return p.b.GroupID
}

// commentBuilder collects the comments of a config in the order of its
// keys: note adds lines that go before the next key given to key.
type commentBuilder struct {
	comments map[string]comment
	pending  []string
}

func (b *commentBuilder) note(lines string) { b.pending = append(b.pending, lines) }

func (b *commentBuilder) key(k, line string) {
	b.comments[k] = comment{head: strings.Join(b.pending, "\n"), line: line}
	b.pending = nil
}

// writtenBy names the front end that writes the bundle, for its files'
// comments: Spec.Frontend, or 'ticketingd init' with flag (" --cluster").
func (p *planner) writtenBy(flag string) string {
	if p.s.Frontend != "" {
		return p.s.Frontend
	}
	return "'ticketingd init" + flag + "'"
}

// consoleKeysComment is what a config says beside console-keys: true.
const consoleKeysComment = "# the lock browser (console's Locks, /v1/locks): key names, expire now"

// consoleKeysOff is the commented-out console-keys line of a config with
// an admin token and the lock browser off: how to turn it on.
const consoleKeysOff = "# console-keys: true   # show lock keys in the console's Locks and 'ticketingd locks list'\n" +
	"#                      # (key names, expire now; behind the admin token); restart the node to apply"

// absPath is the absolute path of name in the bundle directory dir.
func absPath(dir, name string) string {
	p, _ := filepath.Abs(filepath.Join(dir, name))
	return p
}
