package fence_test

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ticketing-dev/ticketing/fence"
	"github.com/ticketing-dev/ticketing/fence/fencetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewPlan(t *testing.T) {
	tk := fencetest.NewTicket("key", 9)
	for _, tc := range []struct {
		name    string
		ticket  fence.Ticket
		opts    []fence.Option
		want    fence.Plan
		wantErr error
	}{
		{"defaults", tk, nil, fence.Plan{Resources: []string{"key"}, Table: "ticketing_fence", Token: 9}, nil},
		{"resource", tk, []fence.Option{fence.WithResource("r")}, fence.Plan{Resources: []string{"r"}, Table: "ticketing_fence", Token: 9}, nil},
		{"resources sorted and deduplicated", tk, []fence.Option{fence.WithResources("b", "a", "b", "\xff")},
			fence.Plan{Resources: []string{"a", "b", "\xff"}, Table: "ticketing_fence", Token: 9}, nil},
		{"last resource option wins", tk, []fence.Option{fence.WithResources("a", "b"), fence.WithResource("c")},
			fence.Plan{Resources: []string{"c"}, Table: "ticketing_fence", Token: 9}, nil},
		{"schema table and margin", tk, []fence.Option{fence.WithTable("app.my_fence"), fence.WithCommitMargin(time.Second)},
			fence.Plan{Resources: []string{"key"}, Table: "app.my_fence", Token: 9, CommitMargin: time.Second}, nil},
		{"nil option ignored", tk, []fence.Option{nil}, fence.Plan{Resources: []string{"key"}, Table: "ticketing_fence", Token: 9}, nil},
		{"max token", fencetest.NewTicket("k", math.MaxInt64), nil,
			fence.Plan{Resources: []string{"k"}, Table: "ticketing_fence", Token: math.MaxInt64}, nil},
		{"nil ticket", nil, nil, fence.Plan{}, fence.ErrNilTicket},
		{"empty key", fencetest.NewTicket("", 1), nil, fence.Plan{}, fence.ErrInvalidResource},
		{"long key", fencetest.NewTicket(strings.Repeat("x", 256), 1), nil, fence.Plan{}, fence.ErrInvalidResource},
		{"no resources", tk, []fence.Option{fence.WithResources()}, fence.Plan{}, fence.ErrInvalidResource},
		{"one empty resource", tk, []fence.Option{fence.WithResources("a", "")}, fence.Plan{}, fence.ErrInvalidResource},
		{"token too big", fencetest.NewTicket("k", math.MaxInt64+1), nil, fence.Plan{}, fence.ErrTokenRange},
		{"table injection", tk, []fence.Option{fence.WithTable("t;drop")}, fence.Plan{}, fence.ErrInvalidTable},
		{"table three parts", tk, []fence.Option{fence.WithTable("a.b.c")}, fence.Plan{}, fence.ErrInvalidTable},
		{"table empty", tk, []fence.Option{fence.WithTable("")}, fence.Plan{}, fence.ErrInvalidTable},
		{"table leading digit", tk, []fence.Option{fence.WithTable("1t")}, fence.Plan{}, fence.ErrInvalidTable},
		{"table too long", tk, []fence.Option{fence.WithTable(strings.Repeat("t", 64))}, fence.Plan{}, fence.ErrInvalidTable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fence.NewPlan(tc.ticket, tc.opts...)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				if !strings.HasPrefix(err.Error(), "fence: ") {
					t.Errorf("error %q lacks the package prefix", err)
				}
				return
			}
			if strings.Join(got.Resources, ",") != strings.Join(tc.want.Resources, ",") || got.Table != tc.want.Table ||
				got.Token != tc.want.Token || got.CommitMargin != tc.want.CommitMargin {
				t.Errorf("plan = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestCheckLease(t *testing.T) {
	tk := fencetest.NewTicket("k", 1)
	if err := fence.CheckLease(tk); err != nil {
		t.Fatalf("fresh ticket: %v", err)
	}
	tk.SetRemaining(time.Second)
	if err := fence.CheckLease(tk, fence.WithCommitMargin(time.Second)); !errors.Is(err, fence.ErrLeaseExpired) {
		t.Fatalf("at the margin: %v", err)
	}
	tk.SetRemaining(0)
	if err := fence.CheckLease(tk); !errors.Is(err, fence.ErrLeaseExpired) {
		t.Fatalf("expired: %v", err)
	}
	if err := fence.CheckLease(nil); !errors.Is(err, fence.ErrNilTicket) {
		t.Fatalf("nil: %v", err)
	}
}

func TestErrors(t *testing.T) {
	stale := &fence.StaleError{Resource: "r\xff", Token: 3, HighWater: 5}
	if !errors.Is(stale, fence.ErrStale) || errors.Is(stale, fence.ErrRelease) {
		t.Error("StaleError must match ErrStale only")
	}
	if got, want := stale.Error(), `fence: stale token 3 for resource "r\xff" (high-water 5)`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	// Its own token as the high-water: the ticket wrote already.
	again := &fence.StaleError{Resource: "r", Token: 20, HighWater: 20}
	if got := again.Error(); !strings.Contains(got, "stale token 20") || !strings.Contains(got, "this ticket already wrote") {
		t.Errorf("Error() = %q, want it to say that this ticket already wrote", got)
	}
	// A token far below the high-water: the message says why (a
	// reinstalled lock service, most likely) and what to do; a gap of
	// exactly ReinstallGap is still an ordinary stale token.
	hw := uint64(1_796_000_000_000_000) // a lock service started from the clock in µs
	if got := (&fence.StaleError{Resource: "r", Token: hw - fence.ReinstallGap, HighWater: hw}).Error(); strings.Contains(got, "reinstalled") {
		t.Errorf("a gap of ReinstallGap: %q, want no reinstall hint", got)
	}
	far := (&fence.StaleError{Resource: "r", Token: 2, HighWater: hw}).Error()
	for _, want := range []string{"fence: stale token 2 for resource \"r\" (high-water 1796000000000000)", "far below the high-water", "probably reinstalled", "--initial-token", "at least 1796000000000000", "--token-start clock"} {
		if !strings.Contains(far, want) {
			t.Errorf("far below: %q does not say %q", far, want)
		}
	}
	if got := (&fence.StaleError{Resource: "r", Token: hw - fence.ReinstallGap - 1, HighWater: hw}).Error(); !strings.Contains(got, "reinstalled") {
		t.Errorf("a gap of ReinstallGap+1: %q, want the reinstall hint", got)
	}
	relErr := errors.New("release: N")
	committed := &fence.ReleaseError{Err: relErr}
	if !fence.Committed(committed) || !errors.Is(committed, fence.ErrRelease) || !errors.Is(committed, relErr) {
		t.Error("ReleaseError with nil Primary: committed, matches ErrRelease and the release error")
	}
	failed := &fence.ReleaseError{Primary: stale, Err: relErr}
	var se *fence.StaleError
	if fence.Committed(failed) || !errors.As(failed, &se) || se != stale || !errors.Is(failed, fence.ErrRelease) {
		t.Error("ReleaseError with a Primary: not committed, exposes the primary")
	}
	if !fence.Committed(nil) || fence.Committed(stale) {
		t.Error("Committed(nil) must be true, Committed(stale) false")
	}
	if !strings.HasPrefix(committed.Error(), "fence: ") {
		t.Errorf("%q", committed.Error())
	}
}
