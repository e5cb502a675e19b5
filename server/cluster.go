package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/raftnet"
	"github.com/ticketing-dev/ticketing/internal/raftstore"
	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// Raft mode: the node and its leader's scheduler.
//
// Every node runs hashicorp/raft with the state machine of cluster_fsm.go.
// A node that is not the leader has RoleStandby with the leader's client
// address as hint: HELLO gets M. When a node wins an election it applies a
// Barrier (every entry of earlier terms is applied), raises the counter to
// the configured floor (in a new cluster with TokenStartClock, at least ClockStart) and records
// its client address (one entry, waited for), restarts every lease at its
// full lease_s plus one election timeout, and only then takes RoleLeader
// and serves. When it loses leadership its
// scheduler stops (waiters are dropped, proposals in flight are forgotten)
// and every session gets M and closes: callers see Indeterminate for what
// was in flight, and retry on the new leader.
//
// The leader's scheduler mirrors the machine's holdings and projects onto
// them every command it has proposed and not yet seen applied: it is the
// only proposer, the commands apply in the order proposed, and a command is
// proposed only when the mirror says it will succeed (a Grant of a key
// projected free, a Free of the token projected to hold it), so the mirror
// is always the state the machine will reach. The one thing it does not
// know in advance is a pending grant's token: until its entry applies, a
// RELEASE cannot name it (N) and a retry by its owner waits for it.
// Replies are sent only from the apply of the entry that decided them:
// nothing is answered before it is committed (but R with
// ClusterConfig.EarlyRelease). Lease and wait timers run on
// the leader's clock (Config.clock); an ended lease is a proposed Free of
// kind expire; followers expire nothing.
type cluster struct {
	s        *Server
	cfg      ClusterConfig
	r        *raft.Raft
	fsm      *clusterFSM
	trans    raft.Transport
	closers  []func() error
	lockFile *os.File
	logErr   func() error // the Raft log store's write error (raftstore.Stores.LogErr); nil with injected stores

	// The scheduler (leader only), under mu.
	mu      sync.Mutex
	active  bool
	stint   uint64
	seq     uint64
	keys    map[string]*ckey
	pending map[uint64]*proposal
	leases  leaseSchedule // the held keys' lease ends (cluster_leases.go)

	// The proposer (cluster_proposer.go): a queue per session, their
	// counts under mu, their commands under pmu.
	queues        map[uint64]*pqueue // by conn.qid
	lastQID       uint64
	own           *pqueue // the leader's own commands (expiries of holdings restored at the takeover); set under mu and pmu
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
	nexpiring     int64         // of pending, the ends of leases (Frees without a RELEASE); under mu
	sessionWaits  atomic.Uint64 // times a session's reader waited at MaxSessionProposals
	proposalLimit atomic.Uint64 // ACQUIREs answered B at MaxProposals
	limitLog      logLimit      // its log lines

	stop       chan struct{}
	wg         sync.WaitGroup
	hintChange chan struct{}

	// Identity and bootstrap (cluster_boot.go).
	logs        raft.LogStore
	stable      raft.StableStore
	snaps       raft.SnapshotStore
	incarnation string                 // this data directory's
	newID       string                 // the cluster ID a first leader records
	gate        atomic.Bool            // Raft's RPCs reach Raft (false while checking the peers before a bootstrap, or after a refusal)
	fatal       atomic.Pointer[error]  // the refusal, if any
	waiting     atomic.Pointer[string] // whom a node checking its peers waits for

	contacts contacts // the peers' replies to this node's AppendEntries (cluster_contact.go)

	graceful      atomic.Bool // Server.Shutdown, not Close
	leaderChanges atomic.Uint64
	serving       atomic.Bool
	commitLatency prometheus.Histogram
	slowGrants    atomic.Uint64 // grants answered B for a commit slower than ElectionTimeout
	slowLog       logLimit      // its log lines
}

// ckey is the leader's view of one key.
type ckey struct {
	key       string
	held      bool
	owner     [wire.OwnerLen]byte
	lease     uint8
	ownedOnly bool
	token     uint64 // 0 while the grant that made it held is not applied yet
	leaseEnd  int64
	hidx      int32      // position in cl.leases (1-based), while held with a known token; 0: not scheduled
	q         *waitQueue // waiters (q.timer unused)
	retries   []*waiter  // ACQUIREs of the owner while its grant is pending
	// freeing is the proposed Free of the holding just ended (until it
	// applies), freeingTok that holding's token: a RELEASE naming it waits
	// for that commit and then gets N.
	freeing    *proposal
	freeingTok uint64
	by         uint64 // the conn.qid of the session whose ACQUIRE made the holding (0: restored by the takeover)
}

// proposal is a command of the current stint awaiting its apply.
type proposal struct {
	ck   *ckey
	w    *waiter // Grant: the ACQUIRE granted
	next *waiter // Free: the waiter granted with it
	rc   *conn   // Free by RELEASE: the releasing session (answered R, or N if its lease had ended)
	rid  uint32
	late []lateRelease // RELEASEs of the freed token that came after the Free was proposed: N once it applies
	kind uint8         // Free: freeRelease, freeReleaseOwned, freeExpire
	at   int64         // proposed (server clock)
	q    *pqueue       // the queue (session) it counts against
	// expiry: a Free no RELEASE asked for (a lease ended), charged to the
	// holder's session and not counted against MaxProposals.
	expiry bool
}

type lateRelease struct {
	c   *conn
	rid uint32
}

// waiter deadlines of ACQUIREs granted at once (no wait).
const noDeadline = math.MaxInt64

func (cc *ClusterConfig) validate(c *Config) error {
	if !validNodeID(cc.NodeID) {
		return fmt.Errorf("server: ClusterConfig.NodeID %q: must be 1 to 64 letters, digits, '.', '_' or '-'", cc.NodeID)
	}
	if cc.transport == nil {
		if cc.RaftListen == "" {
			return errors.New("server: ClusterConfig.RaftListen is required")
		}
		if cc.RaftAdvertise == "" {
			cc.RaftAdvertise = cc.RaftListen
		}
		if err := concreteHostPort(cc.RaftAdvertise); err != nil {
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
			if !validNodeID(p.ID) || p.Address == "" {
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
	if cc.ClusterID != "" && !validNodeID(cc.ClusterID) {
		return fmt.Errorf("server: ClusterConfig.ClusterID %q: must be 1 to 64 letters, digits, '.', '_' or '-'", cc.ClusterID)
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

// MaxNodeIDLen is the longest ClusterConfig.NodeID.
const MaxNodeIDLen = 64

// ValidNodeID reports whether id can be a ClusterConfig.NodeID: 1 to
// MaxNodeIDLen bytes of ASCII letters, digits, '.', '_' and '-'.
func ValidNodeID(id string) bool { return validNodeID(id) }

func validNodeID(id string) bool {
	if len(id) == 0 || len(id) > MaxNodeIDLen {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func concreteHostPort(a string) error {
	host, _, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		return fmt.Errorf("%q is not an address other nodes can dial", a)
	}
	return nil
}

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
		commitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "ticketing", Subsystem: "raft", Name: "commit_seconds",
			Help:    "Time from proposing a log entry (a batch of commands) to its apply on the leader.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
	}
	cl.fsm.done = cl.applied
	cl.fsm.changed = cl.signalHint
	cl.fsm.identified = cl.identified
	cl.newID = cc.ClusterID
	if cl.newID == "" {
		cl.newID = NewClusterID()
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
		nt, err := raftnet.New(raftnet.Config{BindAddr: cc.RaftListen, Advertise: adv, TLS: cc.peerTLS, Members: members, Logger: s.log})
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
	// existing history (cluster_boot.go): alone at once, with peers once
	// every one of them agrees; until then Raft's RPCs do not reach it.
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
	running.Store(r)
	// (Without PeerCertificate, raftnet.New has logged its warning.)
	cl.wg.Add(3)
	go cl.relay(trans.Consumer(), out)
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

// await waits for a raft future, or for ctx, or for the node to stop: a
// future still queued when raft shuts down is never answered
// (hashicorp/raft#498), and must not hang Close.
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
	now := s.now()
	margin := int64(cl.cfg.ElectionTimeout)
	cl.mu.Lock()
	cl.stint, cl.seq = stint, 0
	cl.keys = make(map[string]*ckey, len(hs))
	cl.pending = make(map[uint64]*proposal)
	for _, h := range hs {
		ck := &ckey{key: h.Key, held: true, owner: h.Owner, lease: h.LeaseS, ownedOnly: h.OwnedOnly, token: h.Token}
		// Every lease restarts in full, plus one election timeout: a
		// failover never shortens a lease.
		ck.leaseEnd = now + int64(h.LeaseS)*secondNs + margin
		cl.armLease(ck, now)
		cl.keys[h.Key] = ck
	}
	s.capacity.Held.Store(int64(len(hs)))
	s.capacity.Waiters.Store(0)
	// The proposer takes the new stint before the first command can be
	// queued.
	cl.resetProposerLocked(stint)
	cl.active = true
	cl.mu.Unlock()
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
	cl.mu.Lock()
	was := cl.active
	cl.active = false
	cl.stopLeases()
	for _, ck := range cl.keys {
		if ck.q != nil {
			for w := ck.q.head; w != nil; w = w.next {
				w.done = true
				w.timer.Stop()
			}
		}
	}
	cl.keys, cl.pending = nil, nil
	cl.s.capacity.Held.Store(0)
	cl.s.capacity.Waiters.Store(0)
	cl.resetProposerLocked(0)
	cl.mu.Unlock()
	if was {
		cl.serving.Store(false)
		cl.follow()
	}
}

// applied answers the commands of an applied entry of the current stint
// (the FSM calls it after applying the entry, off its lock).
func (cl *cluster) applied(stint uint64, res []cmdResult) {
	s := cl.s
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if !cl.active || stint != cl.stint {
		return
	}
	now := s.now()
	first := int64(math.MaxInt64)
	defer func() {
		// The entry's earliest command: its wait is the entry's commit
		// latency (with the wait for its turn in the proposer).
		if first != math.MaxInt64 {
			cl.commitLatency.Observe(float64(now-first) / 1e9)
		}
	}()
	cl.entryApplied()
	for _, r := range res {
		p := cl.pending[r.seq]
		if p == nil {
			continue
		}
		delete(cl.pending, r.seq)
		cl.appliedLocked(p)
		first = min(first, p.at)
		ck := p.ck
		if p.w != nil { // a Grant
			cl.grantApplied(ck, p.w, r.ok, r.token, r.exhausted, p.at, now)
			continue
		}
		// A Free.
		if ck.freeing == p {
			ck.freeing, ck.freeingTok = nil, 0
		}
		if !r.ok {
			// Not reached: the mirror said the token held the key.
			s.log.Error("cluster: a release or expiry the scheduler proposed did not apply; resynchronising the key", "key", ck.key)
			if p.rc != nil {
				s.m.notHeld.Add(1)
				p.rc.replySimpleQueued(wire.TypeNotHeld, p.rid)
			}
			if p.next != nil {
				p.next.c.replySimpleQueued(wire.TypeTimedOut, p.next.reqID)
			}
			cl.answerLate(p)
			cl.resync(ck, now)
			continue
		}
		if p.kind == freeExpire {
			s.m.expired.Add(1)
			if p.rc != nil { // a RELEASE that found the lease ended
				s.m.notHeld.Add(1)
				p.rc.replySimpleQueued(wire.TypeNotHeld, p.rid)
			}
		} else if p.rc != nil { // (an early R was answered and counted at once)
			s.m.released.Add(1)
			p.rc.replySimpleQueued(wire.TypeReleased, p.rid)
		}
		if p.next != nil {
			cl.grantApplied(ck, p.next, r.token != 0, r.token, r.exhausted, p.at, now)
		} else if !ck.held && ck.q == nil && cl.keys[ck.key] == ck && len(ck.retries) == 0 && ck.freeing == nil {
			delete(cl.keys, ck.key) // free and idle: forget it
		}
		cl.answerLate(p)
	}
}

// answerLate answers N to the RELEASEs that named the token a Free ended
// (after the releaser's R, if any).
func (cl *cluster) answerLate(p *proposal) {
	for _, lr := range p.late {
		cl.s.m.notHeld.Add(1)
		lr.c.replySimpleQueued(wire.TypeNotHeld, lr.rid)
	}
}

// grantApplied completes the grant of ck to w (its ACQUIRE's reply),
// proposed at proposed.
func (cl *cluster) grantApplied(ck *ckey, w *waiter, ok bool, tok uint64, exhausted bool, proposed, now int64) {
	s := cl.s
	retries := ck.retries
	ck.retries = nil
	if !ok {
		// No token left (MaxToken): the key stays free, and so would it
		// for every waiter: they get B too, as in standalone.
		ck.held = false
		s.capacity.Held.Add(-1)
		if exhausted {
			s.noToken(ErrTokensExhausted)
		}
		w.c.replySimpleQueued(wire.TypeBusy, w.reqID)
		for _, rw := range retries {
			rw.c.replySimpleQueued(wire.TypeBusy, rw.reqID)
		}
		if q := ck.q; q != nil {
			for q.head != nil {
				qw := q.head
				cl.dropQueuedLocked(qw)
				s.m.busy.Add(1)
				qw.c.replySimpleQueued(wire.TypeBusy, qw.reqID)
			}
		}
		return
	}
	ck.token = tok
	ck.leaseEnd = now + int64(ck.lease)*secondNs
	cl.armLease(ck, now)
	w.done = true
	// A commit that took longer than an election timeout may have been
	// applied by a leader that was stalled (a GC pause, SIGSTOP) while
	// another was elected and restarted this lease from an earlier instant:
	// a G now would let its holder count the lease from now, past the new
	// leader's end of it. It is not granted: B, "not granted, try later",
	// as standalone answers an ACQUIRE whose token a slow disk did not
	// reserve in time (T would say that its wait ran out, which it did not).
	stale := now-proposed > int64(cl.cfg.ElectionTimeout)
	if w.c.dead.Load() || now >= w.deadline || stale {
		// The holder is gone, or its wait ran out while the grant was
		// being committed (T), or the commit was too slow to trust (B):
		// it is answered (if it is still there), and the key is freed
		// again at once rather than held by nobody for a lease.
		if stale {
			cl.slowCommit(now - proposed)
		}
		if !w.c.dead.Load() {
			if now >= w.deadline {
				s.m.timeouts.Add(1)
				w.c.replySimpleQueued(wire.TypeTimedOut, w.reqID)
			} else {
				s.m.busy.Add(1)
				w.c.replySimpleQueued(wire.TypeBusy, w.reqID)
			}
		}
		// The holder's retries (no wait of their own): B after a slow
		// commit, T as the grant they waited for otherwise.
		typ := byte(wire.TypeTimedOut)
		if stale {
			typ = wire.TypeBusy
		}
		for _, rw := range retries {
			rw.done = true
			rw.c.replySimpleQueued(typ, rw.reqID)
		}
		cl.freeLocked(ck, freeExpire, nil, 0, ck.owner, now)
		return
	}
	s.m.granted(now - w.arrived)
	w.c.replyGrantedQueued(w.reqID, tok, lockcore.WaitedMS(now, w.arrived))
	for _, rw := range retries {
		rw.done = true
		rw.c.replyGrantedQueued(rw.reqID, tok, 0)
	}
}

// proposalLimited counts an ACQUIRE answered B at MaxProposals, and logs
// at most once per second with the count since the last line.
func (cl *cluster) proposalLimited() {
	cl.s.m.busy.Add(1)
	if since, ok := cl.limitLog.due(cl.s.now(), cl.proposalLimit.Add(1)); ok {
		cl.s.log.Warn("cluster: max-proposals commands await their commit: ACQUIREs of free keys answered B; the log does not keep up with the clients (check ticketing_raft_commit_seconds and which sessions send the most), or raise max-proposals if the leader has the memory",
			"max_proposals", cl.cfg.MaxProposals, "count", since)
	}
}

// slowCommit counts a grant answered B because its commit took took (ns),
// more than ElectionTimeout, and logs at most once per second with the
// count since the last line.
func (cl *cluster) slowCommit(took int64) {
	if since, ok := cl.slowLog.due(cl.s.now(), cl.slowGrants.Add(1)); ok {
		cl.s.log.Warn("cluster: a grant took longer than raft-election to commit: answered B (not granted) and freed again; check the disk and network latency of the nodes, or raise raft-election",
			"commit", time.Duration(took).Round(time.Millisecond), "raft_election", cl.cfg.ElectionTimeout, "count", since)
	}
}

// resync sets ck from the machine (after a command that did not apply as
// projected; not reached).
func (cl *cluster) resync(ck *ckey, now int64) {
	h, held := cl.fsm.holding(ck.key)
	if held {
		ck.owner, ck.token, ck.lease, ck.ownedOnly = h.Owner, h.Token, h.LeaseS, h.OwnedOnly
	}
	if held != ck.held {
		if held {
			cl.s.capacity.Held.Add(1)
		} else {
			cl.s.capacity.Held.Add(-1)
		}
	}
	ck.held = held
	if held {
		ck.leaseEnd = now + int64(ck.lease)*secondNs
		cl.armLease(ck, now)
	} else {
		cl.unarmLease(ck)
	}
}

// freeLocked proposes the end of ck's holding (a release by rc, or an
// expiry), with the grant to the oldest live waiter whose wait has not run
// out, if any, in the same command.
func (cl *cluster) freeLocked(ck *ckey, kind uint8, rc *conn, rid uint32, owner [wire.OwnerLen]byte, now int64) *proposal {
	s := cl.s
	cl.unarmLease(ck)
	var next *waiter
	if q := ck.q; q != nil {
		for q.head != nil {
			w := q.head
			q.remove(w)
			s.capacity.Waiters.Add(-1)
			w.timer.Stop()
			if w.c.dead.Load() {
				w.done = true
				continue
			}
			if now >= w.deadline {
				w.done = true
				s.m.timeouts.Add(1)
				w.c.replySimpleQueued(wire.TypeTimedOut, w.reqID)
				continue
			}
			next = w
			next.proposed = true // its grant is being committed: a CANCEL or close leaves it alone
			break
		}
		if q.head == nil {
			ck.q = nil
		}
	}
	tok := ck.token
	p := &proposal{ck: ck, next: next, rc: rc, rid: rid, kind: kind, expiry: rc == nil}
	ck.freeing, ck.freeingTok = p, tok
	key := ck.key
	// Charged to the releaser, or for an expiry to the session whose
	// ACQUIRE made the holding.
	by := ck.by
	if rc != nil {
		by = cl.sessionID(rc)
	}
	cl.proposeLocked(p, by, func(b []byte, seq uint64) []byte {
		return appendFree(b, seq, key, tok, kind, &owner, next)
	})
	if next != nil {
		ck.by = cl.sessionID(next.c)
		ck.owner, ck.lease, ck.ownedOnly, ck.token = next.owner, next.lease, next.ownedOnly, 0
	} else {
		ck.held, ck.token = false, 0
		s.capacity.Held.Add(-1)
	}
	return p
}

// acquire handles an ACQUIRE on the leader.
func (cl *cluster) acquire(c *conn, req *wire.Request, arrived int64) {
	s := cl.s
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if !cl.active || !cl.admitLocked(c) {
		return // stepping down: the session gets M and closes
	}
	now := s.now()
	ck := cl.keys[string(req.Key)]
	if ck != nil && ck.held && ck.token != 0 && now >= ck.leaseEnd {
		cl.freeLocked(ck, freeExpire, nil, 0, ck.owner, now)
	}
	if ck == nil || !ck.held {
		if int64(len(cl.pending))-cl.nexpiring >= int64(cl.cfg.MaxProposals) {
			// The log does not keep up: refuse a new grant rather than
			// let the queue (and the leader's memory) grow. (The ends
			// of leases are not counted: they are bounded by the held
			// locks, and charged to the sessions that got them.)
			cl.proposalLimited()
			c.replySimple(wire.TypeBusy, req.ReqID)
			return
		}
		if s.capacity.Held.Add(1) > int64(s.cfg.MaxLocks) {
			s.capacity.Held.Add(-1)
			s.m.busy.Add(1)
			c.replySimple(wire.TypeBusy, req.ReqID)
			return
		}
		if ck == nil {
			ck = &ckey{key: string(req.Key)}
			cl.keys[ck.key] = ck
		}
		w := &waiter{c: c, reqID: req.ReqID, owner: req.Owner, lease: req.LeaseS, arrived: arrived,
			deadline: noDeadline, ownedOnly: s.ownedOnly(c), ck: ck, proposed: true}
		if !c.addInflight(w.reqID, flight{cw: w}) {
			s.capacity.Held.Add(-1)
			return
		}
		ck.held, ck.owner, ck.lease, ck.ownedOnly, ck.token = true, req.Owner, req.LeaseS, w.ownedOnly, 0
		ck.by = cl.sessionID(c)
		owner, lease, ownedOnly := req.Owner, req.LeaseS, w.ownedOnly
		key := ck.key
		cl.proposeLocked(&proposal{ck: ck, w: w}, ck.by, func(b []byte, seq uint64) []byte {
			return appendGrant(b, seq, key, &owner, lease, ownedOnly)
		})
		return
	}
	if ck.owner == req.Owner {
		// The holder's retry: its token, lease not extended.
		if ck.token != 0 {
			c.replyGranted(req.ReqID, ck.token, 0)
			return
		}
		w := &waiter{c: c, reqID: req.ReqID, owner: req.Owner, ck: ck, proposed: true}
		if c.addInflight(w.reqID, flight{cw: w}) {
			ck.retries = append(ck.retries, w)
		}
		return
	}
	if req.WaitS == 0 {
		s.m.timeouts.Add(1)
		c.replySimple(wire.TypeTimedOut, req.ReqID)
		return
	}
	q := ck.q
	var old *waiter
	if q != nil {
		old = q.byOwner[req.Owner]
	}
	if old == nil {
		full := q != nil && q.n >= s.cfg.MaxKeyWaiters
		if !full && s.capacity.Waiters.Add(1) > int64(s.cfg.MaxWaiters) {
			s.capacity.Waiters.Add(-1)
			full = true
		}
		if full {
			s.m.busy.Add(1)
			c.replySimple(wire.TypeBusy, req.ReqID)
			return
		}
	}
	w := &waiter{c: c, reqID: req.ReqID, owner: req.Owner, lease: req.LeaseS, arrived: arrived,
		deadline: arrived + int64(req.WaitS)*secondNs, ownedOnly: s.ownedOnly(c), ck: ck}
	if !c.addInflight(w.reqID, flight{cw: w}) {
		if old == nil {
			s.capacity.Waiters.Add(-1)
		}
		return
	}
	if q == nil {
		q = &waitQueue{byOwner: make(map[[wire.OwnerLen]byte]*waiter, 1)}
		ck.q = q
	}
	s.enqueue(q, w, old)
	stint := cl.stint
	w.timer = s.afterFunc(time.Duration(w.deadline-now), func() { cl.waitTimeout(w, stint) })
}

func (cl *cluster) waitTimeout(w *waiter, stint uint64) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if !cl.active || cl.stint != stint || w.done || w.proposed || w.ck.q == nil {
		return
	}
	cl.dropQueuedLocked(w)
	cl.s.m.timeouts.Add(1)
	w.c.replySimpleQueued(wire.TypeTimedOut, w.reqID)
}

func (cl *cluster) dropQueuedLocked(w *waiter) {
	ck := w.ck
	ck.q.remove(w)
	cl.s.capacity.Waiters.Add(-1)
	w.done = true
	w.timer.Stop()
	if ck.q.head == nil {
		ck.q = nil
	}
}

// release handles a RELEASE (owned: RELEASE_OWNED) on the leader.
func (cl *cluster) release(c *conn, req *wire.Request, owned bool) {
	s := cl.s
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if !cl.active || !cl.admitLocked(c) {
		return
	}
	now := s.now()
	ck := cl.keys[string(req.Key)]
	ok := ck != nil && ck.held && ck.token != 0 && ck.token == req.Token &&
		(owned && ck.owner == req.Owner || !owned && !ck.ownedOnly)
	if ok && now >= ck.leaseEnd {
		// The lease ended on this leader's clock: N, but only once the
		// expiry is committed (a deposed leader, whose successor restarted
		// the lease, cannot commit it, and so never says N for a held lock).
		cl.freeLocked(ck, freeExpire, c, req.ReqID, ck.owner, now)
		return
	}
	if !ok && ck != nil && ck.freeing != nil && ck.freeingTok == req.Token {
		// That holding's end (an expiry, or another RELEASE) is proposed
		// but not committed: N once it is (a deposed leader never commits
		// it, and so never says N for a lock its successor still holds).
		ck.freeing.late = append(ck.freeing.late, lateRelease{c, req.ReqID})
		return
	}
	if !ok {
		s.m.notHeld.Add(1)
		c.replySimple(wire.TypeNotHeld, req.ReqID)
		return
	}
	kind := uint8(freeRelease)
	if owned {
		kind = freeReleaseOwned
	}
	// The owner in a Free command is the releaser's (RELEASE_OWNED checks
	// it); for a plain RELEASE it is not looked at.
	p := cl.freeLocked(ck, kind, c, req.ReqID, req.Owner, now)
	if cl.cfg.EarlyRelease {
		// R now: the leader's log order has decided it (the Free is
		// proposed behind everything this leader granted, and any grant
		// of the key goes behind the Free). If this leader fails before
		// the Free commits, its successor still sees the holding and
		// restarts its lease: the key stays taken until that lease ends,
		// as if the holder had died, and no token or exclusion changes.
		p.rc = nil
		s.m.released.Add(1)
		c.replySimple(wire.TypeReleased, req.ReqID)
	}
}

// cancel handles a CANCEL on the leader: a queued ACQUIRE of c is removed
// and answered T; one whose grant is being committed is left alone.
func (cl *cluster) cancel(c *conn, reqID uint32) {
	if c.nInflight.Load() == 0 {
		return
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	c.mu.Lock()
	w := c.inflight[reqID].cw
	c.mu.Unlock()
	if !cl.active || w == nil || w.ck == nil || w.done || w.proposed || cl.keys[w.ck.key] != w.ck {
		return
	}
	cl.dropQueuedLocked(w)
	cl.s.m.timeouts.Add(1)
	cl.s.m.cancelled.Add(1)
	c.replySimpleQueued(wire.TypeTimedOut, reqID)
}

// dropWaiter removes w, of a closing session, from its queue.
func (cl *cluster) dropWaiter(w *waiter) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.active && !w.done && !w.proposed && w.ck.q != nil && cl.keys[w.ck.key] == w.ck {
		cl.dropQueuedLocked(w)
	}
}

// ClusterStatus returns this node's view of the cluster.
func (s *Server) ClusterStatus() (ClusterStatus, error) {
	cl := s.cl
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

// health is TokenStoreErr in Raft mode.
func (cl *cluster) health() error {
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
	cl := s.cl
	if cl == nil {
		return ErrNotCluster
	}
	if !validNodeID(id) {
		return fmt.Errorf("server: node ID %q: must be 1 to 64 letters, digits, '.', '_' or '-'", id)
	}
	if err := concreteHostPort(raftAddr); err != nil {
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
	cl := s.cl
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
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ticketing", Subsystem: "raft", Name: "leader_changes_total",
			Help: "Leader changes this node has observed."}, func() float64 { return float64(cl.leaderChanges.Load()) }),
		gauge("proposals_pending", "Commands the leader has proposed and not yet applied (queued for an entry, or in one).", func() float64 {
			cl.mu.Lock()
			defer cl.mu.Unlock()
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
	s.cl = cl
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

// lastToken is the highest token handed out (standalone), or applied (Raft mode).
func (s *Server) lastToken() uint64 {
	if s.cl != nil {
		return s.cl.fsm.last.Load()
	}
	return s.tokens.last.Load()
}

// tokenCeiling is the durable ceiling (standalone); in Raft mode, the
// committed counter.
func (s *Server) tokenCeiling() uint64 {
	if s.cl != nil {
		return s.cl.fsm.last.Load()
	}
	return s.tokens.ceiling.Load()
}

// heldLocks is the number of held locks: in Raft mode, the holdings of the
// applied log.
func (s *Server) heldLocks() int {
	if s.cl != nil {
		return int(s.cl.fsm.nheld.Load())
	}
	return int(s.capacity.Held.Load())
}
