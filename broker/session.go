package broker

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// request is one ACQUIRE, RELEASE or EXTEND in flight. Requests are pooled; ch is
// signalled exactly once per use, after res is set, under conn.mu.
type request struct {
	typ    byte
	id     uint32
	key    []byte
	owner  [wire.OwnerLen]byte
	waitS  uint8
	leaseS uint8
	token  uint64
	// RELEASE: the end of its release window. The conn it is queued on
	// delivers an expired result at this instant (see expireReleases).
	deadline time.Time
	// frame is the encoded request, encoded by its caller outside the
	// conn's lock; enqueue writes the req_id into it. frameVer is the
	// protocol version it was encoded for: a RELEASE is U on a version-1
	// session and RELEASE_OWNED (V, with owner) on a version-2 one, and
	// is encoded again when a retry picks a session of the other version.
	frame    []byte
	frameVer uint8

	// Guarded by the conn's mu while the request is in its inflight table.
	sent bool // its bytes were handed to conn.Write
	// abandoned: the caller stopped waiting; the conn drops it on its
	// final reply. An abandoned ACQUIRE was cancelled on a version-2
	// session (see withdraw): a G for it is released.
	abandoned bool
	t0        time.Time // taken just before the Write that carried it
	replyBy   time.Time // ACQUIRE: t0 + wait + reply grace; RELEASE: t0 + release window + reply grace; EXTEND: t0 + reply grace

	ch  chan struct{}
	res result

	gen rand.ChaCha8 // ACQUIRE owners (see newOwner)
}

// result is the final outcome of a request on one session.
type result struct {
	typ      byte // the reply type; 0: the session ended without a reply
	token    uint64
	waitedMS uint32
	code     uint16
	msg      string // E message or M hint
	sent     bool   // whether any byte may have been sent
	expired  bool   // RELEASE: its window ended with no final reply
	t0       time.Time
	cause    error // for typ 0: why the session ended
}

// session is one slot of the broker: one address, re-opened in the
// background. cur is the open, ready connection, or nil.
type session struct {
	b    *Broker
	idx  int
	addr string
	node *node // shared by the sessions of one address
	tls  *tls.Config
	cur  atomic.Pointer[conn]
	// poke cuts the session's backoff short: another session was told by
	// its node (M) that this session's address serves (see followHint).
	poke chan struct{}
	// probed: the latest poke was a probe (see probeOthers), not a hint:
	// the backoff restarts, but the session still passes its own M hints on.
	probed atomic.Bool
	// notTLS: a TLS probe of this plain-TCP session's address found no TLS
	// server (see tlsRequired); no other probe until a HELLO succeeds.
	// Used by the session's own goroutine only.
	notTLS bool

	// Guarded by b.mu: the refusal for good of the latest attempt to open
	// the session (nil: it was not refused for good), and when it came.
	refused   error
	refusedAt time.Time

	// pairSeen, guarded by pair.mu: the node's nodePair.became when this
	// session last started an attempt (see pair.wait).
	pairSeen uint64
}

// maxVersion is the protocol version the broker asks every node for
// first.
const maxVersion = wire.Version3

// node is what the sessions of one address share: the protocol version to
// ask it for. Every node is asked for version 3 (maxVersion) until it
// answers E(2) to a HELLO; from then on its sessions open with the next
// lower version at once (3, then 2, then 1), until a session to it of a
// version below 3 drops (a node restarts when it is upgraded): the next
// session to it asks for version 3 again (docs/protocol.md, "Version 2
// additions" and "Version 3 additions"). So a rolling upgrade is picked up
// without restarting the application, at the cost of one E(2) round trip
// per reconnect to a node at version 2, two to one at version 1. A failed
// open does not clear the fallback, except an E(2) to the version-1 HELLO,
// a refusal for good redialled after BackoffMax: E(2) and the lower
// versions' retries cannot alternate faster than that.
type node struct {
	// ask is the version the node's next session asks for.
	ask atomic.Uint32
	// fbLogged is the lowest version a fallback to which was logged at
	// Info since the node's last version-3 session (0: none): later
	// fallbacks to it or above are no news (Debug).
	fbLogged atomic.Uint32
	// foreign: the node's latest HELLO_OK carried another cluster's
	// identity (see Broker.checkCluster). It is no failover target of a
	// pair (see pair.settledLocked) until a session to it opens.
	foreign atomic.Bool
	// p is the node's address and its counts for the pair (see pair),
	// guarded by pair.mu.
	p nodePair
}

// version returns the version the next session to the node asks for.
func (n *node) version() uint8 { return uint8(n.ask.Load()) }

// fellBack records that the node answered E(2) to a HELLO of version ver
// (above 1): its sessions ask for ver-1 from now on. It reports whether
// this call moved the version (the node's other session may have done so
// first), and the level to log it at: Info unless a fallback to ver-1 or
// lower was logged at Info since the node's last version-3 session.
func (n *node) fellBack(ver uint8) (bool, slog.Level) {
	if !n.ask.CompareAndSwap(uint32(ver), uint32(ver-1)) {
		return false, slog.LevelDebug
	}
	for {
		old := n.fbLogged.Load()
		if old != 0 && old <= uint32(ver-1) {
			return true, slog.LevelDebug // known already: not news
		}
		if n.fbLogged.CompareAndSwap(old, uint32(ver-1)) {
			return true, slog.LevelInfo
		}
	}
}

// lostGrant is an ACQUIRE possibly sent whose caller will never get its
// Ticket: a G for it is released by token and, on a version-2 session,
// owner.
type lostGrant struct {
	key   string
	owner [wire.OwnerLen]byte
}

// conn is one open connection of a session, from HELLO_OK to its end.
type conn struct {
	b   *Broker
	s   *session
	nc  net.Conn // what we read and write (TLS or raw)
	raw net.Conn // the TCP conn, closed to tear down at once
	br  *bufio.Reader
	// version is the protocol version of the session (the HELLO_OK's,
	// equal to the one asked for).
	version uint8
	// nodeName is the node name of the HELLO_OK, for logs.
	nodeName string
	// cluster is the group identity of a version-3 HELLO_OK (empty:
	// standalone, or a version below 3).
	cluster string
	// role is the HELLO_OK's role (wire.RoleStandalone, RoleActive,
	// RoleLeader): role 2 turns the broker's pair mode on (see pair).
	role   uint8
	done   chan struct{}
	wake   chan struct{}
	isDead atomic.Bool
	qlen   atomic.Int32 // len(queue), for the writer's batching heuristic

	mu       sync.Mutex
	closed   bool
	err      error
	inflight reqTable
	queue    []*request
	nextID   uint32
	// cancelled: after the conn closed, the ACQUIREs that were possibly
	// sent and had no final reply, by req_id (a G still read is released).
	cancelled map[uint32]lostGrant
	// cancels: req_ids of version-2 ACQUIREs cancelled by their callers,
	// for the writer to send CANCEL for.
	cancels  []uint32
	pingWant bool
	pingOut  bool
	pingID   uint32
	pingSent time.Time // when the PING fell due (not when it was written)
	lastPing time.Time
	wbuf     []byte
	// One timer per conn bounds the waits of its RELEASEs: armed for the
	// earliest window end among them (relAt; zero: not armed), it is
	// touched only when a RELEASE with an earlier end is queued, not once
	// per RELEASE.
	relTimer *time.Timer
	relAt    time.Time
}

// run is the session's manager goroutine: open, serve, reopen with backoff.
//
// What it logs: at Info a session becoming ready (address, the node's
// name, the protocol version and, after a drop or failed attempts, how
// long it was not ready and in how many attempts); at Warn a drop, once,
// with its cause; failed opens as outage.failed says, so that a long
// outage costs a bounded number of lines.
func (s *session) run() {
	b := s.b
	defer b.wg.Done()
	attempt := 0
	// hinted: since its last ready session, this session was poked (see
	// followHint): its backoff restarted at BackoffMin, and its own M
	// hints are not passed on.
	hinted := false
	out := outage{since: time.Now()}
	for b.ctx.Err() == nil {
		// Only the addresses the pair rule allows are dialled (see pair):
		// every one as before, until a node answers as the active of a
		// pair.
		ok, swung := b.pair.wait(s)
		if !ok {
			return
		}
		if swung {
			// The pair moved to this node: its backoff restarts (see
			// pair.wait).
			attempt = 0
		}
		select { // a poke during the attempt below is for a later backoff
		case <-s.poke:
		default:
		}
		ver := s.node.version()
		c, err := s.open(ver)
		if err != nil {
			fallback := ver > wire.Version1 && versionRefused(err)
			inPair := b.pair.failed(s, err, fallback)
			if b.ctx.Err() != nil {
				return
			}
			if fallback {
				// A node of an older version: not a failure, and no
				// refusal for good. Its sessions ask for the next lower
				// version until one of them drops (see node), this one
				// at once.
				if moved, lvl := s.node.fellBack(ver); moved {
					b.log.Log(b.ctx, lvl, fmt.Sprintf("broker: node does not speak protocol version %d; using version %d", ver, ver-1), "addr", s.addr)
				}
				continue
			}
			if ver == wire.Version1 && versionRefused(err) {
				// Version 1 refused too: the node may have been replaced
				// by one that dropped version 1 while this session was
				// down. A refusal for good (redialled after BackoffMax),
				// whose next HELLO asks for version 3 again.
				s.node.ask.Store(maxVersion)
			}
			refused := refusedForGood(err)
			b.openFailed(s, err, refused)
			out.failed(s, err, refused)
			if !hinted && !inPair {
				// A session sent here by another's hint does not pass its
				// own M hint on: two standbys naming each other cannot
				// make their sessions redial each other without backoff.
				// (In pair mode the pair follows hints.)
				s.followHint(err)
			}
			d := s.backoff(attempt)
			if inPair {
				// The pair's target is retried at the pair's pace (see
				// pair.retryPace): a passive takes over at the first HELLO
				// after its peer went silent, and only this node is dialled.
				d = min(d, jitter(b.pair.retryPace()))
			}
			if refused {
				// Retrying soon cannot help; retrying at all lets a fix on
				// the server side (the token added) be picked up.
				d = s.backoffMax()
				attempt = maxAttempt
			}
			b.pauseChosen(s, pauseChoice{attempt: attempt, swung: swung, inPair: inPair, d: d})
			ok, poked := s.pause(d)
			if !ok {
				return
			}
			if poked {
				// The hinted node may be about to serve (a new leader
				// starting up): retry it from the shortest backoff. A
				// probe restarts the backoff too, but is no hint.
				hinted, attempt = hinted || !s.probed.Swap(false), 0
			} else if attempt < maxAttempt {
				attempt++
			}
			continue
		}
		if !b.pair.opened(s, c) { // sets s.cur if it is used
			// In pair mode, a node that is not the active: not used.
			// It waits in pair.wait until its node becomes the target.
			c.raw.Close()
			b.setLastErr(s.errorf(nil, "not used: another node is the active of the pair"))
			continue
		}
		opened := time.Now()
		if c.version >= maxVersion {
			s.node.fbLogged.Store(0)
		}
		s.node.foreign.Store(false)
		hinted = false
		b.signalReady(s)
		attrs := []any{"addr", s.addr, "session", s.idx, "node", c.nodeName, "version", c.version}
		if c.cluster != "" {
			attrs = append(attrs, "cluster", c.cluster)
		}
		if out.dropped || out.failures > 0 {
			attrs = append(attrs, "down_for", opened.Sub(out.since).Round(time.Millisecond), "attempts", out.failures+1)
		}
		b.log.Info("broker: session ready", attrs...)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); c.readLoop() }()
		go func() { defer wg.Done(); c.writeLoop() }()
		c.scanLoop()
		s.cur.CompareAndSwap(c, nil)
		wg.Wait()
		inPair := b.pair.dropped(s, c.err)
		if b.ctx.Err() != nil {
			return
		}
		dropped := time.Now()
		b.setLastErr(c.err)
		b.log.Warn("broker: session dropped", "addr", s.addr, "session", s.idx, "node", c.nodeName, "version", c.version,
			"up_for", dropped.Sub(opened).Round(time.Millisecond), "err", c.err)
		out = outage{since: dropped, dropped: true}
		if c.version < maxVersion {
			// The node may come back upgraded (a restart drops every
			// session): its next session asks for version 3 again, once,
			// and after the backoff below, not at once.
			s.node.ask.Store(maxVersion)
		}
		// A session that lived at least BackoffMax resets the backoff; one
		// that dropped sooner (a flapping node) keeps it growing.
		if dropped.Sub(opened) >= b.set.BackoffMax {
			attempt = 0
		}
		// A node that stopped serving ended the session with M: its hint
		// names the new serving node, whose session need not wait out its
		// backoff. A serving node lost without a hint (killed, partitioned,
		// or an M naming no node) makes every other node's session try
		// again at once: one of them may be the new leader, and their
		// backoff grew while they answered M.
		// In pair mode the pair decides instead: the lost active is
		// retried alone for the settle delay (see pair).
		if !inPair && !s.followHint(c.err) {
			s.probeOthers()
		}
		d := s.backoff(attempt)
		if inPair {
			d = min(d, jitter(b.pair.retryPace())) // the lost active: see pair.retryPace
		}
		b.pauseChosen(s, pauseChoice{attempt: attempt, inPair: inPair, dropped: true, d: d})
		ok, poked := s.pause(d)
		if !ok {
			return
		}
		if poked {
			hinted, attempt = hinted || !s.probed.Swap(false), 0
		} else if attempt < maxAttempt {
			attempt++
		}
	}
}

// pauseChoice is a pause the run loop chose before reopening a session,
// for a test hook (see Broker.onPause): the decision, apart from the
// clock and the scheduler.
type pauseChoice struct {
	attempt int  // the backoff's attempt counter it was computed from
	swung   bool // the failed attempt followed a swing of the pair to the session's node
	inPair  bool // pair mode: bounded by the pair's retry pace
	dropped bool // after a ready session dropped (not a failed open)
	d       time.Duration
}

// pauseChosen passes c to the test hook, if one is set.
func (b *Broker) pauseChosen(s *session, c pauseChoice) {
	if f := b.onPause.Load(); f != nil {
		(*f)(s, c)
	}
}

// pause waits d, or until a poke (see followHint), or until the broker
// closes (ok false). poked says that a poke cut it short.
func (s *session) pause(d time.Duration) (ok, poked bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true, false
	case <-s.poke:
		return true, true
	case <-s.b.ctx.Done():
		return false, false
	}
}

// followHint follows the hint of an M that err carries (a HELLO answered
// with M, or a session ended by M): the sessions to the hinted address, if
// it is one of Addrs and another node than s's, redial at once instead of
// at the end of their backoff. A hint naming an address not in Addrs is
// not followed (logged once per broker at Warn): the broker talks only to
// the nodes it was given, with their TLS settings, so that no node can
// send it elsewhere; list every node of the cluster in Addrs.
//
// It reports whether err carried a hint that names one of Addrs.
func (s *session) followHint(err error) bool {
	var na *NotActiveError
	if !errors.As(err, &na) || na.Hint == "" {
		return false
	}
	h, nerr := normalizeAddr(na.Hint)
	if nerr != nil {
		return false
	}
	found, poked := false, false
	for _, o := range s.b.sessions {
		if o.addr != h {
			continue
		}
		found = true
		if o.node == s.node {
			continue // a node naming itself: nothing to follow
		}
		poked = true
		select {
		case o.poke <- struct{}{}:
		default:
		}
	}
	if poked {
		s.b.log.Debug("broker: following M hint: its sessions redial now", "addr", s.addr, "session", s.idx, "hint", h)
	}
	if !found && s.b.hintWarned.CompareAndSwap(false, true) {
		s.b.log.Warn("broker: M hint names an address not in Addrs; not followed (list every node in Addrs)", "addr", s.addr, "hint", na.Hint)
	}
	return found
}

// probeOthers makes the sessions to every other node redial at once, from
// the shortest backoff (once per lost serving session: a probe is not
// passed on, so it cannot loop).
func (s *session) probeOthers() {
	for _, o := range s.b.sessions {
		if o.node == s.node {
			continue
		}
		o.probed.Store(true)
		select {
		case o.poke <- struct{}{}:
		default:
		}
	}
}

// outage is a session's time without a ready session: from New, or from
// its last drop, to the next ready session.
type outage struct {
	since    time.Time
	dropped  bool      // it began with a drop (not at New)
	failures int       // failed opens (an E(2) fallback is none)
	lastWarn time.Time // the latest Warn line about it (zero: none)
	// refusedWarned: a refusal for good was logged at Warn (or, for a
	// node of another cluster, at Error).
	refusedWarned bool
}

// stillDownFactor: during an outage, failed opens are summarised at Warn
// at most once per stillDownFactor*BackoffMax (50 s with the defaults).
const stillDownFactor = 10

// failed logs a failed open of s. An M naming the serving node (hint) is
// no failure here: it is logged at Debug only, whatever the outage. At
// Warn: the first failure after New (a
// wrong address or a server down shows at once; after a drop, the drop
// line said it already), the first refusal for good of the outage (the
// token or certificate needs a fix), and a summary ("still down", with
// the attempts so far, how long, the latest error) once the outage, or
// the time since the latest Warn line, reaches stillDownFactor*BackoffMax.
// Every other failure is logged at Debug. So a server restart shorter
// than that logs no failure at all, and an outage of length T logs at
// most 2 + T/(stillDownFactor*BackoffMax) lines per session (the ready or
// drop line included; one more with a refusal for good).
func (o *outage) failed(s *session, err error, refused bool) {
	b := s.b
	o.failures++
	var na *NotActiveError
	if errors.As(err, &na) && na.Hint != "" {
		// A node that answers M naming the serving node (a follower, a
		// standby) is the normal state of a cluster's other sessions, not
		// a failure: no Warn, now or as "still down".
		b.log.Debug("broker: HELLO answered M: node not active", "addr", s.addr, "session", s.idx, "hint", na.Hint, "attempts", o.failures)
		return
	}
	now := time.Now()
	ref := o.since
	if !o.lastWarn.IsZero() {
		ref = o.lastWarn
	}
	var wc *WrongClusterError
	if errors.As(err, &wc) && !o.refusedWarned && wc.Cluster == "" {
		// A configuration error: at Error, naming the identity wanted.
		o.lastWarn, o.refusedWarned = now, true
		b.log.Error("broker: node has no cluster identity; not used", "addr", s.addr, "session", s.idx, "node", wc.Node,
			"version", wc.Version, "want", wc.Want, "configured", wc.Configured, "attempts", o.failures)
		return
	}
	if errors.As(err, &wc) && !o.refusedWarned {
		// A configuration error: at Error, naming both identities.
		o.lastWarn, o.refusedWarned = now, true
		b.log.Error("broker: node belongs to another cluster; not used", "addr", s.addr, "session", s.idx, "node", wc.Node,
			"cluster", wc.Cluster, "want", wc.Want, "configured", wc.Configured, "attempts", o.failures)
		return
	}
	switch {
	case (o.failures == 1 && !o.dropped) || (refused && !o.refusedWarned):
		o.lastWarn = now
		o.refusedWarned = o.refusedWarned || refused
		b.log.Warn("broker: session open failed", "addr", s.addr, "session", s.idx, "attempts", o.failures, "for_good", refused, "err", err)
	case now.Sub(ref) >= stillDownFactor*b.set.BackoffMax:
		o.lastWarn = now
		b.log.Warn("broker: session still down", "addr", s.addr, "session", s.idx,
			"down_for", now.Sub(o.since).Round(time.Millisecond), "attempts", o.failures, "for_good", refused, "err", err)
	default:
		b.log.Debug("broker: session open failed", "addr", s.addr, "session", s.idx, "attempts", o.failures, "for_good", refused, "err", err)
	}
}

// maxAttempt caps the attempt counter of the backoff (2^62 is beyond any
// BackoffMax/BackoffMin).
const maxAttempt = 62

// backoff is min(max, min*2^attempt), half of it random jitter.
func (s *session) backoff(attempt int) time.Duration {
	cfg := s.b.set
	d := cfg.BackoffMin
	for i := 0; i < attempt && d < cfg.BackoffMax; i++ {
		if d > cfg.BackoffMax/2 {
			d = cfg.BackoffMax
		} else {
			d *= 2
		}
	}
	return jitter(min(d, cfg.BackoffMax))
}

// backoffMax is the backoff at its cap, BackoffMax, half of it jitter.
func (s *session) backoffMax() time.Duration { return jitter(s.b.set.BackoffMax) }

func jitter(d time.Duration) time.Duration {
	half := d / 2
	return half + rand.N(half+1)
}

// versionRefused reports whether a failed open was the server's E(2).
func versionRefused(err error) bool {
	var se *ServerError
	return errors.As(err, &se) && se.Code == wire.CodeVersion
}

// refusedForGood reports whether a failed open is a refusal that retrying
// cannot cure (see WaitReady): the client token refused (E code 3), the
// protocol version refused (E code 2 to a version-1 HELLO: to a higher
// one, it makes the node's next session ask for the next lower version,
// see run), the server's certificate rejected, TLS against a plain-TCP
// server or plain TCP against a TLS one, or a node of another cluster.
func refusedForGood(err error) bool {
	var se *ServerError
	if errors.As(err, &se) {
		return se.Code == wire.CodeUnauthorized || se.Code == wire.CodeVersion
	}
	return errors.Is(err, ErrCertificate) || errors.Is(err, ErrTLSRequired) || errors.Is(err, ErrServerNotTLS) || errors.Is(err, ErrWrongCluster)
}

func (s *session) errorf(cause error, format string, args ...any) error {
	return &sessionError{addr: s.addr, msg: fmt.Sprintf(format, args...), cause: cause}
}

// open dials, runs the TLS handshake and HELLO asking for protocol
// version ver, within DialTimeout.
func (s *session) open(ver uint8) (*conn, error) {
	b := s.b
	ctx, cancel := context.WithTimeout(b.ctx, b.set.DialTimeout)
	defer cancel()
	raw, err := b.set.Dialer(ctx, "tcp", s.addr)
	if err != nil {
		return nil, s.errorf(err, "dial")
	}
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	c, err := s.handshake(ctx, raw, ver)
	if !stop() || err != nil {
		raw.Close()
		if err == nil {
			err = s.errorf(ctx.Err(), "handshake")
		}
		return nil, err
	}
	return c, nil
}

func (s *session) handshake(ctx context.Context, raw net.Conn, ver uint8) (*conn, error) {
	b := s.b
	nc := raw
	if s.tls != nil {
		tc := tls.Client(raw, s.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			var cv *tls.CertificateVerificationError
			var rh tls.RecordHeaderError
			switch {
			case errors.As(err, &cv):
				err = newErr(ErrCertificate, "", err)
			case errors.As(err, &rh):
				// The server answered the ClientHello with bytes that
				// are not a TLS record: it speaks plain TCP. Retrying
				// cannot cure it.
				err = newErr(ErrServerNotTLS, "it answered the TLS handshake with bytes that are not TLS (it speaks plain TCP): start it with TLS (ticketingd serve --tls-cert and --tls-key, as ticketingd init configures it), or, on a trusted network only, connect without TLS (no ca= or tls= in the URL)", err)
			}
			return nil, s.errorf(err, "TLS handshake (mode %s)", b.set.TLS.Mode)
		}
		nc = tc
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	frame, err := wire.AppendRequest(nil, &wire.Request{
		Type: wire.TypeHello, ReqID: 1, Version: ver,
		AuthToken: []byte(b.set.Token), Name: []byte(b.set.Name),
	})
	if err != nil {
		return nil, s.errorf(err, "encoding HELLO")
	}
	if _, err := nc.Write(frame); err != nil {
		return nil, s.errorf(err, "sending HELLO")
	}
	br := bufio.NewReaderSize(nc, 64<<10)
	var nodeName, cluster string
	var role uint8
	body, err := wire.NewReader(br).Next()
	if err != nil {
		if s.tls == nil && closedUnanswered(err) && s.tlsRequired(ctx) {
			return nil, s.errorf(newErr(ErrTLSRequired, "the server closed the plain-TCP connection after the HELLO and speaks TLS: give its CA in the URL (ca=PATH, the ca.pem that ticketingd init writes) or tls=system", err), "reading HELLO reply")
		}
		return nil, s.errorf(err, "reading HELLO reply")
	}
	s.notTLS = false
	var resp wire.Response
	if err := wire.DecodeResponse(body, &resp); err != nil {
		return nil, s.errorf(err, "HELLO reply")
	}
	switch resp.Type {
	case wire.TypeHelloOK:
		if resp.ReqID != 1 {
			return nil, s.errorf(nil, "HELLO_OK with req_id %d", resp.ReqID)
		}
		if resp.Version != ver {
			// A server answers with the version asked for, or E(2).
			return nil, s.errorf(nil, "protocol error: HELLO_OK with version %d to a version-%d HELLO", resp.Version, ver)
		}
		nodeName, role, cluster = string(resp.Node), resp.Role, string(resp.Cluster)
		if err := b.checkCluster(s, nodeName, cluster, ver); err != nil {
			// Before the session is used: nothing is sent on it.
			return nil, s.errorf(err, "HELLO_OK")
		}
	case wire.TypeError:
		return nil, s.errorf(&ServerError{Code: resp.Code, Message: string(resp.Msg)}, "%s", helloRefused(resp.Code, b.set.Token != ""))
	case wire.TypeNotActive:
		return nil, s.errorf(&NotActiveError{Hint: string(resp.Hint)}, "HELLO")
	default:
		return nil, s.errorf(nil, "unexpected reply %q to HELLO", resp.Type)
	}
	nc.SetDeadline(time.Time{})
	return &conn{
		b: b, s: s, nc: nc, raw: raw, br: br,
		version:   ver,
		nodeName:  nodeName,
		cluster:   cluster,
		role:      role,
		done:      make(chan struct{}),
		wake:      make(chan struct{}, 1),
		nextID:    1,
		lastPing:  time.Now(),
		cancelled: map[uint32]lostGrant{},
	}, nil
}

// helloRefused is the message of a HELLO answered with E(code): for
// E(3), whether a client token was sent and what to do about it.
func helloRefused(code uint16, tokenSent bool) string {
	switch {
	case code != wire.CodeUnauthorized:
		return "HELLO refused"
	case tokenSent:
		return "HELLO refused: the client token sent was refused: it is not in the server's client-tokens file (check the token in the URL, ticketing://TOKEN@host)"
	default:
		return "HELLO refused: no token was sent: put it in the URL as ticketing://TOKEN@host (the server requires a client token)"
	}
}

// closedUnanswered reports whether reading the HELLO reply failed because
// the server closed the connection before any byte of an answer: what a
// TLS server does with a plain-TCP client's HELLO ("first record does not
// look like a TLS handshake"): it closes without an alert, and the
// client reads EOF, or a reset because the rest of its HELLO was unread.
func closedUnanswered(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// tlsRequired reports whether the server at s.addr speaks TLS, by a TLS
// handshake on a connection of its own, closed right after it (nothing is
// sent on it, so its certificate is not verified). It is asked only when
// a plain-TCP HELLO was closed unanswered, which a plain ticketingd does
// only at its limits (max-pending-conns, the auth throttle) or when it
// stops: such a server answers a TLS ClientHello with an E frame or a
// close, not a handshake, so the answer is false. A false answer is kept
// (s.notTLS) until a HELLO succeeds, so that a plain server at its limits
// gets no probe per attempt; a true one is asked again at the next
// attempt, after BackoffMax (a refusal for good).
func (s *session) tlsRequired(ctx context.Context) bool {
	if s.notTLS {
		return false
	}
	raw, err := s.b.set.Dialer(ctx, "tcp", s.addr)
	if err != nil {
		return false // cannot tell
	}
	defer raw.Close()
	host, _, _ := net.SplitHostPort(s.addr)
	tc := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, ServerName: host}) //nolint:gosec // a probe: nothing is sent on it
	err = tc.HandshakeContext(ctx)
	var alert tls.AlertError
	if err == nil || errors.As(err, &alert) {
		return true // a TLS server: it completed a handshake, or sent a TLS alert
	}
	if ctx.Err() == nil {
		s.notTLS = true
	}
	return false
}

// allocID returns a req_id not awaiting a reply (never 0). Called under mu.
func (c *conn) allocID() uint32 {
	for {
		c.nextID++
		id := c.nextID
		if id == 0 || (c.pingOut && id == c.pingID) {
			continue
		}
		// Ids wrap around: skip one still awaiting its reply (a cancelled
		// version-2 ACQUIRE included: it stays in the table until its
		// final reply), or whose slot is taken (the next id will do). The
		// ids in c.cancelled need no check: entries are added only as the
		// conn closes, and a closed conn allocates no more ids.
		if !c.inflight.free(id) {
			continue
		}
		return id
	}
}

// enqueue queues r for the writer. It reports false if the conn is closed.
func (c *conn) enqueue(r *request) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.inflight.reserve()
	r.id = c.allocID()
	wire.PutReqID(r.frame, r.id)
	r.sent, r.abandoned = false, false
	c.inflight.put(r)
	c.queue = append(c.queue, r)
	c.qlen.Store(int32(len(c.queue)))
	first := len(c.queue) == 1
	if r.typ == wire.TypeRelease && (c.relAt.IsZero() || r.deadline.Before(c.relAt)) {
		c.armReleasesLocked(r.deadline)
	}
	c.mu.Unlock()
	// With woken callers still to run, the last of them wakes the writer
	// (Broker.consumed). qlen was stored before woken is loaded here, and
	// consumed loads qlen after its decrement: one of the two sees the
	// other, so the request is never left unwritten.
	if first && c.b.woken.Load() <= 0 {
		c.wakeWriter()
	}
	return true
}

func (c *conn) wakeWriter() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Outcomes of withdraw.
const (
	withdrawnUnsent    = iota // removed before any byte was written
	withdrawnSent             // removed after a possible send
	withdrawnCancelled        // a version-2 ACQUIRE: CANCEL sent, r is the conn's now
	alreadyDone               // a result was delivered; read r.ch
)

// withdraw takes r back from the conn when its caller stops waiting.
//
// With cancel (an ACQUIRE), one possibly sent is cancelled. On a
// version-2 session the writer sends CANCEL for it, and r stays in the
// in-flight table, abandoned, until its final reply: its req_id stays
// reserved, a T or B is absorbed, a G is released by token and owner
// (dispatchLocked). The session and every other request on it are
// untouched. On a version-1 session it is recorded as cancelled and the
// session is closed (the server then drops its queued wait).
//
// Without cancel (a RELEASE), one possibly sent is left to the conn,
// abandoned, so that its reply is absorbed.
func (c *conn) withdraw(r *request, cancel bool, why error) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight.get(r.id) != r || r.abandoned {
		return alreadyDone // abandoned: its window ended, an expired result is in r.ch
	}
	if !r.sent {
		c.inflight.del(r)
		c.unqueueLocked(r)
		return withdrawnUnsent
	}
	if cancel && c.version >= wire.Version2 {
		r.abandoned = true
		c.cancels = append(c.cancels, r.id)
		c.wakeWriter()
		return withdrawnCancelled
	}
	if cancel {
		c.inflight.del(r)
		c.cancelled[r.id] = lostGrant{key: string(r.key), owner: r.owner}
		// why (the caller's ctx error) only in the text: the other
		// requests failed with this error were not cancelled.
		c.failLocked(c.s.errorf(nil, "closed after cancelling a possibly sent ACQUIRE (%v)", why))
	} else {
		r.abandoned = true
	}
	return withdrawnSent
}

func (c *conn) unqueueLocked(r *request) {
	for i, q := range c.queue {
		if q == r {
			c.queue = append(c.queue[:i], c.queue[i+1:]...)
			c.queue = c.queue[:len(c.queue):len(c.queue)]
			c.qlen.Store(int32(len(c.queue)))
			return
		}
	}
}

func (c *conn) armReleasesLocked(at time.Time) {
	c.relAt = at
	if c.relTimer == nil {
		c.relTimer = time.AfterFunc(time.Until(at), c.expireReleases)
	} else {
		c.relTimer.Reset(time.Until(at))
	}
}

// expireReleases runs when the earliest release window of the conn may
// have ended: every RELEASE whose window has ended gets an expired result
// (a sent one stays in the map, abandoned, to absorb a late reply; an
// unsent one is removed), and the timer is re-armed for the next end.
func (c *conn) expireReleases() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	now := time.Now()
	var next time.Time
	for _, r := range c.inflight.slots {
		if r == nil || r.typ != wire.TypeRelease || r.abandoned {
			continue
		}
		if now.Before(r.deadline) {
			if next.IsZero() || r.deadline.Before(next) {
				next = r.deadline
			}
			continue
		}
		if r.sent {
			r.abandoned = true // the conn keeps it; its caller must not reuse it
		} else {
			c.inflight.del(r)
			c.unqueueLocked(r)
		}
		r.deliver(c.b, result{expired: true, sent: r.sent, t0: r.t0})
	}
	c.relAt = time.Time{}
	if !next.IsZero() {
		c.armReleasesLocked(next)
	}
}

// deliver hands res to r's caller, which receives it with Broker.await
// or Broker.recv.
func (r *request) deliver(b *Broker, res result) {
	b.woken.Add(1) // before the caller can receive it and take it off
	r.handOver(res)
}

// handOver is deliver for a result already counted in Broker.woken.
func (r *request) handOver(res result) {
	r.res = res
	r.ch <- struct{}{}
}

func (c *conn) fail(err error) {
	c.mu.Lock()
	c.failLocked(err)
	c.mu.Unlock()
}

// failLocked ends the conn: every request still in it gets a "session
// lost" result that says whether it may have been sent.
func (c *conn) failLocked(err error) {
	if c.closed {
		return
	}
	c.closed = true
	c.isDead.Store(true)
	c.err = err
	close(c.done)
	if c.relTimer != nil {
		c.relTimer.Stop()
	}
	c.raw.Close()
	for _, r := range c.inflight.slots {
		if r == nil {
			continue
		}
		if r.sent && r.typ == wire.TypeAcquire {
			// Its caller gets (or, cancelled on a version-2 session, has
			// had) Indeterminate; a grant for it still read from the
			// socket is released (see dispatch).
			c.cancelled[r.id] = lostGrant{key: string(r.key), owner: r.owner}
		}
		if r.abandoned {
			continue
		}
		r.deliver(c.b, result{sent: r.sent, t0: r.t0, cause: err})
	}
	c.inflight.clear()
	c.queue = nil
	c.cancels = nil
}

func (c *conn) writeLoop() {
	for {
		select {
		case <-c.wake:
		case <-c.done:
			return
		}
		// Let the goroutines that are about to enqueue do so: one Write
		// then carries many frames. Yield again while the queue still
		// grows (a yield costs far less than a loopback write), a few
		// times at most. (Callers woken by a batch of replies need no
		// yield: the last of them wakes the writer, see Broker.woken.)
		for n, i := c.qlen.Load(), 0; i < 5; i++ {
			runtime.Gosched()
			m := c.qlen.Load()
			if m <= n {
				break
			}
			n = m
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		buf := c.wbuf[:0]
		now := time.Now()
		for _, r := range c.queue {
			buf = append(buf, r.frame...)
			r.sent = true
			r.t0 = now
			switch r.typ {
			case wire.TypeAcquire:
				r.replyBy = now.Add(time.Duration(r.waitS)*time.Second + c.b.set.ReplyGrace)
			case wire.TypeExtend:
				r.replyBy = now.Add(c.b.set.ReplyGrace)
			default:
				r.replyBy = now.Add(c.b.set.Config.ReleaseWindow + c.b.set.ReplyGrace)
			}
		}
		clear(c.queue)
		c.queue = c.queue[:0]
		c.qlen.Store(0)
		// Each ACQUIRE cancelled was in an earlier Write (it was sent):
		// its CANCEL follows it on the stream.
		for _, id := range c.cancels {
			buf = wire.AppendCancel(buf, id)
		}
		c.cancels = c.cancels[:0]
		if c.pingWant && !c.pingOut {
			c.pingWant = false
			c.pingID = c.allocID()
			c.pingOut = true
			buf = wire.AppendSimple(buf, wire.TypePing, c.pingID)
		}
		c.wbuf = buf
		c.mu.Unlock()
		if len(buf) == 0 {
			continue
		}
		if _, err := c.nc.Write(buf); err != nil {
			c.fail(c.s.errorf(err, "write"))
			return
		}
		if cap(buf) > 64<<10 {
			c.mu.Lock()
			c.wbuf = nil
			c.mu.Unlock()
		}
	}
}

func (c *conn) readLoop() {
	var resp wire.Response
	var ready []delivery // reader-owned, reused
	for {
		n, err := c.peekFrame(true)
		if err != nil {
			if errors.Is(err, wire.ErrFrameSize) {
				c.fail(c.s.errorf(err, "oversized or empty reply frame"))
			} else {
				c.fail(c.s.errorf(err, "read"))
			}
			return
		}
		// Dispatch this frame and every further whole frame already
		// buffered under one lock; results are delivered after it.
		c.mu.Lock()
		bad := false
		for n > 0 {
			body, _ := c.br.Peek(wire.HeaderLen + n)
			if err := wire.DecodeResponse(body[wire.HeaderLen:], &resp); err != nil {
				c.failLocked(c.s.errorf(err, "bad reply"))
				bad = true
				break
			}
			// After the session ends, keep draining what was already read:
			// a grant for a cancelled ACQUIRE must still be compensated.
			ready = c.dispatchLocked(&resp, ready)
			c.br.Discard(wire.HeaderLen + n)
			if len(ready) >= maxDispatchBatch {
				break
			}
			n, _ = c.peekFrame(false)
		}
		c.mu.Unlock()
		// Count the batch's results in woken at once (one atomic add on a
		// line every caller touches, instead of one per reply).
		k := int32(0)
		for i := range ready {
			if ready[i].r != nil {
				k++
			}
		}
		if k > 0 {
			c.b.woken.Add(k)
		}
		for i := range ready {
			ready[i].run(c)
		}
		clear(ready)
		ready = ready[:0]
		if bad {
			return
		}
	}
}

// maxDispatchBatch bounds the replies dispatched under one hold of c.mu.
const maxDispatchBatch = 64

// peekFrame returns the body length of the next frame, which is then
// wholly buffered in c.br (header included; the caller discards it). With
// block false it never reads from the socket and returns 0 unless a whole
// frame is already buffered.
func (c *conn) peekFrame(block bool) (int, error) {
	if !block && c.br.Buffered() < wire.HeaderLen {
		return 0, nil
	}
	hdr, err := c.br.Peek(wire.HeaderLen)
	if err != nil {
		return 0, err
	}
	n := int(binary.BigEndian.Uint32(hdr))
	if n == 0 || n > wire.MaxBody {
		if !block {
			return 0, nil // reported by the next blocking call
		}
		return 0, wire.ErrFrameSize
	}
	if !block && c.br.Buffered() < wire.HeaderLen+n {
		return 0, nil
	}
	if _, err := c.br.Peek(wire.HeaderLen + n); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	return n, nil
}

// delivery is work that dispatchLocked leaves for after c.mu is released:
// the signal of a request whose result dispatchLocked has set (r.res: the
// request is out of the in-flight table, so nothing else touches it until
// its caller receives the signal), or a compensating release.
type delivery struct {
	r *request
	// compensation: the grant nobody uses, and why
	lost  lostGrant
	token uint64
	why   string
}

func (d *delivery) run(c *conn) {
	if d.r != nil {
		d.r.ch <- struct{}{} // r.res is set; counted in woken by readLoop
		return
	}
	c.b.compensate(d.lost.key, d.token, d.lost.owner, d.why)
}

// answers reports whether a reply of type typ answers a request of type req.
func answers(req, typ byte) bool {
	switch req {
	case wire.TypeAcquire:
		return typ == wire.TypeGranted || typ == wire.TypeTimedOut || typ == wire.TypeBusy
	case wire.TypeRelease:
		return typ == wire.TypeReleased || typ == wire.TypeNotHeld
	case wire.TypeExtend:
		return typ == wire.TypeKept || typ == wire.TypeNotHeld
	}
	return false
}

// dispatchLocked hands one reply to its request, under c.mu. A result for
// an ordinary reply, and a compensating release, are appended to ready, to
// be run after c.mu is released: the request is out of the in-flight map
// by then, so nothing else touches it, and a withdraw finding it gone waits
// on r.ch.
func (c *conn) dispatchLocked(resp *wire.Response, ready []delivery) []delivery {
	if c.closed {
		// Frames read after a close: only a grant for an ACQUIRE that was
		// possibly sent (cancelled, or in flight when the session failed)
		// matters; its caller got no Ticket, so release it.
		if resp.Type == wire.TypeGranted && resp.Token != 0 {
			if lost, ok := c.cancelled[resp.ReqID]; ok {
				delete(c.cancelled, resp.ReqID)
				ready = append(ready, delivery{lost: lost, token: resp.Token, why: "grant read after its session ended"})
			}
		}
		return ready
	}
	id := resp.ReqID
	switch resp.Type {
	case wire.TypePong:
		if c.pingOut && id == c.pingID {
			c.pingOut = false
			return ready
		}
		c.failLocked(c.s.errorf(nil, "PONG with unknown req_id %d", id))
	case wire.TypeNotActive, wire.TypeError:
		var err error
		res := result{typ: resp.Type}
		if resp.Type == wire.TypeError {
			res.code, res.msg = resp.Code, string(resp.Msg)
			err = &ServerError{Code: resp.Code, Message: res.msg}
		} else {
			res.msg = string(resp.Hint)
			err = &NotActiveError{Hint: res.msg}
		}
		if r := c.inflight.get(id); r != nil && r.sent && id != 0 {
			c.inflight.del(r)
			if !r.abandoned {
				res.sent, res.t0 = true, r.t0
				r.deliver(c.b, res)
			}
		}
		c.failLocked(c.s.errorf(err, "server ended the session"))
	default:
		r := c.inflight.get(id)
		switch {
		case resp.Type == wire.TypeGranted && resp.Token == 0:
			// Rule 15a: tokens start at 1; a G with token 0 is malformed,
			// fatal like any malformed reply (its ACQUIRE: Indeterminate).
			c.failLocked(c.s.errorf(nil, "malformed reply: G with token 0 (req_id %d)", id))
		case r == nil || !r.sent:
			c.failLocked(c.s.errorf(nil, "reply %q with unknown req_id %d", resp.Type, id))
		case !answers(r.typ, resp.Type):
			c.failLocked(c.s.errorf(nil, "reply %q does not answer request %q (req_id %d)", resp.Type, r.typ, id))
		default:
			c.inflight.del(r)
			switch {
			case !r.abandoned:
				r.res = result{typ: resp.Type, token: resp.Token, waitedMS: resp.WaitedMS, sent: true, t0: r.t0}
				ready = append(ready, delivery{r: r})
			case r.typ == wire.TypeAcquire && resp.Type == wire.TypeGranted:
				// Granted before the server read our CANCEL: nobody
				// holds this Ticket, release it (T and B need nothing).
				ready = append(ready, delivery{lost: lostGrant{key: string(r.key), owner: r.owner}, token: resp.Token, why: "grant for a cancelled ACQUIRE"})
			}
		}
	}
	return ready
}

// scanLoop runs in the session's manager goroutine while the conn is open:
// keepalive PINGs, the PONG timeout and the ACQUIRE reply deadlines. One
// ticker per session replaces a timer per request.
func (c *conn) scanLoop() {
	cfg := c.b.set
	every := min(cfg.KeepAlive, cfg.KeepAliveTimeout, cfg.ReplyGrace) / 4
	every = max(min(every, time.Second), 5*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-c.b.ctx.Done():
			c.fail(c.s.errorf(ErrClosed, "broker closed"))
			return
		case now := <-t.C:
			c.scan(now)
		}
	}
}

func (c *conn) scan(now time.Time) {
	cfg := c.b.set
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	// The timeout counts from when the PING fell due, not from its Write:
	// a writer stuck in Write (a peer that stopped reading) never writes it.
	if (c.pingOut || c.pingWant) && now.Sub(c.pingSent) > cfg.KeepAliveTimeout {
		c.failLocked(c.s.errorf(nil, "keepalive: PING not answered within %v of falling due", cfg.KeepAliveTimeout))
		return
	}
	if !c.pingOut && !c.pingWant && now.Sub(c.lastPing) >= cfg.KeepAlive {
		c.pingWant = true
		c.lastPing = now
		c.pingSent = now
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	for _, r := range c.inflight.slots {
		if r == nil || !r.sent || !now.After(r.replyBy) {
			continue
		}
		switch r.typ {
		case wire.TypeAcquire:
			c.failLocked(c.s.errorf(nil, "no reply to an ACQUIRE within its wait (%ds) plus the reply grace (%v)", r.waitS, cfg.ReplyGrace))
		case wire.TypeExtend:
			// Its caller gets ErrRefreshUnconfirmed (or, cancelled, had
			// it already): the deadline was not moved.
			c.failLocked(c.s.errorf(nil, "no reply to an EXTEND within the reply grace (%v)", cfg.ReplyGrace))
		default:
			// Its caller has had ErrReleaseUnconfirmed since the window
			// ended (t0 >= the call), so nothing is resent; this bounds the
			// entries of unanswered RELEASEs kept to absorb late replies.
			c.failLocked(c.s.errorf(nil, "no reply to a RELEASE within the release window plus the reply grace (%v)", cfg.ReplyGrace))
		}
		return
	}
}
