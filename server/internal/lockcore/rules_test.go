package lockcore

import (
	"math"
	"testing"
	"time"
)

func TestRules(t *testing.T) {
	o1, o2 := ownerOfString("o1"), ownerOfString("o2")
	if got := decide(false, nil, &o1); got != GrantNew {
		t.Errorf("decide(free) = %d, want GrantNew", got)
	}
	if got := decide(true, &o1, &o1); got != GrantRetry {
		t.Errorf("decide(held by o1, o1) = %d, want GrantRetry", got)
	}
	if got := decide(true, &o1, &o2); got != GrantHeld {
		t.Errorf("decide(held by o1, o2) = %d, want GrantHeld", got)
	}
	for _, tc := range []struct {
		name      string
		kind      uint8
		token     uint64
		owner     Owner
		held      bool
		hToken    uint64
		ownedOnly bool
		want      bool
	}{
		{"release", FreeRelease, 5, o2, true, 5, false, true},
		{"release, wrong token", FreeRelease, 4, o1, true, 5, false, false},
		{"release, not held", FreeRelease, 5, o1, false, 5, false, false},
		{"release, token unknown", FreeRelease, 0, o1, true, 0, false, false},
		{"release of an owned-only holding", FreeRelease, 5, o1, true, 5, true, false},
		{"release-owned", FreeReleaseOwned, 5, o1, true, 5, true, true},
		{"release-owned, not owned-only", FreeReleaseOwned, 5, o1, true, 5, false, true},
		{"release-owned, other owner", FreeReleaseOwned, 5, o2, true, 5, true, false},
		{"release-owned, wrong token", FreeReleaseOwned, 6, o1, true, 5, true, false},
		{"expire", FreeExpire, 5, o2, true, 5, true, true},
		{"expire, wrong token", FreeExpire, 4, o1, true, 5, false, false},
		{"unknown kind", 9, 5, o1, true, 5, false, false},
	} {
		if got := mayFree(tc.kind, tc.token, &tc.owner, tc.held, tc.hToken, &o1, tc.ownedOnly); got != tc.want {
			t.Errorf("%s: mayFree = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestWaitedMS: waited_ms is whole milliseconds, rounded down, and
// saturates rather than wraps (a u32; a pathological wait past 49.7 days).
func TestWaitedMS(t *testing.T) {
	day := int64(24 * time.Hour)
	for _, tc := range []struct {
		now, arrived int64
		want         uint32
	}{
		{0, 5, 0},
		{int64(1999999 * time.Microsecond), 0, 1999}, // rounded down
		{50 * day, 0, math.MaxUint32},
		{math.MaxInt64, 0, math.MaxUint32},
	} {
		if got := WaitedMS(tc.now, tc.arrived); got != tc.want {
			t.Errorf("WaitedMS(%d, %d) = %d, want %d", tc.now, tc.arrived, got, tc.want)
		}
	}
}
