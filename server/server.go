package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"hash/maphash"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ticketing-dev/ticketing/internal/wire"
)

// Stats is a point-in-time snapshot of a Server's state and counters.
type Stats struct {
	Sessions     int    `json:"sessions"`      // sessions that completed HELLO and are open
	HeldLocks    int    `json:"held_locks"`    // granted, unexpired locks (expired ones are swept within ~100 ms)
	Waiters      int    `json:"waiters"`       // queued ACQUIREs over all keys
	LastToken    uint64 `json:"last_token"`    // highest fencing token handed out; never above TokenCeiling
	TokenCeiling uint64 `json:"token_ceiling"` // durable ceiling: no token above it is ever issued
	Standby      bool   `json:"standby"`

	Grants         uint64 `json:"grants"`          // G replies with a new token (idempotent retries excluded)
	TimedOut       uint64 `json:"timed_out"`       // T replies
	Busy           uint64 `json:"busy"`            // B replies
	Released       uint64 `json:"released"`        // R replies
	NotHeld        uint64 `json:"not_held"`        // N replies
	ProtocolErrors uint64 `json:"protocol_errors"` // E frames sent for protocol violations and internal errors (all codes but 5)
	Expired        uint64 `json:"expired"`         // leases that ran out before a release (addition to the contract)

	TokenUnavailable uint64 `json:"token_unavailable"`           // B replies because no token could be reserved in time (included in Busy)
	TokenStoreError  string `json:"token_store_error,omitempty"` // why the token store cannot reserve (TokenStoreErr); empty while it can
}

// Server is a single-node Ticketing lock server. Its methods are safe for
// concurrent use.
type Server struct {
	cfg          Config
	log          *slog.Logger
	tokens       *tokenStore
	tokenDigests [][sha256.Size]byte
	helloOK      []byte // HELLO_OK frame with req_id 0, patched per session
	seed         maphash.Seed
	epoch        time.Time

	shards       [numShards]shard
	held         atomic.Int64
	waiters      atomic.Int64
	sessions     atomic.Int64
	lastCapSweep atomic.Int64
	m            counters

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	firstAddr net.Addr
	conns     map[*conn]struct{}
	closed    bool
	wg        sync.WaitGroup // session goroutines

	bg       sync.WaitGroup // sweeper
	stopBg   chan struct{}
	teardown sync.Once
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
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[*conn]struct{}),
		stopBg:    make(chan struct{}),
	}
	for _, t := range cfg.ClientTokens {
		s.tokenDigests = append(s.tokenDigests, sha256.Sum256([]byte(t)))
	}
	var err error
	s.helloOK, err = wire.AppendResponse(nil, &wire.Response{Type: wire.TypeHelloOK, Version: wire.Version, Role: wire.RoleStandalone, Node: []byte(cfg.NodeName)})
	if err != nil {
		return nil, err
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]*lockState)
	}
	if s.tokens, err = openStore(cfg.DataDir, cfg.TokenBlock, cfg.InitialToken, s.now); err != nil {
		return nil, err
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(newCollector(s)); err != nil {
			s.tokens.close()
			return nil, err
		}
	}
	s.bg.Add(1)
	go s.sweeper()
	return s, nil
}

// Serve accepts connections on ln and serves each as a session until
// Shutdown or Close, after which it returns ErrServerClosed. Serve may be
// called for several listeners at once; it closes ln when it returns.
// Temporary Accept errors are retried with a short backoff; any other error
// is returned.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
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
		if s.cfg.TLS != nil {
			nc = tls.Server(nc, s.cfg.TLS)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return ErrServerClosed
		}
		c := s.newConn(nc)
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
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
		addr = ":5225"
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
		s.tokens.close()
		if s.cfg.Registerer != nil {
			// Unregister so that a new Server can register on the same
			// registry (a restart in the same process).
			s.cfg.Registerer.Unregister(newCollector(s))
		}
	})
}

// Stats returns a snapshot of the server's state and counters.
func (s *Server) Stats() Stats {
	var pe uint64
	for code := range s.m.protoErrs {
		if code != int(wire.CodeShuttingDown) {
			pe += s.m.protoErrs[code].Load()
		}
	}
	st := Stats{
		Sessions:       int(s.sessions.Load()),
		HeldLocks:      int(s.held.Load()),
		Waiters:        int(s.waiters.Load()),
		LastToken:      s.tokens.last.Load(),
		TokenCeiling:   s.tokens.ceiling.Load(),
		Standby:        s.cfg.Standby,
		Grants:         s.m.grants.Load(),
		TimedOut:       s.m.timeouts.Load(),
		Busy:           s.m.busy.Load(),
		Released:       s.m.released.Load(),
		NotHeld:        s.m.notHeld.Load(),
		ProtocolErrors: pe,
		Expired:        s.m.expired.Load(),
	}
	st.TokenUnavailable = s.m.tokenUnavailable.Load()
	if err := s.TokenStoreErr(); err != nil {
		st.TokenStoreError = err.Error()
	}
	return st
}
