package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/broker"
	"github.com/ticketing-dev/ticketing/fence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLongJob runs a job two leases long (12 steps of 500 ms under a 3 s
// lease): KeepAlive keeps the lock, the job finishes with its first
// token, and the fenced write commits on the refreshed deadline. Without
// the keep-alive the commit would be refused (fence.ErrLeaseExpired) and
// check would fail.
func TestLongJob(t *testing.T) {
	cfg := config{Lease: 3 * time.Second, Steps: 12, Step: 500 * time.Millisecond}
	var out bytes.Buffer
	res, err := run(t.Context(), &out, cfg)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if err := res.check(cfg); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if res.Token != 1 || res.Report.Token != 1 {
		t.Errorf("token %d, report %v: want token 1 throughout (a fresh token store)", res.Token, res.Report)
	}
	for _, want := range []string{"kept alive", "step 12/12 done", "sqlfence.Run", "committed; the lock is released"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the story lacks %q:\n%s", want, out.String())
		}
	}
}

// TestLostLockStopsTheJob: an operator expires the lock after step 2 of
// 20. The next background refresh is answered "not held", the keep-alive
// context is cancelled with broker.ErrNotHeld, and the job stops there
// (long before its end) and writes nothing.
func TestLostLockStopsTheJob(t *testing.T) {
	cfg := config{Lease: 3 * time.Second, Steps: 20, Step: 500 * time.Millisecond, LoseLockAfter: 2}
	var out bytes.Buffer
	res, err := run(t.Context(), &out, cfg)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if err := res.check(cfg); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !errors.Is(res.Lost, broker.ErrNotHeld) || res.Rows != 0 {
		t.Fatalf("lost %v, rows %d: want broker.ErrNotHeld and nothing written\n%s", res.Lost, res.Rows, out.String())
	}
	if !strings.Contains(out.String(), "LOCK LOST") {
		t.Errorf("the story does not say the lock was lost:\n%s", out.String())
	}
}

// TestSettle: what the fenced write's error means. A committed write
// whose release failed is a non-nil error that is still done: settle
// must not call it "not written" (the job would be redone and its result
// written twice).
func TestSettle(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want verdict
	}{
		{"nil", nil, committed},
		{"committed, release unconfirmed", &fence.ReleaseError{Err: broker.ErrReleaseUnconfirmed}, committedReleaseFailed},
		{"committed, release unsent", fmt.Errorf("wrapped: %w", &fence.ReleaseError{Err: broker.ErrUnsent}), committedReleaseFailed},
		{"stale, release failed", &fence.ReleaseError{Primary: &fence.StaleError{Resource: key, Token: 1, HighWater: 2}, Err: broker.ErrUnsent}, notWritten},
		{"stale", &fence.StaleError{Resource: key, Token: 1, HighWater: 2}, notWritten},
		{"lease expired", fmt.Errorf("%w: -1s remaining", fence.ErrLeaseExpired), notWritten},
		{"commit unknown", fmt.Errorf("sqlfence: %w: broken pipe", fence.ErrCommitUnknown), commitUnknown},
		{"the write ended the transaction", fmt.Errorf("sqlfence: %w", fence.ErrTxEnded), commitUnknown},
		{"the write failed", errors.New("disk full"), notWritten},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var said []string
			got := settle(func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) }, tc.err)
			if got != tc.want {
				t.Fatalf("settle(%v) = %v, want %v", tc.err, got, tc.want)
			}
			if got == committedReleaseFailed && !strings.Contains(strings.Join(said, "\n"), "do not run it again") {
				t.Errorf("settle said %q, want it to say not to run the job again", said)
			}
		})
	}
}

// TestCheck: check reports a job that did not end as it must, rather
// than a success.
func TestCheck(t *testing.T) {
	full := config{Lease: 5 * time.Second, Steps: 4, Step: time.Second}
	good := result{Token: 1, StepsDone: 4, Verdict: committed, Report: &report{Name: key, Steps: 4, Token: 1}, Rows: 1}
	if err := good.check(full); err != nil {
		t.Fatalf("good: %v", err)
	}
	lose := full
	lose.LoseLockAfter = 2
	stopped := result{Token: 1, StepsDone: 3, Lost: fmt.Errorf("%w: EXTEND answered N", broker.ErrNotHeld)}
	if err := stopped.check(lose); err != nil {
		t.Fatalf("stopped: %v", err)
	}
	for name, c := range map[string]struct {
		cfg config
		res func(*result)
	}{
		"steps missing":         {full, func(r *result) { r.StepsDone = 3 }},
		"lost":                  {full, func(r *result) { r.Lost = broker.ErrLeaseEnding }},
		"not committed":         {full, func(r *result) { r.Verdict = notWritten }},
		"no report":             {full, func(r *result) { r.Report, r.Rows = nil, 0 }},
		"another token's":       {full, func(r *result) { r.Report = &report{Name: key, Steps: 4, Token: 2} }},
		"not stopped":           {lose, func(r *result) { r.Lost = nil }},
		"ran to the end":        {lose, func(r *result) { r.StepsDone = 4 }},
		"wrote after the loss":  {lose, func(r *result) { r.Rows = 1 }},
		"lost for other reason": {lose, func(r *result) { r.Lost = broker.ErrLeaseEnding }},
	} {
		t.Run(name, func(t *testing.T) {
			r := good
			if c.cfg.LoseLockAfter > 0 {
				r = stopped
			}
			c.res(&r)
			if err := r.check(c.cfg); err == nil {
				t.Errorf("check accepted %+v", r)
			}
		})
	}
}
