package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/raftnet"
	"github.com/ticketing-dev/ticketing/server/internal/replica"
)

// ClusterConfig makes a Server a node of a Raft cluster (Config.Cluster).
// Only the leader serves: it answers HELLO with HELLO_OK (role leader),
// every other node with NOT_ACTIVE (M) and the leader's Advertise address
// as hint. Tokens come from the replicated state machine's counter, so the
// token store of Config.DataDir is not used; the Raft log, stable store and
// snapshots are kept in DataDir/raft.
type ClusterConfig struct {
	// NodeID names this node in the Raft configuration: 1 to 64 bytes of
	// letters, digits, '.', '_' and '-'. Required.
	NodeID string

	// RaftListen is the host:port the Raft transport listens on. Required
	// unless Transport is set.
	RaftListen string

	// RaftAdvertise is the host:port the other nodes dial to reach this
	// one (it is the node's address in the Raft configuration). Default
	// RaftListen; it must not be an unspecified address (0.0.0.0, ::).
	RaftAdvertise string

	// Advertise is the client address (host:port) the other nodes give as
	// the NOT_ACTIVE hint while this node leads. Required; at most 255 bytes.
	Advertise string

	// Peers is the initial configuration (this node included) used to
	// bootstrap a node that has no Raft state yet; a node with state
	// ignores it. Empty: a node without state waits to be added by the
	// leader (ticketingd cluster add). With more than this node, a node
	// without state first asks every peer and bootstraps only once all of
	// them have answered that they start the same new cluster (or have
	// just started it with this node's agreement): a node whose data
	// directory is new, wiped or replaced refuses to bootstrap next to a
	// peer that has state, as it does a peer that answers as another node
	// or with other Peers or another ClusterID (see ErrClusterRefused).
	Peers []Peer

	// Join (etcd's initial-cluster-state existing) makes a node without
	// Raft state wait to be added to a running cluster (ticketingd cluster
	// add) and never bootstrap, whatever Peers says; Peers must be empty.
	Join bool

	// ClusterID names the cluster this node belongs to: 1 to 64 letters,
	// digits, '.', '_' or '-' (NewClusterID draws one). The first leader
	// records it in the replicated state (without one, a random one), and
	// ClusterStatus shows it. Nodes that bootstrap a cluster together must
	// have the same ClusterID; a node whose Raft state names another
	// cluster refuses to go on. Empty: any.
	ClusterID string

	// PeerCertificate and PeerRoots, given together, secure the Raft
	// transport with mutual TLS (TLS 1.3) against the cluster CA:
	// PeerCertificate is this node's certificate with its private key
	// (the certificates after the leaf are sent to peers as
	// intermediates), PeerRoots the pool of cluster CAs whose node
	// certificates this node accepts from its peers (during a CA rotation,
	// the old and the new CA). A node certificate carries both extended
	// key usages ServerAuth and ClientAuth, and the dialling node checks
	// that its peer's certificate names the host of the peer's Raft
	// address (as ticketingd init --cluster issues them). New checks
	// PeerCertificate at once: it must have a private key, verify against
	// PeerRoots now, and be a node certificate; otherwise, or with only
	// one of the two set, New fails. New copies the certificate: later
	// changes to it have no effect. Neither set means plain TCP, and New
	// logs a warning.
	PeerCertificate *tls.Certificate
	PeerRoots       *x509.CertPool

	// HeartbeatTimeout and ElectionTimeout are Raft's (defaults
	// DefaultRaftHeartbeat and DefaultRaftElection). A new leader restarts
	// every lease at its full lease_s plus ElectionTimeout.
	HeartbeatTimeout, ElectionTimeout time.Duration

	// MaxSessionProposals bounds the commands one session may have
	// awaiting their commit (its grants and releases proposed and not yet
	// applied, and the ends of the leases it got, which are charged to it):
	// while it has that many, the leader reads no more of its requests
	// (its client is held back by TCP; no request is refused).
	// Default DefaultMaxSessionProposals.
	//
	// MaxProposals bounds the commands of requests (grants and releases)
	// the leader has proposed and not yet applied, over all sessions: an
	// ACQUIRE of a free key beyond it gets B. Releases and expiries are
	// never refused, and expiries are not counted (they are bounded by
	// Config.MaxLocks). Default DefaultMaxProposals.
	//
	// With both, entries of bounded size filled from every session in
	// turn, at most two entries in flight, an entry of its own at once for
	// a session with none in flight, and smaller entries one at a time
	// while a session is held back at MaxSessionProposals and another
	// sends a request at a time, no session can take the log from the
	// others or grow the leader's memory: a session that sends one request
	// at a time keeps most of its rate. A negative value is an error in
	// New.
	MaxSessionProposals, MaxProposals int

	// EarlyRelease makes the leader answer a RELEASE with R as soon as it
	// has decided it (the Free is queued for the log), before it is
	// committed, which saves the releaser one commit (an uncontended
	// acquire+release cycle waits for one commit instead of two). Off by
	// default: R is answered once the release is committed, as the
	// protocol's R ("the exact token was current and is now released")
	// requires. EarlyRelease departs from that: if the Free does not commit
	// (the leader dies, or is deposed, or hands its leadership on, before
	// it does), the next leader still has the holding and keeps the key
	// held until its restarted lease ends (lease_s plus ElectionTimeout),
	// although its releaser was told R; an ACQUIRE with the same owner then
	// gets the same token again (waited_ms 0), a repeated token that starts
	// no new lease. Exclusion and tokens do not depend on it: no grant of
	// the key to another owner can commit before that Free, and no token is
	// issued twice. Without it, a RELEASE cut off by a failover gets no R,
	// and the broker resends it to the new leader, which frees the key at
	// once. (Deviation from the agreed contract, opt-in.)
	EarlyRelease bool

	// CommittedRelease is ignored: the committed release is the default
	// (see EarlyRelease). Setting it together with EarlyRelease is an
	// error in New.
	//
	// Deprecated: the default since EarlyRelease was added; leave it unset.
	CommittedRelease bool

	// For tests: an in-memory transport and stores instead of RaftListen
	// and DataDir/raft.
	transport raft.Transport
	stores    *raftStores
	tune      func(*raft.Config)

	// peerTLS is PeerCertificate and PeerRoots as the transport takes
	// them, made by validate (checkPeerTLS); nil without them.
	peerTLS *raftnet.PeerTLS
}

// checkPeerTLS checks PeerCertificate and PeerRoots (for validate) and
// makes cc.peerTLS of them.
func (cc *ClusterConfig) checkPeerTLS() (err error) {
	cc.peerTLS, err = replica.PeerTLS("ClusterConfig", cc.PeerCertificate, cc.PeerRoots)
	return err
}

// Peer is one node of a cluster's initial configuration.
type Peer struct {
	ID      string // the node's NodeID
	Address string // its RaftAdvertise address
}

// Defaults of ClusterConfig.
const (
	DefaultRaftHeartbeat = 500 * time.Millisecond
	DefaultRaftElection  = 500 * time.Millisecond
)

// ClusterStatus is a cluster node's view of the cluster (Server.ClusterStatus).
type ClusterStatus struct {
	NodeID          string          `json:"node_id"`
	ClusterID       string          `json:"cluster_id"`          // the cluster's identity: the replicated one once a leader has recorded it, else this node's ClusterID
	Bootstrap       string          `json:"bootstrap,omitempty"` // a node without state that waits for its peers before it bootstraps: whom it waits for
	State           string          `json:"state"`               // Raft state: Leader, Follower, Candidate, Shutdown
	Serving         bool            `json:"serving"`             // this node serves clients (the leader, once it restarted the leases)
	Leader          string          `json:"leader"`              // the leader's NodeID, as this node knows it; empty if none
	LeaderAddress   string          `json:"leader_address"`      // its Raft address
	LeaderAdvertise string          `json:"leader_advertise"`    // its client address (the M hint)
	Term            uint64          `json:"term"`
	CommitIndex     uint64          `json:"commit_index"`
	AppliedIndex    uint64          `json:"applied_index"`
	LastLogIndex    uint64          `json:"last_log_index"`
	LeaderChanges   uint64          `json:"leader_changes"` // leader changes this node has seen since it started
	Servers         []ClusterMember `json:"servers"`        // the Raft configuration

	// MembersView is "leader" when this node leads: the members'
	// Reachable, SinceContactMS, LogIndex, Lag and LastError are its view.
	// Elsewhere it says that only the leader knows them (they are absent).
	MembersView string `json:"members_view"`
	// SinceLeaderContactMS, on a node that does not lead, is how long ago
	// it last heard from a leader (Raft's LastContact); absent if never.
	SinceLeaderContactMS *int64 `json:"since_leader_contact_ms,omitempty"`
}

// ClusterMember is one server of the Raft configuration.
type ClusterMember struct {
	ID        string `json:"id"`
	Address   string `json:"address"`   // Raft address
	Suffrage  string `json:"suffrage"`  // Voter, Nonvoter, Staging
	Advertise string `json:"advertise"` // client address, once the node has led (empty until then)
	Leader    bool   `json:"leader"`

	// The leader's view of the member, in the leader's status only (absent
	// on other nodes; see ClusterStatus.MembersView). hashicorp/raft does
	// not make the leader's per-follower state public: these come from
	// the member's replies to the leader's AppendEntries RPCs (heartbeats
	// every HeartbeatTimeout/10 or so, and appends).

	// Reachable: the leader had a reply from the member within the
	// heartbeat timeout, and no failed RPC since. The leader's own entry
	// is reachable.
	Reachable *bool `json:"reachable,omitempty"`
	// SinceContactMS is how long ago the leader last had a reply from the
	// member, in milliseconds; absent if it never had one (or for the
	// leader itself).
	SinceContactMS *int64 `json:"since_contact_ms,omitempty"`
	// LogIndex is the member's last log index as the member reported it in
	// that reply; once its log agrees with the leader's (after the leader's
	// first append of its term), that is its match index as of that reply.
	// Entries the leader pipelined to it since its last heartbeat reply
	// are not counted: under writes it can be a heartbeat interval behind,
	// and for a member that stopped it is a lower bound of what it has.
	// The leader's own entry has the leader's last log index.
	LogIndex *uint64 `json:"log_index,omitempty"`
	// Lag is the leader's last log index minus LogIndex, in entries (0 if
	// the member reported more).
	Lag *uint64 `json:"lag,omitempty"`
	// LastError is the leader's last failed RPC to the member, when no
	// reply came after it.
	LastError string `json:"last_error,omitempty"`
}

// ErrNotCluster is returned by the cluster methods of a Server that is not
// a cluster node.
var ErrNotCluster = errors.New("server: not a cluster node")

// NotLeaderError is returned by a cluster change (AddVoter, RemoveServer)
// made on a node that is not the leader. errors.Is(err, ErrNotLeader).
type NotLeaderError struct {
	Leader        string // the leader's NodeID, if known
	LeaderAddress string // its Raft address
}

// errRaftShutdown and errRemoved are TokenStoreErr of a cluster node whose
// raft has shut down, or that its configuration no longer lists.
var (
	errRaftShutdown = errors.New("server: this node's raft has shut down (removed from the cluster, or a store error): it cannot serve or follow")
	errRemoved      = errors.New("server: this node is not in the cluster's configuration (removed): it cannot serve or vote")
	// errLogWrite wraps the Raft log store's write error (a full disk).
	errLogWrite = errors.New("server: this node cannot write its Raft log (free space in its data dir, or fix the disk): it cannot follow or lead until an append succeeds")
)

// ErrNotLeader matches a NotLeaderError.
var ErrNotLeader = errors.New("server: not the cluster leader")

func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return "server: not the cluster leader (no leader known)"
	}
	return fmt.Sprintf("server: not the cluster leader (the leader is %s at %s)", e.Leader, e.LeaderAddress)
}

// Is makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// The cluster methods of a Server (implemented in log_cluster.go):
//
//	func (s *Server) ClusterStatus() (ClusterStatus, error)                 // ErrNotCluster in standalone
//	func (s *Server) AddVoter(ctx context.Context, id, raftAddr string) error // on the leader; NotLeaderError elsewhere
//	func (s *Server) RemoveServer(ctx context.Context, id string) error     // on the leader; NotLeaderError elsewhere

// raftStores are the Raft stores of a node (tests: in-memory ones).
type raftStores struct {
	log    raft.LogStore
	stable raft.StableStore
	snaps  raft.SnapshotStore
}
