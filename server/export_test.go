package server

import "github.com/hashicorp/raft"

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
	Trans *raft.InmemTransport
	Store *raft.InmemStore
	Snaps *raft.InmemSnapshotStore
}

// NewInmemNode returns the in-memory transport and stores of node id.
func NewInmemNode(id string) *InmemNode {
	_, tr := raft.NewInmemTransport(raft.ServerAddress(id))
	return &InmemNode{ID: id, Trans: tr, Store: raft.NewInmemStore(), Snaps: raft.NewInmemSnapshotStore()}
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
func (s *Server) Snapshot() error { return s.cl.r.Snapshot().Error() }
