package raftnet

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
)

// tlsStream is the raft.StreamLayer over crypto/tls. Its own accept loop
// takes TCP connections from the listener and handshakes each in a
// goroutine of its own, under a deadline and the slots of a gate (members'
// IPs have slots of their own; every other source shares the rest, a few at
// most per source), so that neither a stalled stranger nor a failed
// handshake ever reaches raft, and strangers cannot take the slots that
// members need: Accept returns only authenticated peers, and an error only
// once the layer is closed (raft's accept loop backs off for up to a second
// on every Accept error). Every connection it accepted or dialled is closed
// by Close, which returns only after the layer's goroutines have exited.
type tlsStream struct {
	ln        net.Listener
	advertise net.Addr
	local     net.Addr // the source address of dialled connections, or nil
	tls       *PeerTLS
	server    *tls.Config

	handshakeTimeout time.Duration
	gate             *connlimit.Gate
	accepted         chan net.Conn // authenticated inbound connections

	log *slog.Logger
	// Log limiters, one per kind of line, so that a flood of one kind does
	// not hide the others.
	refused       *connlimit.Limiter // connections from non-members refused by the gate
	failed        *connlimit.Limiter // failed handshakes from non-members, accept errors
	memberRefused *connlimit.Limiter // connections from members' IPs refused by the gate
	memberFailed  *connlimit.Limiter // failed handshakes from members' IPs
	resolveFail   *connlimit.Limiter // failed lookups of members' names

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	conns connSet
}

// streamConfig is what newTLSStream needs of Config, with the defaults
// applied.
type streamConfig struct {
	handshakeTimeout                time.Duration
	maxShared, perSource, perMember int
	members                         func() []raft.ServerAddress
	budget                          *connlimit.Budget
}

func newTLSStream(ln net.Listener, advertise net.Addr, p *PeerTLS, sc streamConfig, log *slog.Logger) *tlsStream {
	ctx, cancel := context.WithCancel(context.Background())
	s := &tlsStream{
		ln: ln, advertise: advertise, tls: p, server: p.ServerConfig(),
		handshakeTimeout: sc.handshakeTimeout,
		gate:             connlimit.NewGate(sc.maxShared, sc.perSource, sc.perMember),
		accepted:         make(chan net.Conn),
		log:              log,
		refused:          connlimit.NewLimiter(time.Second),
		failed:           connlimit.NewLimiter(time.Second),
		memberRefused:    connlimit.NewLimiter(time.Second),
		memberFailed:     connlimit.NewLimiter(time.Second),
		resolveFail:      connlimit.NewLimiter(time.Second),
		ctx:              ctx, cancel: cancel,
	}
	// Dial from the IP the layer listens on, if it is a specific one, so
	// that peers see this node's connections come from its address (on a
	// host with several, or with several loopback addresses, the kernel
	// would pick one by the route).
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && ta.IP != nil && !ta.IP.IsUnspecified() {
		s.local = &net.TCPAddr{IP: ta.IP, Zone: ta.Zone}
	}
	s.ln = sc.budget.Listener(ln, "raft", s.gate.IsMember)
	if sc.members != nil {
		w := s.memberWatch(sc.members)
		w.Refresh(ctx) // members have their slots from the start
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			w.Run(ctx, membersEvery)
		}()
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

// acceptLoop owns the listener's Accept until Close.
func (s *tlsStream) acceptLoop() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient error such as EMFILE: back off as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.failed.Do(func(suppressed int) {
				s.log.Warn("raft peer transport: accept failed", "error", err, "suppressed", suppressed)
			})
			select {
			case <-time.After(delay):
				continue
			case <-s.ctx.Done():
				return
			}
		}
		delay = 0
		t, why := s.gate.Enter(connlimit.RemoteIP(c))
		if why != connlimit.Admitted {
			// Log before closing, so that the line exists by the time the
			// stranger sees its connection end.
			s.logRefusal(c.RemoteAddr().String(), why)
			_ = c.Close()
			continue
		}
		s.wg.Add(1)
		go s.handshake(c, t)
	}
}

// logRefusal logs a connection the gate refused, at most once a second per
// kind (members' IPs or others).
func (s *tlsStream) logRefusal(remote string, why connlimit.Refusal) {
	maxShared, perSource, perMember := s.gate.Limits()
	switch why {
	case connlimit.MemberAllFull:
		s.memberRefused.Do(func(suppressed int) {
			s.log.Warn("raft peer transport: too many handshakes in progress from a member's address, connection refused (the member retries; if this lasts, something else connects from that address: see the operations guide)",
				"remote", remote, "member_slots", perMember, "per_source", perSource, "shared", maxShared, "suppressed", suppressed)
		})
	case connlimit.SourceFull:
		s.refused.Do(func(suppressed int) {
			s.log.Warn("raft peer transport: too many handshakes in progress from this source, connection refused (not a member's address: a stranger, or a node not yet in the configuration)",
				"remote", remote, "per_source", perSource, "suppressed", suppressed)
		})
	default:
		s.refused.Do(func(suppressed int) {
			s.log.Warn("raft peer transport: too many handshakes in progress from non-members, connection refused (members have slots of their own)",
				"remote", remote, "shared", maxShared, "suppressed", suppressed)
		})
	}
}

// handshake authenticates one inbound connection, which holds the gate's
// slot t, and hands it to Accept.
func (s *tlsStream) handshake(raw net.Conn, t connlimit.Ticket) {
	defer s.wg.Done()
	ctx, cancel := context.WithTimeout(s.ctx, s.handshakeTimeout)
	tc := tls.Server(raw, s.server)
	err := tc.HandshakeContext(ctx)
	cancel()
	s.gate.Leave(t)
	if err != nil {
		if s.ctx.Err() == nil {
			remote := raw.RemoteAddr().String()
			if s.gate.IsMember(t.IP()) {
				s.memberFailed.Do(func(suppressed int) {
					s.log.Warn("raft peer transport: peer handshake failed, from a member's address (check that node's certificate, its expiry and the CA files of both)",
						"remote", remote, "error", err, "suppressed", suppressed)
				})
			} else {
				s.failed.Do(func(suppressed int) {
					s.log.Warn("raft peer transport: peer handshake failed",
						"remote", remote, "error", err, "suppressed", suppressed)
				})
			}
		}
		_ = raw.Close()
		return
	}
	c, ok := s.conns.track(tc)
	if !ok {
		return
	}
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log.Debug("raft peer transport: peer connected", "remote", raw.RemoteAddr().String(),
			"peer", tc.ConnectionState().PeerCertificates[0].Subject.CommonName)
	}
	select {
	case s.accepted <- c:
	case <-s.ctx.Done():
		_ = c.Close()
	}
}

// Accept returns the next authenticated inbound connection, or
// net.ErrClosed once the layer is closed.
func (s *tlsStream) Accept() (net.Conn, error) {
	select {
	case <-s.ctx.Done():
		return nil, net.ErrClosed
	default:
	}
	select {
	case c := <-s.accepted:
		return c, nil
	case <-s.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Addr is the advertised address, the one peers dial.
func (s *tlsStream) Addr() net.Addr { return s.advertise }

// Dial opens an authenticated connection to the peer at address (host:port)
// within timeout (no limit if zero): the peer's certificate must verify
// against the cluster CA pool for host and be a node certificate. The
// connection comes from the listener's IP if that is a specific one.
func (s *tlsStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	host, _, err := net.SplitHostPort(string(address))
	if err != nil {
		return nil, err
	}
	ctx := s.ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	d := tls.Dialer{NetDialer: &net.Dialer{LocalAddr: s.local}, Config: s.tls.ClientConfig(host)}
	return s.conns.dialled(d.DialContext(ctx, "tcp", string(address)))
}

// Close stops accepting, closes every connection the layer accepted or
// dialled, and waits for its goroutines. It is idempotent.
func (s *tlsStream) Close() error {
	if !s.conns.close() {
		return nil
	}
	s.cancel()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// connSet tracks a stream layer's open connections so that Close can close
// them: raft's NetworkTransport closes neither the connections it accepted
// nor those in its pool, and its goroutine serving an inbound connection
// lives as long as the connection. The zero value is ready to use.
type connSet struct {
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

// track records c, or closes it and reports false if the set is closed.
// dialled tracks a connection a Dial made (c, err from the dialer), or
// closes it with net.ErrClosed if the set is closed.
func (cs *connSet) dialled(c net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return nil, err
	}
	tc, ok := cs.track(c)
	if !ok {
		return nil, net.ErrClosed
	}
	return tc, nil
}

func (cs *connSet) track(c net.Conn) (net.Conn, bool) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.closed {
		_ = c.Close()
		return nil, false
	}
	if cs.conns == nil {
		cs.conns = make(map[*trackedConn]struct{})
	}
	tc := &trackedConn{Conn: c, set: cs}
	cs.conns[tc] = struct{}{}
	return tc, true
}

// close closes every tracked connection and every later one; it reports
// whether this was the first call.
func (cs *connSet) close() bool {
	cs.mu.Lock()
	if cs.closed {
		cs.mu.Unlock()
		return false
	}
	cs.closed = true
	conns := cs.conns
	cs.conns = nil
	cs.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
	return true
}

// trackedConn forgets itself in its set when closed.
type trackedConn struct {
	net.Conn
	set *connSet
}

func (c *trackedConn) Close() error {
	c.set.mu.Lock()
	delete(c.set.conns, c) // a no-op on the nil map after close
	c.set.mu.Unlock()
	return c.Conn.Close()
}
