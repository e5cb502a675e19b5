package server

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/proctest"
)

// seamPairNodes starts a pair (primary, backup) on loopback peer links and
// one fake clock, and waits until the primary is active and replicating to
// its passive backup. The heartbeat interval is long, so that the fake
// clock's advances never make the peer look silent: the heartbeats that
// settle the pair are those sent on each link's start and on each
// transition.
func seamPairNodes(t *testing.T, clk *FakeClock) (primary, backup *Server) {
	t.Helper()
	port, err := proctest.FreePortRun("127.0.0.1", 2)
	if err != nil {
		t.Fatal(err)
	}
	pa, ba := "127.0.0.1:"+strconv.Itoa(port), "127.0.0.1:"+strconv.Itoa(port+1)
	start := func(role PairRole, self, peer string) *Server {
		cfg := Config{DataDir: t.TempDir(), Pair: &PairConfig{Role: role, Listen: self, Peer: peer,
			Advertise: "127.0.0.1:5301", Heartbeat: time.Hour}}
		SetClock(&cfg, clk)
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	primary, backup = start(PairPrimary, pa, ba), start(PairBackup, ba, pa)
	deadline := time.Now().Add(seamDeadline)
	for {
		ps, _ := primary.PairStatus()
		bs, _ := backup.PairStatus()
		if ps.State == "ACTIVE" && ps.Replicating && bs.State == "PASSIVE" && bs.HasState {
			return primary, backup
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pair did not settle: primary %+v, backup %+v", ps, bs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// seamPair is the pair's implementation of the seam: the active primary;
// at rest, nothing awaits the passive's acknowledgement and the passive's
// machine is the active's.
func seamPair(t *testing.T, clk *FakeClock) *seamLog {
	s, backup := seamPairNodes(t, clk)
	p, q := s.pairMode(), backup.pairMode()
	return &seamLog{s: s, clk: clk, rest: func() (seamState, string) {
		p.sh.mu.Lock()
		pending, projected := p.sh.core.Pending()+len(p.pending), p.sh.core.Holdings()
		applied, last, attached := p.m.Holdings(), p.m.Last(), p.attached != nil
		p.sh.mu.Unlock()
		if pending > 0 {
			return seamState{}, fmt.Sprintf("%d commands in flight", pending)
		}
		if !attached {
			return seamState{}, "the passive is not attached"
		}
		q.sh.mu.Lock()
		hs, l := q.m.Holdings(), q.m.Last()
		q.sh.mu.Unlock()
		if l != last || !slices.Equal(hs, applied) {
			return seamState{}, fmt.Sprintf("the passive's machine (last %d, %v) is not the active's (last %d, %v)", l, hs, last, applied)
		}
		return seamState{last: last, projected: projected, applied: applied, machine: true}, ""
	}}
}

// TestSeamContractPair runs the seam's scenario against the pair's log
// (the active primary replicating to its passive backup).
func TestSeamContractPair(t *testing.T) {
	seamScenario(t, seamPair(t, NewFakeClock()))
}
