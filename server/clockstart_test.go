package server_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/server"
)

// TestTokenStoreStartsAboveClock: with TokenStartClock, a new data dir's
// first token is above the wall clock in microseconds at its creation, so that it is above
// every token an earlier installation (which never issues a token per
// microsecond) can have issued; tokens then continue from the persisted
// ceiling, even when the clock has moved far ahead (it is never read
// again) or back.
func TestTokenStoreStartsAboveClock(t *testing.T) {
	dir := t.TempDir()
	before := uint64(time.Now().UnixMicro())
	s1, addr := startServer(t, server.Config{DataDir: dir, TokenBlock: 8, TokenStart: server.TokenStartClock})
	after := uint64(time.Now().UnixMicro())
	first := session(t, addr).acquireOK(1, owner(1), 0, 30, "a")
	if first <= before || first > after+1 {
		t.Fatalf("first token %d of a new store, want in (%d, %d]: above the wall clock in µs at its creation", first, before, after+1)
	}
	ceil := s1.Stats().TokenCeiling
	s1.Close()

	for _, clk := range []struct {
		name string
		us   int64
	}{{"clock far ahead", int64(ceil) + 1e12}, {"clock set back", 1000}} {
		restore := server.SetWallMicros(func() int64 { return clk.us })
		s, addr := startServer(t, server.Config{DataDir: dir, TokenBlock: 8, TokenStart: server.TokenStartClock})
		tok := session(t, addr).acquireOK(1, owner(2), 0, 30, "b")
		restore()
		if tok != ceil+1 {
			t.Fatalf("%s: first token %d after a restart, want %d (the persisted ceiling %d, plus one)", clk.name, tok, ceil+1, ceil)
		}
		ceil = s.Stats().TokenCeiling
		s.Close()
	}
}

// TestTokenStoreInitialTokenAboveClock: with TokenStartClock, an
// InitialToken above the clock wins; one below it is a floor the clock is
// already above.
func TestTokenStoreInitialTokenAboveClock(t *testing.T) {
	now := uint64(time.Now().UnixMicro())
	high := now + 1e12
	if tok := firstToken(t, server.Config{DataDir: t.TempDir(), InitialToken: high, TokenStart: server.TokenStartClock}); tok != high+1 {
		t.Fatalf("InitialToken %d above the clock: first token %d, want %d", high, tok, high+1)
	}
	if tok := firstToken(t, server.Config{DataDir: t.TempDir(), InitialToken: 5000, TokenStart: server.TokenStartClock}); tok <= now {
		t.Fatalf("InitialToken 5000: first token %d, want above the clock (%d)", tok, now)
	}
}

// TestClockStartBounds: ClockStart is the wall clock in µs, 0 for a
// clock before 1970, and at most MaxClockStart for an absurd one, which
// leaves most of the token space.
func TestClockStartBounds(t *testing.T) {
	for _, c := range []struct {
		us   int64
		want uint64
	}{{-5, 0}, {0, 0}, {1_800_000_000_000_000, 1_800_000_000_000_000}, {math.MaxInt64, server.MaxClockStart}} {
		restore := server.SetWallMicros(func() int64 { return c.us })
		got := server.ClockStart()
		restore()
		if got != c.want {
			t.Errorf("ClockStart with the clock at %d µs: %d, want %d", c.us, got, c.want)
		}
	}
	// A clock at its bound: the store starts and grants.
	restore := server.SetWallMicros(func() int64 { return math.MaxInt64 })
	defer restore()
	if tok := firstToken(t, server.Config{DataDir: t.TempDir(), TokenStart: server.TokenStartClock}); tok != server.MaxClockStart+1 {
		t.Fatalf("first token %d with an absurd clock, want %d", tok, server.MaxClockStart+1)
	}
}

// TestClusterStartsAboveClock: with TokenStartClock, a new cluster's
// counter starts above the wall clock at its creation, on every node: the first leader proposes it
// through the log (no node reads its own clock at apply time). A restart
// of every node, with the clock far ahead, continues from the log.
func TestClusterStartsAboveClock(t *testing.T) {
	before := uint64(time.Now().UnixMicro())
	tc := newTestCluster(t, 3, func(_ int, cfg *server.Config) { cfg.TokenStart = server.TokenStartClock })
	c := tc.leaderSession(tc.leader())
	first := c.acquireOK(2, owner(1), 0, 10, "k")
	if first <= before {
		t.Fatalf("a new cluster's first token %d, want above the wall clock at creation (%d µs)", first, before)
	}
	eventually(t, fmt.Sprintf("every node's counter at the first token %d", first), func() bool {
		for _, nd := range tc.nodes {
			if nd.s.Stats().LastToken != first {
				return false
			}
		}
		return true
	})
	c.nc.Close()
	restore := server.SetWallMicros(func() int64 { return int64(first) + 1e12 })
	defer restore()
	for i := range tc.nodes {
		tc.stop(i)
	}
	for i := range tc.nodes {
		tc.start(i)
	}
	c = tc.leaderSession(tc.leader())
	if tok := c.acquireOK(3, owner(2), 0, 10, "k2"); tok != first+1 {
		t.Fatalf("token %d after a full restart with the clock far ahead, want %d: the counter continues from the log", tok, first+1)
	}
}

// TestTokenStartOneDefault: by default (TokenStartOne, the zero value) a
// new data dir's first token is 1, as the protocol says, whatever the
// clock; InitialToken is a floor; and a data dir started with
// TokenStartClock keeps its ceiling when restarted with the default (the
// persisted state wins, tokens never go back).
func TestTokenStartOneDefault(t *testing.T) {
	if tok := firstToken(t, server.Config{DataDir: t.TempDir()}); tok != 1 {
		t.Fatalf("first token %d of a new store with the default TokenStart, want 1 (the protocol's start)", tok)
	}
	if tok := firstToken(t, server.Config{DataDir: t.TempDir(), InitialToken: 5000}); tok != 5001 {
		t.Fatalf("first token %d with InitialToken 5000 and the default TokenStart, want 5001", tok)
	}
	dir := t.TempDir()
	s, addr := startServer(t, server.Config{DataDir: dir, TokenBlock: 8, TokenStart: server.TokenStartClock})
	first := session(t, addr).acquireOK(1, owner(1), 0, 30, "a")
	ceil := s.Stats().TokenCeiling
	s.Close()
	if tok := firstToken(t, server.Config{DataDir: dir, TokenBlock: 8}); tok != ceil+1 || tok <= first {
		t.Fatalf("first token %d after a restart with the default TokenStart, want %d (the persisted ceiling plus one)", tok, ceil+1)
	}
}

// TestClusterTokenStartOneDefault: a new cluster with the default
// TokenStart issues token 1 first, on every node.
func TestClusterTokenStartOneDefault(t *testing.T) {
	tc := newTestCluster(t, 3, nil)
	c := tc.leaderSession(tc.leader())
	if tok := c.acquireOK(2, owner(1), 0, 10, "k"); tok != 1 {
		t.Fatalf("a new cluster's first token %d with the default TokenStart, want 1 (the protocol's start)", tok)
	}
	eventually(t, "every node's counter at 1", func() bool {
		for _, nd := range tc.nodes {
			if nd.s.Stats().LastToken != 1 {
				return false
			}
		}
		return true
	})
}

// TestTokenStartConfig: the names of TokenStart round-trip, and New
// refuses a value that is neither.
func TestTokenStartConfig(t *testing.T) {
	for _, ts := range []server.TokenStart{server.TokenStartOne, server.TokenStartClock} {
		if got, err := server.ParseTokenStart(ts.String()); err != nil || got != ts {
			t.Errorf("ParseTokenStart(%q) = %v, %v; want %v", ts.String(), got, err, ts)
		}
	}
	if _, err := server.ParseTokenStart("wall"); err == nil {
		t.Error("ParseTokenStart(\"wall\"): no error")
	}
	if _, err := server.New(server.Config{DataDir: t.TempDir(), TokenStart: 7}); err == nil || !strings.Contains(err.Error(), "TokenStart") {
		t.Fatalf("New with TokenStart 7: %v, want an error naming TokenStart", err)
	}
}
