package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/server/internal/replica"
)

// Cluster identity and bootstrap.
//
// A cluster has an identity fixed at its creation: ClusterConfig.ClusterID
// ('ticketingd init --cluster' writes one random 128-bit ID into every
// node's config of a bundle), or, without one, a random ID that the first
// leader draws. The first leader records it in the replicated state (a
// ClusterID command in its takeover entry; snapshots carry it), so every
// node that has the state knows it; ClusterStatus shows it. A node whose
// state names another cluster than its ClusterID refuses to go on.
//
// A node without Raft state bootstraps only when that cannot fork an
// existing history:
//
//   - ClusterConfig.Join (initial-cluster-state existing, what 'init
//     --cluster --add' writes) never bootstraps: it waits to be added.
//   - Peers of this node alone bootstraps at once (a one-node cluster,
//     e.g. a standalone node's migration).
//   - Otherwise the node first asks every peer of Peers, over the Raft
//     transport (mutual TLS with the cluster CA, given PeerCertificate), who it
//     is: an identity probe. It bootstraps only once every peer has
//     answered that it is the node Peers names there and either has no
//     state either, with the same Peers and ClusterID and not Join, or has
//     bootstrapped from the same Peers and ClusterID after it saw this very
//     data directory agree (a node that starts late). A peer with any other
//     state means that the cluster exists and this node's data directory is
//     new, wiped or replaced: it refuses, and so it does for a peer that
//     answers as another node (a wrong address), a different Peers (naming
//     the entry) or ClusterID. An unreachable peer is waited for (and
//     logged), never bootstrapped around. Until it has decided, the node
//     takes part in no Raft exchange: it neither votes nor accepts entries.
//
// "This very data directory" is its incarnation: a random ID stored in the
// Raft stable store at the node's first start, which a wipe of the data
// directory loses. A node that bootstraps stores the incarnations of the
// nodes it bootstrapped with (its bootstrap record), and answers probes
// with it.
//
// A node without state, whatever its mode, also grants no vote: a wiped
// node that is still in the configuration could otherwise elect a node
// that lacks entries it had acknowledged before the wipe.
//
// The probe is an AppendEntries request of term 0 (Raft never sends term 0)
// whose header's Addr holds identMagic and this node's identity as JSON;
// the answer has the answering node's identity in the same place. The
// transport wrapper (gatedTransport) answers it before Raft sees it.

// identMagic prefixes the identity of a probe and of its answer.
var identMagic = []byte("ticketing-identity/1\n")

// Keys in the Raft stable store.
var (
	keyIncarnation = []byte("ticketing.incarnation")
	keyBootRecord  = []byte("ticketing.bootstrap")
)

// ErrClusterRefused matches the error of a cluster node that refused to
// bootstrap, or refused the state or the peers it found (see
// ClusterConfig.Join): Serve returns it, and TokenStoreErr reports it.
// The message says what was found and what the operator does.
var ErrClusterRefused = errors.New("server: cluster node refused to start")

type refusal struct{ msg string }

func (r *refusal) Error() string        { return r.msg }
func (r *refusal) Is(target error) bool { return target == ErrClusterRefused }

func refusef(format string, args ...any) error {
	return &refusal{msg: fmt.Sprintf(format, args...)}
}

// NewClusterID returns a random cluster identity: 128 bits as 32
// lowercase hexadecimal digits.
func NewClusterID() string { return replica.NewID() }

// NewClusterIDFor returns a random cluster identity bound to the initial
// configuration peers: NewClusterID's 32 digits, ".p" and 12 hexadecimal
// digits of a SHA-256 of the peers (IDs and addresses, in any order).
// ticketingd init --cluster writes one into every node of a bundle. A
// node configured with such an ID refuses to bootstrap with other peers
// (ErrClusterRefused): a bundle node started with a peers setting of its
// own (itself alone, say) would otherwise form a second cluster under
// the bundle's identity, which clients could not tell from the first.
// The one exception is the way in from a standalone node: a node whose
// data directory holds a standalone token ceiling may bootstrap with
// itself alone (docs/operations.md, "Migrating from a standalone node").
func NewClusterIDFor(peers []Peer) string {
	return NewClusterID() + ".p" + peersDigest(peers)
}

// peersDigest is the digest NewClusterIDFor binds an identity to.
func peersDigest(peers []Peer) string {
	h := sha256.New()
	for _, p := range sortedPeers(peers) {
		fmt.Fprintf(h, "%s=%s\n", p.ID, p.Address)
	}
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// boundDigest returns the peers digest of an identity made by
// NewClusterIDFor, and whether id is one.
func boundDigest(id string) (string, bool) {
	const n = 32 + 2 + 12
	if len(id) != n || id[32:34] != ".p" {
		return "", false
	}
	for _, c := range []byte(id[:32] + id[34:]) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return id[34:], true
}

// checkBoundPeers refuses a bootstrap with peers other than those the
// node's ClusterID is bound to (NewClusterIDFor), except a node alone
// that starts from a standalone token ceiling (alone).
func checkBoundPeers(cc *ClusterConfig, alone bool) error {
	want, ok := boundDigest(cc.ClusterID)
	if !ok || want == peersDigest(cc.Peers) || alone {
		return nil
	}
	return refusef("cluster: node %s refuses to bootstrap: its cluster-id %s was made by ticketingd init for another initial configuration than its peers setting (%s). "+
		"A node of a bundle started with other peers would form a second cluster under the bundle's identity, which clients could not tell from the first. "+
		"Start it with its bundle's config unchanged (peers as init wrote them); for a cluster of other nodes, make a bundle for them with ticketingd init --cluster",
		cc.NodeID, cc.ClusterID, describePeers(cc.Peers))
}

// describePeers lists peers as ID=ADDRESS, sorted by ID.
func describePeers(peers []Peer) string {
	var b strings.Builder
	for i, p := range sortedPeers(peers) {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(p.ID + "=" + p.Address)
	}
	return b.String()
}

// identity is a node's answer to a probe, and what a probe says of the
// prober.
type identity struct {
	NodeID      string      `json:"node_id"`
	Incarnation string      `json:"incarnation"`
	Join        bool        `json:"join,omitempty"`
	ClusterID   string      `json:"cluster_id,omitempty"` // configured
	Peers       []Peer      `json:"peers,omitempty"`      // configured
	HasState    bool        `json:"has_state"`
	Term        uint64      `json:"term,omitempty"`
	LastIndex   uint64      `json:"last_index,omitempty"`
	StateID     string      `json:"state_cluster_id,omitempty"` // the replicated one
	Boot        *bootRecord `json:"bootstrap,omitempty"`
	Refused     bool        `json:"refused,omitempty"` // it refused (and takes no part): nobody bootstraps around it
	Members     []string    `json:"members,omitempty"` // the IDs of its latest Raft configuration
}

// bootRecord is what a node bootstrapped with.
type bootRecord struct {
	ClusterID    string            `json:"cluster_id,omitempty"`
	Peers        []Peer            `json:"peers"`
	Incarnations map[string]string `json:"incarnations"` // node ID -> incarnation
}

// loadIncarnation returns the incarnation in stable, storing a new one
// first if there is none.
func loadIncarnation(stable raft.StableStore) (string, error) {
	v, err := stable.Get(keyIncarnation)
	if err != nil && err.Error() != "not found" { // raft's own test for a missing key
		return "", err
	}
	if len(v) > 0 {
		return string(v), nil
	}
	inc := replica.NewID()
	if err := stable.Set(keyIncarnation, []byte(inc)); err != nil {
		return "", err
	}
	return inc, nil
}

func loadBootRecord(stable raft.StableStore) *bootRecord {
	v, err := stable.Get(keyBootRecord)
	if err != nil || len(v) == 0 {
		return nil
	}
	var r bootRecord
	if json.Unmarshal(v, &r) != nil {
		return nil
	}
	return &r
}

func storeBootRecord(stable raft.StableStore, r *bootRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return stable.Set(keyBootRecord, b)
}

// sortedPeers returns a copy of peers sorted by ID.
func sortedPeers(peers []Peer) []Peer {
	ps := slices.Clone(peers)
	slices.SortFunc(ps, func(a, b Peer) int { return strings.Compare(a.ID, b.ID) })
	return ps
}

// diffPeers names the first entry in which them's initial configuration
// (theirs) differs from this node's (mine), or returns "".
func diffPeers(mine, theirs []Peer, them string) string {
	t := map[string]string{}
	for _, p := range theirs {
		t[p.ID] = p.Address
	}
	m := map[string]bool{}
	for _, p := range sortedPeers(mine) {
		m[p.ID] = true
		a, ok := t[p.ID]
		switch {
		case !ok:
			return fmt.Sprintf("this node lists %s=%s, %s does not list %s", p.ID, p.Address, them, p.ID)
		case a != p.Address:
			return fmt.Sprintf("this node lists %s=%s, %s lists %s=%s", p.ID, p.Address, them, p.ID, a)
		}
	}
	for _, p := range sortedPeers(theirs) {
		if !m[p.ID] {
			return fmt.Sprintf("%s lists %s=%s, this node does not list %s", them, p.ID, p.Address, p.ID)
		}
	}
	return ""
}

// gatedTransport is the Raft transport of a node: it answers identity
// probes itself, and passes Raft's RPCs on to Raft only once the node may
// take part (cluster.admit).
type gatedTransport struct {
	raft.Transport
	cl *cluster
	ch chan raft.RPC
}

// gatedPreVoteTransport is a gatedTransport over a transport with
// pre-vote.
type gatedPreVoteTransport struct {
	*gatedTransport
	pv raft.WithPreVote
}

func (t gatedPreVoteTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return t.pv.RequestPreVote(id, target, args, resp)
}

// newGatedTransport returns the gated transport over under, and the
// channel its Consumer reads (where cluster.relay writes).
func newGatedTransport(cl *cluster, under raft.Transport) (raft.Transport, chan<- raft.RPC) {
	g := &gatedTransport{Transport: under, cl: cl, ch: make(chan raft.RPC)}
	if pv, ok := under.(raft.WithPreVote); ok {
		return gatedPreVoteTransport{g, pv}, g.ch
	}
	return g, g.ch
}

// Consumer is where Raft reads the RPCs that cluster.relay passes on.
func (t *gatedTransport) Consumer() <-chan raft.RPC { return t.ch }

// Close closes the transport under it.
func (t *gatedTransport) Close() error {
	if c, ok := t.Transport.(raft.WithClose); ok {
		return c.Close()
	}
	return nil
}

// SetHeartbeatHandler passes heartbeats to cb once the node takes part.
func (t *gatedTransport) SetHeartbeatHandler(cb func(raft.RPC)) {
	if cb == nil {
		t.Transport.SetHeartbeatHandler(nil)
		return
	}
	t.Transport.SetHeartbeatHandler(func(rpc raft.RPC) {
		if t.cl.admit(rpc) {
			cb(rpc)
		}
	})
}

// errNotJoined answers the Raft RPCs of a node that has not decided yet
// whether it may bootstrap (or has refused).
var errNotJoined = errors.New("ticketing: this node takes no part in Raft yet (it checks its peers before it bootstraps, or it refused)")

// relay passes the RPCs of the transport under the gate to Raft.
func (cl *cluster) relay(in <-chan raft.RPC, out chan<- raft.RPC) {
	defer cl.wg.Done()
	for {
		select {
		case <-cl.stop:
			return
		case rpc := <-in:
			if !cl.admit(rpc) {
				continue
			}
			select {
			case out <- rpc:
			case <-cl.stop:
				// A response of the request's type: raft's in-memory
				// pipeline reads one even beside an error.
				rpc.Respond(emptyResponse(rpc.Command), raft.ErrRaftShutdown)
				return
			}
		}
	}
}

// emptyResponse is a zero response of the type that answers cmd (nil for
// a request raft does not pipeline).
func emptyResponse(cmd any) any {
	switch cmd.(type) {
	case *raft.AppendEntriesRequest:
		return &raft.AppendEntriesResponse{}
	case *raft.RequestVoteRequest:
		return &raft.RequestVoteResponse{}
	case *raft.RequestPreVoteRequest:
		return &raft.RequestPreVoteResponse{}
	case *raft.InstallSnapshotRequest:
		return &raft.InstallSnapshotResponse{}
	case *raft.TimeoutNowRequest:
		return &raft.TimeoutNowResponse{}
	}
	return nil
}

// admit answers rpc itself (a probe; anything while the gate is closed;
// anything from a node that is not a member (cluster.member); a vote
// request while the node has no state) and returns false, or returns true
// for Raft to handle it.
func (cl *cluster) admit(rpc raft.RPC) bool {
	if req, ok := rpc.Command.(*raft.AppendEntriesRequest); ok && req.Term == 0 && bytes.HasPrefix(req.Addr, identMagic) {
		cl.answerProbe(rpc, req)
		return false
	}
	if !cl.gate.Load() {
		rpc.Respond(cl.typedResponse(rpc.Command), errNotJoined)
		return false
	}
	if h, ok := rpc.Command.(raft.WithRPCHeader); !ok || !cl.member(string(h.GetRPCHeader().ID)) {
		var id, addr []byte
		if ok {
			id, addr = h.GetRPCHeader().ID, h.GetRPCHeader().Addr
		}
		rpc.Respond(cl.typedResponse(rpc.Command), fmt.Errorf("ticketing: node %s: %q is not a member of its Raft configuration", cl.cfg.NodeID, id))
		select {
		case cl.strangers <- stranger{id: string(id), addr: string(addr)}:
		default: // the checker is busy: the next request asks again
		}
		return false
	}
	switch rpc.Command.(type) {
	case *raft.RequestVoteRequest:
		if cl.rp.Load().LastIndex() == 0 {
			rpc.Respond(&raft.RequestVoteResponse{RPCHeader: cl.rpcHeader(nil)}, nil)
			return false
		}
	case *raft.RequestPreVoteRequest:
		if cl.rp.Load().LastIndex() == 0 {
			rpc.Respond(&raft.RequestPreVoteResponse{RPCHeader: cl.rpcHeader(nil)}, nil)
			return false
		}
	}
	return true
}

// typedResponse is a response of the type that answers cmd, with this
// node's header: raft's in-memory pipeline reads one even beside an error.
func (cl *cluster) typedResponse(cmd any) any {
	switch cmd.(type) {
	case *raft.AppendEntriesRequest:
		return &raft.AppendEntriesResponse{RPCHeader: cl.rpcHeader(nil)}
	case *raft.RequestVoteRequest:
		return &raft.RequestVoteResponse{RPCHeader: cl.rpcHeader(nil)}
	case *raft.RequestPreVoteRequest:
		return &raft.RequestPreVoteResponse{RPCHeader: cl.rpcHeader(nil)}
	case *raft.InstallSnapshotRequest:
		return &raft.InstallSnapshotResponse{RPCHeader: cl.rpcHeader(nil)}
	case *raft.TimeoutNowRequest:
		return &raft.TimeoutNowResponse{RPCHeader: cl.rpcHeader(nil)}
	}
	return nil
}

// Members. A node takes Raft RPCs only from the members of its latest
// configuration (uncommitted entries included, as Raft tracks it), of its
// bootstrap record, and from nodes that a member vouches for. The log
// matching that Raft relies on does not hold between two histories:
// every bootstrap writes its configuration at index 1 in term 1, so a
// member whose data directory was wiped and that bootstrapped again
// (with itself alone, say) has a log that a leader of the old history
// takes for a prefix of its own. Taking the leader's entries on it, that
// node joined the old history with a state of its own, and could then
// lead alone under the same identity. A node with no configuration (no
// state: a node waiting to be added, or a new one) takes them from
// anyone, as it must to be added.
//
// A node that is not a member and sends anyway is checked
// (strangerChecker): if its bootstrap record names this node's ID with
// another data directory (incarnation) than this one, in a cluster of this
// node's identity, this node's data directory was wiped or replaced after
// it had been that cluster's member, and it refuses to go on (its state
// is a second history under the same node ID). Otherwise a member of this
// node's configuration that lists the sender in its own vouches for it
// (the sender was added by an entry this node has not received yet: a
// follower that missed a membership change must still take the entries
// of a leader added by it), for vouchTTL, renewed while it sends.

// memberCache is the set of IDs of the latest configuration, as read at.
type memberCache struct {
	ids []string
	at  time.Time
}

// memberTTL is how long a read configuration is used: a change is seen
// within it (a removed member's RPCs are taken that long after).
const memberTTL = time.Second

// vouchTTL is how long a member's word for a stranger holds.
const vouchTTL = 30 * time.Second

// member reports whether node id may send this node Raft RPCs.
func (cl *cluster) member(id string) bool {
	r := cl.rp.Load()
	if r == nil {
		return false
	}
	now := time.Now()
	mc := cl.members.Load()
	if mc == nil || now.Sub(mc.at) > memberTTL || !slices.Contains(mc.ids, id) {
		// Read again on a miss: the configuration may have just changed.
		mc = &memberCache{at: now}
		for _, sv := range r.GetConfiguration().Configuration().Servers {
			mc.ids = append(mc.ids, string(sv.ID))
		}
		cl.members.Store(mc)
	}
	if len(mc.ids) == 0 || slices.Contains(mc.ids, id) {
		return true
	}
	if b := cl.bootIDs.Load(); b != nil && slices.Contains(*b, id) {
		return true
	}
	if at, ok := cl.vouched.Load(id); ok && now.Sub(at.(time.Time)) < vouchTTL {
		return true
	}
	return false
}

// setBootIDs records the IDs of the bootstrap record rec for member.
func (cl *cluster) setBootIDs(rec *bootRecord) {
	ids := make([]string, 0, len(rec.Peers))
	for _, p := range rec.Peers {
		ids = append(ids, p.ID)
	}
	cl.bootIDs.Store(&ids)
}

// stranger is a node that sent a Raft RPC without being a member: its ID
// and address as its request's header gave them.
type stranger struct{ id, addr string }

// strangerRecheck is how often the same stranger is checked at most.
const strangerRecheck = 2 * time.Second

// strangerChecker checks the strangers that admit passes it.
func (cl *cluster) strangerChecker() {
	defer cl.wg.Done()
	for {
		select {
		case <-cl.stop:
			return
		case st := <-cl.strangers:
			if at, ok := cl.lastCheck[st.id]; ok && time.Since(at) < strangerRecheck {
				continue
			}
			cl.lastCheck[st.id] = time.Now()
			cl.checkStranger(st)
		}
	}
}

// checkStranger asks the stranger st who it is, and refuses to go on if
// its answer shows this node's Raft state to be a second history under
// this node's ID (forkEvidence); otherwise asks the members whether st is
// one of theirs (then it vouches for st), or logs the refusal.
func (cl *cluster) checkStranger(st stranger) {
	r := cl.rp.Load()
	if r == nil || st.id == "" {
		return
	}
	me := cl.self()
	if st.addr != "" {
		if th, ok, _, err := cl.probe(Peer{ID: st.id, Address: st.addr}, &me); err == nil && ok && th.NodeID == st.id {
			if why := cl.forkEvidence(&me, &th); why != "" {
				cl.refuse(refusef("cluster: node %s refuses to go on: node %s (%s) of cluster %s (term %d, last index %d) sends it Raft requests, and %s: "+
					"this node's data directory was wiped or replaced after it had been a member, and its Raft state (term %d, last index %d) is a second history under the same node ID, whose leader could issue the cluster's fencing tokens again. "+
					"Stop this node and move its data-dir/raft aside; on the cluster's leader, 'ticketingd cluster remove %s'; then add this machine as a new node: "+
					"'ticketingd init --cluster --add --node NEWID=HOST' (initial-cluster-state existing, no peers), start it, and on the leader 'ticketingd cluster add NEWID=RAFTADDR' "+
					"(docs/operations.md, \"Refusals at start\")",
					cl.cfg.NodeID, st.id, st.addr, clusterOf(&th), th.Term, th.LastIndex, why, me.Term, me.LastIndex, cl.cfg.NodeID))
				return
			}
		}
	}
	for _, sv := range r.GetConfiguration().Configuration().Servers {
		id := string(sv.ID)
		if id == cl.cfg.NodeID || id == st.id {
			continue
		}
		th, ok, _, err := cl.probe(Peer{ID: id, Address: string(sv.Address)}, &me)
		// A member's word: this node takes its entries anyway.
		if err == nil && ok && th.NodeID == id && slices.Contains(th.Members, st.id) {
			if _, had := cl.vouched.Swap(st.id, time.Now()); !had {
				cl.s.log.Info("cluster: taking Raft requests from a node a member lists in its configuration (an entry that adds it has not reached this node yet)",
					"node_id", cl.cfg.NodeID, "from", st.id, "address", st.addr, "member", id)
			}
			return
		}
	}
	if at, ok := cl.lastWarn[st.id]; !ok || time.Since(at) >= strangerWarnEvery {
		cl.lastWarn[st.id] = time.Now()
		cl.s.log.Warn("cluster: refusing Raft requests from a node that is not a member of this node's configuration (nor of its bootstrap record), and that no member lists",
			"node_id", cl.cfg.NodeID, "from", st.id, "address", st.addr)
	}
}

// clusterOf is the cluster a node's identity th says it is of: the
// replicated ID, else its bootstrap record's.
func clusterOf(th *identity) string {
	if th.StateID != "" || th.Boot == nil {
		return th.StateID
	}
	return th.Boot.ClusterID
}

// forkEvidence returns what shows, in the identity th of a node that sends
// this node (me) Raft requests without being a member of its
// configuration, that this node's state is a second history under its
// ID; or "". Both need a cluster of this node's identity, and this node
// to have bootstrapped its state itself (it has a bootstrap record: a
// node added to a cluster has none, so a member removed, wiped and added
// again under its old ID never refuses here):
//
//   - th was bootstrapped together with a node of this ID but of another
//     data directory (incarnation);
//   - or th lists this node as a member while this node's configuration
//     is still itself alone: a node alone adds every other member itself,
//     after writing the entry to its own log, so th's configuration came
//     from a log this node no longer has (the cluster began with this
//     node alone, a migration, and its data directory was wiped since).
func (cl *cluster) forkEvidence(me, th *identity) string {
	mine := me.StateID
	if mine == "" {
		mine = cl.cfg.ClusterID
	}
	if me.Boot == nil || mine == "" || clusterOf(th) != mine {
		return ""
	}
	if th.Boot != nil {
		if inc := th.Boot.Incarnations[cl.cfg.NodeID]; inc != "" && inc != cl.incarnation {
			return fmt.Sprintf("was bootstrapped together with a node %s of another data directory than this one", cl.cfg.NodeID)
		}
	}
	if len(me.Members) == 1 && me.Members[0] == cl.cfg.NodeID && slices.Contains(th.Members, cl.cfg.NodeID) {
		return fmt.Sprintf("lists %s as a member, while this node's configuration is itself alone, as it bootstrapped", cl.cfg.NodeID)
	}
	return ""
}

// strangerWarnEvery is how often the refusal of one stranger is logged.
const strangerWarnEvery = time.Minute

func (cl *cluster) rpcHeader(addr []byte) raft.RPCHeader {
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(cl.cfg.NodeID), Addr: addr}
}

// self is this node's identity now.
func (cl *cluster) self() identity {
	id := identity{
		NodeID:      cl.cfg.NodeID,
		Incarnation: cl.incarnation,
		Join:        cl.cfg.Join,
		ClusterID:   cl.cfg.ClusterID,
		Peers:       sortedPeers(cl.cfg.Peers),
	}
	has, err := raft.HasExistingState(cl.logs, cl.stable, cl.snaps)
	id.HasState = has || err != nil // unreadable: claim state, the safe side
	if r := cl.rp.Load(); r != nil {
		id.Term, id.LastIndex = r.CurrentTerm(), r.LastIndex()
		for _, sv := range r.GetConfiguration().Configuration().Servers {
			id.Members = append(id.Members, string(sv.ID))
		}
	}
	id.StateID = cl.fsm.clusterID()
	id.Refused = cl.fatal.Load() != nil
	if id.HasState {
		id.Boot = loadBootRecord(cl.stable)
	}
	return id
}

// answerProbe answers an identity probe with this node's identity. A node
// that checks its peers before bootstrapping also checks the prober, so
// that both refuse a mismatch whichever asks first (the other may be gone
// by the time this one asks).
func (cl *cluster) answerProbe(rpc raft.RPC, req *raft.AppendEntriesRequest) {
	me := cl.self()
	b, _ := json.Marshal(me)
	rpc.Respond(&raft.AppendEntriesResponse{
		RPCHeader: cl.rpcHeader(append(slices.Clip(identMagic), b...)),
		Term:      me.Term, LastLog: me.LastIndex, Success: true,
	}, nil)
	var th identity
	if cl.gate.Load() || cl.fatal.Load() != nil || me.HasState || json.Unmarshal(req.Addr[len(identMagic):], &th) != nil || th.HasState {
		return
	}
	p := Peer{ID: th.NodeID, Address: "not in this node's peers"}
	for _, q := range cl.cfg.Peers {
		if q.ID == th.NodeID {
			p = q
		}
	}
	if _, err := judge(&me, p, &th); err != nil {
		cl.refuse(err)
	}
}

// probe asks peer p who it is. ok is false if p did not answer with an
// identity; resp is its answer then.
func (cl *cluster) probe(p Peer, me *identity) (th identity, ok bool, resp raft.AppendEntriesResponse, err error) {
	b, _ := json.Marshal(me)
	req := &raft.AppendEntriesRequest{RPCHeader: cl.rpcHeader(append(slices.Clip(identMagic), b...))}
	if err = cl.trans.AppendEntries(raft.ServerID(p.ID), raft.ServerAddress(p.Address), req, &resp); err != nil {
		return th, false, resp, err
	}
	if !bytes.HasPrefix(resp.Addr, identMagic) || json.Unmarshal(resp.Addr[len(identMagic):], &th) != nil {
		return th, false, resp, nil
	}
	return th, true, resp, nil
}

// judge decides what peer p's identity th means for the bootstrap of this
// node (me): agree, or a refusal.
func judge(me *identity, p Peer, th *identity) (bool, error) {
	self := me.NodeID
	if th.NodeID != p.ID {
		return false, refusef("cluster: node %s refuses to bootstrap: its peers setting gives %s the Raft address %s, but the node there is %s. "+
			"A wrong address in peers: correct it (every node of a new cluster must list the same IDs and addresses) and restart %s",
			self, p.ID, p.Address, th.NodeID, self)
	}
	if th.HasState {
		rec := th.Boot
		if rec != nil && rec.ClusterID == me.ClusterID && diffPeers(me.Peers, rec.Peers, p.ID) == "" && rec.Incarnations[self] == me.Incarnation {
			return true, nil // it bootstrapped with this data directory's agreement: this node starts late
		}
		cid := th.StateID
		if cid == "" && rec != nil {
			cid = rec.ClusterID
		}
		if cid != "" && me.ClusterID != "" && cid != me.ClusterID {
			return false, refusef("cluster: node %s refuses to bootstrap: its peer %s (%s) belongs to another cluster, %s (term %d, last index %d), while this node's cluster-id is %s. "+
				"Check peers and cluster-id: this node's config and that address are from different clusters",
				self, p.ID, p.Address, cid, th.Term, th.LastIndex, me.ClusterID)
		}
		if cid == "" {
			cid = "(its ID not recorded yet)"
		}
		return false, refusef("cluster: node %s refuses to bootstrap: it has no Raft state, but its peer %s (%s) has the state of cluster %s (term %d, last index %d) "+
			"and did not start it together with this data directory: a cluster exists, and this node's data directory is new, wiped or replaced. "+
			"Bootstrapping again would start a second history under the same node IDs, whose leader could issue fencing tokens again. "+
			"To bring this machine back: on the leader, 'ticketingd cluster remove %s'; then add it as a new node: "+
			"'ticketingd init --cluster --add --node NEWID=HOST' (initial-cluster-state existing, no peers), start it, and on the leader 'ticketingd cluster add NEWID=RAFTADDR' "+
			"(docs/operations.md, \"Refusals at start\")",
			self, p.ID, p.Address, cid, th.Term, th.LastIndex, self)
	}
	if th.Join {
		return false, refusef("cluster: node %s refuses to bootstrap: its peer %s (%s) is initial-cluster-state existing (it waits to be added to a running cluster and never bootstraps), "+
			"but this node's peers lists it in a new cluster. Give every node of a new cluster initial-cluster-state new and the same peers; "+
			"if the cluster runs already, add %s with 'ticketingd cluster add' instead",
			self, p.ID, p.Address, self)
	}
	if th.ClusterID != me.ClusterID {
		return false, refusef("cluster: node %s refuses to bootstrap: its peer %s (%s) has cluster-id %q, this node %q: their configs are of different clusters. "+
			"Give every node of the new cluster the same cluster-id (init --cluster writes one per bundle) and restart them",
			self, p.ID, p.Address, th.ClusterID, me.ClusterID)
	}
	if d := diffPeers(me.Peers, th.Peers, p.ID); d != "" {
		return false, refusef("cluster: node %s refuses to bootstrap: its initial configuration (peers) differs from that of %s (%s): %s. "+
			"Every node of a new cluster must have the same peers: correct the wrong entry, and restart the nodes",
			self, p.ID, p.Address, d)
	}
	return true, nil
}

// bootstrapper probes the peers until every one agrees, then bootstraps
// and opens the gate; or refuses.
func (cl *cluster) bootstrapper() {
	defer cl.wg.Done()
	delay := 100 * time.Millisecond
	var lastLog time.Time
	for {
		incs, waiting, err := cl.probeAll()
		if err != nil {
			cl.refuse(err)
			return
		}
		if waiting == "" {
			if err := cl.bootstrapNow(incs); err != nil {
				cl.refuse(fmt.Errorf("server: bootstrap the cluster: %w", err))
			}
			return
		}
		cl.waiting.Store(&waiting)
		if time.Since(lastLog) >= 10*time.Second {
			lastLog = time.Now()
			cl.s.log.Info("cluster: no raft state: waiting for every peer to answer before bootstrapping (a node never bootstraps without them)",
				"node_id", cl.cfg.NodeID, "waiting_for", waiting)
		}
		select {
		case <-cl.stop:
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// probeAll asks every other peer at once. It returns the incarnations of
// all peers if every one agrees; otherwise what it still waits for, or a
// refusal.
func (cl *cluster) probeAll() (map[string]string, string, error) {
	me := cl.self()
	type result struct {
		agree   bool
		inc     string
		waiting string
		err     error
		other   bool // the peer answered as another node: its refusal comes first
	}
	res := make([]result, len(me.Peers))
	var wg sync.WaitGroup
	for i, p := range me.Peers {
		if p.ID == me.NodeID {
			res[i] = result{agree: true, inc: me.Incarnation}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			th, ok, resp, err := cl.probe(p, &me)
			switch {
			case err != nil:
				res[i].waiting = fmt.Sprintf("%s at %s (%v)", p.ID, p.Address, err)
			case !ok && (resp.Term > 0 || resp.LastLog > 0):
				res[i].err = refusef("cluster: node %s refuses to bootstrap: its peer %s (%s) has Raft state (term %d, last index %d) and answers as an older ticketingd: a cluster exists there. "+
					"Add this node to it instead (docs/operations.md, \"Refusals at start\")", me.NodeID, p.ID, p.Address, resp.Term, resp.LastLog)
			case !ok:
				res[i].waiting = fmt.Sprintf("%s at %s (answers without an identity: an older ticketingd?)", p.ID, p.Address)
			default:
				res[i].agree, res[i].err = judge(&me, p, &th)
				res[i].inc, res[i].other = th.Incarnation, th.NodeID != p.ID
				if res[i].err == nil && th.Refused { // it agrees, but has refused (another peer): wait for it
					res[i].agree, res[i].waiting = false, fmt.Sprintf("%s at %s (it refused to start: see its log)", p.ID, p.Address)
				}
			}
		}()
	}
	wg.Wait()
	for _, r := range res {
		if r.other {
			return nil, "", r.err
		}
	}
	incs := map[string]string{}
	var waiting []string
	for i, r := range res {
		if r.err != nil {
			return nil, "", r.err
		}
		if r.waiting != "" {
			waiting = append(waiting, r.waiting)
		}
		incs[me.Peers[i].ID] = r.inc
	}
	return incs, strings.Join(waiting, "; "), nil
}

// bootstrapNow stores the bootstrap record, bootstraps the running Raft
// node with Peers and opens the gate.
func (cl *cluster) bootstrapNow(incs map[string]string) error {
	rec := &bootRecord{ClusterID: cl.cfg.ClusterID, Peers: sortedPeers(cl.cfg.Peers), Incarnations: incs}
	if err := storeBootRecord(cl.stable, rec); err != nil {
		return err
	}
	cl.setBootIDs(rec)
	if err := cl.await(context.Background(), cl.r.BootstrapCluster(peersConfiguration(cl.cfg.Peers))); err != nil {
		return err
	}
	cl.waiting.Store(nil)
	cl.gate.Store(true)
	cl.s.log.Info("cluster: bootstrapped", "node_id", cl.cfg.NodeID, "peers", len(cl.cfg.Peers), "cluster_id", cl.cfg.ClusterID)
	return nil
}

// peersConfiguration is the Raft configuration of peers, all voters.
func peersConfiguration(peers []Peer) raft.Configuration {
	var conf raft.Configuration
	for _, p := range peers {
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Address)})
	}
	return conf
}

// refuse makes the node stop taking part and makes Serve return err.
func (cl *cluster) refuse(err error) {
	cl.gate.Store(false)
	if !cl.fatal.CompareAndSwap(nil, &err) {
		return
	}
	cl.s.log.Error(err.Error(), "node_id", cl.cfg.NodeID)
	s := cl.s
	s.mu.Lock()
	for ln := range s.listeners {
		ln.Close()
	}
	s.mu.Unlock()
}

// refusal is the node's refusal to join its cluster, if any (mode).
func (cl *cluster) refusal() error {
	if p := cl.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// identified checks the cluster ID the state names against ClusterID.
func (cl *cluster) identified(id string) {
	if cl.cfg.ClusterID != "" && id != cl.cfg.ClusterID {
		cl.refuse(refusef("cluster: node %s refuses the Raft state in its data directory: it is of cluster %s, but this node's cluster-id is %s. "+
			"The data directory and the config are of different clusters: start this node with the config of its cluster, or with an empty data directory as a new node of this one",
			cl.cfg.NodeID, id, cl.cfg.ClusterID))
	}
}
