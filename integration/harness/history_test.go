package harness_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/integration/harness"
)

// TestCheckersFail shows that each checker reports the violation it is
// for, and passes a clean history.
func TestCheckersFail(t *testing.T) {
	op := func(h *harness.History, proc, kind string, token uint64, err error) {
		h.Complete(h.Invoke(proc, kind, "k"), token, err, "")
	}
	clean := harness.NewHistory()
	op(clean, "a", harness.KindAcquire, 1, nil)
	op(clean, "a", harness.KindRelease, 1, nil)
	op(clean, "b", harness.KindAcquire, 0, broker.ErrIndeterminate)
	killed := clean.Event("test", "killed", "")
	up := clean.Event("test", "listening", "")
	op(clean, "b", harness.KindAcquire, 2, nil)
	for _, err := range []error{
		harness.CheckTokensUnique(clean),
		harness.CheckNoTicketAfterIndeterminate(clean),
		harness.CheckTokensIncreaseAcross(clean, killed, up),
		harness.CheckFencedIncreasing(clean),
	} {
		if err != nil {
			t.Errorf("clean history: %v", err)
		}
	}

	dup := harness.NewHistory()
	op(dup, "a", harness.KindAcquire, 7, nil)
	op(dup, "b", harness.KindAcquire, 7, nil)
	if harness.CheckTokensUnique(dup) == nil {
		t.Error("CheckTokensUnique passed a duplicate token")
	}

	ticketWithErr := harness.NewHistory()
	op(ticketWithErr, "a", harness.KindAcquire, 3, broker.ErrIndeterminate)
	if harness.CheckNoTicketAfterIndeterminate(ticketWithErr) == nil {
		t.Error("CheckNoTicketAfterIndeterminate passed a ticket with an indeterminate outcome")
	}
	foreign := harness.NewHistory()
	op(foreign, "a", harness.KindAcquire, 0, broker.ErrIndeterminate)
	op(foreign, "a", harness.KindFence, 4, nil)
	if harness.CheckNoTicketAfterIndeterminate(foreign) == nil {
		t.Error("CheckNoTicketAfterIndeterminate passed a fenced write with an ungranted token")
	}

	back := harness.NewHistory()
	op(back, "a", harness.KindAcquire, 10, nil)
	k := back.Event("test", "killed", "")
	u := back.Event("test", "listening", "")
	op(back, "a", harness.KindAcquire, 9, nil)
	if harness.CheckTokensIncreaseAcross(back, k, u) == nil {
		t.Error("CheckTokensIncreaseAcross passed a token going back")
	}

	outage := harness.NewHistory()
	from := outage.Now()
	op(outage, "a", harness.KindAcquire, 0, broker.ErrTimedOut)
	to := outage.Now() + time.Nanosecond
	if harness.CheckOutcomes(outage, harness.Within(from, to), harness.OutcomeUnsent) == nil {
		t.Error("CheckOutcomes passed an outcome not allowed")
	}

	fenced := harness.NewHistory()
	op(fenced, "a", harness.KindFence, 5, nil)
	time.Sleep(time.Millisecond)
	op(fenced, "b", harness.KindFence, 4, nil)
	if harness.CheckFencedIncreasing(fenced) == nil {
		t.Error("CheckFencedIncreasing passed a decreasing commit")
	}
}

const ms = time.Millisecond

// recorded is a History of ops with explicit times (History.Record).
func recorded(ops ...harness.Op) *harness.History {
	h := harness.NewHistory()
	for _, op := range ops {
		h.Record(op)
	}
	return h
}

func grant(p, key string, tok uint64, inv, done, deadline time.Duration) harness.Op {
	return harness.Op{Process: p, Kind: harness.KindAcquire, Key: key, Token: tok, Invoke: inv, Complete: done, Outcome: harness.OutcomeOK, Deadline: deadline}
}

func release(p, key string, tok uint64, inv, done time.Duration, outcome string) harness.Op {
	return harness.Op{Process: p, Kind: harness.KindRelease, Key: key, Token: tok, Invoke: inv, Complete: done, Outcome: outcome}
}

// TestRealTimeCheckersFail: the checkers of explicitly timed histories
// pass a good one and report each violation they are for.
func TestRealTimeCheckersFail(t *testing.T) {
	good := recorded(
		grant("a", "k", 1, 0, 10*ms, 1000*ms),
		release("a", "k", 1, 20*ms, 30*ms, harness.OutcomeOK),
		grant("b", "k", 2, 5*ms, 25*ms, 1000*ms),
		release("b", "k", 2, 40*ms, 50*ms, harness.OutcomeNotHeld),
		grant("c", "k", 3, 2000*ms, 2010*ms, 3000*ms), // after b's deadline
		harness.Op{Process: "d", Kind: harness.KindAcquire, Key: "k", Outcome: harness.OutcomeIndeterminate, Invoke: 0, Complete: 5 * ms},
	)
	for name, check := range map[string]func(*harness.History) error{
		"CheckNoTicketAfterIndeterminate": harness.CheckNoTicketAfterIndeterminate,
		"CheckTokensUnique":               harness.CheckTokensUnique,
		"CheckTokensFollowRealTime":       harness.CheckTokensFollowRealTime,
		"CheckLeaseExclusion":             harness.CheckLeaseExclusion,
		"CheckReleasedIntervals":          harness.CheckReleasedIntervals,
	} {
		if err := check(good); err != nil {
			t.Errorf("%s on a good history: %v", name, err)
		}
	}

	for _, tc := range []struct {
		name  string
		check func(*harness.History) error
		ops   []harness.Op
	}{
		{"ticket with an error", harness.CheckNoTicketAfterIndeterminate, []harness.Op{
			{Process: "a", Kind: harness.KindAcquire, Key: "k", Outcome: harness.OutcomeIndeterminate, Token: 7, Complete: 1},
		}},
		{"release of a token never granted", harness.CheckNoTicketAfterIndeterminate, []harness.Op{
			release("a", "k", 9, 0, 1, harness.OutcomeOK),
		}},
		{"fenced write without a token", harness.CheckNoTicketAfterIndeterminate, []harness.Op{
			{Process: "a", Kind: harness.KindFence, Key: "k", Outcome: harness.OutcomeOK, Complete: 1},
		}},
		{"token granted twice", harness.CheckTokensUnique, []harness.Op{
			grant("a", "k", 5, 0, 1, 1000*ms), grant("b", "j", 5, 2, 3, 1000*ms),
		}},
		{"token went back in time", harness.CheckTokensFollowRealTime, []harness.Op{
			grant("a", "k", 5, 0, 1*ms, 1000*ms), grant("b", "j", 4, 2*ms, 3*ms, 1000*ms),
		}},
		{"two holders", harness.CheckLeaseExclusion, []harness.Op{
			grant("a", "k", 1, 0, 1*ms, 1000*ms), grant("b", "k", 2, 2*ms, 500*ms, 1500*ms),
		}},
		{"overlapping confirmed releases", harness.CheckReleasedIntervals, []harness.Op{
			grant("a", "k", 1, 0, 1*ms, 1000*ms), release("a", "k", 1, 600*ms, 610*ms, harness.OutcomeOK),
			grant("b", "k", 2, 2*ms, 500*ms, 1500*ms), release("b", "k", 2, 700*ms, 710*ms, harness.OutcomeOK),
		}},
		{"overlapping confirmed releases by fenced writes", harness.CheckReleasedIntervals, []harness.Op{
			grant("a", "k", 1, 0, 1*ms, 1000*ms),
			{Process: "a", Kind: harness.KindFence, Key: "k", Token: 1, Invoke: 600 * ms, Complete: 610 * ms, Outcome: harness.OutcomeOK, Release: harness.OutcomeOK},
			grant("b", "k", 2, 2*ms, 500*ms, 1500*ms), release("b", "k", 2, 700*ms, 710*ms, harness.OutcomeOK),
		}},
		{"unexpected outcome", func(h *harness.History) error {
			return harness.CheckOutcomes(h, harness.OfKind(harness.KindAcquire), harness.OutcomeOK, harness.OutcomeTimedOut)
		}, []harness.Op{{Process: "a", Kind: harness.KindAcquire, Outcome: harness.OutcomeError, Complete: 1}}},
	} {
		if err := tc.check(recorded(tc.ops...)); err == nil {
			t.Errorf("%s: not detected", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
}

// TestRecord: Record keeps the caller's times and numbers the ops.
func TestRecord(t *testing.T) {
	h := harness.NewHistory()
	h.Complete(h.Invoke("a", harness.KindAcquire, "k"), 1, nil, "")
	at := h.FromWall(h.Start().Add(time.Hour).UnixNano())
	if at != time.Hour {
		t.Errorf("FromWall: %v, want 1h", at)
	}
	if seq := h.Record(grant("w", "k", 2, at, at+ms, at+time.Second)); seq != 1 {
		t.Errorf("Seq %d, want 1", seq)
	}
	ops := h.Ops()
	if got := ops[1]; got.Invoke != at || got.Complete != at+ms || got.Deadline != at+time.Second || got.Token != 2 {
		t.Errorf("recorded op %+v", got)
	}
	if n := h.Count(harness.KindAcquire, harness.OutcomeOK); n != 2 {
		t.Errorf("Count = %d, want 2", n)
	}
}

func TestOutcome(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, harness.OutcomeOK},
		{broker.ErrUnsent, harness.OutcomeUnsent},
		{broker.ErrIndeterminate, harness.OutcomeIndeterminate},
		{broker.ErrNotHeld, harness.OutcomeNotHeld},
		{&fence.StaleError{Token: 1, HighWater: 2}, harness.OutcomeStale},
		{&fence.ReleaseError{Primary: &fence.StaleError{}, Err: broker.ErrNotHeld}, harness.OutcomeStale},
		{&fence.ReleaseError{Err: broker.ErrNotHeld}, harness.OutcomeReleaseFailed},
		{&fence.ReleaseError{Primary: fence.ErrLeaseExpired, Err: broker.ErrNotHeld}, harness.OutcomeLeaseExpired},
		{errors.New("x"), harness.OutcomeError},
	} {
		if got := harness.Outcome(c.err); got != c.want {
			t.Errorf("Outcome(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
