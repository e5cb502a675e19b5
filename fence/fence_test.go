package fence_test

import (
	"errors"
	"fmt"
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
	// A token of an earlier pair epoch is a deposed side's, not a reinstall.
	if got := (&fence.StaleError{Resource: "r", Token: hw - 1<<fence.PairEpochShift, HighWater: hw}).Error(); strings.Contains(got, "probably reinstalled") || !strings.Contains(got, "earlier token epoch") {
		t.Errorf("one epoch below: %q, want the deposed-side explanation, not the reinstall advice", got)
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

// TestStaleCause: a stale token far below the high-water is told apart by
// the token epochs (the high bits a hot-standby pair puts its epoch in): a
// deposed pair side's token is a few epochs behind and the message says it
// is expected; a token in the same epoch, or very many epochs behind, is a
// reinstalled lock service and the message says how to continue.
func TestStaleCause(t *testing.T) {
	const shift = fence.PairEpochShift
	tok := func(epoch, n uint64) uint64 { return epoch<<shift | n }
	clockEpoch := uint64(1_796_000_000_000_000) >> shift // token-start clock, late 2026
	for _, c := range []struct {
		name      string
		token, hw uint64
		want      fence.StaleCause
	}{
		{"a grant behind", 41, 42, fence.StaleBehind},
		{"its own write", 42, 42, fence.StaleAlreadyWrote},
		{"gap of ReinstallGap across an epoch boundary", tok(7, 1<<shift-1<<31), tok(8, 1<<31), fence.StaleBehind},
		{"pair failover: primary's epoch 0 deposed by the backup's epoch 1", tok(0, 12), tok(1, 3), fence.StaleEarlierEpoch},
		{"pair failover from the clock", tok(clockEpoch, 900), tok(clockEpoch+1, 2), fence.StaleEarlierEpoch},
		{"a split brain and several restarts later", tok(clockEpoch, 900), tok(clockEpoch+9, 1<<39), fence.StaleEarlierEpoch},
		{"the largest lag a pair is credited with", tok(4, 1), tok(4+fence.MaxPairEpochLag, 1), fence.StaleEarlierEpoch},
		{"reinstalled at 1 under a clock-started high-water", 2, tok(clockEpoch, 5), fence.StaleFarBelow},
		{"reinstalled at 1 under a counter of 2^33", 2, 1 << 33, fence.StaleFarBelow},
		{"clock set back an hour and more, same epoch", tok(clockEpoch, 1<<38), tok(clockEpoch, 1<<38+1<<33), fence.StaleFarBelow},
		{"beyond the largest pair lag", tok(4, 1), tok(5+fence.MaxPairEpochLag, 1), fence.StaleFarBelow},
	} {
		e := &fence.StaleError{Resource: "r", Token: c.token, HighWater: c.hw}
		if got := e.Cause(); got != c.want {
			t.Errorf("%s: Cause() = %v, want %v", c.name, got, c.want)
		}
		msg := e.Error()
		if !strings.HasPrefix(msg, fmt.Sprintf("fence: stale token %d for resource \"r\" (high-water %d)", c.token, c.hw)) {
			t.Errorf("%s: %q does not start with the token and the high-water", c.name, msg)
		}
		reinstall := strings.Contains(msg, "probably reinstalled")
		deposed := strings.Contains(msg, "lost the active role") && strings.Contains(msg, "expected, nothing to repair")
		switch c.want {
		case fence.StaleEarlierEpoch:
			if reinstall || !deposed || !strings.Contains(msg, fmt.Sprintf("earlier token epoch (%d) than the high-water (%d)", c.token>>shift, c.hw>>shift)) {
				t.Errorf("%s: %q, want the deposed pair side, not a reinstall", c.name, msg)
			}
		case fence.StaleFarBelow:
			if !reinstall || deposed || !strings.Contains(msg, fmt.Sprintf("--initial-token N, N at least the highest high_water in the fence table (here at least %d)", c.hw)) {
				t.Errorf("%s: %q, want the reinstall advice", c.name, msg)
			}
		default:
			if reinstall || deposed {
				t.Errorf("%s: %q, want neither a reinstall nor a deposed side", c.name, msg)
			}
		}
	}
	if s := fence.StaleCause(9).String(); s != "StaleCause(9)" {
		t.Errorf("unknown cause: %q", s)
	}
}
