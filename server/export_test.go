package server

import (
	"errors"
	"io"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// Hooks for the black-box tests in package server_test.

// SetCeilingWriter makes servers created after it write their token
// ceiling with f (which may call WriteCeiling to write it for real); the
// returned func restores the real writer.
func SetCeilingWriter(f func(dir string, v uint64) error) (restore func()) {
	old := writeCeilingFunc
	writeCeilingFunc = f
	return func() { writeCeilingFunc = old }
}

// WriteCeiling is the real ceiling writer.
var WriteCeiling = writeCeiling

// FormatCeiling renders a ceiling file's content.
var FormatCeiling = formatCeiling

// (FakeClock, NewFakeClock and SetClock, in fakeclock_test.go, inject the
// scheduler's clock.)

// InmemNode is a cluster node's in-memory Raft transport and stores, kept
// across restarts of the node's Server.
type InmemNode struct {
	ID    string
	Addr  string // its Raft address ("inmem-ID:1")
	Trans *raft.InmemTransport
	Store *raft.InmemStore
	Snaps *raft.InmemSnapshotStore
}

// NewInmemNode returns the in-memory transport and stores of node id.
func NewInmemNode(id string) *InmemNode {
	addr := "inmem-" + id + ":1"
	_, tr := raft.NewInmemTransport(raft.ServerAddress(addr))
	return &InmemNode{ID: id, Addr: addr, Trans: tr, Store: raft.NewInmemStore(), Snaps: raft.NewInmemSnapshotStore()}
}

// Use makes cc use n's transport and stores.
func (n *InmemNode) Use(cc *ClusterConfig) {
	cc.transport = n.Trans
	cc.stores = &raftStores{log: n.Store, stable: n.Store, snaps: n.Snaps}
}

// SetRaftTuning lets a test change the Raft configuration of a node (e.g.
// snapshot thresholds).
func SetRaftTuning(cc *ClusterConfig, f func(*raft.Config)) { cc.tune = f }

// Snapshot makes the node take a Raft snapshot now.
func (s *Server) Snapshot() error { return s.clusterMode().r.Snapshot().Error() }

// UseLossy is Use with a transport that fails each outgoing RPC for which
// drop returns true (message loss; pipelining is off so that every append
// goes through AppendEntries).
func (n *InmemNode) UseLossy(cc *ClusterConfig, drop func() bool) {
	n.Use(cc)
	cc.transport = &lossyTransport{Transport: n.Trans, close: n.Trans, drop: drop}
}

type lossyTransport struct {
	raft.Transport
	close raft.WithClose
	drop  func() bool
}

var errDropped = errors.New("test: message dropped")

func (t *lossyTransport) Close() error { return t.close.Close() }

func (t *lossyTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

func (t *lossyTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	if t.drop() {
		return errDropped
	}
	return t.Transport.AppendEntries(id, target, args, resp)
}

func (t *lossyTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if t.drop() {
		return errDropped
	}
	return t.Transport.RequestVote(id, target, args, resp)
}

func (t *lossyTransport) InstallSnapshot(id raft.ServerID, target raft.ServerAddress, args *raft.InstallSnapshotRequest, resp *raft.InstallSnapshotResponse, data io.Reader) error {
	if t.drop() {
		return errDropped
	}
	return t.Transport.InstallSnapshot(id, target, args, resp, data)
}

// ProposalsPending returns the commands a cluster leader has proposed and
// not yet applied: those of requests (ACQUIRE, RELEASE), the ends of
// leases, and how many of all those are on the leader's own queue (not
// charged to a session).
func ProposalsPending(s *Server) (requests, expiries, own int) {
	cl := s.clusterMode()
	cl.sh.mu.Lock()
	defer cl.sh.mu.Unlock()
	if cl.own == nil {
		return 0, 0, 0
	}
	for _, p := range cl.pending {
		if p.lp.Expiry() {
			expiries++
		}
	}
	return len(cl.pending) - expiries, expiries, cl.own.n
}

// UseDropping wraps cc's transport (set by Use) so that each outgoing RPC
// for which drop returns true fails.
func UseDropping(cc *ClusterConfig, drop func() bool) {
	cc.transport = &lossyTransport{Transport: cc.transport, close: cc.transport.(raft.WithClose), drop: drop}
}

// SetWallMicros makes ClockStart read f instead of the wall clock (in
// microseconds since 1970); the returned func restores the real clock.
// Only for tests that do not run in parallel.
func SetWallMicros(f func() int64) (restore func()) {
	old := wallMicros
	wallMicros = f
	return func() { wallMicros = old }
}

// UseTransport makes cc use n's in-memory transport only: the node keeps
// its Raft log, stable store and snapshots on disk in its DataDir, as a
// real node does.
func (n *InmemNode) UseTransport(cc *ClusterConfig) { cc.transport = n.Trans }

// TransferLeadershipTo hands the leadership of s (the leader) to node id.
func (s *Server) TransferLeadershipTo(id, addr string) error {
	return s.clusterMode().r.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(addr)).Error()
}

// BrowseWork is the lock browser's work so far (Server.Locks): its scans,
// chunks (each one hold of a table's mutex), keys visited, and the most
// keys one chunk visited.
type BrowseWork struct{ Scans, Chunks, Visits, MaxChunk int64 }

// BrowseWork returns s's lock browser's work so far.
func (s *Server) BrowseWork() BrowseWork {
	b := s.browse
	return BrowseWork{Scans: b.scans.Load(), Chunks: b.chunks.Load(), Visits: b.visits.Load(), MaxChunk: b.maxChunk.Load()}
}

// The lock browser's bounds.
const (
	LockChunkVisits = lockChunkVisits
	MaxLockVisits   = maxLockVisits
	LockPollShare   = lockPollShare
)
