package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"hash/maphash"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ticketing-dev/ticketing/internal/connlimit"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Stats is a point-in-time snapshot of a Server's state and counters.
type Stats struct {
	Sessions int `json:"sessions"` // sessions that completed HELLO and are open
	Pending  int `json:"pending"`  // connections that have not completed HELLO yet
	// ConnBudget is the connections the server's listeners may hold open
	// at once (Config.ConnBudget; 0: no cap), ConnBudgetInUse those that
	// do, ConnBudgetRefused the connections closed at accept beyond it.
	ConnBudget        int    `json:"conn_budget"`
	ConnBudgetInUse   int    `json:"conn_budget_in_use"`
	ConnBudgetRefused uint64 `json:"conn_budget_refused"`
	HeldLocks         int    `json:"held_locks"`    // granted, unexpired locks (expired ones are swept within ~100 ms)
	Waiters           int    `json:"waiters"`       // queued ACQUIREs over all keys
	LastToken         uint64 `json:"last_token"`    // highest fencing token handed out; never above TokenCeiling
	TokenCeiling      uint64 `json:"token_ceiling"` // durable ceiling: no token above it is ever issued
	Standby           bool   `json:"standby"`       // the role does not serve (RoleStandby)
	Role              string `json:"role"`          // the role: standby, standalone, active or leader (Server.SetRole)

	Grants         uint64 `json:"grants"`          // G replies with a new token (idempotent retries excluded)
	TimedOut       uint64 `json:"timed_out"`       // T replies (those to a CANCEL included)
	Busy           uint64 `json:"busy"`            // B replies
	Released       uint64 `json:"released"`        // R replies
	NotHeld        uint64 `json:"not_held"`        // N replies
	Kept           uint64 `json:"kept"`            // K replies (EXTEND, protocol version 3)
	ProtocolErrors uint64 `json:"protocol_errors"` // E frames sent for protocol violations and internal errors (all codes but 5)
	Expired        uint64 `json:"expired"`         // leases that ran out before a release (addition to the contract)

	TokenUnavailable uint64 `json:"token_unavailable"`           // B replies because no token could be reserved in time (included in Busy)
	Cancelled        uint64 `json:"cancelled"`                   // waiting ACQUIREs removed by a CANCEL and answered T (included in TimedOut)
	TokenStoreError  string `json:"token_store_error,omitempty"` // why the token store cannot reserve (TokenStoreErr); empty while it can

	// ProtocolErrorsByCode is ProtocolErrors by E code (the
	// ticketing_protocol_errors_total metric's code label); absent while
	// it is 0. The console shows its recent changes.
	ProtocolErrorsByCode map[uint16]uint64 `json:"protocol_errors_by_code,omitempty"`
	// GrantWait is the histogram of the waits of the grants counted in
	// Grants (the ticketing_grant_wait_seconds metric); the difference of
	// two snapshots (WaitHistogram.Sub) gives the percentiles of the
	// grants between them (WaitHistogram.Quantile).
	GrantWait WaitHistogram `json:"grant_wait"`

	Pair *PairStatus `json:"pair,omitempty"` // a pair node's view of its pair (Server.PairStatus)
}

// Server is a single-node Ticketing lock server. Its methods are safe for
// concurrent use.
type Server struct {
	cfg          Config
	log          *slog.Logger
	group        func() string // the replicated group's identity (groupID); nil standalone. Set before any goroutine of the mode starts
	tokenDigests [][sha256.Size]byte
	role         atomic.Pointer[roleState] // current role; its HELLO_OK or hint
	roleSw       roleSwitch
	seed         maphash.Seed
	epoch        time.Time
	clk          clock // nil: the real monotonic clock (epoch)

	capacity     lockcore.Capacity // held locks and waiters, against MaxLocks and MaxWaiters
	mode         mode              // standalone, a Raft node or a pair node, with its state: chosen at New
	sessions     atomic.Int64
	lastCapSweep atomic.Int64
	m            counters

	peerSessions peerCounts
	pending      *connlimit.Gate   // connections before HELLO_OK: MaxPendingConns, pendingPer per peer
	pendingPer   int               // connections before HELLO one peer may hold
	budget       *connlimit.Budget // every listener's connections (Config.ConnBudget); nil: no cap
	auth         authThrottle
	logs         logLimiter
	writeChunk   int           // bytes per socket write (see conn.writeLocked)
	idleScans    int           // idle scans without a frame that drop a session
	closingCh    chan struct{} // closed when Shutdown or Close begins
	browse       *browser      // the lock browser's scans and recent answers (browse.go)

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	firstAddr net.Addr
	conns     map[*conn]struct{}
	closed    bool
	wg        sync.WaitGroup // session goroutines

	bg       sync.WaitGroup // sweeper
	stopBg   chan struct{}
	teardown sync.Once

	registered []prometheus.Collector // on cfg.Registerer, by New; unregistered by finish
}

// New validates cfg, opens (or creates) the durable token store in
// cfg.DataDir and returns a Server that is not yet listening. A corrupt or
// unwritable data directory is an error naming the path. New registers the
// Prometheus collectors on cfg.Registerer, if set. Call Close or Shutdown to
// release the data directory and the background goroutines, even if Serve
// was never called.
func New(cfg Config) (*Server, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		seed:      maphash.MakeSeed(),
		epoch:     time.Now(),
		clk:       cfg.clock,
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
		stopBg:    make(chan struct{}),
		closingCh: make(chan struct{}),
		browse:    newBrowser(),
	}
	s.m.init()
	s.peerSessions.n = make(map[netip.Addr]int)
	s.pendingPer = min(max(cfg.MaxPendingConns/4, minPerPeerDefault), cfg.MaxPendingConns)
	s.pending = connlimit.NewGate(cfg.MaxPendingConns, s.pendingPer, 0)
	s.newBudget()
	s.writeChunk = cfg.SocketBuffer
	if s.writeChunk <= 0 {
		s.writeChunk = DefaultSocketBuffer
	}
	for _, t := range cfg.ClientTokens {
		s.tokenDigests = append(s.tokenDigests, sha256.Sum256([]byte(t)))
	}
	initial, hint := RoleStandalone, ""
	if cfg.Pair != nil {
		initial = RoleStandby // until the pair's state machine lets it serve
	}
	if cfg.Cluster != nil {
		initial = RoleStandby // until this node leads
	} else if cfg.Standby {
		initial, hint = RoleStandby, cfg.StandbyHint
	}
	rs, err := s.newRoleState(initial, hint)
	if err != nil {
		return nil, err
	}
	s.role.Store(rs)
	s.capacity.MaxLocks, s.capacity.MaxWaiters = int64(cfg.MaxLocks), int64(cfg.MaxWaiters)
	// The mode, chosen once: nothing after New asks which it is.
	switch {
	case cfg.mode != nil:
		s.mode = cfg.mode(s)
		s.bg.Add(1)
		go s.housekeeping()
		return s, nil
	case cfg.Cluster != nil:
		return s.startCluster()
	case cfg.Pair != nil:
		return s.startPair()
	default:
		return s.startStandalone()
	}
}

// Serve accepts connections on ln and serves each as a session until
// Shutdown or Close, after which it returns ErrServerClosed. Serve may be
// called for several listeners at once; it closes ln when it returns.
// Each connection takes a unit of the connection budget (Config.ConnBudget)
// until it closes.
// Temporary Accept errors are retried with a short backoff; any other error
// is returned.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	if err := s.mode.refusal(); err != nil {
		s.mu.Unlock()
		ln.Close()
		return err
	}
	ln = s.budget.Listener(ln, "lock", nil)
	s.listeners[ln] = struct{}{}
	if s.firstAddr == nil {
		s.firstAddr = ln.Addr()
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrServerClosed
			}
			if err := s.mode.refusal(); err != nil {
				return err // a cluster node's refusal (log_cluster_boot.go)
			}
			var ne net.Error
			if (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, errTemporary(err)) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept error; retrying", "err", err, "backoff", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		peer := peerOf(nc.RemoteAddr())
		pt, ok := s.addPending(peer)
		if !ok {
			// Refused as cheaply as possible: no goroutine, no buffer.
			s.m.pendingRefused.Add(1)
			nc.Close()
			if s.logs.allow(peer) {
				s.log.Warn("connection refused: too many connections before HELLO", "peer", nc.RemoteAddr().String(),
					"limit", s.cfg.MaxPendingConns, "per_address_limit", s.pendingPer)
			} else {
				s.m.logSuppressed.Add(1)
			}
			continue
		}
		if tc, ok := connlimit.NetConnOf(nc).(*net.TCPConn); ok && s.cfg.SocketBuffer > 0 {
			tc.SetReadBuffer(s.cfg.SocketBuffer)
			tc.SetWriteBuffer(s.cfg.SocketBuffer)
		}
		if s.cfg.TLS != nil {
			nc = tls.Server(nc, s.cfg.TLS)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			s.donePending(pt)
			nc.Close()
			return ErrServerClosed
		}
		c := s.newConn(nc, peer)
		c.pendingT = pt
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// addPending counts a new connection before HELLO from peer, unless
// MaxPendingConns, or the per-address share of them (a quarter, at least 64),
// is reached.
func (s *Server) addPending(peer netip.Addr) (connlimit.Ticket, bool) {
	t, why := s.pending.Enter(peer)
	return t, why == connlimit.Admitted
}

// donePending gives back the count addPending took.
func (s *Server) donePending(t connlimit.Ticket) { s.pending.Leave(t) }

// pendingConns returns the connections before HELLO.
func (s *Server) pendingConns() int {
	n, _ := s.pending.InUse()
	return n
}

// errTemporary returns err if it says it is temporary (as accept errors
// such as EMFILE do), else a sentinel that matches nothing.
func errTemporary(err error) error {
	if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
		return err
	}
	return errNever
}

var errNever = errors.New("never")

// ListenAndServe listens on the TCP address addr (":5225" when empty) and
// calls Serve.
func (s *Server) ListenAndServe(addr string) error {
	if addr == "" {
		addr = ":" + strconv.Itoa(wire.DefaultPort)
	}
	if s.isClosed() {
		return ErrServerClosed
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// Addr returns the address of the first listener passed to Serve, or nil
// before Serve has been called.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstAddr
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// stopAccepting marks the server closed, closes its listeners and returns
// the open connections.
func (s *Server) stopAccepting() []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		close(s.closingCh)
	}
	s.closed = true
	for ln := range s.listeners {
		ln.Close()
	}
	cs := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		cs = append(cs, c)
	}
	return cs
}

// Shutdown stops accepting connections, sends E(5) with req_id 0 to every
// session (and connection still before HELLO), closes them, and releases the
// data directory. It returns nil when all sessions are closed, or ctx's error
// once ctx is done, in which case the remaining connections are closed at
// once before it returns. Locks are not persisted: a restarted server starts
// with no locks, and with tokens above the durable ceiling.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mode.stopping()
	frame := wire.AppendError(nil, 0, wire.CodeShuttingDown, "shutting down")
	for _, c := range s.stopAccepting() {
		c.closeWith(frame)
	}
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		for _, c := range s.stopAccepting() {
			c.kill()
		}
		<-done
	}
	s.finish()
	return err
}

// Close closes all listeners and sessions at once, without E(5), waits for
// the session goroutines to exit, and releases the data directory. It is
// idempotent and always returns nil.
func (s *Server) Close() error {
	for _, c := range s.stopAccepting() {
		c.kill()
	}
	s.wg.Wait()
	s.finish()
	return nil
}

func (s *Server) finish() {
	s.teardown.Do(func() {
		close(s.stopBg)
		s.bg.Wait()
		s.logs.flush(s.log, logInterval)
		s.mode.close()
		if s.cfg.Registerer != nil {
			s.unregister(s.cfg.Registerer)
		}
	})
}

// Stats returns a snapshot of the server's state and counters.
func (s *Server) Stats() Stats {
	role := s.role.Load().role
	mc := s.mode.counts()
	st := Stats{
		Sessions:          int(s.sessions.Load()),
		Pending:           s.pendingConns(),
		ConnBudget:        func() int { n, _ := s.budget.Max(); return n }(),
		ConnBudgetInUse:   s.budget.InUse(),
		ConnBudgetRefused: s.budget.Refused(),
		HeldLocks:         mc.held,
		Waiters:           int(s.capacity.Waiters.Load()),
		LastToken:         mc.last,
		TokenCeiling:      mc.ceiling,
		Standby:           !role.Serving(),
		Role:              role.String(),
		Grants:            s.m.grants.Load(),
		TimedOut:          s.m.timeouts.Load(),
		Busy:              s.m.busy.Load(),
		Released:          s.m.released.Load(),
		NotHeld:           s.m.notHeld.Load(),
		Kept:              s.m.kept.Load(),
		ProtocolErrors:    s.m.protoErrs.Load(),
		Expired:           s.m.expired.Load(),
	}
	st.TokenUnavailable = s.m.tokenUnavailable.Load()
	st.Cancelled = s.m.cancelled.Load()
	st.ProtocolErrorsByCode = s.m.protoErrorsByCode()
	st.GrantWait = s.m.grantWait()
	if err := s.TokenStoreErr(); err != nil {
		st.TokenStoreError = err.Error()
	}
	if ps, ok := s.PairStatus(); ok {
		st.Pair = &ps
	}
	return st
}

// idleScansPerTimeout is how many idle scans one IdleTimeout spans: a
// session is dropped after between IdleTimeout and 1.25 IdleTimeout
// without a complete frame.
const idleScansPerTimeout = 4

// housekeeping drops idle sessions, writes the summaries of rate-limited
// log lines and prunes the authentication-failure table.
func (s *Server) housekeeping() {
	defer s.bg.Done()
	tick := logInterval
	if it := s.cfg.IdleTimeout; it > 0 {
		tick = max(min(tick, it/idleScansPerTimeout), time.Millisecond)
		s.idleScans = int((it + tick - 1) / tick)
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	lastFlush := time.Now()
	for {
		select {
		case <-s.stopBg:
			return
		case now := <-t.C:
			if s.idleScans > 0 {
				s.dropIdle()
			}
			if now.Sub(lastFlush) >= logInterval {
				lastFlush = now
				s.logs.flush(s.log, logInterval)
				s.auth.prune(now)
			}
		}
	}
}

// dropIdle closes, with E(1) "idle timeout", the sessions that for
// s.idleScans scans have sent no complete frame and awaited no reply: a
// session with a queued ACQUIRE is never idle, and its clock restarts when
// the reply to the last one is queued (dropInflightLocked sets active).
func (s *Server) dropIdle() {
	var idle []*conn
	s.mu.Lock()
	for c := range s.conns {
		if !c.session.Load() {
			continue // before HELLO_OK: HelloTimeout applies
		}
		if c.active.Swap(false) || c.nInflight.Load() > 0 {
			c.idleScans = 0
			continue
		}
		if c.idleScans++; c.idleScans >= s.idleScans {
			idle = append(idle, c)
		}
	}
	s.mu.Unlock()
	for _, c := range idle {
		if c.dead.Load() {
			continue
		}
		s.m.idleTimeouts.Add(1)
		c.protoError(wire.CodeMalformed, 0, "idle timeout")
	}
}
