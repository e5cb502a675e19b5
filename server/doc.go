// Package server is the Ticketing lock service as a library: a server
// speaking protocol versions 1, 2 and 3 (docs/protocol.md) over TCP or
// TLS, standalone, as a node of a Raft cluster (Config.Cluster) or as one
// node of a hot-standby pair (Config.Pair).
//
//	srv, err := server.New(server.Config{DataDir: "/var/lib/ticketing"})
//	if err != nil {
//		return err
//	}
//	go srv.ListenAndServe(":5225") // returns ErrServerClosed after Shutdown
//	...
//	err = srv.Shutdown(ctx)
//
// New validates the Config (every zero field means its documented default),
// opens the token store and starts the background sweeper; it does not
// listen. Serve (any number of listeners), Shutdown, Close, Addr and Stats
// are safe for concurrent use. Close or Shutdown must be called to release
// the data directory and the background goroutines, even if Serve never ran.
//
// # Sessions
//
// One connection is one session, served by a reader goroutine (requests are
// handled in arrival order) and a writer goroutine. Before HELLO_OK a
// connection has only its reader goroutine, which reads exactly the HELLO
// frame without a read buffer; the buffer and the writer come with HELLO_OK.
// The first frame must be
// HELLO, checked in this order: version byte (E(2)), exact length (E(1)),
// client token (E(3)), then session limit (E(7)), then the per-address
// session limit MaxSessionsPerPeer (E(7)); a server that does not serve
// (RoleStandby, see Roles) answers a HELLO that passed the token check with
// NOT_ACTIVE (M, with its hint) and closes. A connection that has not completed HELLO within HelloTimeout
// (counted from accept, TLS handshake included) gets E(1) with req_id 0 and
// is closed; one whose TLS handshake fails or does not finish in time is
// closed without a frame. Client tokens
// are compared as SHA-256 digests with crypto/subtle against every configured
// token, so neither which token matched nor the token's length shows in the
// timing; tokens are never logged. An address that keeps sending wrong
// tokens is slowed down: after 20 recent failures (decaying with a 10 s
// half-life) each E(3) waits 10 ms, doubling per failure up to 500 ms, and
// the answers to one address are serialised; one that would wait more than
// 1 s in that queue waits 1 s beside it, for at most 16 connections of the
// address at a time, and beyond those the connection is closed without an
// answer. A flooding address gets at most about 18 E(3) per second; a
// misconfigured client with a few connections always gets its E(3), at
// most 1 s late. A correct token is never delayed; other addresses are not
// affected.
//
// A session that sends no complete frame for IdleTimeout (30 s by default,
// three keepalive intervals of the broker) while none of its requests
// awaits a reply is closed with E(1) "idle timeout" and req_id 0, between 1
// and 1.25 IdleTimeouts after the later of its last complete frame and the
// reply to its last queued ACQUIRE; a partly received frame does not count,
// and a session never is idle while an ACQUIRE of it waits in a queue.
//
// After HELLO_OK requests may be pipelined and replies come out of order: an
// ACQUIRE may wait in a queue while later requests (PING included) are
// answered at once. Reusing the req_id of an ACQUIRE still waiting (in a
// queue, or for a token) is E(1), except by a CANCEL (version 2).
// Every E closes the session (the server half-closes after the E and drains
// input for a moment, so the peer reads the E rather than a reset). A
// structurally broken frame, a second HELLO or an unknown type is E(1) with
// the frame's req_id (0 if the body had fewer than 5 bytes, and for a length
// prefix of 0 or above 1024); a well-formed request with key_len 0 or
// lease_s outside 1..250 is E(4).
//
// Replies are appended to a per-session buffer under a mutex and written in
// batches: the reader writes them itself when no further request is
// buffered (one write for a pipeline of requests), and the writer goroutine
// writes replies produced elsewhere (a grant pushed by another session's
// RELEASE, a lease timer, a wait timeout). No lock is held while writing, so
// a slow peer stalls only its own session. Every accepted TCP connection
// gets SocketBuffer (64 KiB) kernel send and receive buffers, so peers that
// do not read cannot grow the kernel's TCP memory. A session whose unsent
// replies exceed OutputBuffer, or whose socket does not take a piece of at
// most SocketBuffer bytes within WriteTimeout (3 s), is dropped.
//
// When a session closes for any reason its waiting ACQUIREs are dropped;
// its granted locks are not: they stay held until released by exact token
// (from any session) or until the lease ends.
//
// # Locks
//
// Keys are opaque byte strings of 1..255 bytes. ACQUIRE on a free key grants
// at once with a new token. ACQUIRE by the owner already holding the key gets
// the same token, waited_ms 0, and the lease is not extended. ACQUIRE with
// wait_s 0 on a held key gets T at once and is never queued. Otherwise the
// ACQUIRE waits in a FIFO queue per key: when the key frees, the oldest
// waiter whose session is still open is granted (new token, waited_ms from
// when its frame was read, rounded down); when its wait_s passes first it
// gets T. A waiter whose wait_s has passed when the key frees gets T, never
// G, even if its timer has not run yet (a stalled process, a late timer). An ACQUIRE by an owner that is already waiting for the same key
// takes that earlier ACQUIRE's place in the queue, and the earlier one is
// answered T at once (one queue position per owner; a deliberate retry does
// not produce two grants).
//
// A grant lasts exactly lease_s seconds. Expiry is exact and pushed: every
// ACQUIRE and RELEASE checks the lease first (at or after the instant, the
// key is free and RELEASE gets N), a key with waiters has a timer at its
// lease end that grants the next waiter, and a sweeper frees expired locks
// nobody touches every 100 ms (and at once, before a capacity rejection).
// RELEASE frees the key only if the given token is the current one (R),
// from any session; otherwise N.
//
// # Version 2
//
// A HELLO asking for version 1 or 2 gets HELLO_OK with that version; the
// session keeps it. On a version-1 session CANCEL (C) and RELEASE_OWNED (V)
// are unknown types: E(1). On a version-2 session, CANCEL names an ACQUIRE
// of the same session by its req_id (the one request that may reuse a
// req_id in flight): if that ACQUIRE is waiting in a queue, or for a
// fencing token (not yet decided), it is removed and answered T at once,
// touching nothing else (counted in Stats.TimedOut and Stats.Cancelled);
// otherwise (answered, being answered, granted, unknown) nothing happens,
// with no reply. CANCEL never frees a granted lock. RELEASE_OWNED frees the
// key only if both the token and the holder's owner match (R); otherwise N.
//
// With Config.OwnedReleaseOnly (off by default), a lock granted to an
// ACQUIRE of a version-2 session, at once or as a waiter, can be freed only
// by RELEASE_OWNED: a RELEASE (U) of it, from any session and even with the
// right token, gets N and the lock stays held. Locks granted on version-1
// sessions are freed by U as above.
//
// # Version 3
//
// A HELLO asking for version 3 gets a version-3 HELLO_OK, which also
// carries the identity of the node's replicated group: a cluster's ID, a
// pair's ID (PairConfig.ID), empty standalone; a client never uses two
// nodes with different identities as one service. A version-3 session may
// send EXTEND (X: token, owner, lease_s, key): if the key's holding has
// that token and that holder, its lease ends no earlier than lease_s after
// the EXTEND was read (the later of its end and that instant: never
// shortened), the token stays, and the answer is K (KEPT, counted in
// Stats.Kept); otherwise N. The holding's lease_s becomes the new one when
// the end moves (when the current end is later, both stay), so a takeover
// restarts the lease at least as long as its holder was told. A replicated
// node answers K only once the extension is committed (a cluster) or
// acknowledged by the passive (a pair). On versions 1 and 2, X is an
// unknown type: E(1). A HELLO for version 4 or later gets E(2).
//
// # The code: the lock core, the replication logs, the sessions
//
// The code is in three rooms, and a file's name says which it is in:
//
//	internal/lockcore/   the lock core: every lock rule, once (no clock, no I/O)
//	log_standalone*.go   the replication logs, one per mode, behind the
//	log_cluster*.go        seam lockcore.Proposer: standalone (the token
//	log_pair*.go           store), the Raft cluster, the hot-standby pair
//	session*.go          the sessions: frames in, the core's events;
//	                       the core's effects, frames out (session_shard.go
//	                       is where the two meet, and the mode interface)
//
// Beside them are the server's front door (server.go: New, Serve,
// Shutdown, Stats; browse.go: the lock browser and expire now; config.go;
// role.go; metrics.go; clock.go) and the
// pure parts the logs are built from, each a package of its own:
// internal/bstar (the Binary Star state machine) and, outside server/,
// internal/raftlog, internal/raftstore and internal/raftnet (the Raft
// node's log, stable store and transport). The admin HTTP handler is
// package server/admin.
//
// Every lock decision is made in one place, package internal/lockcore, in
// two parts. The Machine is the replicated state: the holdings (key ->
// owner, token, lease_s, owned-only) and the highest token applied,
// changed only by the commands Grant(key, owner, lease_s, owned_only) ->
// token | held | exhausted and Free(kind, key, token, owner [, the next
// waiter's grant]) -> freed, kind a RELEASE, a RELEASE_OWNED or an expiry;
// a Free changes nothing unless that token still holds the key. It is
// deterministic; Snapshot and restore encode it (versioned, sorted by key:
// equal states, equal bytes). The Core is the scheduler in front of it:
// FIFO waiters, wait and lease deadlines, capacity, owned release, cancel,
// and a takeover's lease restart (Promote). It reads no clock and does no
// I/O: every event comes in with the caller's now, its replies come out as
// effects, and its commands go to a lockcore.Proposer, the replication
// seam; it projects each command at once (the key is held, or free, as it
// will be) and learns its outcome when it applies. Both use the same
// rules (lockcore's rules.go), and the command encoding of every
// replicated mode is lockcore's.
//
// The replication logs implement the seam. Standalone's (localLog,
// log_standalone.go) applies at once: a grant's token comes from the token store's
// reservation (log_standalone_store.go), so no command is ever in flight. The Raft mode's
// (raftLog, log_cluster_seam.go) queues each command for the leader's proposer
// (log_cluster_proposer.go), which packs them into hashicorp/raft entries; every
// node applies the committed entries to a Machine (log_cluster_fsm.go), and on
// the leader the outcomes go back to the core (Core.Applied), which then
// answers: nothing is answered before it is committed. The hot-standby
// pair's (pairLog, log_pair_seam.go) applies each command to the active node's
// Machine at once and, while the passive node is attached, streams it over
// the peer link (log_pair_link.go) and gives the core its outcome when the
// passive has acknowledged it; alone it gives it at once (log_pair.go drives
// the Binary Star state machine, log_pair_epoch.go the token epochs).
//
// The sessions (session.go, session_peers.go) read requests and write replies. A
// shard (session_shard.go) is one core with the mutex every event of it is under,
// its clock and one timer at the core's next deadline; carryOut turns the
// core's effects into replies and counters. Standalone has 256 shards,
// chosen by a hash of the key, each a core over its keys applied directly
// under the shard mutex; a cluster leader has one core over all keys, fed
// by the applied log, promoted at takeover and demoted when it loses its
// leadership; a pair's active node likewise has one core, promoted when
// it starts serving and demoted when it steps down. Which of the three the
// server is (its mode) is chosen once, at New. An ACQUIRE is decided as of when its frame was read (or of the
// core's last event, if later): a lease counted from then ends no earlier
// than its holder's own count, which starts when it sent the ACQUIRE.
//
// The token source is outside the critical section's waiting: under a
// shard mutex a grant only takes the next token below the durable ceiling
// with a compare-and-swap; the fsync that raises the ceiling runs in the
// store's goroutine, ahead of need. A grant that finds no token left
// never waits under the mutex: an ACQUIRE of a free key waits for the
// reservation (up to 1 s, then B) without it, and a waiter whose turn comes
// then gets B.
//
// # Roles
//
// A server's role (Server.SetRole, Server.Role, Stats.Role, the
// ticketing_role gauge, a log line per change) is RoleStandalone by
// default, RoleStandby with Config.Standby. A serving role (standalone,
// active, leader) answers HELLO with HELLO_OK carrying the role's number;
// RoleStandby answers it with M and the hint. On a change from serving to
// RoleStandby every connection gets M (req_id 0) with the new hint and is
// closed, so every waiting ACQUIRE ends with its session; held locks are
// kept in the state machine (held locks survive a failover) and are
// there when the node serves again, unless their lease ended meanwhile. In standalone mode a role change is for
// a standby and for tests; replicated modes drive it.
//
// Within a core, entries sit on intrusive lists, one per lease length,
// which the monotonic clock keeps sorted by expiry, so sweeping looks only
// at list heads; the waiters' deadlines and the lease ends of keys with
// waiters are in heaps, whose earliest instant is the shard's timer.
// Released keys stay in the map for 2 s so that re-acquiring them
// allocates nothing.
//
// # Raft mode (a cluster)
//
// With Config.Cluster the server is a node of a 3- or 5-node cluster on
// hashicorp/raft. Every node applies the committed log to one state
// machine over all keys (the holdings, the token counter, the nodes'
// client addresses); only the leader serves. What every replicated mode promises:
//
//   - Tokens are the machine's counter, +1 per committed grant, so no token
//     is issued twice and a new leader's tokens are above every earlier
//     one. A new cluster's first token is 1, as the protocol says; with
//     Config.TokenStart TokenStartClock its counter starts above the wall
//     clock in microseconds (ClockStart), read by its first leader when it
//     takes over and put in the log, so that it is above every token an
//     earlier installation can have issued; it is read only while the
//     counter is still 0, never again, and the first leader's TokenStart
//     decides (give every node the same). Config.InitialToken, and the ceiling of a
//     standalone token store found in DataDir (a migration), are a floor:
//     a node that takes over raises the counter to its floor through the
//     log. The floor is the
//     node's configuration, not the cluster's: give every node the same
//     InitialToken (a node whose floor is above the counter a leader left
//     logs an error), and start a cluster from a standalone data dir only
//     with that node alone (New refuses a bootstrap of several nodes with
//     it), adding the others once it leads.
//   - A node answers a HELLO with HELLO_OK (role leader) only once it has
//     won an election, applied a Barrier (every earlier entry is applied),
//     raised the counter to the floor and recorded its client address
//     (ClusterConfig.Advertise) in the log, and restarted every lease at
//     its full lease_s plus one election timeout: a failover never shortens
//     a lease. Every other node answers M with the leader's client address
//     (empty while no leader is known).
//   - When the leader loses its leadership (a partition: raft's leader
//     lease, one heartbeat timeout without a majority), its waiters are
//     dropped and every session gets M and closes: what was in flight is
//     Indeterminate for its caller. Held locks live in the log and survive.
//   - Every leader's stint begins with an entry naming it; from its apply
//     on, every node skips the entries of other stints (a deposed leader's
//     late ones), so the new leader's view of the holdings stays exact.
//   - No grant is answered before it is committed: the leader's scheduler
//     queues commands for the proposer, which puts everything queued while
//     raft appends the previous entry into the next one (group commit: many
//     grants share one append and one fsync), and replies from the apply of
//     the entry on the leader. A release of the holder and the grant to the
//     next waiter are one command, so a contended hand-off costs one commit.
//   - One session cannot take the log from the others: every command is
//     charged to a session (an expiry to the session that got the lock);
//     a session with ClusterConfig.MaxSessionProposals commands awaiting
//     their apply is not read from until one applies (TCP holds its client
//     back; nothing is refused); entries are bounded and filled in turns
//     from every session with commands queued, at most two in flight; a
//     session with none in flight gets an entry at once; entries are
//     small and one at a time while a session is held back and another
//     sends a request at a time; and an ACQUIRE of a free key beyond
//     ClusterConfig.MaxProposals commands of requests awaiting their apply
//     gets B (see log_cluster_proposer.go).
//   - A RELEASE of the current holding is answered R once its Free is
//     committed, as the protocol's R ("the exact token was current and is
//     now released") requires; one cut off by a failover gets no R, and the
//     broker resends it to the new leader. ClusterConfig.EarlyRelease
//     (opt-in, a deviation from the protocol) answers R as soon as the
//     leader has queued the Free, and counts it then in
//     ticketing_released_total. Any later grant of the key is queued behind
//     that Free, so it commits only after it: no other owner gets the key,
//     and no token is issued twice, whatever becomes of the R. But if the
//     Free does not commit (the leader dies, or was cut off from the others
//     and deposed without knowing it yet, or hands its leadership on at
//     Shutdown), the next leader still sees the holding and restarts its
//     lease, so the key stays held until that lease ends (lease_s plus
//     ElectionTimeout), as if the holder had died without releasing; the
//     releaser, told R, does not resend. An ACQUIRE by the same owner then
//     gets G with the same token and waited_ms 0: a repeated token, which
//     docs/protocol.md says starts no new lease (a client must never reuse
//     an owner for a new acquire; the broker takes a fresh random one for
//     each). EarlyRelease saves every release a commit: an uncontended
//     acquire+release cycle waits for one commit instead of two.
//   - Expiry is a log entry the leader proposes when a lease ends on its
//     clock; followers expire nothing. A grant that is not answered G is
//     freed again by the next entry, so that no key stays held by nobody
//     for a lease: one whose waiter left (its session closed), or whose
//     wait ran out while it was being committed (T), or whose commit took
//     longer than an election timeout, so that another leader may have
//     restarted the lease from an earlier instant (B, as standalone answers
//     an ACQUIRE that a slow disk leaves without a token; counted in
//     ticketing_raft_slow_grants_total, and logged at most once a second);
//     a grant committed by a leader that died before answering it stays
//     held until its (restarted) lease ends, as its caller saw
//     Indeterminate.
//   - The holder's retry of its ACQUIRE gets its token (lease not
//     extended), on the leader that granted it or on a later one.
//   - A RELEASE whose lease ended (on the leader's clock), or that names a
//     holding whose end is proposed but not committed yet, gets N only once
//     that end is committed: a deposed leader cannot commit it, so it never
//     answers N for a lock its successor still holds. (Answers that need no
//     commit, T to an ACQUIRE with wait_s 0 of a held key, B, the holder's
//     retry, and the early R of EarlyRelease, may come from a leader that
//     does not know yet that it was deposed; none of them grants anything.)
//
// The Raft state is in DataDir/raft, locked against a second process: the
// log in log/ (segment files with one fdatasync per append, package
// internal/raftlog), the stable store in raft.db (raft-boltdb) and the
// snapshots in snapshots/. ClusterConfig.Peers
// bootstraps a node with no Raft state; a node with state ignores it. The
// peer transport (package internal/raftnet) uses mutual TLS against the
// cluster CA with ClusterConfig.PeerCertificate and PeerRoots, and logs a
// warning without them.
// Membership changes (AddVoter, RemoveServer) are made on the leader;
// elsewhere they return a NotLeaderError naming the leader. ClusterStatus
// reports the node's Raft state, leader, term, commit and applied index and
// the configuration. Shutdown (not Close) of a leader first transfers its
// leadership, so that the others need not wait for an election timeout.
//
// # Pair mode (a hot-standby pair)
//
// With Config.Pair the server is one node of a Binary Star pair
// (PairConfig; docs/ha.md "Hot-standby pair"). Only the active node serves
// (role RoleActive, HELLO_OK role 2); the other answers M with the
// active's PairConfig.Advertise. A HELLO is the state machine's client
// request: it makes a passive node active once its peer has been silent
// for two heartbeats, and only then (the client is the witness). A node
// that starts serving takes a token epoch above every one it has used or
// seen, fsync'd in DataDir/pair.epoch; tokens of epoch e are
// e<<40 .. (e+1)<<40 - 1, even epochs the primary's, odd the backup's, so
// the two never issue the same token and the newer active's tokens are
// above the older one's; an active that hears of a higher epoch in its
// peer's heartbeat (a split brain whose new active died before the link
// healed) moves above it, durably, before its next grant. A plaintext peer
// link off loopback needs PairConfig.PeerPlaintext. Server.PairStatus and
// Stats.Pair show the node's view of the pair.
//
// # Tokens and durability
//
// Fencing tokens come from one atomic counter for the whole server: they
// strictly increase across all keys. A new token store (an empty or new
// DataDir) issues 1 first, as the protocol says, or the token above
// Config.InitialToken. With Config.TokenStart TokenStartClock (an opt-in,
// which the configs of ticketingd init set) it starts above the wall
// clock in microseconds since 1970 instead (ClockStart, about 1.8e15, a
// 5000th of MaxToken), or above Config.InitialToken if that is higher: no
// server issues a token per microsecond, so a new installation's tokens
// are above every token an earlier one can have issued, and the databases
// it fenced accept them without the operator having to know their
// high-water (starting at 1 again, a reinstalled server's every fenced
// write fails as stale). The clock is read once, at creation: the first
// ceiling persists the start, and every later start continues from the
// stored ceiling, never from the clock (a clock set back cannot lower the
// tokens, one far ahead does not raise them). They never go backwards,
// across restarts (kill -9 included): the file tokens.ceiling in DataDir
// holds a durable ceiling, and no token above it is ever handed out. The
// ceiling is raised TokenBlock tokens at a time (write a temporary file,
// fsync, rename, fsync the directory) by a background goroutine as soon as
// half of the current block is used, so grants do not wait for the disk
// unless the disk falls behind. On start the counter continues above the
// stored ceiling (up to one block of tokens is skipped per restart).
//
// The file is one line, "ticketing-token-ceiling v1 <ceiling> <crc32c>": a
// format version and a checksum. A complete tokens.ceiling.tmp (what a crash
// between its fsync and the rename leaves) counts too: the higher valid
// ceiling wins. New fails, naming the path, if the file is corrupt, if the
// directory cannot be created or written, or if no valid ceiling is found in
// a directory that holds anything (LOCK alone included: ErrCeilingMissing);
// it never starts tokens from scratch except in an empty or new directory. A first
// start that dies before its first ceiling is durable leaves such a
// directory, and it is refused too (it cannot be told from one whose ceiling
// was deleted); no token was issued from it, so it may be removed. (A first
// start that fails with an error removes its LOCK again.)
// Config.InitialToken makes tokens continue strictly above it (or above the
// stored ceiling if that is higher, never backwards): the way to restart a
// directory whose ceiling was lost, or to continue above another server's
// tokens. New also takes an exclusive flock on DataDir/LOCK so that two
// servers never share a store.
//
// Tokens never exceed MaxToken (2^63-1, what the fence and signed 64-bit
// columns accept) and nothing wraps: TokenBlock is 1..2^32, New fails with
// ErrTokensExhausted if the stored ceiling (or InitialToken) plus one block
// would pass MaxToken, and a running server reserves its last block only up
// to MaxToken, after which ACQUIREs of free keys get B at once.
//
// No lock-table mutex is ever held while waiting for the disk. A grant
// takes a token without waiting; if the reservation has fallen behind (no
// token below the durable ceiling), the ACQUIRE of a free key waits for it
// outside the shard mutex and off its session's reader for at most one
// second (the session's later requests, other sessions, RELEASE, PING and
// other keys go on; its req_id stays awaited, and a session that closes
// ends the wait), then tries again once; if there is still no token it gets B
// (definitely not granted; the session stays open). A waiter whose turn
// comes while no token is available is answered B at once, and the next
// waiter is tried. Those B replies are counted in ticketing_busy_total and
// ticketing_token_unavailable_total and logged at most once a second. If
// the reservation failed (the disk returned an error), the ACQUIRE gets
// E(6) instead, the session closes, and the error is logged; grants resume
// above every earlier token once a reservation succeeds. TokenStoreErr
// reports a failed, stalled (running over a second) or exhausted store.
// Close and Shutdown wait at most a second for a reservation in progress;
// if it is still stuck, they return and DataDir stays locked until it ends.
//
// Locks themselves are kept in memory only: a restarted server starts with
// no locks (clients' leases on the old process are gone; fencing tokens keep
// databases safe, since every new token is higher than any issued before).
//
// # Limits
//
// MaxLocks (held, unexpired locks), MaxWaiters (queued ACQUIREs over all
// keys) and MaxKeyWaiters (queued ACQUIREs for one key): an ACQUIRE that
// would add a held lock or a waiter beyond one of them gets B at once. The
// holder's retry still gets G and wait_s 0 on a held key still gets T,
// whatever the load. An owner taking over its own place in a queue adds no
// waiter. MaxSessions and MaxSessionsPerPeer are enforced at HELLO with
// E(7). Connections that have not completed HELLO are bounded by
// HelloTimeout and by MaxPendingConns, of which one address may hold a
// quarter (at least 64); a connection beyond is closed at accept. A peer
// address is the IPv4 address, or the /64 prefix of an IPv6 address.
//
// # TLS
//
// If Config.TLS is set, every accepted connection is wrapped with
// tls.Server; the handshake must complete within HelloTimeout. Client
// certificate verification is whatever that tls.Config requires (ClientAuth,
// ClientCAs); the server adds nothing.
//
// # Metrics
//
// With Config.Registerer set, New registers the server's collectors (and
// Close or Shutdown unregisters them, so a new Server may register on the
// same registry) exposing:
//
//	ticketing_sessions                   gauge: open sessions
//	ticketing_held_locks                 gauge: granted, unexpired locks
//	ticketing_waiters                    gauge: queued ACQUIREs
//	ticketing_token_last                 gauge: highest token handed out
//	ticketing_token_ceiling              gauge: durable token ceiling
//	ticketing_grants_total               counter: grants with a new token
//	ticketing_timeouts_total             counter: T replies
//	ticketing_busy_total                 counter: B replies
//	ticketing_released_total             counter: R replies
//	ticketing_not_held_total             counter: N replies
//	ticketing_kept_total                 counter: K replies (EXTEND, version 3)
//	ticketing_expired_total              counter: leases that ran out
//	ticketing_output_overflows_total     counter: sessions dropped for not reading
//	ticketing_pending_conns              gauge: connections before HELLO_OK
//	ticketing_idle_timeouts_total        counter: sessions dropped by IdleTimeout
//	ticketing_pending_refused_total      counter: connections closed by MaxPendingConns
//	ticketing_conn_budget                gauge: ConnBudget (0: no cap)
//	ticketing_conn_budget_in_use         gauge: connections holding a unit of it
//	ticketing_conn_budget_refused_total  counter: connections closed by ConnBudget
//	ticketing_peer_session_limit_total   counter: E(7) by MaxSessionsPerPeer
//	ticketing_auth_failures_total        counter: HELLOs with a wrong token
//	ticketing_auth_throttled_total       counter: of those, closed unanswered
//	ticketing_log_suppressed_total       counter: peer log lines rate-limited
//	ticketing_protocol_errors_total      counter by code: E frames sent (all but 5)
//	ticketing_cancelled_total            counter: ACQUIREs removed by a CANCEL
//	ticketing_grant_wait_seconds         histogram: ACQUIRE read to grant
//	ticketing_token_unavailable_total    counter: B replies for want of a token
//	ticketing_token_store_ok             gauge: 1 while TokenStoreErr is nil
//	ticketing_role                       gauge: 0 standby, 1 standalone, 2 active, 3 leader
//
// In Raft mode also:
//
//	ticketing_raft_commit_seconds        histogram: a log entry's proposal to its apply on the leader
//	ticketing_raft_entry_commands        histogram: commands per log entry the leader proposed and applied
//	ticketing_raft_leader_changes_total  counter: leader changes this node has observed
//	ticketing_raft_applied_index         gauge: last log index applied to the state machine
//	ticketing_raft_commit_index          gauge: last committed log index
//	ticketing_raft_leader                gauge: 1 while this node leads and serves
//
// (In Raft mode ticketing_token_last and ticketing_token_ceiling are both
// the applied counter, and ticketing_token_store_ok is 1.)
//
// In pair mode also:
//
//	ticketing_pair_state                        gauge: 1 PRIMARY, 2 BACKUP, 3 ACTIVE, 4 PASSIVE
//	ticketing_pair_serving                      gauge: 1 while this node serves
//	ticketing_pair_replicating                  gauge: 1 while the active waits for the passive's acknowledgements
//	ticketing_pair_epoch_mark                   gauge: 1 + the highest token epoch used or seen
//	ticketing_pair_unreplicated_commands_total  counter: commands applied with no passive attached
//	ticketing_pair_dual_actives_total           counter: heartbeats showing both nodes serving
//	ticketing_pair_dual_passives_total          counter: heartbeats showing neither serving
//	ticketing_pair_transitions_total            counter: Binary Star state transitions
//
// (In pair mode ticketing_token_last is the machine's highest token and
// ticketing_token_ceiling the last token of the epoch served.)
//
// The protocol_errors_total series for codes 1 to 7 (but 5) exist from the
// start; a code above 7 gets a series of its own once sent. The hot path
// increments atomics, which counter and gauge funcs read at scrape time,
// and observes the grant-wait histogram (client_golang's, lock-free). Stats returns the same numbers as a struct. Logs go to
// Config.Logger (nil discards): a Warn per protocol violation with the
// peer address, code and req_id, never the client token. Warnings caused by
// peers are rate-limited: the first per address in each 10 s, for at most 20
// addresses, is logged in full; the rest are counted and summed up in one
// Warn per 10 s (and at Close), "log lines about peers suppressed (rate
// limit)", with the counts of the addresses with the most lines.
//
// # Admin endpoints
//
// Package server/admin is ticketingd's admin listener as an http.Handler:
// GET /healthz (TokenStoreErr, and a shutting-down signal), /status
// (Stats, the build and ClusterStatus, as JSON types of that package),
// /metrics (the registry given to Config.Registerer), on a cluster node
// POST /cluster/add and /cluster/remove (AddVoter, RemoveServer), with an
// optional Bearer token, and the lock browser: GET /v1/locks (Locks), GET
// /v1/locks/{key} (Lock) and POST /v1/locks/{key}/expire (ExpireLock),
// served only with admin.Options.ConsoleKeys and the token (key names can
// be sensitive). A program that embeds a Server mounts admin.New(srv,
// admin.Options{...}) on an http.Server of its own.
//
// # Lock browser and expire now
//
// Locks returns a page of the held locks: those whose key starts with a
// prefix and sorts after a cursor (bytewise), at most a limit, sorted by
// key; Lock one key with its waiters in FIFO order. A lock shows its key,
// token, owner, lease_s, owned-only flag, lease left (and its end on the
// wall clock), number of waiters and holder: the session whose ACQUIRE
// was granted, by the client name of its HELLO and its remote address.
// Each session has one such record, shared by its holdings and waiters
// and referring to nothing else of it, so a holding that outlives its
// session keeps only those two strings (and the lock's record stays in its
// size class: one pointer). Locks whose lease has ended and grants not yet
// applied are left out. Where this node serves, they come from its lock
// core (standalone: the 256 shards' cores, their locks merged in key
// order; a cluster leader's, a pair active's one core): the page's View
// is "standalone", "leader" or "active". A cluster follower or a pair's passive answers from its
// applied state machine instead: View "follower-applied" or
// "passive-applied", the holdings as of its last applied command (key,
// token, owner, lease_s, owned-only), without lease ends, waiters or
// holders, which only the serving node's core has. A page's work does
// not grow with the table: each core (and machine) keeps its keys in a
// B-tree, and a page seeks to its first key and visits the keys of its
// prefix only, at most 256 under a table's mutex at a time (released
// between chunks) and 10,000 in all (a page that runs out of them is
// short, with More and Next where it stopped; lockcore's
// BenchmarkCoreLocks: 3 µs for a page of 100 among 100,000). One page is
// searched at a time, and its answer serves the same query for a second,
// so that pollers of the same page (the console's tabs) cost one search;
// an ExpireLock drops the answers kept.
//
// ExpireLock is an operator's "expire now": a core event (Core.Expire)
// that, if the key is held with the exact token given, ends the lease as
// its running out does: one Free command of kind expiry, with the grant to
// the oldest live waiter whose wait has not ended, so the waiter gets a
// new, higher token, and the old holder's RELEASE and EXTEND get N and its
// fenced writes are rejected once the new holder has written. It is answered once that command applied:
// at once standalone, once committed in a cluster (a command of the log
// that nodes of earlier versions apply too), once the attached passive has
// acknowledged it in a pair. Another token is ErrLockToken, a key not held
// (or whose lease had ended) ErrLockNotFound; a follower refuses with
// NotLeaderError, a passive with NotActiveError, naming where to ask.
// Each call is logged at Warn with the key, the token, the outcome and
// its by (who asked: the admin listener's remote address and operator).
//
// # Shutdown
//
// Shutdown closes the listeners (Serve returns ErrServerClosed), sends E(5)
// with req_id 0 to every connection, including those before HELLO, and
// closes them once the E is written; it returns when all are closed, or
// when ctx is done, after closing the rest at once (it then returns ctx's
// error). Close does the same without E(5). Both release the data
// directory; both are idempotent.
package server
