package checker_test

import (
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/integration/checker"
)

const ms = time.Millisecond

func grant(p, key string, tok uint64, inv, done, deadline time.Duration) checker.Op {
	return checker.Op{Process: p, Kind: checker.KindAcquire, Key: key, Token: tok, Invoke: inv, Complete: done, Outcome: checker.Granted, Deadline: deadline}
}

func release(p, key string, tok uint64, inv, done time.Duration, outcome string) checker.Op {
	return checker.Op{Process: p, Kind: checker.KindRelease, Key: key, Token: tok, Invoke: inv, Complete: done, Outcome: outcome}
}

// Each checker must pass a good history and fail a bad one: the tests that
// use them would otherwise prove nothing.
func TestCheckersCanFail(t *testing.T) {
	good := []checker.Op{
		grant("a", "k", 1, 0, 10*ms, 1000*ms),
		release("a", "k", 1, 20*ms, 30*ms, checker.Released),
		grant("b", "k", 2, 5*ms, 25*ms, 1000*ms),
		release("b", "k", 2, 40*ms, 50*ms, checker.NotHeld),
		grant("c", "k", 3, 2000*ms, 2010*ms, 3000*ms), // after b's deadline
		{Process: "d", Kind: checker.KindAcquire, Key: "k", Outcome: checker.Indeterminate, Invoke: 0, Complete: 5 * ms},
	}
	for name, check := range map[string]func([]checker.Op) error{
		"NoTicketOnError":      checker.NoTicketOnError,
		"TokensUnique":         checker.TokensUnique,
		"TokensFollowRealTime": checker.TokensFollowRealTime,
		"LeaseExclusion":       checker.LeaseExclusion,
		"ReleasedIntervals":    checker.ReleasedIntervals,
	} {
		if err := check(good); err != nil {
			t.Errorf("%s on a good history: %v", name, err)
		}
	}

	for _, tc := range []struct {
		name  string
		check func([]checker.Op) error
		ops   []checker.Op
	}{
		{"ticket with an error", checker.NoTicketOnError, []checker.Op{
			{Process: "a", Kind: checker.KindAcquire, Key: "k", Outcome: checker.Indeterminate, Token: 7},
		}},
		{"release of a token never granted", checker.NoTicketOnError, []checker.Op{
			release("a", "k", 9, 0, 1, checker.Released),
		}},
		{"token granted twice", checker.TokensUnique, []checker.Op{
			grant("a", "k", 5, 0, 1, 1000*ms), grant("b", "j", 5, 2, 3, 1000*ms),
		}},
		{"token went back in time", checker.TokensFollowRealTime, []checker.Op{
			grant("a", "k", 5, 0, 1*ms, 1000*ms), grant("b", "j", 4, 2*ms, 3*ms, 1000*ms),
		}},
		{"two holders", checker.LeaseExclusion, []checker.Op{
			grant("a", "k", 1, 0, 1*ms, 1000*ms), grant("b", "k", 2, 2*ms, 500*ms, 1500*ms),
		}},
		{"overlapping confirmed releases", checker.ReleasedIntervals, []checker.Op{
			grant("a", "k", 1, 0, 1*ms, 1000*ms), release("a", "k", 1, 600*ms, 610*ms, checker.Released),
			grant("b", "k", 2, 2*ms, 500*ms, 1500*ms), release("b", "k", 2, 700*ms, 710*ms, checker.Released),
		}},
		{"unexpected outcome", func(ops []checker.Op) error {
			return checker.Outcomes(ops, checker.KindAcquire, checker.Granted, checker.TimedOut)
		}, []checker.Op{{Process: "a", Kind: checker.KindAcquire, Outcome: checker.Other}}},
	} {
		if err := tc.check(tc.ops); err == nil {
			t.Errorf("%s: not detected", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
}

func TestWriteLog(t *testing.T) {
	good := []checker.LogRow{
		{ID: 1, Process: "w1", Token: 3, Read: 0, Wrote: 1},
		{ID: 2, Process: "w2", Token: 5, Read: 1, Wrote: 2},
		{ID: 3, Process: "w1", Token: 9, Read: 2, Wrote: 3},
	}
	if err := checker.WriteLog(good, 3, 9); err != nil {
		t.Errorf("good log: %v", err)
	}
	if n := checker.LostUpdates(good, 3); n != 0 {
		t.Errorf("good log: %d lost updates", n)
	}
	// A paused writer read 1 before w2's write and wrote 2 after it.
	lost := []checker.LogRow{
		{ID: 1, Process: "w1", Token: 3, Read: 0, Wrote: 1},
		{ID: 2, Process: "w2", Token: 5, Read: 1, Wrote: 2},
		{ID: 3, Process: "w1", Token: 4, Read: 1, Wrote: 2},
	}
	if err := checker.WriteLog(lost, 2, 5); err == nil {
		t.Error("lost update not detected by WriteLog")
	}
	if n := checker.LostUpdates(lost, 2); n != 1 {
		t.Errorf("LostUpdates = %d, want 1", n)
	}
	ops := []checker.Op{
		{Process: "w1", Kind: checker.KindWrite, Token: 3, Outcome: checker.WriteOK},
		{Process: "w2", Kind: checker.KindWrite, Token: 5, Outcome: checker.Stale},
	}
	if err := checker.LogMatchesHistory(good[:2], ops); err == nil {
		t.Error("a committed row of a stale write not detected")
	}
	if err := checker.LogMatchesHistory(good[:1], ops[:1]); err != nil {
		t.Errorf("matching log: %v", err)
	}
	if err := checker.LogMatchesHistory(nil, ops[:1]); err == nil {
		t.Error("a write ok but missing from the log not detected")
	}
}
