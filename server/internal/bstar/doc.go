// Package bstar is the state machine of a Binary Star hot-standby pair
// (the ZeroMQ Guide's Binary Star pattern, bstarsrv.c's
// s_state_machine, of which the Guide also gives a Ruby port; docs/ha.md
// "Hot-standby pair" says how the pair
// behaves). It decides states and nothing else: it does no I/O, reads no
// clock and starts no goroutine.
//
// # The pattern
//
// Two ticketingd processes run as a pair, one started as the primary and
// one as the backup. Each sends its state to the other every heartbeat
// interval, and a heartbeat received is an event: PEER_PRIMARY,
// PEER_BACKUP, PEER_ACTIVE or PEER_PASSIVE (the peer's state; PeerEvent).
// A client's request is the fifth event, CLIENT_REQUEST. From the starting
// states PRIMARY and BACKUP the pair settles with one node ACTIVE (it
// serves) and the other PASSIVE (it refuses clients and stands by): the
// primary becomes active when it hears the backup, the backup passive
// when it hears an active primary. A primary serves clients while it has
// not heard a backup yet; a backup never does. The peer counts as dead
// once DeadAfter heartbeat intervals have passed since its last heartbeat
// (Expiry).
//
// # The client is the witness
//
// A passive node does not take over because its peer went silent: a
// silent peer may just be a cut peer link while every client still
// reaches it. It takes over only when a client asks it to serve
// (CLIENT_REQUEST; in ticketingd, a HELLO) after its peer went silent. A
// client contacts the other node of the pair only after it has lost the
// active one for a settle delay (the Guide's client waits 2 s), so a client
// request reaching the passive is the evidence that the active is gone
// for the clients too. The pair is therefore only as safe as its clients
// are disciplined: a client that probes the passive while the active
// answers can make both active.
//
// # What the caller does
//
// The caller keeps a Machine (New) and feeds it every event with its own
// now, nanoseconds on a monotonic clock whose readings are positive:
//
//   - a heartbeat received: m, out = m.Handle(PeerEvent(peerState), now);
//     Handle refreshes the peer expiry, as the Guide's main loop does,
//     unless out.Err is set;
//   - a client HELLO: m, out = m.Handle(ClientRequest, now); the session
//     is served only if out.Serve, and otherwise answered NOT_ACTIVE (M)
//     with the peer's client address as its hint (the Guide's example drops the
//     request without a reply and lets the client time out);
//   - every out.Transition is logged with out.Reason and moves the role
//     reported in /status and in the role metric (State.String and the
//     State's number);
//   - out.Err is logged at error level and acted on as ErrDualActives,
//     ErrDualPassives and ErrInvalid say.
//
// Step is the same decision without the Machine: the state, the event,
// now and the peer expiry in, the Outcome out.
//
// # Where the Guide's example is unclear, and what this package chose
//
//   - The takeover instant: the Guide's Ruby port takes over when now >
//     peer_expiry, bstarsrv.c when now >= peer_expiry; Step uses >=.
//   - A client request to a PRIMARY: the Guide's example (and bstarsrv.c) has no row
//     for it, so it is served at once and the node stays PRIMARY; Step
//     does the same. The Guide's later reactor, bstar.c, serves it only
//     once the peer expiry has passed (set 2 heartbeats after the start,
//     refreshed by every heartbeat) and then becomes ACTIVE, so that a
//     primary restarting while the backup is active does not serve before
//     it hears the backup (a failback split brain). The Guide's rule leaves
//     that window, one heartbeat interval after a restart, to the clients'
//     discipline; a caller that wants bstar.c's guard refuses a client
//     while the state is PRIMARY and now < max(Expiry(start, heartbeat),
//     m.PeerExpiry). ticketingd does (server/log_pair.go).
//   - The faults: the Ruby port's break leaves only the
//     loop over the readable sockets, so the process keeps running;
//     bstarsrv.c exits. Here they are
//     Outcome.Err values; the process does not exit (ErrDualActives and
//     ErrDualPassives say what the caller does instead).
//   - The takeover log line: bstarsrv.c prints "failover successful", the
//     Ruby port nothing; every transition has a Reason here.
//   - The Guide's unknown states and events are no-ops (a client is even
//     served in state 0), and a passive with no peer expiry asserts: here
//     they are ErrInvalid, and a client request is refused.
//   - Two nodes started with the same role: neither the Guide's example nor this
//     package detects it (two primaries both serve, two backups never
//     serve; the Reason says so). ticketingd's peer link handshake, which
//     knows the configured roles, detects it, and then neither node serves.
//
// This package decides only states. What a state implies for the data is
// in package server (log_pair.go, log_pair_seam.go, log_pair_epoch.go): the replication
// from the active to the passive and the catch-up of a passive that
// joins, and the split-brain rule (tokens ordered by an epoch, the node
// with the lower epoch stepping down when the peer link heals).
package bstar
