package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raftnet"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server"
)

// maxNodeIDLen is the longest --node-id (server.MaxNodeIDLen).
const maxNodeIDLen = server.MaxNodeIDLen

// maxAdminTokenLen is the longest --admin-token.
const maxAdminTokenLen = 256

// minRaftTimeout is the smallest --raft-heartbeat and --raft-election
// hashicorp/raft accepts.
const minRaftTimeout = 5 * time.Millisecond

// validNodeID reports whether id is a node ID (server.ValidNodeID).
func validNodeID(id string) bool { return server.ValidNodeID(id) }

// validAdminToken reports whether t can travel in an Authorization header
// as it is: printable ASCII without blanks.
func validAdminToken(t string) bool {
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] > '~' {
			return false
		}
	}
	return true
}

// modeSetting is a setting that means something only in some mode, and
// whether it is set (not its default).
type modeSetting struct {
	name string
	set  bool
}

// clusterOnly are the settings that mean something only with --cluster.
func (o *serveOptions) clusterOnly() []modeSetting {
	return []modeSetting{
		{"node-id", o.NodeID != ""},
		{"raft-listen", o.RaftListen != ""},
		{"raft-advertise", o.RaftAdvertise != ""},
		{"peers", len(o.Peers) > 0},
		{"raft-heartbeat", o.RaftHeartbeat != server.DefaultRaftHeartbeat},
		{"raft-election", o.RaftElection != server.DefaultRaftElection},
		{"max-session-proposals", o.MaxSessionProposals != 0},
		{"max-proposals", o.MaxProposals != 0},
		{"early-release", o.EarlyRelease},
		{"committed-release", o.CommittedRelease},
		{"cluster-id", o.ClusterID != ""},
		{"initial-cluster-state", o.InitialState != initialStateNew},
	}
}

// replicatedOnly are the settings of a node of either replicated mode,
// --cluster or --pair: its client address for the other nodes' hints and
// its peer links' TLS.
func (o *serveOptions) replicatedOnly() []modeSetting {
	return []modeSetting{
		{"advertise", o.Advertise != ""},
		{"peer-tls-cert", o.PeerTLSCert != ""},
		{"peer-tls-key", o.PeerTLSKey != ""},
		{"peer-tls-ca", o.PeerTLSCA != ""},
	}
}

// checkModes validates the settings of the replicated modes (after the
// others): --cluster and --pair exclude each other, a mode's settings
// need their mode, and each mode checks its own.
func (o *serveOptions) checkModes(src func(string) string) error {
	if o.Cluster && o.Pair != "" {
		return usagef("%s and %s exclude each other: a node is of a Raft cluster or of a hot-standby pair", src("pair"), src("cluster"))
	}
	if !o.Cluster && o.Pair == "" {
		for _, c := range o.replicatedOnly() {
			if c.set {
				return usagef("%s needs --cluster or --pair (it is a setting of a cluster or pair node)", src(c.name))
			}
		}
	}
	if !o.Cluster {
		for _, c := range o.clusterOnly() {
			if c.set {
				return usagef("%s needs --cluster (it is a cluster node's setting)", src(c.name))
			}
		}
	}
	if o.Pair == "" {
		for _, c := range o.pairOnly() {
			if c.set {
				return usagef("%s needs --pair (it is a pair node's setting)", src(c.name))
			}
		}
	}
	switch {
	case o.Cluster:
		return o.checkCluster(src)
	case o.Pair != "":
		return o.checkPair(src)
	}
	return nil
}

// checkAdvertise validates --advertise of a node of mode (--cluster or
// --pair): a specific address the hint's one-byte length holds, required
// when --listen is not a specific address (its default).
func (o *serveOptions) checkAdvertise(mode string, src func(string) string) error {
	if o.Advertise != "" {
		if err := checkHostPort(src("advertise"), o.Advertise, hostPortRule{}); err != nil {
			return err
		}
		if len(o.Advertise) > wire.MaxNameLen { // NOT_ACTIVE's hint has a one-byte length
			return usagef("%s is longer than %d bytes", src("advertise"), wire.MaxNameLen)
		}
	} else if host, _, err := net.SplitHostPort(o.Listen); err != nil || isWildcardHost(host) {
		return usagef("%s needs --advertise, the address clients reach this node at: %s %q is not a specific address", mode, src("listen"), o.Listen)
	}
	return nil
}

// checkPeerTLSFiles: the peer TLS files come together or not at all.
func (o *serveOptions) checkPeerTLSFiles() error {
	if n := nonEmpty(o.PeerTLSCert, o.PeerTLSKey, o.PeerTLSCA); n != 0 && n != 3 {
		return usagef("--peer-tls-cert, --peer-tls-key and --peer-tls-ca must be given together")
	}
	return nil
}

// Values of --initial-cluster-state (etcd's names).
const (
	initialStateNew      = "new"
	initialStateExisting = "existing"
)

// hostPortRule says what an address setting may be.
type hostPortRule struct {
	wildcard bool // the host may be empty or unspecified (0.0.0.0, ::)
	port0    bool // the port may be 0
}

// checkHostPort validates a host:port setting; what names it in errors.
func checkHostPort(what, addr string, rule hostPortRule) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("invalid %s %q: want HOST:PORT", what, addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 || p == 0 && !rule.port0 {
		want := "1..65535"
		if rule.port0 {
			want = "0..65535"
		}
		return usagef("invalid %s %q: want a port %s", what, addr, want)
	}
	if !rule.wildcard && isWildcardHost(host) {
		return usagef("invalid %s %q: want a specific host, not a wildcard address", what, addr)
	}
	return nil
}

// isWildcardHost reports whether host, the host part of a listen address,
// means every interface: empty, 0.0.0.0 or ::.
func isWildcardHost(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// parsePeers reads --peers: each element a comma-separated list of
// ID=HOST:PORT. IDs and addresses must be unique.
func parsePeers(what string, elems []string) ([]server.Peer, error) {
	var peers []server.Peer
	ids, addrs := map[string]bool{}, map[string]string{}
	for _, e := range elems {
		for _, entry := range strings.Split(e, ",") {
			entry = strings.TrimSpace(entry)
			id, addr, ok := strings.Cut(entry, "=")
			if !ok {
				return nil, usagef("invalid %s entry %q: want ID=HOST:PORT", what, entry)
			}
			if !validNodeID(id) {
				return nil, usagef("invalid %s entry %q: the ID must be 1 to %d letters, digits, '.', '_' or '-'", what, entry, maxNodeIDLen)
			}
			if err := checkHostPort(what+" entry "+id, addr, hostPortRule{}); err != nil {
				return nil, err
			}
			if ids[id] {
				return nil, usagef("invalid %s: node %s is listed twice", what, id)
			}
			if other, dup := addrs[addr]; dup {
				return nil, usagef("invalid %s: nodes %s and %s have the same address %s", what, other, id, addr)
			}
			ids[id], addrs[addr] = true, id
			peers = append(peers, server.Peer{ID: id, Address: addr})
		}
	}
	return peers, nil
}

// raftAdvertise is the node's Raft address: --raft-advertise, or
// --raft-listen.
func (o *serveOptions) raftAdvertise() string {
	if o.RaftAdvertise != "" {
		return o.RaftAdvertise
	}
	return o.RaftListen
}

// checkCluster validates the settings of a cluster node (checkModes
// calls it with --cluster): --node-id and --raft-listen are required, and
// the rest must be consistent.
func (o *serveOptions) checkCluster(src func(string) string) error {
	if o.Standby {
		return usagef("%s and --cluster exclude each other: a cluster node's role follows the Raft leadership", src("standby"))
	}
	if o.StandbyHint != "" {
		return usagef("%s and --cluster exclude each other: a cluster node's hint is the leader's --advertise address", src("standby-hint"))
	}
	if o.NodeID == "" {
		return usagef("--cluster needs --node-id")
	}
	if !validNodeID(o.NodeID) {
		return usagef("invalid %s %q: want 1 to %d letters, digits, '.', '_' or '-'", src("node-id"), o.NodeID, maxNodeIDLen)
	}
	if o.RaftListen == "" {
		return usagef("--cluster needs --raft-listen")
	}
	// The Raft address is in the cluster configuration, which the other
	// nodes dial: no port 0.
	if err := checkHostPort(src("raft-listen"), o.RaftListen, hostPortRule{wildcard: true}); err != nil {
		return err
	}
	if o.RaftAdvertise != "" {
		if err := checkHostPort(src("raft-advertise"), o.RaftAdvertise, hostPortRule{}); err != nil {
			return err
		}
	} else if host, _, _ := net.SplitHostPort(o.RaftListen); isWildcardHost(host) {
		return usagef("%s %q is a wildcard address: give --raft-advertise, the address the other nodes dial", src("raft-listen"), o.RaftListen)
	}
	if err := o.checkAdvertise("--cluster", src); err != nil {
		return err
	}
	peers, err := parsePeers(src("peers"), o.Peers)
	if err != nil {
		return err
	}
	switch o.InitialState {
	case initialStateNew:
	case initialStateExisting:
		if len(peers) > 0 {
			return usagef("%s is existing (this node joins a running cluster: 'ticketingd cluster add' on its leader; it never bootstraps), so %s, the configuration of a new cluster, must be empty", src("initial-cluster-state"), src("peers"))
		}
	default:
		return usagef("invalid %s %q: want new or existing", src("initial-cluster-state"), o.InitialState)
	}
	if o.ClusterID != "" && !validNodeID(o.ClusterID) {
		return usagef("invalid %s %q: want 1 to %d letters, digits, '.', '_' or '-'", src("cluster-id"), o.ClusterID, maxNodeIDLen)
	}
	if len(peers) > 0 {
		self := -1
		for i, p := range peers {
			if p.ID == o.NodeID {
				self = i
			}
		}
		if self < 0 {
			return usagef("%s does not list this node (%s): the initial configuration must include it", src("peers"), o.NodeID)
		}
		if a := peers[self].Address; a != o.raftAdvertise() {
			return usagef("%s gives this node (%s) the address %s, but its Raft address (--raft-advertise, default --raft-listen) is %s", src("peers"), o.NodeID, a, o.raftAdvertise())
		}
	}
	if err := o.checkPeerTLSFiles(); err != nil {
		return err
	}
	if o.RaftHeartbeat < minRaftTimeout {
		return usagef("invalid %s %v: must be at least %v", src("raft-heartbeat"), o.RaftHeartbeat, minRaftTimeout)
	}
	if o.RaftElection < o.RaftHeartbeat {
		return usagef("invalid %s %v: must be at least --raft-heartbeat (%v)", src("raft-election"), o.RaftElection, o.RaftHeartbeat)
	}
	for _, l := range []struct {
		name string
		v    int
	}{{"max-session-proposals", o.MaxSessionProposals}, {"max-proposals", o.MaxProposals}} {
		if l.v < 0 {
			return usagef("invalid %s %d: must be >= 0 (0 means the default)", src(l.name), l.v)
		}
	}
	if o.EarlyRelease && o.CommittedRelease {
		return usagef("%s and %s exclude each other: committed-release is the default (and deprecated); keep only early-release to answer a RELEASE before it is committed", src("early-release"), src("committed-release"))
	}
	return nil
}

func nonEmpty(ss ...string) int {
	n := 0
	for _, s := range ss {
		if s != "" {
			n++
		}
	}
	return n
}

// peerTLS is the node's certificate and the CA pool of --peer-tls-cert,
// --peer-tls-key and --peer-tls-ca, for the PeerCertificate and PeerRoots
// of server.ClusterConfig or server.PairConfig.
type peerTLS struct {
	cert  tls.Certificate
	roots *x509.CertPool
}

// loadPeerTLS reads --peer-tls-cert, --peer-tls-key and --peer-tls-ca, and
// checks the certificate as server.New does, so that the error names the
// files; nil without them (or without --cluster and --pair).
func loadPeerTLS(o *serveOptions) (*peerTLS, error) {
	if !o.Cluster && o.Pair == "" || o.PeerTLSCert == "" {
		return nil, nil
	}
	cert, roots, err := raftnet.LoadPeerFiles(o.PeerTLSCert, o.PeerTLSKey, o.PeerTLSCA)
	if err == nil {
		_, err = raftnet.NewPeerTLS(cert, roots)
	}
	if err != nil {
		return nil, runtimef("--peer-tls-cert %s / --peer-tls-key %s / --peer-tls-ca %s: %w", o.PeerTLSCert, o.PeerTLSKey, o.PeerTLSCA, err)
	}
	return &peerTLS{cert: cert, roots: roots}, nil
}

// clusterConfig builds the server's ClusterConfig from validated options,
// the lock port's bound address (--advertise's default when --listen has
// port 0) and the peer TLS from loadPeerTLS (nil: plain TCP).
func clusterConfig(o *serveOptions, listen net.Addr, pt *peerTLS) *server.ClusterConfig {
	peers, _ := parsePeers("--peers", o.Peers) // validated
	advertise := o.clientAdvertise(listen)
	cc := &server.ClusterConfig{
		NodeID:           o.NodeID,
		RaftListen:       o.RaftListen,
		RaftAdvertise:    o.raftAdvertise(),
		Advertise:        advertise,
		Peers:            peers,
		HeartbeatTimeout: o.RaftHeartbeat,
		ElectionTimeout:  o.RaftElection,
		EarlyRelease:     o.EarlyRelease,

		MaxSessionProposals: o.MaxSessionProposals,
		MaxProposals:        o.MaxProposals,
		Join:                o.InitialState == initialStateExisting,
		ClusterID:           o.ClusterID,
	}
	if pt != nil {
		cert := pt.cert
		cc.PeerCertificate, cc.PeerRoots = &cert, pt.roots
	}
	return cc
}

// clientAdvertise is the node's client address for the other nodes'
// hints: --advertise, or --listen (validated: a specific address), or with
// --listen's port 0 the lock port's bound address listen.
func (o *serveOptions) clientAdvertise(listen net.Addr) string {
	if o.Advertise != "" {
		return o.Advertise
	}
	if _, port, _ := net.SplitHostPort(o.Listen); port == "0" {
		return listen.String()
	}
	return o.Listen
}

// peersString is for log lines: the peers as ID=ADDR,...
func peersString(peers []server.Peer) string {
	var b strings.Builder
	for i, p := range peers {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%s", p.ID, p.Address)
	}
	return b.String()
}
