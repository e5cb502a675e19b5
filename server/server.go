package server

import (
	"context"
	"errors"
	"net"
)

// Stats is a point-in-time snapshot of a Server's state and counters.
type Stats struct {
	Sessions     int    `json:"sessions"`      // sessions that completed HELLO and are open
	HeldLocks    int    `json:"held_locks"`    // granted, unexpired locks (expiry is swept within ~100 ms)
	Waiters      int    `json:"waiters"`       // queued ACQUIREs over all keys
	LastToken    uint64 `json:"last_token"`    // highest fencing token handed out (or reserved past)
	TokenCeiling uint64 `json:"token_ceiling"` // durable ceiling: no token above it is ever issued
	Standby      bool   `json:"standby"`

	Grants         uint64 `json:"grants"`          // G replies with a new token (idempotent retries excluded)
	TimedOut       uint64 `json:"timed_out"`       // T replies
	Busy           uint64 `json:"busy"`            // B replies
	Released       uint64 `json:"released"`        // R replies
	NotHeld        uint64 `json:"not_held"`        // N replies
	ProtocolErrors uint64 `json:"protocol_errors"` // E replies sent for protocol violations (codes 1-4, 7)
}

var errTODO = errors.New("server: not implemented yet")

// Server is a single-node Ticketing lock server. Its methods are safe for
// concurrent use.
type Server struct {
	cfg Config
}

// New validates cfg, opens (or creates) the durable token store in
// cfg.DataDir and returns a Server that is not yet listening. A corrupt or
// unwritable data directory is an error naming the path. Call Close or
// Shutdown to release the data directory, even if Serve was never called.
func New(cfg Config) (*Server, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg}, nil
}

// Serve accepts connections on ln and serves each as a session until
// Shutdown or Close, after which it returns ErrServerClosed. Serve may be
// called for several listeners at once. Any other error from ln.Accept
// (after retrying temporary ones) is returned.
func (s *Server) Serve(ln net.Listener) error { return errTODO }

// ListenAndServe listens on the TCP address addr (":5225" when empty) and
// calls Serve.
func (s *Server) ListenAndServe(addr string) error { return errTODO }

// Addr returns the address of the first listener passed to Serve, or nil
// before Serve has been called.
func (s *Server) Addr() net.Addr { return nil }

// Shutdown stops accepting connections, sends E(5) with req_id 0 to every
// session, closes them, and releases the data directory. It returns when all
// sessions are closed, or with ctx's error once ctx is done (in which case
// the remaining sessions are closed at once). Locks are not persisted: a
// restarted server starts with no locks and tokens above the durable ceiling.
func (s *Server) Shutdown(ctx context.Context) error { return errTODO }

// Close closes all listeners and sessions at once, without E(5), waits for
// the session goroutines to exit, and releases the data directory. It is
// idempotent.
func (s *Server) Close() error { return nil }

// Stats returns a snapshot of the server's state and counters.
func (s *Server) Stats() Stats { return Stats{Standby: s.cfg.Standby} }
