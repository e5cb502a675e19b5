package bstar

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// State is a node's Binary Star state. The numbers are the Guide's
// (STATE_PRIMARY = 1 .. STATE_PASSIVE = 4, the Ruby port) and are what
// a heartbeat carries (the Ruby port sends "%d" % fsm.state); the zero
// State is not a state.
type State uint8

const (
	// Primary is the state a node started as the primary begins in (Guide
	// line 141): it serves clients until a heartbeat makes it Active or
	// Passive.
	Primary State = 1
	// Backup is the state a node started as the backup begins in (Guide
	// line 148): it serves no client until it has become Passive and then
	// Active.
	Backup State = 2
	// Active is the node that serves the pair's clients.
	Active State = 3
	// Passive is the standby: it refuses clients while its peer is alive.
	Passive State = 4
)

// String returns the Guide's name of the state (PRIMARY, BACKUP, ACTIVE,
// PASSIVE), or State(n) for a number that is no state.
func (s State) String() string {
	switch s {
	case Primary:
		return "PRIMARY"
	case Backup:
		return "BACKUP"
	case Active:
		return "ACTIVE"
	case Passive:
		return "PASSIVE"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Valid reports whether s is one of the four states.
func (s State) Valid() bool { return s >= Primary && s <= Passive }

// Event is what happens to a node: a heartbeat from its peer, carrying the
// peer's state, or a client's request. The numbers are the Guide's
// (PEER_PRIMARY = 1 .. CLIENT_REQUEST = 5, the Ruby port); a peer
// event's number is the peer's State (PeerEvent).
type Event uint8

const (
	// PeerPrimary: the peer's heartbeat says PRIMARY.
	PeerPrimary Event = 1
	// PeerBackup: the peer's heartbeat says BACKUP.
	PeerBackup Event = 2
	// PeerActive: the peer's heartbeat says ACTIVE.
	PeerActive Event = 3
	// PeerPassive: the peer's heartbeat says PASSIVE.
	PeerPassive Event = 4
	// ClientRequest: a client asks this node to serve it (in ticketingd, a
	// HELLO).
	ClientRequest Event = 5
)

// String returns the Guide's name of the event (PEER_PRIMARY, PEER_BACKUP,
// PEER_ACTIVE, PEER_PASSIVE, CLIENT_REQUEST), or Event(n) for a number
// that is no event.
func (e Event) String() string {
	switch e {
	case PeerPrimary:
		return "PEER_PRIMARY"
	case PeerBackup:
		return "PEER_BACKUP"
	case PeerActive:
		return "PEER_ACTIVE"
	case PeerPassive:
		return "PEER_PASSIVE"
	case ClientRequest:
		return "CLIENT_REQUEST"
	}
	return fmt.Sprintf("Event(%d)", uint8(e))
}

// Valid reports whether e is one of the five events.
func (e Event) Valid() bool { return e >= PeerPrimary && e <= ClientRequest }

// Peer reports whether e is a heartbeat from the peer (one of the four
// PEER_ events).
func (e Event) Peer() bool { return e >= PeerPrimary && e <= PeerPassive }

// PeerEvent returns the event a heartbeat carrying the peer's state raises
// (the Ruby port: fsm.event = msg.to_i of the peer's "%d" % fsm.state). It
// returns an Event that is not Valid for a State that is not.
func PeerEvent(peer State) Event {
	if !peer.Valid() {
		return 0
	}
	return Event(peer)
}

// ErrDualActives is Outcome.Err when an Active node hears that its peer is
// Active too (the Ruby port: "fatal error - dual masters, aborting"): a
// split brain, both nodes having served clients, has just become visible,
// usually because the peer link healed. The Guide's example exits. ticketingd must
// not: an exit of both would leave no node, and the clients of each side
// hold locks. The state stays Active and the peer expiry is not refreshed
// (Machine.Handle). What ticketingd does (server/log_pair.go): log the fault
// at error level, count it, and apply the pair's split-brain rule, under
// which the node with the lower epoch steps down
// (closes its sessions with M, becomes Passive with its peer expiry set
// from this heartbeat, since the peer is evidently alive, and resyncs from
// the peer) while the other keeps serving.
var ErrDualActives = errors.New("bstar: dual actives: the peer is active too")

// ErrDualPassives is Outcome.Err when a Passive node hears that its peer
// is Passive too (the Ruby port: "fatal error - dual slaves, aborting"):
// neither node serves, so the pair is down for its clients, though no
// data is at risk. The Guide's example exits. ticketingd keeps running: the intended
// action is to log the fault at error level and count it, and to leave
// the state Passive and the peer expiry unrefreshed (Machine.Handle does),
// so that while the fault lasts the peer's heartbeats stop counting and
// the first client request after the expiry makes this node Active (the
// failover rule of the Ruby port). The peer, hearing
// PEER_ACTIVE while Passive, then stays Passive. (A node that never got
// its peer's state does not take over at all: server/log_pair.go.)
var ErrDualPassives = errors.New("bstar: dual passives: the peer is passive too")

// ErrInvalid is Outcome.Err for an input the Guide's state machine has no
// meaning for: a State or an Event out of range (a malformed heartbeat,
// say), or a client request to a Passive node whose peer expiry was never
// set (the Guide's example asserts peer_expiry > 0 there, the Ruby port; a Machine
// cannot get there, since it becomes Passive only on a heartbeat, which
// sets the expiry). The state is unchanged, a client request is refused
// and the peer expiry is not refreshed. The caller logs it at error level
// and drops the event; the Guide's example ignores an unknown event (and serves
// clients in an unknown state), ticketingd refuses to.
var ErrInvalid = errors.New("bstar: invalid input")

// Outcome is what Step decided for one event.
type Outcome struct {
	// Next is the state after the event: the state before it when Err is
	// set or nothing changes.
	Next State
	// Transition is set when Next differs from the state before the
	// event. Every transition is logged, with Reason, and moves the role in
	// /status and in the role metric.
	Transition bool
	// Serve is set for a ClientRequest the node serves. A ClientRequest
	// without it is refused: the server answers the client NOT_ACTIVE (M).
	// Serve is never set for a peer event.
	Serve bool
	// Err is nil, or ErrDualActives or ErrDualPassives (the faults the
	// Guide aborts on), or wraps ErrInvalid. Test it with errors.Is; each
	// error's comment says what the caller does.
	Err error
	// Reason is the log line's message: what happened and why. It is set
	// for every outcome, transition or not.
	Reason string
}

// DeadAfter is the number of heartbeat intervals after the peer's last
// heartbeat at which the peer counts as dead (the Ruby port: peer_expiry =
// now + 2 * HEARTBEAT).
const DeadAfter = 2

// Expiry returns the peer expiry after a heartbeat received at last with
// the pair's heartbeat interval: last + DeadAfter × heartbeat, the instant
// from which a Passive node takes over on a client request. last is in
// nanoseconds on the caller's monotonic clock. The sum saturates at
// math.MaxInt64 instead of wrapping. A heartbeat interval that is not
// positive gives math.MaxInt64 (the peer never counts as dead): a
// misconfigured pair does not fail over, rather than failing over at once.
func Expiry(last int64, heartbeat time.Duration) int64 {
	if heartbeat <= 0 || int64(heartbeat) > math.MaxInt64/DeadAfter {
		return math.MaxInt64
	}
	d := DeadAfter * int64(heartbeat)
	if last > math.MaxInt64-d {
		return math.MaxInt64
	}
	return last + d
}

// action is what a row of the table does; the Guide's table encodes the
// same in its [message, state] pairs (the Ruby port reads them in run_fsm).
type action uint8

const (
	// ignore: no entry in the Guide's table (run_fsm returns, Guide lines
	// 103-104): the state is unchanged; it is a heartbeat that needs no
	// move.
	ignore action = iota + 1
	// move: [message, STATE]: log the message, change to STATE (Guide lines
	// 115-117).
	move
	// serve: a client request with no entry in the Guide's table: it is
	// answered and the state is unchanged.
	serve
	// refuse: ["", false] for a client request: an exception, no answer
	//.
	refuse
	// fatal: ["E: ...", false] for a heartbeat: the Guide's example aborts (Guide
	// lines 106-107, 179-180).
	fatal
	// failover: [CLIENT_REQUEST, true]: Active if the peer expired, else
	// refuse.
	failover
)

// rule is one (state, event) row of the table.
type rule struct {
	act    action
	next   State  // move
	err    error  // fatal
	reason string // the log line; failover has its own two
}

// table is the Guide's $fsm_states with its implicit
// rows (the pairs it has no entry for) written out: every (state, event)
// pair has a row. It is indexed [state][event].
var table = [Passive + 1][ClientRequest + 1]rule{
	Primary: {
		// No entry for PEER_PRIMARY: two nodes started as primary. The Guide's example
		// does not detect it; both serve as primaries.
		PeerPrimary: {act: ignore, reason: "peer is PRIMARY too: both nodes were started as primary, which the pair does not detect; staying PRIMARY"},
		// A rule of the Guide's example.
		PeerBackup: {act: move, next: Active, reason: "connected to backup (passive), ready active"},
		// A rule of the Guide's example.
		PeerActive: {act: move, next: Passive, reason: "connected to backup (active), ready passive"},
		// No entry: the peer is passive while we restarted as primary; it
		// goes active on our PRIMARY heartbeat, and we go
		// passive on its PEER_ACTIVE.
		PeerPassive: {act: ignore, reason: "peer is PASSIVE: waiting for it to go active on our PRIMARY heartbeat"},
		// No entry: the client is served (the Ruby port; bstarsrv.c:
		// "Accept client connections"). A primary serves before the backup
		// appears, and stays PRIMARY while it does.
		ClientRequest: {act: serve, reason: "client served: a primary serves until it hears its backup"},
	},
	Backup: {
		// No entry: the primary is up but not active yet; it goes active on
		// our BACKUP heartbeat, and we go passive on its
		// PEER_ACTIVE.
		PeerPrimary: {act: ignore, reason: "peer is PRIMARY: waiting for it to go active on our BACKUP heartbeat"},
		// No entry: two nodes started as backup. The Guide's example does not detect
		// it; neither serves.
		PeerBackup: {act: ignore, reason: "peer is BACKUP too: both nodes were started as backup, which the pair does not detect; staying BACKUP"},
		// A rule of the Guide's example.
		PeerActive: {act: move, next: Passive, reason: "connected to primary (active), ready passive"},
		// No entry: the peer is passive while we restarted as backup; it
		// goes active on our BACKUP heartbeat, and we go
		// passive on its PEER_ACTIVE.
		PeerPassive: {act: ignore, reason: "peer is PASSIVE: waiting for it to go active on our BACKUP heartbeat"},
		// The Guide's rule: refused whatever the peer's liveness: a backup
		// serves no client until it has become passive (on the primary's
		// PEER_ACTIVE) and its peer then went silent.
		ClientRequest: {act: refuse, reason: "client refused: a backup serves only after it has been passive and its peer went silent"},
	},
	Active: {
		// No entry: the peer restarted as primary; it goes passive on our
		// ACTIVE heartbeat.
		PeerPrimary: {act: ignore, reason: "peer is PRIMARY (restarting): it goes passive on our ACTIVE heartbeat"},
		// No entry: the peer restarted as backup; it goes passive on our
		// ACTIVE heartbeat.
		PeerBackup: {act: ignore, reason: "peer is BACKUP (restarting): it goes passive on our ACTIVE heartbeat"},
		// The Guide's rule: dual actives, the Guide's example aborts.
		PeerActive: {act: fatal, err: ErrDualActives, reason: "fatal: dual actives, both nodes serve (split brain)"},
		// No entry: the steady state of the active.
		PeerPassive: {act: ignore, reason: "peer is PASSIVE: staying ACTIVE"},
		// No entry: the client is served.
		ClientRequest: {act: serve, reason: "client served by the active"},
	},
	Passive: {
		// The Guide's rule: the peer restarted; it goes passive on our
		// ACTIVE heartbeat.
		PeerPrimary: {act: move, next: Active, reason: "peer restarted as primary (it goes passive), ready active"},
		// The Guide's rule: the peer restarted; it goes passive on our
		// ACTIVE heartbeat.
		PeerBackup: {act: move, next: Active, reason: "peer restarted as backup (it goes passive), ready active"},
		// No entry: the steady state of the passive.
		PeerActive: {act: ignore, reason: "peer is ACTIVE: staying PASSIVE"},
		// The Guide's rule: dual passives, the Guide's example aborts.
		PeerPassive: {act: fatal, err: ErrDualPassives, reason: "fatal: dual passives, neither node serves"},
		// The Guide's rule: the client is the witness.
		ClientRequest: {act: failover},
	},
}

// Step is the Guide's state machine (run_fsm, the Ruby port;
// bstarsrv.c's s_state_machine) as a pure function: the node's state s,
// the event e, the caller's now and the peer expiry (Expiry of the peer's
// last heartbeat; 0 if none was received) in, the Outcome out. now and
// peerExpiry matter only to a client request to a Passive node: it is
// served, and the node becomes Active, only if now >= peerExpiry (the
// peer went silent); otherwise it is refused.
func Step(s State, e Event, now, peerExpiry int64) Outcome {
	switch {
	case !s.Valid():
		return Outcome{Next: s, Err: fmt.Errorf("%w: state %d", ErrInvalid, uint8(s)), Reason: "invalid state " + s.String() + ": event " + e.String() + " dropped"}
	case !e.Valid():
		return Outcome{Next: s, Err: fmt.Errorf("%w: event %d", ErrInvalid, uint8(e)), Reason: "invalid event " + e.String() + " dropped in state " + s.String()}
	}
	r := table[s][e]
	switch r.act {
	case move:
		return Outcome{Next: r.next, Transition: r.next != s, Reason: r.reason}
	case serve:
		return Outcome{Next: s, Serve: true, Reason: r.reason}
	case refuse, ignore:
		return Outcome{Next: s, Reason: r.reason}
	case fatal:
		return Outcome{Next: s, Err: r.err, Reason: r.reason}
	case failover:
		if peerExpiry <= 0 {
			return Outcome{Next: s, Err: fmt.Errorf("%w: client request to a passive node that never heard its peer", ErrInvalid),
				Reason: "client refused: passive with no peer heartbeat ever received"}
		}
		if now >= peerExpiry {
			return Outcome{Next: Active, Transition: true, Serve: true, Reason: "failover: a client came after the peer went silent, ready active"}
		}
		return Outcome{Next: s, Reason: "client refused: passive and the peer is alive"}
	}
	panic("bstar: table row without an action: " + s.String() + " " + e.String())
}

// Machine is one node's Binary Star state: the Guide's BStarState (Guide
// lines 58-66: state, peer_expiry) and the pair's heartbeat interval. It
// is a value: Handle returns the next one.
type Machine struct {
	// State is the node's state.
	State State
	// PeerExpiry is the instant (nanoseconds on the caller's monotonic
	// clock) from which the peer counts as dead: Expiry of its last
	// heartbeat. It is 0 until the first heartbeat.
	PeerExpiry int64
	// Heartbeat is the pair's heartbeat interval (the Guide's HEARTBEAT,
	// 1 s, the Ruby port).
	Heartbeat time.Duration
}

// New returns the Machine of a node started as start, which must be
// Primary or Backup, with the pair's heartbeat
// interval, which must be positive. Otherwise the error wraps ErrInvalid.
func New(start State, heartbeat time.Duration) (Machine, error) {
	if start != Primary && start != Backup {
		return Machine{}, fmt.Errorf("%w: a node starts as PRIMARY or BACKUP, not %s", ErrInvalid, start)
	}
	if heartbeat <= 0 {
		return Machine{}, fmt.Errorf("%w: heartbeat interval %v is not positive", ErrInvalid, heartbeat)
	}
	return Machine{State: start, Heartbeat: heartbeat}, nil
}

// Handle applies the event e, received at now, and returns the next
// Machine with the Outcome (Step's). As in the Guide's main loop (Guide
// lines 176-181), a heartbeat whose Outcome has no Err refreshes the peer
// expiry to Expiry(now, m.Heartbeat), whether or not it moved the state,
// and one with an Err (a fault, or an invalid event) does not. A client
// request never refreshes it.
func (m Machine) Handle(e Event, now int64) (Machine, Outcome) {
	out := Step(m.State, e, now, m.PeerExpiry)
	m.State = out.Next
	if e.Peer() && out.Err == nil {
		m.PeerExpiry = Expiry(now, m.Heartbeat)
	}
	return m, out
}
