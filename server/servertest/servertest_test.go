package servertest_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/server"
	"github.com/ticketing-dev/ticketing/server/servertest"
)

func newBroker(t *testing.T, addr string) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.Config{Addrs: []string{addr}, BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

func acquire(t *testing.T, b *broker.Broker, key string) *broker.Ticket {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	tk, err := b.Acquire(ctx, key, broker.AcquireOptions{Lease: 10 * time.Second, Wait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestStart(t *testing.T) {
	srv := servertest.Start(t, server.Config{NodeName: "fixture"})
	if srv.DataDir() == "" {
		t.Fatal("no data directory")
	}
	tk := acquire(t, newBroker(t, srv.Addr()), "k")
	if st := srv.Server().Stats(); st.HeldLocks != 1 || st.Sessions == 0 {
		t.Errorf("stats %+v, want one lock and the broker's sessions", st)
	}
	_ = tk // the Cleanup shuts down with the broker still connected
}

// TestKeepsDataDir: a given DataDir is used as is.
func TestKeepsDataDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	srv := servertest.Start(t, server.Config{DataDir: dir})
	if srv.DataDir() != dir {
		t.Errorf("DataDir() = %s, want %s", srv.DataDir(), dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "tokens.ceiling")); err != nil {
		t.Error(err)
	}
}

// TestRestart: the same address and data directory, a new server.Server,
// tokens above the old ones, and the broker reconnects.
func TestRestart(t *testing.T) {
	srv := servertest.Start(t, server.Config{TokenBlock: 4})
	addr, old := srv.Addr(), srv.Server()
	b := newBroker(t, addr)
	first := acquire(t, b, "k").Token()

	srv.Restart(t)
	if srv.Addr() != addr {
		t.Errorf("address %s after restart, want %s", srv.Addr(), addr)
	}
	if srv.Server() == old {
		t.Error("the same server.Server after restart")
	}
	if second := acquire(t, b, "k").Token(); second <= first {
		t.Errorf("token %d after restart, not above %d", second, first)
	}
}

// TestClose: Close stops the server at once and is idempotent; the
// Cleanup after it has nothing left to do.
func TestClose(t *testing.T) {
	srv := servertest.Start(t, server.Config{})
	srv.Close()
	srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := newBroker(t, srv.Addr()).WaitReady(ctx); err == nil {
		t.Error("a session after Close")
	}
}

// fakeTB records what Start reports.
type fakeTB struct {
	testing.TB
	t      *testing.T
	fatal  bool
	errors int
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) TempDir() string   { return f.t.TempDir() }
func (f *fakeTB) Cleanup(fn func()) { f.t.Cleanup(fn) }
func (f *fakeTB) Fatal(...any)      { f.fatal = true; panic(f) }
func (f *fakeTB) Error(...any)      { f.errors++ }

// TestStartFails: an invalid Config fails the test at once.
func TestStartFails(t *testing.T) {
	tb := &fakeTB{t: t}
	func() {
		defer func() {
			if r := recover(); r != nil && r != tb {
				panic(r)
			}
		}()
		servertest.Start(tb, server.Config{MaxLocks: -1})
	}()
	if !tb.fatal {
		t.Error("Start with an invalid Config did not fail the test")
	}
}
