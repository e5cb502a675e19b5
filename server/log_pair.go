package server

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/server/internal/bstar"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// The hot-standby pair's mode (the ZeroMQ Guide's Binary Star pattern; docs/ha.md).
//
// A pair node's mode is the *pair. Its state is the Binary Star state
// machine's (package internal/bstar): heartbeats from the peer and client
// HELLOs are its events, and the node serves while it is PRIMARY (after
// its start guard) or ACTIVE. While it serves, one lock core over all keys
// (pair.sh) takes the sessions' requests; its replication log (pairLog,
// log_pair_seam.go) applies every command to the node's lock machine at once
// and, while the passive peer is attached, streams it over the peer link
// (log_pair_link.go) and lets the core answer only once the passive has
// acknowledged it. Alone, it answers at once (unreplicated). A node that
// starts serving takes a new token epoch (log_pair_epoch.go) and promotes the
// core with the machine's holdings, every lease restarted in full plus one
// heartbeat interval; a node that stops serving (a split brain resolved
// against it) demotes the core, and its sessions close with M.

// pair is a pair node.
type pair struct {
	s        *Server
	cfg      PairConfig
	parity   uint64 // 0 primary (even epochs), 1 backup (odd epochs)
	floor    uint64 // tokens are above it: InitialToken, and ClockStart for a new data dir with TokenStartClock
	epochs   *epochStore
	lockFile *os.File
	ln       net.Listener
	id       atomic.Pointer[string] // the pair's identity (pair.id); "" until the backup adopts its primary's
	serverTL *tls.Config
	clientTL *tls.Config

	// mu serialises the state machine's events and the role changes they
	// make; it is taken before sh.mu.
	mu       sync.Mutex
	fsm      bstar.Machine
	started  int64     // server clock at start: a primary serves no client for DeadAfter heartbeats after it (bstar's start guard)
	peer     heartbeat // the peer's last heartbeat
	peerAdv  string    // the peer's client address (its hello)
	serving  uint64    // 1 + the epoch this node serves under; 0: not serving
	refusals logLimit
	// misconfigured: the peer was started with this node's role; no
	// client is served until a restart.
	misconfigured bool

	// sh is the serving node's lock core; the fields below it are under
	// sh.mu.
	sh        shard
	m         *lockcore.Machine
	hasState  bool     // the machine is a copy of the active's (a snapshot came), or this node's own from serving
	seq       uint64   // the last stream seq: the active's last command, the passive's last applied
	attached  *outLink // the out link the stream goes to; nil: unreplicated
	pending   []pairPending
	buf       []byte
	failedLog logLimit

	out  atomic.Pointer[outLink] // the current out link (nil: down)
	inMu sync.Mutex
	in   net.Conn // the current in link

	last, ceil   atomic.Uint64
	nheld        atomic.Int64
	state        atomic.Uint32 // fsm.State, for metrics and status
	replicating  atomic.Bool
	unreplicated atomic.Uint64
	dualActives  atomic.Uint64
	dualPassives atomic.Uint64
	transitions  atomic.Uint64
	unrepLog     logLimit

	stop chan struct{}
	wg   sync.WaitGroup
}

// pairPending is a command of the active in flight to the passive.
type pairPending struct {
	seq uint64
	at  int64
	lp  *lockcore.Proposal
	res lockcore.Result
}

// startPair is the end of New for a pair node.
func (s *Server) startPair() (*Server, error) {
	pc := *s.cfg.Pair
	p := &pair{s: s, cfg: pc, stop: make(chan struct{}), m: lockcore.NewMachine()}
	if pc.Role == PairBackup {
		p.parity = 1
	}
	if err := os.MkdirAll(s.cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	lf, err := lockDir(filepath.Join(s.cfg.DataDir, lockFile))
	if err != nil {
		return nil, err
	}
	p.lockFile = lf
	if p.epochs, err = openEpochStore(s.cfg.DataDir); err != nil {
		unlockDir(lf)
		return nil, err
	}
	p.floor = s.cfg.InitialToken
	if p.epochs.fresh && s.cfg.TokenStart == TokenStartClock {
		p.floor = max(p.floor, ClockStart())
	}
	if pc.peerTLS != nil {
		p.serverTL = pc.peerTLS.ServerConfig()
		host, _, _ := net.SplitHostPort(pc.Peer)
		p.clientTL = pc.peerTLS.ClientConfig(host)
	} else {
		s.log.Warn("pair: the peer link is plain TCP: anyone who can reach the peer port can pose as the peer; give peer-tls-cert, peer-tls-key and peer-tls-ca (ticketingd init --pair writes them)")
	}
	p.ln = pc.listener
	if p.ln == nil {
		if p.ln, err = net.Listen("tcp", pc.Listen); err != nil {
			unlockDir(lf)
			return nil, fmt.Errorf("server: pair: listen %s: %w", pc.Listen, err)
		}
	}
	id, err := loadPairID(s.cfg.DataDir, pc)
	if err != nil {
		p.ln.Close()
		unlockDir(lf)
		return nil, err
	}
	p.id.Store(&id)
	s.group = func() string { return *p.id.Load() }
	start := bstar.Primary
	if pc.Role == PairBackup {
		start = bstar.Backup
	}
	p.fsm, _ = bstar.New(start, pc.Heartbeat) // validated
	p.state.Store(uint32(start))
	p.started = s.now()
	p.sh = shard{exact: true, rep: p, wakeAt: lockcore.NoDeadline, view: ViewActive}
	p.sh.core = lockcore.New(lockcore.Config{Capacity: &s.capacity, MaxKeyWaiters: s.cfg.MaxKeyWaiters}, pairLog{p})
	s.mode = p
	if s.cfg.Registerer != nil {
		if err := s.register(s.cfg.Registerer); err != nil {
			p.close()
			return nil, err
		}
	}
	s.log.Info("pair: starting", "role", string(pc.Role), "state", start.String(), "peer", pc.Peer, "peer_listen", p.ln.Addr().String(),
		"advertise", pc.Advertise, "heartbeat", pc.Heartbeat, "peer_tls", pc.peerTLS != nil, "epoch_mark", p.epochs.mark, "pair_id", id)
	p.admitConns()
	p.wg.Add(3)
	go p.acceptLoop()
	go p.dialLoop()
	go p.tickLoop()
	s.bg.Add(1)
	go s.housekeeping()
	return s, nil
}

// clientRequest is the state machine's CLIENT_REQUEST: a HELLO. It returns
// when the node's role is what the event made it (a takeover included);
// the HELLO is then answered by the role (HELLO_OK while serving, M
// otherwise).
func (p *pair) clientRequest() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.s.now()
	st := p.fsm.State
	switch {
	case p.misconfigured:
		p.refused("client refused: the peer was started with the same role as this node (see the error above)")
		return
	case st == bstar.Primary && p.serving == 0 && now < max(bstar.Expiry(p.started, p.cfg.Heartbeat), p.fsm.PeerExpiry):
		// bstar.c's guard: a primary that (re)starts serves no client
		// until it has had DeadAfter heartbeats to hear an active backup.
		p.refused("client refused: a starting primary waits two heartbeats for its backup before it serves")
		return
	case st == bstar.Passive && now >= p.fsm.PeerExpiry && p.fsm.PeerExpiry > 0 && !p.hasStateNow():
		p.refused("client refused: the peer went silent, but this passive node never received the active's state (no snapshot since it became passive), so it cannot take over without losing the held locks; restart the peer")
		return
	}
	next, out := p.fsm.Handle(bstar.ClientRequest, now)
	if out.Err != nil {
		p.s.log.Error("pair: "+out.Reason, "err", out.Err)
		return
	}
	if !out.Serve {
		p.refused(out.Reason)
		return
	}
	if p.serving == 0 {
		if err := p.activate(now); err != nil {
			p.s.log.Error("pair: cannot start serving", "err", err)
			return // the state machine's state is not moved
		}
	}
	p.setState(next, out)
}

// helloFrame is this node's hello (with the pair's identity as it is now).
func (p *pair) helloFrame() []byte {
	return appendHello(nil, pairRoleByte(p.cfg.Role), p.cfg.Advertise, *p.id.Load())
}

// adoptID checks the peer's pair identity against this node's: a node
// without one (a backup that has not met its primary yet) adopts it, and
// records it; another one, or none, is refused (a node without one
// learns it from this node's hello, and dials again with it).
func (p *pair) adoptID(peer string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	mine := *p.id.Load()
	switch {
	case peer == "":
		if _, ok := p.refusals.due(p.s.now(), 1); ok {
			p.s.log.Warn("pair: refused a peer link whose hello gives no pair ID (a node that has not met its peer yet learns it from this node's hello and dials again)", "pair_id", mine)
		}
		return fmt.Errorf("%w: the peer gave no pair ID", errPairLink)
	case peer == mine:
		return nil
	case mine == "":
		if err := storePairID(p.s.cfg.DataDir, peer); err != nil {
			p.s.log.Error("pair: cannot record the pair's identity", "err", err)
			return err
		}
		p.id.Store(&peer)
		p.s.log.Info("pair: adopted the pair's identity from the peer", "pair_id", peer)
		return nil
	}
	if _, ok := p.refusals.due(p.s.now(), 1); ok {
		p.s.log.Error("pair: the peer belongs to another pair (another pair ID): its link is refused; check --peer", "pair_id", mine, "peer_pair_id", peer)
	}
	return fmt.Errorf("%w: the peer's pair ID %q is not this pair's %q", errPairLink, peer, mine)
}

// sameRole is the node at this node's configured peer address answering
// with this node's role: two primaries would both serve, with tokens of
// the same epochs. The node stops serving, if it does, takes no epoch and
// refuses every client until it is restarted (with the right role, or
// the right --peer); so does the other node when its own dial meets this
// one. Only this node's own dial decides it: a same-role hello on an
// accepted link (which anyone who reaches the peer port can send) is
// refused and changes nothing, so it cannot stop the node or make it burn
// epochs.
func (p *pair) sameRole(peer string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.misconfigured {
		p.s.log.Error("pair: the peer was started with the same role as this node; a pair needs one primary and one backup. This node serves no client until it is restarted with the right role",
			"role", string(p.cfg.Role), "peer", peer)
	}
	p.misconfigured = true
	if p.serving != 0 {
		p.stepDown()
	}
}

// maxPeerMarkLead bounds how far above this node's knowledge a peer's
// epoch mark may be (heartbeat). A peer's mark is 1 + the highest epoch it
// used or saw; what it saw came from this node, and each time it starts
// serving unheard it takes at most 2 epochs above what it knew. So a mark
// more than 2k above this node's is a peer that served over k times
// without this node hearing it, or a forgery: with k = 32 the latter
// moves the pair's epochs by at most 64 of their 2^23 per heartbeat.
const maxPeerMarkLead = 64

// peerMarkLimit is the highest epoch mark (or serving epoch + 1) this node
// accepts from its peer (under p.mu): maxPeerMarkLead above its own mark,
// its token floor's epoch and the epoch of the wall clock's microseconds
// (where a new data dir with token-start clock begins).
func (p *pair) peerMarkLimit() uint64 {
	return max(p.epochs.mark, markOfToken(p.floor), markOfToken(ClockStart())) + maxPeerMarkLead
}

// refused logs a refused client (at most once a second).
func (p *pair) refused(reason string) {
	if _, ok := p.refusals.due(p.s.now(), 1); ok {
		p.s.log.Info("pair: "+reason, "state", p.fsm.State.String(), "hint", p.peerAdv)
	}
}

func (p *pair) hasStateNow() bool {
	p.sh.mu.Lock()
	defer p.sh.mu.Unlock()
	return p.hasState
}

// setState moves the state machine to next (under p.mu), logging a
// transition.
func (p *pair) setState(next bstar.Machine, out bstar.Outcome) {
	from := p.fsm.State
	p.fsm = next
	p.state.Store(uint32(next.State))
	if out.Transition {
		p.transitions.Add(1)
		p.s.log.Info("pair: "+from.String()+" -> "+next.State.String()+": "+out.Reason, "from", from.String(), "to", next.State.String(), "epoch", int64(p.serving)-1)
		p.sendHeartbeat()
	}
}

// onHeartbeat is a heartbeat from the peer (its in link's reader); an
// error refuses it and closes the link.
func (p *pair) onHeartbeat(h heartbeat) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.s.now()
	if lim := p.peerMarkLimit(); h.mark > lim || h.serving > lim {
		if _, ok := p.refusals.due(now, 1); ok {
			p.s.log.Error("pair: refused a heartbeat whose token epoch is beyond what the peer can have reached: a forgery, or a peer that served more than 32 times unheard; if the peer is genuine, restart this node with --initial-token above the peer's last token",
				"peer_mark", h.mark, "peer_serving", h.serving, "epoch_mark", p.epochs.mark, "limit", lim)
		}
		return fmt.Errorf("%w: heartbeat epoch mark %d above %d", errPairLink, max(h.mark, h.serving), lim)
	}
	p.peer = h
	if h.mark > p.epochs.mark {
		// Every epoch the peer has used or seen is remembered durably: a
		// node that starts serving after a restart, without hearing its
		// peer, still takes an epoch above the peer's.
		if err := p.epochs.raise(h.mark); err != nil {
			p.s.log.Error("pair: cannot record the peer's token epoch", "err", err)
		}
	}
	next, out := p.fsm.Handle(bstar.PeerEvent(h.state), now)
	switch {
	case errors.Is(out.Err, bstar.ErrDualActives):
		p.dualActives.Add(1)
		if p.serving < h.serving {
			p.s.log.Error("pair: dual actives (split brain): both nodes served; this node has the lower token epoch, so it steps down, closes its sessions with M and resyncs from its peer",
				"epoch", p.serving-1, "peer_epoch", h.serving-1)
			p.stepDown()
			next.State = bstar.Passive
			next.PeerExpiry = bstar.Expiry(now, p.cfg.Heartbeat)
			p.setState(next, bstar.Outcome{Next: bstar.Passive, Transition: true, Reason: "split brain resolved: the peer's token epoch is higher"})
		} else {
			if _, ok := p.refusals.due(now, 1); ok {
				p.s.log.Error("pair: dual actives (split brain): both nodes served; this node has the higher token epoch and keeps serving, the peer steps down",
					"epoch", p.serving-1, "peer_epoch", int64(h.serving)-1)
			}
			p.reepoch(max(h.mark, h.serving))
		}
		return nil
	case errors.Is(out.Err, bstar.ErrDualPassives):
		p.dualPassives.Add(1)
		p.s.log.Error("pair: "+out.Reason+": the first client after the peer's heartbeats stop counting makes this node active", "err", out.Err)
		p.fsm = next
		return nil
	case out.Err != nil:
		p.s.log.Error("pair: "+out.Reason, "err", out.Err)
		return nil
	}
	switch {
	case next.State == bstar.Active && p.serving == 0 && p.misconfigured:
		// Stopped by a peer of its own role: no epoch is taken and no
		// client served until a restart.
	case next.State == bstar.Active && p.serving == 0:
		if err := p.activate(now); err != nil {
			p.s.log.Error("pair: cannot start serving", "err", err)
			return nil
		}
	case next.State == bstar.Passive && p.serving != 0:
		// A primary that served before it heard an active backup.
		p.s.log.Error("pair: this primary served before it heard its backup, which is active: it steps down, closes its sessions with M and resyncs from the backup")
		p.stepDown()
	case p.serving != 0:
		p.reepoch(max(h.mark, h.serving))
	}
	p.setState(next, out)
	if p.serving == 0 {
		p.follow()
	}
	p.maybeAttach(now)
	return nil
}

// follow keeps the NOT_ACTIVE hint at the peer's client address (not
// serving; under p.mu).
func (p *pair) follow() {
	if err := p.s.SetRole(RoleStandby, p.peerAdv); err != nil {
		p.s.log.Error("pair: role change", "err", err)
	}
}

// activate makes this node serve (under p.mu): a new epoch, durable
// before anything is served; the counter raised into it; the core
// promoted with the machine's holdings, every lease restarted in full
// plus one heartbeat interval; then RoleActive.
func (p *pair) activate(now int64) error {
	sh := &p.sh
	sh.mu.Lock()
	e, err := nextEpoch(p.parity, p.floor, p.epochs.mark, p.peer.mark, markOfToken(p.m.Last()))
	if err == nil {
		err = p.epochs.raise(e + 1)
	}
	if err != nil {
		sh.mu.Unlock()
		return err
	}
	p.m.Raise(max(epochBase(e), p.floor))
	p.m.SetCeiling(epochCeil(e))
	p.last.Store(p.m.Last())
	p.ceil.Store(p.m.Ceiling())
	hs := p.m.Holdings()
	sh.core.Promote(p.s.shardNow(sh), hs, int64(p.cfg.Heartbeat))
	p.s.rearm(sh)
	p.sh.serving, p.hasState = true, true
	p.attached, p.pending = nil, nil
	p.replicating.Store(false)
	sh.mu.Unlock()
	p.serving = e + 1
	if err := p.s.SetRole(RoleActive, ""); err != nil {
		p.s.log.Error("pair: role change", "err", err)
	}
	p.s.log.Info("pair: serving", "epoch", e, "first_token", p.m.Last()+1, "held_locks", len(hs),
		"leases_restarted_for", fmt.Sprintf("lease_s + %v", p.cfg.Heartbeat))
	p.sendHeartbeat()
	return nil
}

// reepoch moves a serving node (under p.mu) into a new epoch above mark
// (1 + an epoch) if mark says that an epoch at or above its own was used:
// the peer served while this node did not hear it (a split brain it never
// saw resolved, the peer dead or stopped before the link healed) and its
// tokens are above every token of this node's epoch. Without the move,
// every grant here would stay below them, and the fence would refuse the
// writes of a holder of the only lock on a resource the peer's side wrote.
//
// As activate: the new epoch is durable (fsync'd) before the next grant,
// and the counter is raised into it. Held locks keep their tokens and
// their leases (nothing is shortened or restarted); a grant decided
// before the move keeps its token of the old epoch, and is answered in
// the order it was decided, before any grant of the new epoch. An
// attached passive gets the move as a stream frame ('F'), in order with
// the commands. A node that cannot record the new epoch stops serving
// (it must not grant again in the old one); the next heartbeat or client
// makes it serve again under a new epoch.
func (p *pair) reepoch(mark uint64) {
	if p.serving == 0 || mark <= p.serving {
		return
	}
	sh := &p.sh
	sh.mu.Lock()
	old := p.serving - 1
	e, err := nextEpoch(p.parity, p.floor, p.epochs.mark, mark, markOfToken(p.m.Last()))
	if err == nil {
		err = p.epochs.raise(e + 1)
	}
	if err != nil {
		sh.mu.Unlock()
		p.s.log.Error("pair: the peer used a token epoch above this node's, and this node cannot take a higher one: it stops serving, and closes its sessions with M",
			"epoch", old, "peer_mark", mark, "err", err)
		p.stepDown()
		return
	}
	p.m.Raise(max(epochBase(e), p.floor))
	p.m.SetCeiling(epochCeil(e))
	p.last.Store(p.m.Last())
	p.ceil.Store(p.m.Ceiling())
	if o := p.attached; o != nil {
		p.seq++
		if !o.queue(frameFloor, nil, p.seq, p.m.Last(), p.m.Ceiling()) {
			o.close() // its reader's linkDown detaches
		}
		p.pending = append(p.pending, pairPending{seq: p.seq, at: p.s.now()})
	}
	first := p.m.Last() + 1
	sh.mu.Unlock()
	p.serving = e + 1
	p.s.log.Warn("pair: the peer used a token epoch above the one this node serves under (it served while this node did not hear it): this node moves to a higher epoch before its next grant; held locks keep their tokens and leases",
		"epoch", old, "new_epoch", e, "peer_mark", mark, "first_token", first)
	p.sendHeartbeat()
}

// stepDown makes a serving node stop (under p.mu): the core demoted (its
// waiters and commands in flight forgotten), the stream ended, the
// machine to be replaced by the peer's snapshot; the sessions close with
// M (follow).
func (p *pair) stepDown() {
	sh := &p.sh
	sh.mu.Lock()
	sh.core.Demote()
	p.sh.serving, p.hasState = false, false
	if p.attached != nil {
		p.attached.close()
	}
	p.attached, p.pending = nil, nil
	p.replicating.Store(false)
	sh.mu.Unlock()
	p.serving = 0
	p.follow()
}

// sendHeartbeat queues this node's heartbeat on its out link (under p.mu).
func (p *pair) sendHeartbeat() {
	o := p.out.Load()
	if o == nil {
		return
	}
	h := heartbeat{state: p.fsm.State, mark: p.epochs.mark, serving: p.serving, hasState: p.hasStateNow()}
	o.queue(frameHeartbeat, h.body())
}

// tickLoop sends the heartbeats and ends the replication to a passive
// that went silent or stopped acknowledging.
func (p *pair) tickLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.mu.Lock()
		p.sendHeartbeat()
		now := p.s.now()
		expired := p.fsm.PeerExpiry > 0 && now >= p.fsm.PeerExpiry
		p.mu.Unlock()
		if o := p.out.Load(); o != nil && expired && now-o.since >= bstar.DeadAfter*int64(p.cfg.Heartbeat) {
			// The peer is silent on a link that still looks up (a host
			// that vanished sends no FIN): dial again, so that a peer that
			// comes back hears this node's heartbeats.
			o.close()
		}
		sh := &p.sh
		sh.mu.Lock()
		switch {
		case p.attached == nil:
		case expired:
			p.detachLocked("the peer went silent (no heartbeat for two intervals)")
		case len(p.pending) > 0 && now-p.pending[0].at >= bstar.DeadAfter*int64(p.cfg.Heartbeat):
			p.detachLocked("the passive has not acknowledged a command for two heartbeat intervals")
		}
		sh.mu.Unlock()
	}
}

// dialLoop keeps the out link up.
func (p *pair) dialLoop() {
	defer p.wg.Done()
	failing := false // the last dial failed (logged once until one succeeds)
	for {
		nc, r, h, err := dialPeer(p.cfg.Peer, p.clientTL, p.cfg.Heartbeat, p.helloFrame())
		switch {
		case err != nil && !failing:
			failing = true
			p.s.log.Warn("pair: cannot reach the peer; trying again every heartbeat (logged again once it answers)", "peer", p.cfg.Peer, "err", err)
		case err == nil && failing:
			failing = false
			p.s.log.Info("pair: the peer answers again", "peer", p.cfg.Peer)
		}
		// The node at the configured peer address with this node's role
		// is a misconfigured pair, whatever its pair ID (two primaries
		// started without one draw two): this node stops. Then the pair
		// ID.
		if err == nil && h.role == pairRoleByte(p.cfg.Role) {
			nc.Close()
			p.sameRole(p.cfg.Peer)
			err = errPairLink
		}
		if err == nil {
			if err = p.adoptID(h.id); err != nil {
				nc.Close()
			}
		}
		if err == nil {
			o := newOutLink(nc, p.s.now())
			p.setPeerAdvertise(h.advertise)
			p.out.Store(o)
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				o.writeLoop(bstar.DeadAfter * p.cfg.Heartbeat)
			}()
			p.mu.Lock()
			p.sendHeartbeat()
			p.maybeAttach(p.s.now())
			p.mu.Unlock()
			p.ackLoop(o, r)
			p.out.CompareAndSwap(o, nil)
			p.linkDown(o)
		}
		select {
		case <-p.stop:
			return
		case <-time.After(p.retryDelay(err)):
		}
	}
}

// retryDelay is the wait before the next dial: after a failure a
// heartbeat interval (at most 250 ms: a peer that starts is found soon),
// after a link that was up a short one.
func (p *pair) retryDelay(err error) time.Duration {
	if err != nil {
		return min(p.cfg.Heartbeat, 250*time.Millisecond)
	}
	return min(p.cfg.Heartbeat, 50*time.Millisecond)
}

func (p *pair) setPeerAdvertise(a string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a == p.peerAdv {
		return
	}
	p.peerAdv = a
	if p.serving == 0 {
		p.follow()
	}
}

// ackLoop reads the peer's acknowledgements on out link o until it fails
// or closes.
func (p *pair) ackLoop(o *outLink, r *bufio.Reader) {
	go func() {
		select {
		case <-o.done:
		case <-p.stop:
			o.close()
		}
	}()
	var buf []byte
	for {
		typ, body, err := readFrame(r, pairSmallFrame, &buf)
		if err != nil || typ != frameAck || len(body) != 8 {
			if err == nil {
				p.s.log.Error("pair: the peer sent an unexpected frame on the link it accepted; closing it", "type", string(rune(typ)))
			}
			o.close()
			return
		}
		p.acked(o, beUint64(body))
	}
}

// acceptLoop accepts the peer's out link (this node's in link).
func (p *pair) acceptLoop() {
	defer p.wg.Done()
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.stop:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			p.serveIn(nc)
		}()
	}
}

// serveIn runs an accepted in link: the hello, then the peer's
// heartbeats and stream, each stream frame acknowledged.
func (p *pair) serveIn(nc net.Conn) {
	defer nc.Close()
	if p.serverTL == nil && !p.cfg.PeerPlaintext && !loopbackAddr(nc.RemoteAddr()) {
		if _, ok := p.refusals.due(p.s.now(), 1); ok {
			p.s.log.Warn("pair: refused a plain TCP peer link from a non-loopback address (give the pair peer TLS, or peer-plaintext on a network nobody else reaches)", "remote", nc.RemoteAddr().String())
		}
		return
	}
	// One deadline for the handshake and the hello: a stranger that says
	// nothing holds its slot (admitConns) for helloTimeout at most.
	deadline := time.Now().Add(p.helloTimeout())
	if p.serverTL != nil {
		tc := tls.Server(nc, p.serverTL)
		tc.SetDeadline(deadline)
		if err := tc.Handshake(); err != nil {
			p.s.log.Warn("pair: peer link handshake failed", "remote", nc.RemoteAddr().String(), "err", err)
			return
		}
		nc = tc
	}
	nc.SetDeadline(deadline)
	r := bufio.NewReaderSize(nc, 64<<10)
	var buf []byte
	typ, body, err := readFrame(r, pairSmallFrame, &buf)
	if err != nil {
		return
	}
	h, err := parseHello(typ, body)
	if err != nil {
		p.s.log.Warn("pair: refused a peer link", "remote", nc.RemoteAddr().String(), "err", err)
		return
	}
	// The pair ID first (adopted by a node without one, so that its
	// hello carries it), then this node's hello, even to a peer of the
	// same role or of another pair: it learns of the fault too (and a
	// node that has not met its peer learns the pair ID).
	idErr := p.adoptID(h.id)
	if _, err := nc.Write(p.helloFrame()); err != nil || idErr != nil {
		return
	}
	if h.role == pairRoleByte(p.cfg.Role) {
		// Refused, and nothing changes here: the dialler, if it is a
		// node of this pair started with the wrong role, stops itself
		// on this hello (sameRole).
		if _, ok := p.refusals.due(p.s.now(), 1); ok {
			p.s.log.Error("pair: refused a peer link from a node that says it has this node's role; a pair needs one primary and one backup",
				"role", string(p.cfg.Role), "remote", nc.RemoteAddr().String())
		}
		return
	}
	nc.SetDeadline(time.Time{})
	p.inMu.Lock()
	if p.in != nil {
		p.in.Close() // the peer dialled again: its older link is dead to it
	}
	p.in = nc
	p.inMu.Unlock()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-p.stop:
			nc.Close()
		case <-done:
		}
	}()
	p.setPeerAdvertise(h.advertise)
	p.readIn(nc, r)
}

// readIn reads the peer's frames until the link fails.
func (p *pair) readIn(nc net.Conn, r *bufio.Reader) {
	st := inStream{}
	var ack, buf []byte
	var applied, acked uint64 // the last stream frame applied, and acknowledged
	for {
		nc.SetReadDeadline(time.Now().Add(4 * bstar.DeadAfter * p.cfg.Heartbeat))
		typ, body, err := readFrame(r, pairMaxFrame, &buf)
		if err != nil {
			return
		}
		switch typ {
		case frameHeartbeat:
			h, err := parseHeartbeat(body)
			if err != nil {
				p.s.log.Error("pair: malformed heartbeat; closing the peer link", "err", err)
				return
			}
			if p.onHeartbeat(h) != nil {
				return
			}
		case frameSnapshot, frameCommand, frameFloor:
			seq, err := p.applyStream(&st, typ, body)
			if err != nil {
				p.s.log.Error("pair: the replication stream failed; closing the peer link (the active sends a new snapshot when it reconnects)", "err", err)
				return
			}
			if seq != 0 {
				applied = seq
			}
		default:
			p.s.log.Error("pair: unknown frame on the peer link; closing it", "type", int(typ))
			return
		}
		// One acknowledgement for everything applied, once nothing more
		// is buffered: after any frame, a heartbeat included (the stream
		// must not wait for the next command to be acknowledged).
		if applied != acked && r.Buffered() == 0 {
			ack = appendFrame(ack[:0], frameAck, nil, applied)
			nc.SetWriteDeadline(time.Now().Add(bstar.DeadAfter * p.cfg.Heartbeat))
			if _, err := nc.Write(ack); err != nil {
				return
			}
			acked = applied
		}
	}
}

// The lock path's questions (lockLog, lockpath.go): one table, the
// active's core; on the passive, the lock browser reads its machine (the
// active's state as of the last command it applied), and an operator's
// Expire is refused with the active's address.

func (p *pair) shardOf([]byte) *shard                           { return &p.sh }
func (p *pair) tables() int                                     { return 1 }
func (p *pair) table(int) *shard                                { return &p.sh }
func (p *pair) admitRequest(*shard, *conn) (uint64, bool, bool) { return 0, false, true }

func (p *pair) readApplied(f func(m *lockcore.Machine)) string {
	p.sh.mu.Lock()
	defer p.sh.mu.Unlock()
	f(p.m)
	return ViewPassiveApplied
}

func (p *pair) notServing() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return &NotActiveError{Active: p.peerAdv}
}

func (p *pair) counts() modeCounts {
	return modeCounts{last: p.last.Load(), ceiling: p.ceil.Load(), held: int(p.nheld.Load())}
}
func (p *pair) health() error  { return nil }
func (p *pair) hello()         { p.clientRequest() }
func (p *pair) refusal() error { return nil }
func (p *pair) stopping()      {}

// The effects of a replicated core that the pair never has: its core has
// no MaxPending and no MaxCommit, and its machine applies at once.
func (p *pair) proposalLimited()  { p.s.m.busy.Add(1) }
func (p *pair) slowCommit(int64)  { p.s.m.busy.Add(1) }
func (p *pair) resync(key string) { p.resyncLocked(key) }

func (p *pair) close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.ln.Close()
	if o := p.out.Load(); o != nil {
		o.close()
	}
	p.inMu.Lock()
	if p.in != nil {
		p.in.Close()
	}
	p.inMu.Unlock()
	p.wg.Wait()
	p.sh.stopTimer()
	unlockDir(p.lockFile)
}

// PairStatus is a pair node's view of the pair (Stats.Pair).
type PairStatus struct {
	ID            string `json:"pair_id"`        // the pair's identity (PairConfig.ID, or the one recorded in the data dir)
	Role          string `json:"role"`           // the configured role: primary or backup
	State         string `json:"state"`          // the Binary Star state: PRIMARY, BACKUP, ACTIVE or PASSIVE
	Serving       bool   `json:"serving"`        // this node serves clients
	Epoch         int64  `json:"epoch"`          // the token epoch it serves under; -1: not serving
	PeerState     string `json:"peer_state"`     // the state in the peer's last heartbeat ("" if none)
	PeerAlive     bool   `json:"peer_alive"`     // a heartbeat came within two intervals
	PeerAdvertise string `json:"peer_advertise"` // the peer's client address
	Replicating   bool   `json:"replicating"`    // the active streams its commands to the passive and waits for its acknowledgements
	HasState      bool   `json:"has_state"`      // the node holds the pair's lock state (a passive: a snapshot came)
	Unreplicated  uint64 `json:"unreplicated"`   // commands the active applied while no passive was attached
	DualActives   uint64 `json:"dual_actives"`   // heartbeats that showed both nodes serving (split brain)
	DualPassives  uint64 `json:"dual_passives"`  // heartbeats that showed neither serving
	Transitions   uint64 `json:"transitions"`    // state machine transitions
	EpochMark     uint64 `json:"epoch_mark"`     // 1 + the highest epoch used or seen (durable)
	LastToken     uint64 `json:"last_token"`     // the highest token applied
	TokenCeiling  uint64 `json:"token_ceiling"`  // the last token of the epoch served (or last applied)
	HeldLocks     int    `json:"held_locks"`     // holdings in this node's machine
	Heartbeat     string `json:"heartbeat"`      // the heartbeat interval
	PeerListen    string `json:"peer_listen"`    // the peer link's listen address
	Peer          string `json:"peer"`           // the peer's address
}

// pairMode is the server's mode if it is a pair node, else nil.
func (s *Server) pairMode() *pair {
	p, _ := s.mode.(*pair)
	return p
}

// PairStatus returns this node's view of its pair; ok is false if the
// server is not a pair node.
func (s *Server) PairStatus() (st PairStatus, ok bool) {
	p := s.pairMode()
	if p == nil {
		return PairStatus{}, false
	}
	p.mu.Lock()
	now := s.now()
	st = PairStatus{Role: string(p.cfg.Role), State: p.fsm.State.String(), Serving: p.serving != 0, Epoch: int64(p.serving) - 1,
		PeerAlive: p.fsm.PeerExpiry > 0 && now < p.fsm.PeerExpiry, PeerAdvertise: p.peerAdv, EpochMark: p.epochs.mark,
		Heartbeat: p.cfg.Heartbeat.String(), PeerListen: p.ln.Addr().String(), Peer: p.cfg.Peer, ID: *p.id.Load()}
	if p.peer.state.Valid() {
		st.PeerState = p.peer.state.String()
	}
	p.mu.Unlock()
	st.HasState = p.hasStateNow()
	st.Replicating = p.replicating.Load()
	st.Unreplicated = p.unreplicated.Load()
	st.DualActives, st.DualPassives = p.dualActives.Load(), p.dualPassives.Load()
	st.Transitions = p.transitions.Load()
	st.LastToken, st.TokenCeiling, st.HeldLocks = p.last.Load(), p.ceil.Load(), int(p.nheld.Load())
	return st, true
}

func (p *pair) collectors() []prometheus.Collector {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "ticketing", Subsystem: "pair", Name: name, Help: help}, f)
	}
	counter := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "ticketing", Subsystem: "pair", Name: name, Help: help},
			func() float64 { return float64(v.Load()) })
	}
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	return []prometheus.Collector{
		gauge("state", "The Binary Star state: 1 PRIMARY, 2 BACKUP, 3 ACTIVE, 4 PASSIVE.", func() float64 { return float64(p.state.Load()) }),
		gauge("serving", "1 while this node serves clients, else 0.", func() float64 { return b(p.s.role.Load().role.Serving()) }),
		gauge("replicating", "1 while the active streams its commands to an attached passive and answers after its acknowledgement, else 0.", func() float64 { return b(p.replicating.Load()) }),
		gauge("epoch_mark", "1 + the highest token epoch this node has used or seen.", func() float64 {
			p.mu.Lock()
			defer p.mu.Unlock()
			return float64(p.epochs.mark)
		}),
		counter("unreplicated_commands_total", "Commands the active applied and answered with no passive attached.", &p.unreplicated),
		counter("dual_actives_total", "Heartbeats that showed both nodes serving (a split brain becoming visible).", &p.dualActives),
		counter("dual_passives_total", "Heartbeats that showed neither node serving.", &p.dualPassives),
		counter("transitions_total", "Binary Star state transitions.", &p.transitions),
	}
}
