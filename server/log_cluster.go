package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/fsutil"
	"github.com/ticketing-dev/ticketing/internal/raft"
	"github.com/ticketing-dev/ticketing/internal/raftnet"
	"github.com/ticketing-dev/ticketing/internal/raftstore"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
	"github.com/ticketing-dev/ticketing/server/internal/replica"
)

// Raft mode: the node.
//
// Every node runs hashicorp/raft with the state machine of log_cluster_fsm.go.
// A node that is not the leader has RoleStandby with the leader's client
// address as hint: HELLO gets M. When a node wins an election it applies a
// Barrier (every entry of earlier terms is applied), raises the counter to
// the configured floor (in a new cluster with TokenStartClock, at least
// ClockStart) and records its client address (one entry, waited for),
// promotes its lock core with the applied holdings, every lease restarted
// at its full lease_s plus one election timeout, and only then takes
// RoleLeader and serves. When it loses leadership its core is demoted
// (waiters are dropped, commands in flight are forgotten) and every
// session gets M and closes: callers see Indeterminate for what was in
// flight, and retry on the new leader.
//
// The leader's core (log_cluster_seam.go) is the only proposer; it projects
// every command it proposes (a Grant of a key it holds free, a Free of the
// token it holds), the commands of a key apply in the order proposed
// (those of different keys may not: the proposer takes its sessions'
// queues in turns), so its projection is the state the machine reaches. What it cannot know in
// advance is a pending grant's token: until its entry applies, a RELEASE
// cannot name it (N) and a retry by its owner waits for it. Replies come
// from the apply of the entry that decided them: nothing is answered
// before it is committed (but R with ClusterConfig.EarlyRelease). Lease and
// wait deadlines run on the leader's clock (Config.clock), every lease end
// on time (the shard's timer); an ended lease is a proposed Free of kind
// expire; followers expire nothing.
type cluster struct {
	s        *Server
	cfg      ClusterConfig
	r        *raft.Raft
	fsm      *clusterFSM
	trans    raft.Transport
	closers  []func() error
	lockFile *os.File
	logErr   func() error // the Raft log store's write error (raftstore.Stores.LogErr); nil with injected stores

	// The scheduler (leader only): the lock core of the leader, fed by the
	// applied log, under sh.mu, which also guards the fields below it.
	sh      shard // sh.serving: the scheduler runs (this node leads)
	stint   uint64
	seq     uint64
	pending map[uint64]*proposal // the commands of this stint in flight, by seq

	// The proposer (log_cluster_proposer.go): a queue per session, their
	// counts under sh.mu, their commands under pmu.
	queues        map[uint64]*pqueue // by conn.qid
	lastQID       uint64
	own           *pqueue // the leader's own commands (expiries of holdings restored at the takeover); set under sh.mu and pmu
	pmu           sync.Mutex
	pring         *pqueue             // the queues with commands, in turn
	pqueues       int                 // queues in the ring
	pkeys         map[string]keyRoute // the queue of each key with queued commands
	pinflight     int                 // entries proposed, not yet applied
	pscratch      []byte
	pfresh        []*pqueue                                          // queues with commands, none in an entry in flight (and some no longer so)
	pents         [maxEntriesInFlight + maxExpressInFlight][]*pqueue // per entry in flight (from phead, pinflight of them), the queue of each of its commands
	phead         int
	pentAt        [maxEntriesInFlight + maxExpressInFlight]time.Time // per entry in flight: when proposed; zero for an express entry
	pheavyAt      time.Time                                          // while contended, no normal entry is proposed before this (pacing)
	pcand         []*pqueue                                          // scratch of packLocked
	lightAt       int64                                              // when an express entry last took a command of a session not held back (server clock)
	heldAt        atomic.Int64                                       // when a session's reader last waited in admitLocked (server clock)
	nwaiting      atomic.Int32                                       // sessions' readers waiting in admitLocked
	pstint        uint64
	pwake         chan struct{}
	sessionWaits  atomic.Uint64 // times a session's reader waited at MaxSessionProposals
	proposalLimit atomic.Uint64 // ACQUIREs answered B at MaxProposals
	limitLog      logLimit      // its log lines

	stop       chan struct{}
	wg         sync.WaitGroup
	hintChange chan struct{}

	// Identity and bootstrap (log_cluster_boot.go).
	logs        raft.LogStore
	stable      raft.StableStore
	snaps       raft.SnapshotStore
	incarnation string                 // this data directory's
	newID       string                 // the cluster ID a first leader records
	gate        atomic.Bool            // Raft's RPCs reach Raft (false while checking the peers before a bootstrap, or after a refusal)
	fatal       atomic.Pointer[error]  // the refusal, if any
	waiting     atomic.Pointer[string] // whom a node checking its peers waits for

	// Who may send this node Raft RPCs (cluster.admit, log_cluster_boot.go).
	rp        atomic.Pointer[raft.Raft]   // cl.r, for the transport's goroutines
	members   atomic.Pointer[memberCache] // the latest configuration's IDs, as last read
	bootIDs   atomic.Pointer[[]string]    // the IDs of the bootstrap record
	vouched   sync.Map                    // node ID -> time.Time: a member listed it
	strangers chan stranger               // to strangerChecker
	lastCheck map[string]time.Time        // strangerChecker's: when each stranger was last checked
	lastWarn  map[string]time.Time        // strangerChecker's: when its refusal was last logged

	// The standalone token ceiling this node started from, until it is
	// marked as imported (leadership's: markCeilingImported).
	ceilingMark     string
	ceilingImported uint64

	contacts contacts // the peers' replies to this node's AppendEntries (log_cluster_contact.go)

	graceful      atomic.Bool // Server.Shutdown, not Close
	leaderChanges atomic.Uint64
	serving       atomic.Bool
	commitLatency prometheus.Histogram
	entryCommands prometheus.Histogram // commands per entry applied on the leader
	slowGrants    atomic.Uint64        // grants answered B for a commit slower than ElectionTimeout
	slowLog       logLimit             // its log lines
}

func (cc *ClusterConfig) validate(c *Config) error {
	if !replica.ValidID(cc.NodeID) {
		return replica.IDError("ClusterConfig.NodeID", cc.NodeID)
	}
	if cc.transport == nil {
		if cc.RaftListen == "" {
			return errors.New("server: ClusterConfig.RaftListen is required")
		}
		if cc.RaftAdvertise == "" {
			cc.RaftAdvertise = cc.RaftListen
		}
		if err := replica.DialableHostPort(cc.RaftAdvertise); err != nil {
			return fmt.Errorf("server: ClusterConfig.RaftAdvertise: %w", err)
		}
	}
	if cc.Advertise == "" {
		return errors.New("server: ClusterConfig.Advertise (the client address other nodes give as hint) is required")
	}
	if len(cc.Advertise) > wire.MaxNameLen {
		return fmt.Errorf("server: ClusterConfig.Advertise longer than %d bytes", wire.MaxNameLen)
	}
	if len(cc.Peers) > 0 {
		seen := map[string]bool{}
		self := false
		for _, p := range cc.Peers {
			if !replica.ValidID(p.ID) || p.Address == "" {
				return fmt.Errorf("server: ClusterConfig.Peers: bad peer %q=%q", p.ID, p.Address)
			}
			if seen[p.ID] {
				return fmt.Errorf("server: ClusterConfig.Peers: node %q twice", p.ID)
			}
			seen[p.ID] = true
			if p.ID == cc.NodeID {
				self = true
				if cc.transport == nil && p.Address != cc.RaftAdvertise {
					return fmt.Errorf("server: ClusterConfig.Peers gives %s the address %s, but its RaftAdvertise is %s", p.ID, p.Address, cc.RaftAdvertise)
				}
			}
		}
		if !self {
			return fmt.Errorf("server: ClusterConfig.Peers does not list this node (%s)", cc.NodeID)
		}
	}
	if cc.Join && len(cc.Peers) > 0 {
		return errors.New("server: ClusterConfig.Join (initial-cluster-state existing: the node waits to be added and never bootstraps) and Peers (the configuration of a new cluster) exclude each other")
	}
	if cc.ClusterID != "" && !replica.ValidID(cc.ClusterID) {
		return replica.IDError("ClusterConfig.ClusterID", cc.ClusterID)
	}
	if cc.HeartbeatTimeout < 0 || cc.ElectionTimeout < 0 {
		return errors.New("server: negative ClusterConfig timeout")
	}
	if cc.HeartbeatTimeout == 0 {
		cc.HeartbeatTimeout = DefaultRaftHeartbeat
	}
	if cc.MaxSessionProposals < 0 || cc.MaxProposals < 0 {
		return fmt.Errorf("server: negative ClusterConfig.MaxSessionProposals (%d) or MaxProposals (%d)", cc.MaxSessionProposals, cc.MaxProposals)
	}
	if cc.MaxSessionProposals == 0 {
		cc.MaxSessionProposals = DefaultMaxSessionProposals
	}
	if cc.MaxProposals == 0 {
		cc.MaxProposals = DefaultMaxProposals
	}
	if cc.ElectionTimeout == 0 {
		cc.ElectionTimeout = DefaultRaftElection
	}
	if c.Standby {
		return errors.New("server: Config.Standby and Config.Cluster are exclusive (a cluster node's role follows the election)")
	}
	if cc.EarlyRelease && cc.CommittedRelease {
		return errors.New("server: ClusterConfig.EarlyRelease and the deprecated CommittedRelease contradict each other: leave CommittedRelease unset (the committed release is the default)")
	}
	return cc.checkPeerTLS()
}

// MaxNodeIDLen is the longest ClusterConfig.NodeID (and ClusterID,
// PairConfig.ID).
const MaxNodeIDLen = replica.MaxIDLen

// ValidNodeID reports whether id can be a ClusterConfig.NodeID (or a
// ClusterID, a PairConfig.ID): 1 to MaxNodeIDLen bytes of ASCII letters,
// digits, '.', '_' and '-', and neither "." nor "..".
func ValidNodeID(id string) bool { return replica.ValidID(id) }

// newCluster starts the Raft node of s (called by New).
func newCluster(s *Server) (*cluster, error) {
	cc := *s.cfg.Cluster
	cl := &cluster{
		s:          s,
		cfg:        cc,
		fsm:        newClusterFSM(),
		pwake:      make(chan struct{}, 1),
		stop:       make(chan struct{}),
		hintChange: make(chan struct{}, 1),
		strangers:  make(chan stranger, 16),
		lastCheck:  map[string]time.Time{},
		lastWarn:   map[string]time.Time{},
		commitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "ticketing", Subsystem: "raft", Name: "commit_seconds",
			Help:    "Time from proposing a log entry (a batch of commands) to its apply on the leader.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		entryCommands: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "ticketing", Subsystem: "raft", Name: "entry_commands",
			Help:    "Commands in each log entry the leader proposed and applied (its count is the entries, its sum the commands).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 8), // 1 .. 128 (maxEntryCommands)
		}),
	}
	cl.sh = shard{exact: true, rep: cl, wakeAt: lockcore.NoDeadline, view: ViewLeader}
	cl.sh.core = lockcore.New(lockcore.Config{
		Capacity:      &s.capacity,
		MaxKeyWaiters: s.cfg.MaxKeyWaiters,
		MaxPending:    cc.MaxProposals,
		MaxCommit:     int64(cc.ElectionTimeout),
		EarlyRelease:  cc.EarlyRelease,
	}, raftLog{cl})
	cl.fsm.done = cl.applied
	cl.fsm.changed = cl.signalHint
	cl.fsm.identified = cl.identified
	cl.newID = cc.ClusterID
	if cl.newID == "" {
		cl.newID = replica.NewID()
	}
	ok := false
	defer func() {
		if !ok {
			cl.closeResources()
		}
	}()

	// Tokens continue above the configured floor, and above a standalone
	// ceiling found in the data dir (a migration), whichever is higher.
	floor := s.cfg.InitialToken
	ceilPath := filepath.Join(s.cfg.DataDir, ceilingFile)
	var imported uint64
	switch b, err := os.ReadFile(ceilPath); {
	case err == nil:
		v, err := parseCeiling(b)
		if err != nil {
			return nil, fmt.Errorf("server: %s: a standalone token ceiling that cannot be read: %w", ceilPath, err)
		}
		imported = v
		if v > floor {
			floor = v
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("server: %s: %w", ceilPath, err)
	}
	cl.fsm.floor = floor
	cl.fsm.clockStart = s.cfg.TokenStart == TokenStartClock
	cl.fsm.lowFloor = func(last uint64) {
		s.log.Error("cluster: this node's token floor (initial-token, or an imported standalone ceiling) is above the cluster's counter: the leader was started without it, and may issue tokens at or below it. Give every node the same initial-token", "floor", floor, "counter", last)
	}

	var logs raft.LogStore
	var stable raft.StableStore
	var snaps raft.SnapshotStore
	if cc.stores != nil {
		logs, stable, snaps = cc.stores.log, cc.stores.stable, cc.stores.snaps
	} else {
		dir := filepath.Join(s.cfg.DataDir, "raft")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		lf, err := lockDir(filepath.Join(dir, "LOCK"))
		if err != nil {
			return nil, err
		}
		cl.lockFile = lf
		st, err := raftstore.Open(dir, raftnet.HCLogger(s.log).Named("raft"))
		if err != nil {
			return nil, err
		}
		cl.closers = append(cl.closers, st.Close)
		cl.logErr = st.LogErr
		logs, stable, snaps = st.Log, st.Stable, st.Snapshots
	}

	var err error
	trans := cc.transport
	// The transport's members (whose IPs get handshake slots of their own):
	// the bootstrap peers until raft runs, then its latest configuration.
	var running atomic.Pointer[raft.Raft]
	if trans == nil {
		adv, err := net.ResolveTCPAddr("tcp", cc.RaftAdvertise)
		if err != nil {
			return nil, fmt.Errorf("server: ClusterConfig.RaftAdvertise: %w", err)
		}
		members := func() []raft.ServerAddress {
			var addrs []raft.ServerAddress
			if r := running.Load(); r != nil {
				for _, sv := range r.GetConfiguration().Configuration().Servers {
					addrs = append(addrs, sv.Address)
				}
				return addrs
			}
			for _, p := range cc.Peers {
				addrs = append(addrs, raft.ServerAddress(p.Address))
			}
			return addrs
		}
		nt, err := raftnet.New(raftnet.Config{BindAddr: cc.RaftListen, Advertise: adv, TLS: cc.peerTLS, Members: members, Budget: s.budget, Logger: s.log})
		if err != nil {
			return nil, err
		}
		cl.closers = append(cl.closers, nt.Close)
		trans = nt
	}
	cl.logs, cl.stable, cl.snaps = logs, stable, snaps
	if cl.incarnation, err = loadIncarnation(stable); err != nil {
		return nil, fmt.Errorf("server: raft state in %s: %w", s.cfg.DataDir, err)
	}
	cl.trans = trans

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cc.NodeID)
	rc.HeartbeatTimeout = cc.HeartbeatTimeout
	rc.ElectionTimeout = cc.ElectionTimeout
	rc.LeaderLeaseTimeout = cc.HeartbeatTimeout
	rc.CommitTimeout = 5 * time.Millisecond
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 256
	rc.Logger = raftnet.HCLogger(s.log).Named("raft")
	rc.NoLegacyTelemetry = true
	if cc.tune != nil {
		cc.tune(rc)
	}

	has, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return nil, fmt.Errorf("server: raft state in %s: %w", s.cfg.DataDir, err)
	}
	markPath := filepath.Join(s.cfg.DataDir, ceilingImportedFile)
	mark, err := os.ReadFile(markPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("server: %s: %w", markPath, err)
	}
	if imported > 0 && !has && mark != nil && !cc.Join && len(cc.Peers) > 0 {
		// The ceiling went into a cluster's state already, and that state
		// is gone from here: a bootstrap would be a second history.
		return nil, refusef("cluster: node %s refuses to bootstrap: the standalone token ceiling in its data directory (%s) was imported into a cluster already (%s: %s), and this node's Raft state is gone (wiped or moved aside). "+
			"Bootstrapping again would start a second history under the same node ID, whose leader could issue the cluster's fencing tokens again. "+
			"To bring this machine back: on the cluster's leader, 'ticketingd cluster remove %s'; then add it as a new node: "+
			"'ticketingd init --cluster --add --node NEWID=HOST' (initial-cluster-state existing, no peers), start it, and on the leader 'ticketingd cluster add NEWID=RAFTADDR' "+
			"(docs/operations.md, \"Refusals at start\")",
			cc.NodeID, ceilPath, markPath, strings.TrimSpace(string(mark)), cc.NodeID)
	}
	if imported > 0 && mark == nil {
		cl.ceilingMark, cl.ceilingImported = markPath, imported
	}
	if imported > 0 && !has {
		// The ceiling is this node's alone: only this node's takeover can
		// put it in the log. A cluster may start from it only with this
		// node alone (the others added later, once its tokens are there).
		if !(len(cc.Peers) == 1 && cc.Peers[0].ID == cc.NodeID) {
			return nil, fmt.Errorf("server: %s holds a standalone token ceiling (%d): a cluster can start from it only on this node alone, so that its first leader is the node that knows it. Bootstrap this node with itself as the only peer, then add the others (ticketingd cluster add); or move the file aside and give every node initial-token %d", ceilPath, imported, imported)
		}
		s.log.Info("cluster: tokens continue above the standalone ceiling found in the data dir", "ceiling", imported)
	}
	// A node without state bootstraps only when that cannot fork an
	// existing history (log_cluster_boot.go): alone at once, with peers once
	// every one of them agrees; until then Raft's RPCs do not reach it.
	// And never under a bundle's identity with other peers than the
	// bundle's.
	if !has && !cc.Join && len(cc.Peers) > 0 {
		if err := checkBoundPeers(&cc, imported > 0); err != nil {
			return nil, err
		}
	}
	if has {
		if rec := loadBootRecord(stable); rec != nil {
			cl.setBootIDs(rec)
		}
	}
	cl.gate.Store(true)
	checkPeers := false
	switch {
	case has && len(cc.Peers) > 0:
		s.log.Info("cluster: raft state exists; the peers setting is ignored", "node_id", cc.NodeID)
	case has:
	case cc.Join:
		s.log.Info("cluster: no raft state, initial-cluster-state existing: waiting to be added to a cluster", "node_id", cc.NodeID)
	case len(cc.Peers) == 0:
		s.log.Info("cluster: no raft state and no peers: waiting to be added to a cluster", "node_id", cc.NodeID)
	case len(cc.Peers) == 1:
		rec := &bootRecord{ClusterID: cc.ClusterID, Peers: cc.Peers, Incarnations: map[string]string{cc.NodeID: cl.incarnation}}
		if err := storeBootRecord(stable, rec); err != nil {
			return nil, fmt.Errorf("server: bootstrap the cluster: %w", err)
		}
		cl.setBootIDs(rec)
		if err := raft.BootstrapCluster(rc, logs, stable, snaps, trans, peersConfiguration(cc.Peers)); err != nil {
			return nil, fmt.Errorf("server: bootstrap the cluster: %w", err)
		}
		s.log.Info("cluster: bootstrapped", "node_id", cc.NodeID, "peers", 1, "cluster_id", cc.ClusterID)
	default:
		cl.gate.Store(false)
		checkPeers = true
		s.log.Info("cluster: no raft state: asking every peer before bootstrapping", "node_id", cc.NodeID, "peers", len(cc.Peers), "cluster_id", cc.ClusterID)
	}
	gt, out := newGatedTransport(cl, trans)
	r, err := raft.NewRaft(rc, cl.fsm, logs, stable, snaps, gt)
	if err != nil {
		return nil, fmt.Errorf("server: start raft: %w", err)
	}
	cl.r = r
	cl.rp.Store(r)
	running.Store(r)
	s.group = cl.fsm.clusterID
	// (Without PeerCertificate, raftnet.New has logged its warning.)
	cl.wg.Add(4)
	go cl.relay(trans.Consumer(), out)
	go cl.strangerChecker()
	go cl.leadership()
	go cl.proposer()
	if checkPeers {
		cl.wg.Add(1)
		go cl.bootstrapper()
	}
	ok = true
	return cl, nil
}

func (cl *cluster) closeResources() {
	for i := len(cl.closers) - 1; i >= 0; i-- {
		cl.closers[i]()
	}
	unlockDir(cl.lockFile)
}

// shutdown stops the node. After Server.Shutdown (graceful), a leader
// first hands its leadership over, so that the others need not wait for an
// election timeout; after Close it just stops, as a crash would.
func (cl *cluster) shutdown() {
	if cl.graceful.Load() && cl.r.State() == raft.Leader {
		if err := cl.r.LeadershipTransfer().Error(); err != nil {
			cl.s.log.Info("cluster: no leadership transfer before shutdown", "err", err)
		}
	}
	cl.stopScheduler()
	close(cl.stop)
	if err := cl.r.Shutdown().Error(); err != nil {
		cl.s.log.Warn("cluster: raft shutdown", "err", err)
	}
	cl.wg.Wait()
	cl.closeResources()
}

// await waits for a raft future, or for ctx, or for the node to stop. A
// future still queued when raft shuts down is answered with
// ErrRaftShutdown (internal/raft; upstream never answers it,
// hashicorp/raft#498); the stop case returns without waiting for that.
func (cl *cluster) await(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-cl.stop:
		return raft.ErrRaftShutdown
	case <-ctx.Done():
		return fmt.Errorf("server: cluster change outcome unknown: %w", ctx.Err())
	}
}

func (cl *cluster) signalHint() {
	select {
	case cl.hintChange <- struct{}{}:
	default:
	}
}

// leadership follows this node's Raft state: it takes over on winning an
// election, steps down on losing it, and keeps the NOT_ACTIVE hint (the
// leader's client address) current while following.
func (cl *cluster) leadership() {
	defer cl.wg.Done()
	obs := make(chan raft.Observation, 16)
	o := raft.NewObserver(obs, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	cl.r.RegisterObserver(o)
	defer cl.r.DeregisterObserver(o)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var lastLeader raft.ServerID
	for {
		select {
		case <-cl.stop:
			return
		case lead := <-cl.r.LeaderCh():
			cl.stopScheduler()
			if lead {
				cl.takeOver()
			} else {
				cl.follow()
			}
		case o := <-obs:
			if lo, ok := o.Data.(raft.LeaderObservation); ok && lo.LeaderID != "" && lo.LeaderID != lastLeader {
				lastLeader = lo.LeaderID
				cl.leaderChanges.Add(1)
			}
			if !cl.serving.Load() {
				cl.follow()
			}
		case <-cl.hintChange:
			if !cl.serving.Load() {
				cl.follow()
			}
		case <-tick.C:
			cl.markCeilingImported()
			// A leader whose takeover failed (an entry that could not be
			// committed) tries again while it leads.
			if !cl.serving.Load() && cl.r.State() == raft.Leader {
				cl.takeOver()
			} else if !cl.serving.Load() {
				cl.follow()
			}
		}
	}
}

// markCeilingImported writes the mark beside a standalone token ceiling
// that this node started from, once the cluster's applied (committed)
// counter has reached it: the ceiling is then in the cluster's state, and
// the mark keeps the data directory from being bootstrapped again from
// it (a wiped member restarted alone with the ceiling left beside its
// data-dir/raft would start a second history of the cluster's tokens).
func (cl *cluster) markCeilingImported() {
	if cl.ceilingMark == "" || cl.fsm.last.Load() < cl.ceilingImported {
		return
	}
	id := cl.fsm.clusterID()
	body := fmt.Sprintf("imported into cluster %s (counter %d)\n", id, cl.fsm.last.Load())
	if err := fsutil.ReplaceFile(cl.ceilingMark, []byte(body)); err != nil {
		cl.s.log.Warn("cluster: cannot mark the standalone token ceiling as imported (tried again each second)", "file", cl.ceilingMark, "err", err)
		return
	}
	cl.s.log.Info("cluster: the standalone token ceiling is in the cluster's state: marked as imported", "file", cl.ceilingMark, "ceiling", cl.ceilingImported, "cluster_id", id)
	cl.ceilingMark = ""
}

// follow sets RoleStandby with the leader's client address as hint.
func (cl *cluster) follow() {
	_, id := cl.r.LeaderWithID()
	hint := ""
	if id != "" {
		hint = cl.fsm.advertised(string(id))
	}
	if err := cl.s.SetRole(RoleStandby, hint); err != nil {
		cl.s.log.Error("cluster: role change", "err", err)
	}
}

// takeOver makes the new leader serve: Barrier, floor and address, lease
// restart, then RoleLeader.
func (cl *cluster) takeOver() {
	start := time.Now()
	if err := cl.await(context.Background(), cl.r.Barrier(0)); err != nil {
		cl.s.log.Info("cluster: barrier failed; not serving", "err", err)
		return
	}
	var b [8]byte
	rand.Read(b[:])
	stint := binary.BigEndian.Uint64(b[:]) | 1 // never 0 (the takeover's own entries)
	cmds, n := appendStint(nil, stint), 1
	if fl := cl.fsm.takeoverFloor(); fl > cl.fsm.last.Load() {
		cmds, n = appendFloor(cmds, fl), n+1
	}
	if cl.fsm.advertised(cl.cfg.NodeID) != cl.cfg.Advertise {
		cmds, n = appendAdvertise(cmds, cl.cfg.NodeID, cl.cfg.Advertise), n+1
	}
	if cl.fsm.clusterID() == "" { // last: a node of an earlier version stops at it
		cmds, n = appendClusterID(cmds, cl.newID), n+1
	}
	if err := cl.await(context.Background(), cl.r.Apply(append(entryHeader(0, n), cmds...), 0)); err != nil {
		cl.s.log.Info("cluster: takeover entry failed; not serving", "err", err)
		return
	}
	if cl.r.State() != raft.Leader {
		return
	}
	hs, last := cl.fsm.holdingsNow()

	s := cl.s
	margin := int64(cl.cfg.ElectionTimeout)
	cl.sh.mu.Lock()
	cl.stint, cl.seq = stint, 0
	cl.pending = make(map[uint64]*proposal)
	// Every lease restarts in full, plus one election timeout: a failover
	// never shortens a lease.
	cl.sh.core.Promote(s.shardNow(&cl.sh), hs, margin)
	s.rearm(&cl.sh)
	// The proposer takes the new stint before the first command can be
	// queued.
	cl.resetProposerLocked(stint)
	cl.sh.serving = true
	cl.sh.mu.Unlock()
	cl.serving.Store(true)
	if err := s.SetRole(RoleLeader, ""); err != nil {
		s.log.Error("cluster: role change", "err", err)
	}
	s.log.Info("cluster: leading", "node_id", cl.cfg.NodeID, "held_locks", len(hs), "last_token", last,
		"leases_restarted_for", fmt.Sprintf("lease_s + %v", cl.cfg.ElectionTimeout), "takeover", time.Since(start).Round(time.Microsecond))
}

// stopScheduler ends the leader's scheduler (if it runs): timers stop,
// waiters and proposals are forgotten; then the role becomes RoleStandby,
// which closes every session with M.
func (cl *cluster) stopScheduler() {
	cl.sh.mu.Lock()
	was := cl.sh.serving
	cl.sh.serving = false
	cl.sh.core.Demote()
	cl.pending = nil
	cl.resetProposerLocked(0)
	cl.sh.mu.Unlock()
	if was {
		cl.serving.Store(false)
		cl.follow()
	}
}

// clusterMode is the server's mode if it is a Raft node, else nil.
func (s *Server) clusterMode() *cluster {
	cl, _ := s.mode.(*cluster)
	return cl
}

// ClusterStatus returns this node's view of the cluster.
func (s *Server) ClusterStatus() (ClusterStatus, error) {
	cl := s.clusterMode()
	if cl == nil {
		return ClusterStatus{}, ErrNotCluster
	}
	r := cl.r
	st := ClusterStatus{
		NodeID:        cl.cfg.NodeID,
		ClusterID:     cl.fsm.clusterID(),
		State:         r.State().String(),
		Serving:       cl.serving.Load(),
		CommitIndex:   r.CommitIndex(),
		AppliedIndex:  r.AppliedIndex(),
		LastLogIndex:  r.LastIndex(),
		LeaderChanges: cl.leaderChanges.Load(),
	}
	if st.ClusterID == "" {
		st.ClusterID = cl.cfg.ClusterID
	}
	if w := cl.waiting.Load(); w != nil {
		st.Bootstrap = "waiting for " + *w
	}
	if t, err := strconv.ParseUint(r.Stats()["term"], 10, 64); err == nil {
		st.Term = t
	}
	addr, id := r.LeaderWithID()
	st.Leader, st.LeaderAddress = string(id), string(addr)
	addrs := cl.fsm.addresses()
	if id != "" {
		st.LeaderAdvertise = addrs[string(id)]
	}
	leading := r.State() == raft.Leader
	if leading {
		st.MembersView = "leader"
	} else {
		st.MembersView = "not the leader: reachable, last contact, log index and lag are the leader's view; ask the leader's admin listener"
		if st.Leader != "" {
			st.MembersView += " (" + st.Leader + "'s)"
		}
		if lc := r.LastContact(); !lc.IsZero() {
			ms := time.Since(lc).Milliseconds()
			st.SinceLeaderContactMS = &ms
		}
	}
	now := time.Now()
	if f := r.GetConfiguration(); f.Error() == nil {
		for _, sv := range f.Configuration().Servers {
			m := ClusterMember{
				ID: string(sv.ID), Address: string(sv.Address), Suffrage: sv.Suffrage.String(),
				Advertise: addrs[string(sv.ID)], Leader: sv.ID == id,
			}
			switch {
			case leading && string(sv.ID) == cl.cfg.NodeID:
				yes, li, lag := true, st.LastLogIndex, uint64(0)
				m.Reachable, m.LogIndex, m.Lag = &yes, &li, &lag
			case leading:
				cl.contacts.memberContact(&m, cl.cfg.HeartbeatTimeout, st.LastLogIndex, now)
			}
			st.Servers = append(st.Servers, m)
		}
	}
	return st, nil
}

// health is TokenStoreErr in Raft mode: tokens come from the replicated
// counter, which this node can no longer reach once it refused to start
// (log_cluster_boot.go), its raft has shut down, or it has been removed from
// the cluster.
// hello: a Raft node's HELLO needs nothing of the mode (mode).
func (cl *cluster) hello() {}

// stopping marks a Shutdown (mode): a leader transfers its leadership
// before it stops.
func (cl *cluster) stopping() { cl.graceful.Store(true) }

func (cl *cluster) health() error {
	if p := cl.fatal.Load(); p != nil {
		return *p
	}
	if cl.r.State() == raft.Shutdown {
		return errRaftShutdown
	}
	if cl.logErr != nil {
		if err := cl.logErr(); err != nil {
			// Raft goes on when an append fails: the node would stay
			// behind (a follower) or lose its leadership, and look healthy.
			return fmt.Errorf("%w: %w", errLogWrite, err)
		}
	}
	f := cl.r.GetConfiguration()
	if f.Error() != nil {
		return nil
	}
	servers := f.Configuration().Servers
	for _, sv := range servers {
		if string(sv.ID) == cl.cfg.NodeID {
			return nil
		}
	}
	if len(servers) == 0 {
		return nil // waiting to be added
	}
	return errRemoved
}

func (cl *cluster) notLeader() error {
	addr, id := cl.r.LeaderWithID()
	return &NotLeaderError{Leader: string(id), LeaderAddress: string(addr)}
}

// membershipTimeout bounds a configuration change when ctx has no deadline.
const membershipTimeout = 30 * time.Second

func changeTimeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return membershipTimeout
}

// AddVoter adds node id, reachable by its peers at raftAddr, to the
// cluster as a voter (on the leader). Adding a node that is already a
// voter at that address changes nothing.
func (s *Server) AddVoter(ctx context.Context, id, raftAddr string) error {
	cl := s.clusterMode()
	if cl == nil {
		return ErrNotCluster
	}
	if !replica.ValidID(id) {
		return replica.IDError("node ID", id)
	}
	if err := replica.DialableHostPort(raftAddr); err != nil {
		return fmt.Errorf("server: raft address: %w", err)
	}
	if cl.r.State() != raft.Leader {
		return cl.notLeader()
	}
	err := cl.await(ctx, cl.r.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, changeTimeout(ctx)))
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return cl.notLeader()
	}
	if err == nil {
		s.log.Info("cluster: voter added", "id", id, "address", raftAddr)
	}
	return err
}

// RemoveServer removes node id from the cluster (on the leader). A leader
// may remove itself: it steps down once the change is committed.
func (s *Server) RemoveServer(ctx context.Context, id string) error {
	cl := s.clusterMode()
	if cl == nil {
		return ErrNotCluster
	}
	if cl.r.State() != raft.Leader {
		return cl.notLeader()
	}
	f := cl.r.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	found := false
	for _, sv := range f.Configuration().Servers {
		found = found || string(sv.ID) == id
	}
	if !found {
		return fmt.Errorf("server: node %q is not in the cluster configuration", id)
	}
	err := cl.await(ctx, cl.r.RemoveServer(raft.ServerID(id), 0, changeTimeout(ctx)))
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return cl.notLeader()
	}
	if err == nil {
		s.log.Info("cluster: server removed", "id", id)
	}
	return err
}

// clusterCollectors are the cluster's Prometheus collectors.
func (cl *cluster) collectors() []prometheus.Collector {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "ticketing", Subsystem: "raft", Name: name, Help: help}, f)
	}
	return []prometheus.Collector{
		cl.commitLatency,
		cl.entryCommands,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ticketing", Subsystem: "raft", Name: "leader_changes_total",
			Help: "Leader changes this node has observed."}, func() float64 { return float64(cl.leaderChanges.Load()) }),
		gauge("proposals_pending", "Commands the leader has proposed and not yet applied (queued for an entry, or in one).", func() float64 {
			cl.sh.mu.Lock()
			defer cl.sh.mu.Unlock()
			return float64(len(cl.pending))
		}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ticketing", Subsystem: "raft", Name: "session_waits_total",
			Help: "Times the leader stopped reading a session's requests because it had max-session-proposals commands (its requests, and the ends of its leases) awaiting their commit."}, func() float64 { return float64(cl.sessionWaits.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ticketing", Subsystem: "raft", Name: "proposal_limit_total",
			Help: "ACQUIREs answered B because the leader had max-proposals commands of requests awaiting their commit (included in busy_total)."}, func() float64 { return float64(cl.proposalLimit.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ticketing", Subsystem: "raft", Name: "slow_grants_total",
			Help: "Grants whose commit took longer than the election timeout, answered B (included in busy_total) and freed again."}, func() float64 { return float64(cl.slowGrants.Load()) }),
		gauge("applied_index", "Index of the last log entry applied to the state machine.", func() float64 { return float64(cl.r.AppliedIndex()) }),
		gauge("commit_index", "Index of the last committed log entry.", func() float64 { return float64(cl.r.CommitIndex()) }),
		gauge("leader", "1 while this node leads and serves, else 0.", func() float64 {
			if cl.serving.Load() {
				return 1
			}
			return 0
		}),
	}
}

// startCluster is the end of New in Raft mode: the Raft node instead of
// the token store.
func (s *Server) startCluster() (*Server, error) {
	cl, err := newCluster(s)
	if err != nil {
		return nil, err
	}
	s.mode = cl
	if s.cfg.Registerer != nil {
		if err := s.register(s.cfg.Registerer); err != nil {
			cl.shutdown()
			return nil, err
		}
	}
	s.bg.Add(1)
	go s.housekeeping()
	return s, nil
}
