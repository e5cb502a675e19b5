package checker_test

import (
	"testing"

	"github.com/ticketing-dev/ticketing/integration/checker"
	"github.com/ticketing-dev/ticketing/integration/harness"
)

// Each check must pass a good log and fail a bad one: the chaos test would
// otherwise prove nothing.
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
	okWrite := harness.Op{Process: "w1", Kind: harness.KindFence, Token: 3, Outcome: harness.OutcomeOK}
	staleWrite := harness.Op{Process: "w2", Kind: harness.KindFence, Token: 5, Outcome: harness.OutcomeStale}
	history := func(ops ...harness.Op) *harness.History {
		h := harness.NewHistory()
		for _, op := range ops {
			h.Record(op)
		}
		return h
	}
	if err := checker.LogMatchesHistory(good[:2], history(okWrite, staleWrite)); err == nil {
		t.Error("a committed row of a stale write not detected")
	}
	if err := checker.LogMatchesHistory(good[:1], history(okWrite)); err != nil {
		t.Errorf("matching log: %v", err)
	}
	if err := checker.LogMatchesHistory(nil, history(okWrite)); err == nil {
		t.Error("a write ok but missing from the log not detected")
	}
}
