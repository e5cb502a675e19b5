// Package broker is the Go client of the Ticketing lock service: it acquires
// leased locks that carry strictly increasing fencing tokens, and releases
// them. One Broker, shared by every goroutine of a process, keeps sessions
// to one node, a hot-standby pair or a cluster, follows the serving node
// and tells each call's outcome with one error sentinel. Its behaviour is
// stated below; docs/semantics.md in the repository lists it point by
// point with the tests that show it, and docs/protocol.md is the wire
// protocol.
//
//	cfg, err := broker.ParseURL("ticketing://TOKEN@10.0.0.5:5225?ca=/etc/ticketing/ca.pem")
//	if err != nil { ... }          // only for an invalid configuration
//	b, err := broker.New(cfg)      // or broker.Connect("127.0.0.1:5225")
//	if err != nil { ... }          // only for an invalid configuration
//	defer b.Close()
//	if err := b.WaitReady(ctx); err != nil { ... } // at start-up: New never dials
//	t, err := b.Acquire(ctx, "order-42", broker.AcquireOptions{
//		Lease: 30 * time.Second, // required: 1..250 s
//		Wait:  5 * time.Second,  // 0: one immediate try
//		Work:  2 * time.Second,  // 0: no work budget
//	})
//	if err != nil { ... }          // see "Acquire outcomes"; ErrUnsent: retry soon
//	// in ONE database transaction: reject t.Token() <= stored high-water,
//	// store it, do the business write, commit; only then:
//	err = t.Release(ctx)
//
// Example runs the same steps (with Connect) against an in-process server.
// For work longer than a lease, Ticket.KeepAlive refreshes the lease in
// the background and returns a context that is cancelled before the lock
// can be lost (see "Refresh and KeepAlive"; ExampleTicket_KeepAlive).
//
// # Connections
//
// New validates its Config and returns at once; it never dials and never
// fails because a server is down. Sessions are opened in the background and
// re-opened after a drop with capped exponential backoff and jitter
// (BackoffMin doubling up to BackoffMax, half of each delay random), each
// session on its own, so a drop never disturbs the others. The backoff is
// reset only by a session that lived at least BackoffMax, so a node that
// drops sessions right after HELLO is not redialled at BackoffMin forever. One address is
// one node held with two sessions; two or more addresses are a cluster with
// one session per address. A node that answers HELLO with M (not serving) is
// not used, and retried later with the same backoff. Requests go only to
// ready sessions, that is to nodes that answered HELLO_OK: in a cluster,
// the serving node (its leader), and WaitReady returns only once a session
// to it is ready.
//
// In a cluster the broker follows M hints. An M (to HELLO, or ending a
// session when its node stops serving) names the serving node's client
// address; if that is one of Addrs (after the same normalisation, so list
// the nodes as they advertise themselves), that node's session redials at
// once instead of at the end of its backoff, and, if the node does not
// serve yet (a new leader starting up), keeps retrying it from BackoffMin.
// So after a leader change the broker is ready again on the new leader
// without any action of the caller, within about one round trip once the
// new leader serves. A session sent to a node by a hint does not pass that
// node's own hint on until it has been ready once: two nodes naming each
// other cannot make the broker redial them without backoff. A hint naming
// an address not in Addrs is not followed (logged once at Warn): the broker
// talks only to the nodes it was given, with their TLS settings, so that
// no node can send its clients elsewhere. ACQUIREs in flight on a node that
// stops serving are Indeterminate (ErrIndeterminate), never retried.
//
// At start the broker dials the first address of Addrs first, and the
// others once that attempt has ended (a HELLO_OK, an M, a failure) or
// after Config.PairSettle (2 s by default), whichever comes first: a
// hot-standby pair whose first address is the active is then never
// contacted on its passive (see Hot-standby pairs). For a cluster this
// costs one round trip to the first node at start, or PairSettle if that
// node does not answer at all.
//
// Each session has a reader and a writer goroutine and an in-flight map by
// req_id; requests are pipelined, replies may come in any order, so a
// waiting ACQUIRE never blocks the requests behind it. The reader hands out
// every reply already buffered under one hold of the session lock, and
// delivers the results after releasing it. Callers encode their
// frames; the writer yields while its queue still grows (a few times at
// most) and then writes every queued frame in one Write. Callers woken by
// replies do not wake the writers one by one: the last of them to run
// does, so that the requests of a whole wave of callers go out in one
// Write per session (the rotation is unchanged). The release window
// is enforced by one timer per session, armed for the earliest window end
// among its RELEASEs, rather than a timer per RELEASE. ACQUIREs and RELEASEs share one
// round-robin rotation over the ready sessions. Each session sends a PING
// every KeepAlive; a PING unanswered within KeepAliveTimeout of falling due
// closes the session (a dead peer). The timeout counts from when the PING
// fell due, so a writer stuck in Write (a peer that stopped reading) is
// detected too, and no call hangs on such a session.
//
// With no ready session, Acquire fails at once with ErrUnsent; it never
// waits for one. Right after New no session is ready yet, so call WaitReady,
// which waits for the first ready session, at start-up before the first
// Acquire (until a session has been ready once, the ErrUnsent's message
// says so). A session whose latest attempt was refused for good (the
// client token refused, E code 3: ErrUnauthorized; the protocol version
// refused, E code 2 to a version-1 HELLO: *ServerError; the server's
// certificate rejected: ErrCertificate; a plain-TCP client whose HELLO a
// TLS server closed: ErrTLSRequired; a TLS client whose handshake a
// plain-TCP server answered with bytes that are not TLS: ErrServerNotTLS;
// a node of another cluster: a
// *WrongClusterError, see "Cluster identity") redials only after
// BackoffMax; when every session is in that state, WaitReady returns the
// refusal at once. A fix on the server side
// is picked up by the next redial. When ctx ends first, WaitReady's error
// matches ErrNotReady and ctx's error, and its message carries the last
// session error.
//
// # Hot-standby pairs
//
// A hot-standby pair (Binary Star, docs/ha.md) is two nodes: an active
// that serves and a passive that answers M naming it. The passive takes
// over only when a client comes to it after its peer has been silent for
// two heartbeats: the clients are the witness that the active is gone.
// That is safe only if a client contacts the other node only after it
// has lost the active, never while the active answers it: with the link
// between the nodes cut and both reachable, a client's probe of the
// passive would make it active too, and the pair would have two actives
// (a split brain, in which only the fencing tokens keep the data right).
//
// So the broker is a disciplined witness. It learns that it talks to a
// pair from a HELLO_OK with role 2 (active of a pair), and from then on,
// for the life of the Broker:
//
//   - While the active serves, the broker dials no other address: no
//     background attempt, no race between addresses, nothing at the
//     keepalives.
//   - When it loses the active (its session dropped, a keepalive timeout,
//     an M with no hint it follows), it redials that address alone until
//     the address has not served for Config.PairSettle (default 2 s, the
//     ZeroMQ Guide's SETTLE_DELAY) with no attempt to it in flight (an
//     attempt that may still be answered); only then does it dial the
//     other node, and after another PairSettle without serving the first
//     one again (with more than two addresses, the next in Addrs order).
//     If the active comes back within the settle delay, the broker uses
//     it again and never contacts the other node.
//   - Each move to a node restarts the backoff of its sessions at
//     BackoffMin, and the node the broker is trying is retried at least
//     every quarter of PairSettle (at least 10 ms; half of it jitter),
//     whatever the backoff grew to: half a heartbeat when PairSettle is
//     two of the pair's heartbeats, as advised. The broker cannot know
//     the heartbeat (no frame carries it), but PairSettle is set from it.
//     So the passive, which takes over at the first HELLO after its peer
//     has been silent for two heartbeats, is reached within half a
//     heartbeat of being able to.
//   - An M whose hint names the other listed node is followed at once,
//     without the settle delay: the node that sends it says that it does
//     not serve (an active stepping down, a passive naming the active), so
//     contacting the node it names is not probing a passive behind an
//     active's back. Two exceptions keep this from looping: a node reached
//     by a hint does not pass its own hint on until it has served, and a
//     hint naming the node the broker left after the settle delay is not
//     followed (a passive that has not yet noticed that its peer is gone
//     names it; the broker keeps retrying the passive, which takes over
//     once it notices).
//   - A node other than the active that answers HELLO_OK (a second
//     active: a split brain) is not used, and when the active is found,
//     sessions ready on other nodes are closed: requests go to one node
//     only.
//
// ACQUIREs in flight on a lost active are ErrIndeterminate, as in every
// mode; while no node serves (the settle delay included), Acquire fails
// at once with ErrUnsent and WaitReady waits. List the primary first in
// Addrs, and set PairSettle (the URL's pair_settle) to at least the time
// the passive needs to declare its peer dead (two heartbeats): with less,
// the other node still answers M when the broker first comes to it, and
// the failover takes one more settle delay. Against a standalone node
// (role 1) or a cluster (role 3) none of this applies: the broker keeps a
// session per node as described under Connections.
//
// # Protocol versions
//
// The broker asks every node for protocol version 3, which adds EXTEND
// (Ticket.Refresh) and the cluster identity in HELLO_OK to version 2;
// version 2 adds CANCEL (drop one waiting ACQUIRE, the session lives on)
// and RELEASE_OWNED (release by token and owner) to version 1. A node that
// answers E(2) (an older server) is asked again at once with the next
// lower version (3, then 2, then 1; no backoff, not a refusal), and later
// sessions to that address ask for that version until a session of a
// version below 3 to it drops: the next session (after the usual backoff)
// asks for version 3 again, so that a node upgraded in a rolling upgrade
// (which restarts it, dropping its sessions) is used with version 3
// without restarting the application. Against a node still at version 2
// this costs one E(2) round trip per reconnect, two at version 1, never
// more: failed opens keep asking for the lower version (but for an E(2)
// to the version-1 HELLO, a refusal for good whose redial, after
// BackoffMax, asks for version 3). A HELLO_OK carrying another version
// than the one asked is a protocol error: the session is not used. What
// version 2 changes is what a cancellation after a possible send does
// (see Cancellation) and how a release is sent (see Release); version 3
// adds Refresh and KeepAlive (on a node of version 2 or 1 they are
// ErrUnsupported, nothing sent) and the identity check; everything else
// is the same in every version, and a version-1 session behaves exactly
// as before version 2 existed.
//
// # Cluster identity
//
// A version-3 HELLO_OK carries the identity of the node's replicated
// group: the ID of its Raft cluster or of its hot-standby pair (empty for
// a standalone node). The broker never uses two nodes with different
// identities as one service: it keeps to Config.Cluster (the URL's
// cluster=, which the TICKETING_URL printed by ticketingd init --cluster
// and --pair carries) or, without one, to the first non-empty identity it
// meets (decided once: of two sessions opening at once to two clusters,
// one is refused). A node with another identity (a node started with a
// wrong peer list forms a one-node cluster of its own; an address of
// another cluster listed by mistake) is a configuration error: its
// session is closed right after HELLO_OK, before any request, it is no
// failover target (a pair's settle delay passes it over), and it is
// redialled only after BackoffMax (a refusal for good: a fix is picked up
// then). The broker logs it at Error ("broker: node belongs to another
// cluster; not used": addr, node, cluster, want, configured), once per
// session until that session is ready. With no usable node left, the
// refusal is the cause of the error callers get: a *WrongClusterError
// matching ErrWrongCluster (a cause, no outcome of its own) inside
// Acquire's and Refresh's ErrUnsent and WaitReady's ErrNotReady (at once
// when every session is so refused). A node without an identity (a
// standalone server, or a server of protocol version 1 or 2, whose
// HELLO_OK carries none) is refused the same way when Config.Cluster is
// set, since nothing shows it belongs to that cluster: its
// *WrongClusterError has an empty Cluster, also matches
// ErrNoClusterIdentity, and says why (a standalone server, or the
// version it speaks); the log line is "broker: node has no cluster
// identity; not used". Without Config.Cluster such nodes are used (a
// standalone server's URL has no cluster=). So during an upgrade from
// servers of version 1 or 2, leave cluster= out of the URL until every
// node speaks version 3. Broker.Cluster returns the identity kept to.
//
// # Refresh and KeepAlive
//
// A lease is 1..250 s; Ticket.Refresh extends it (EXTEND, protocol
// version 3) with the ticket's key, token and owner, for a lease rounded
// up to whole seconds and checked as Acquire's (ErrInvalidArgument before
// anything is sent). The server keeps the lock for at least that lease
// from when it reads the EXTEND, never shortens it, never changes the
// token, and in a cluster or a pair answers only once the extension is
// replicated (a new leader restarts the lease from its refreshed length).
//
//	outcome                  error                     the deadline, and what to do
//	-----------------------  ------------------------  -------------------------------------------
//	kept (K)                 nil                       max(current, t1 + lease*0.99), t1 taken just
//	                                                    before the EXTEND may have been written
//	not held (N)             ErrNotHeld                no later than t1 (Remaining < 0, the fence
//	                                                    refuses); the lock is lost: stop the work
//	lost reply               ErrRefreshUnconfirmed     unchanged (never assumed extended); still
//	                                                    held until then; refresh again
//	never sent               ErrUnsent                 unchanged; safe to retry at once
//	older server             ErrUnsupported            unchanged; nothing sent (version 2 or 1)
//	released ticket          ErrNotHeld                unchanged; nothing sent
//	node not serving, E      ErrNotActive, *ServerError unchanged; not extended
//	bad lease                ErrInvalidArgument        unchanged; nothing sent
//
// Ticket.KeepAlive(ctx, lease) makes one refresh at once (its error is
// returned, and nothing is started, if it fails), then refreshes in the
// background whenever the deadline is within 0.99*lease - lease/3 (so
// about every lease/3), retrying a failed refresh every lease/30 (50 ms
// to 1 s). It returns a context derived from ctx that is cancelled as
// soon as the ticket can no longer be sure that it holds the lock, with
// context.Cause saying why: the deadline came within lease/3 (the margin)
// with no confirmed refresh (ErrLeaseEnding, the last refresh's error in
// its message); a refresh was answered N (ErrNotHeld); Release, Close or
// the drop safety net ran (ErrNotHeld, ErrClosed), before the RELEASE is
// sent; or ctx ended (ctx's cause). So the signal fires before the
// conservative deadline, which is itself no later than the server's lease
// end: work that stops when it fires stops before anyone else can be
// granted the key. The only delay is the scheduling of the keep-alive's
// goroutine, so keep the margin (a third of the lease) well above the
// pauses the process may see. Release, Close and the drop release wait
// for that goroutine; cancel ctx to stop refreshing while keeping the
// ticket. The fence (fence.CheckLease, an adapter's Run) reads Remaining
// at commit, so a refreshed ticket commits on its refreshed deadline.
//
// In a cluster or a hot-standby pair, take a KeepAlive lease of at least
// 4x the failover time (10 s or more with the default timeouts). With L
// the lease and t1 the send time of the last confirmed refresh, the
// deadline is t1 + 0.99*L, the next refresh is due at t1 + L/3 and the
// lost signal fires at t1 + 0.99*L - L/3: a refresh that falls due as a
// failover starts has about 0.32*L (less one retry interval, L/30) to get
// through, or the signal fires (ErrLeaseEnding) although the server may
// have kept the lock. A 6 s lease (1.7 s to spare) signalled a lost lock
// across a 2.4 s pair failover; a 10 s lease has 2.9 s. examples/longjob
// in the repository is a job longer than the lease, kept alive and
// fenced.
//
// # Errors: exactly one outcome
//
// Every error of this package matches exactly one outcome with errors.Is:
// one of the sentinels (ErrInvalidArgument, ErrInvalidConfig, ErrTimedOut,
// ErrBusy, ErrIndeterminate, ErrUnsent, ErrLeaseTooShort, ErrNotHeld,
// ErrReleaseUnconfirmed, ErrClosed, ErrUnauthorized, ErrNotActive,
// ErrNotReady, ErrCertificate, ErrTLSRequired, ErrServerNotTLS,
// ErrRefreshUnconfirmed, ErrUnsupported, ErrLeaseEnding), or a
// *ServerError for an E other than code 3. A cancelled call may also match ctx's error. The cause behind an
// outcome is in its message; it is matchable too only when it matches no
// outcome itself (a dial or x509 error is, and so is ErrWrongCluster; the "no ready session" behind an
// ErrReleaseUnconfirmed, or the *ServerError that ended the session behind
// an ErrIndeterminate, is not). So the sentinels can be tested in any order.
//
// # Acquire outcomes
//
// Arguments are rounded up to whole seconds and never clamped: wait 0..255 s
// (0 is one immediate try, never queued), lease 1..250 s, work budget
// 0..lease, key 1..255 bytes; anything else is ErrInvalidArgument before
// anything is sent. Every Acquire uses a fresh random 16-byte owner and is
// never resent.
//
//	outcome                  error                     what the caller should do
//	-----------------------  ------------------------  -------------------------------------------
//	granted                  nil, *Ticket              fence with Token, work, Release
//	granted, lease too short ErrLeaseTooShort          not held (compensating release made); retry
//	                                                    with a longer lease or smaller work budget
//	timed out (T)            ErrTimedOut               not granted; retry later if useful
//	busy (B)                 ErrBusy                   not granted (capacity); back off, then retry
//	node not serving (M)     ErrNotActive              not granted; retry (other nodes are used)
//	server error (E)         *ServerError              not granted; code 3 matches ErrUnauthorized
//	lost reply               ErrIndeterminate          may be held by the discarded owner until the
//	                                                    lease ends: do NOT enter the critical
//	                                                    section; a new Acquire may be refused until
//	                                                    then
//	never sent               ErrUnsent                 not granted; safe to retry at once
//	bad arguments            ErrInvalidArgument        fix the call; nothing was sent
//	closed                   ErrClosed                 the Broker was closed
//
// A Ticket is returned only when its conservative remaining time
// (Ticket.Deadline: t0 + (waited_ms + lease_s*1000)*0.99, t0 taken just
// before the ACQUIRE may have been written) is positive and at least the
// rounded work budget. The server's word is bounded: a waited_ms
// above the broker's own time since t0 is taken as that time, so the
// deadline never exceeds t0 + elapsed + lease, and a G with token 0 is a
// malformed reply (session-fatal; the ACQUIRE is Indeterminate).
//
// Indeterminate covers: the session dropped after a byte may have been
// written; the session turned fatal (an M or E naming another request, a
// malformed, oversized or unknown frame, an unknown req_id, a reply of the
// wrong type); no reply within wait plus ReplyGrace (the session is then
// closed); a cancellation after a possible send. A grant still read from
// the socket for an ACQUIRE whose caller has no Ticket (one cancelled after
// a possible send, or in flight when its session turned fatal) is released
// in the background, within the release window.
//
// # Release
//
// Ticket.Release sends RELEASE with the exact token; on a version-2 session
// it sends RELEASE_OWNED with the exact token and the owner of the ACQUIRE
// that was granted it, so that no other client can free the lock by
// guessing its token (compensating releases, Close and the drop safety net
// do the same). It retries, on any ready
// session, only within 5 s (absolute) of the call, and resends only after the
// session that carried it dropped, never after silence on a live session.
// nil means R (released); ErrNotHeld means N (expired, or no longer this
// token's); ErrReleaseUnconfirmed means that an attempt may have been sent
// and no final reply came within the window (never assumed success);
// ErrUnsent means that nothing was sent within the window (no ready
// session): definitely not released, the ticket is still held and Release
// may be called again. A second Release after any other result returns the
// first result and sends nothing. A RELEASE left unanswered on a live session is kept in the
// session's in-flight map so that a late reply is absorbed silently; if no
// reply comes within the window plus ReplyGrace, the session is closed (its
// caller was told ErrReleaseUnconfirmed long before, so nothing is resent).
// This bounds the entries kept for unanswered RELEASEs.
//
// A Release whose ctx ends before anything was sent returns ErrUnsent (plus
// ctx's error): the ticket is still held, may be released again, and is
// still released by Close or when dropped. If an earlier attempt may have
// been sent (its session dropped), the result is ErrReleaseUnconfirmed
// instead.
//
// Close releases every unreleased Ticket concurrently, best effort, within
// the same window, then closes the sessions; it returns within the window
// plus teardown. Release after Close returns the result of Close's release,
// or ErrClosed at once. A Ticket dropped without Release is released in the
// background when the garbage collector finds it (the second collection
// after its grant at the earliest), with a warning log: use Release when
// the result matters.
//
// # Cancellation
//
// Every blocking method takes a context. A cancelled call's error matches
// both an outcome sentinel and ctx's error (context.Canceled or
// context.DeadlineExceeded):
//
//   - cancelled before any byte of the ACQUIRE was handed to the socket
//     (including a request still in the write queue): ErrUnsent. A queued
//     request whose session drops moves to another session only if its
//     ctx has not ended; otherwise it is ErrUnsent with nothing sent;
//   - cancelled after a possible send, on a version-2 session: the result is
//     ErrIndeterminate, at once. The broker sends CANCEL for that ACQUIRE
//     (the server drops the queued wait and answers it T); the session and
//     every other request on it carry on. The ACQUIRE's req_id stays
//     reserved until its final reply; a G that still arrives (granted
//     before the server read the CANCEL) is released in the background by
//     token and owner. A server that never answers the ACQUIRE still has
//     the session closed at wait plus ReplyGrace;
//   - cancelled after a possible send, on a version-1 session (an older
//     server): the session is closed (the server then drops the queued
//     wait; the other requests on that session become Indeterminate or, if
//     unsent, move to another session) and the result is ErrIndeterminate;
//   - if the grant was already read when the cancel happened, a bounded
//     compensating release is started and the result is ErrIndeterminate,
//     never a Ticket;
//   - if T or B had already arrived, that outcome stands.
//
// On a version-1 session, give Acquire a context that lasts at least wait
// plus a margin: a cancellation there costs the other waiters of the
// session.
//
// # TLS
//
// Config.TLS.Mode: TLSOff (default), TLSSystemRoots (system trust store),
// TLSCAFile (only the CAs in CAFile, read and parsed by New: an unreadable or
// invalid file is an error there), TLSInsecureSkipVerify (no verification;
// for tests only). A CAFile selects TLSCAFile: with the mode unset it
// implies it, with another mode it is an error from New (ParseURL applies
// the same rule to ca=), so a CA file never ends in plain TCP. ServerName defaults to the host of each address. The
// client Token is sent in HELLO and never appears in errors or logs.
//
// # Concurrency
//
// A Broker and its Tickets are safe for concurrent use by any number of
// goroutines; create one Broker per application and share it. Close is
// idempotent and returns only after every goroutine of the Broker has
// exited.
package broker
