// Package servertest runs an in-process Ticketing server for tests, in the
// manner of net/http/httptest.
//
//	srv := servertest.Start(t, server.Config{})
//	b, err := broker.New(broker.Config{Addrs: []string{srv.Addr()}})
//
// Start fills in a temporary data directory, listens on 127.0.0.1 with a
// port of the system's choosing and serves in a goroutine; the test's
// Cleanup shuts the server down and waits until Serve has returned, so no
// goroutine outlives the test (the repository's tests check that with
// goleak).
package servertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/server"
)

// ShutdownTimeout bounds the graceful Shutdown in a Server's Cleanup; the
// sessions still open after it are closed at once.
const ShutdownTimeout = 10 * time.Second

// Server is an in-process server.Server listening on a loopback address.
// Its methods are safe for concurrent use.
type Server struct {
	cfg server.Config

	mu     sync.Mutex
	srv    *server.Server
	addr   string
	served chan error // Serve's result; nil once collected
}

// Start creates a server.Server with cfg (DataDir defaults to tb.TempDir()),
// serves it on 127.0.0.1:0 and registers a Cleanup that shuts it down
// gracefully (E(5) to every session) and waits for Serve to return; an
// error of Shutdown, or of Serve other than server.ErrServerClosed, fails
// tb. Start fails tb at once if the server cannot be created or cannot
// listen.
func Start(tb testing.TB, cfg server.Config) *Server {
	tb.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = tb.TempDir()
	}
	s := &Server{cfg: cfg}
	if err := s.start("127.0.0.1:0", 0); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
		defer cancel()
		if err := s.stop(func(srv *server.Server) error { return srv.Shutdown(ctx) }); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// start creates the server and serves it on addr, retrying for up to
// retryFor while the address is still in use.
func (s *Server) start(addr string, retryFor time.Duration) error {
	srv, err := server.New(s.cfg)
	if err != nil {
		return fmt.Errorf("servertest: %w", err)
	}
	giveUp := time.Now().Add(retryFor)
	var ln net.Listener
	for {
		ln, err = net.Listen("tcp", addr)
		if err == nil || time.Now().After(giveUp) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		_ = srv.Close()
		return fmt.Errorf("servertest: %w", err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	s.mu.Lock()
	s.srv, s.addr, s.served = srv, ln.Addr().String(), served
	s.mu.Unlock()
	return nil
}

// stop ends the current server with end (Shutdown or Close) and waits for
// Serve to return. It is a no-op when the server is already stopped.
func (s *Server) stop(end func(*server.Server) error) error {
	s.mu.Lock()
	srv, served := s.srv, s.served
	s.served = nil
	s.mu.Unlock()
	if served == nil {
		return nil
	}
	err := end(srv)
	if serr := <-served; !errors.Is(serr, server.ErrServerClosed) {
		err = errors.Join(err, fmt.Errorf("servertest: Serve: %w", serr))
	}
	return err
}

// Addr returns the address the server listens on, host:port. It stays the
// same across Restart.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Server returns the current server.Server (a new one after Restart).
func (s *Server) Server() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// DataDir returns the server's data directory.
func (s *Server) DataDir() string { return s.cfg.DataDir }

// Close closes the server at once (server.Server.Close: every session is
// dropped without E(5)) and waits for Serve to return. It is idempotent;
// Restart starts the server again.
func (s *Server) Close() {
	_ = s.stop((*server.Server).Close)
}

// Restart closes the server if it is running (as Close) and starts a new
// server.Server with the same Config, data directory and address, so the
// tokens it hands out are above every token of the previous one and
// clients reconnect to the same address. It fails tb if the new server
// cannot start (it retries for a few seconds while the port is in use).
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.Close()
	if err := s.start(s.Addr(), 5*time.Second); err != nil {
		tb.Fatal(err)
	}
}
