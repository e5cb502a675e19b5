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
