package server

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// TestNextEpoch: a node takes the smallest epoch of its parity (primary
// even, backup odd) above every mark it knows and at least the epoch of
// its token floor; the ranges of two epochs never overlap, and the newer
// is above.
func TestNextEpoch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		parity uint64
		floor  uint64
		marks  []uint64
		want   uint64
	}{
		{"new primary", 0, 0, nil, 0},
		{"new backup", 1, 0, nil, 1},
		{"primary after its epoch 0", 0, 0, []uint64{1}, 2},
		{"backup after the primary's epoch 0", 1, 0, []uint64{0, 1}, 1},
		{"primary after the backup's epoch 1", 0, 0, []uint64{1, 2}, 2},
		{"backup after epoch 6 seen", 1, 0, []uint64{3, 7}, 7},
		{"primary with a floor in epoch 5", 0, 5<<epochShift + 17, nil, 6},
		{"backup with a floor in epoch 5", 1, 5<<epochShift + 17, nil, 5},
		{"clock start", 0, 1_800_000_000_000_000, nil, 1_800_000_000_000_000>>epochShift + (1_800_000_000_000_000>>epochShift)%2},
	} {
		got, err := nextEpoch(tc.parity, tc.floor, tc.marks...)
		if err != nil || got != tc.want {
			t.Errorf("%s: nextEpoch = %d, %v; want %d", tc.name, got, err, tc.want)
		}
		if got%2 != tc.parity {
			t.Errorf("%s: epoch %d has the other node's parity", tc.name, got)
		}
		if epochCeil(got) < tc.floor {
			t.Errorf("%s: epoch %d ends (%d) below the floor %d", tc.name, got, epochCeil(got), tc.floor)
		}
	}
	if epochBase(1) <= epochCeil(0) || epochCeil(maxEpoch) != lockcore.MaxToken {
		t.Fatalf("ranges: base(1) %d, ceil(0) %d, ceil(max) %d", epochBase(1), epochCeil(0), epochCeil(maxEpoch))
	}
	if _, err := nextEpoch(1, 0, maxEpoch+1); !errors.Is(err, ErrTokensExhausted) {
		t.Fatalf("past the last epoch: %v, want ErrTokensExhausted", err)
	}
}

// TestEpochStore: pair.epoch is durable (a raise survives a reopen, a
// lower mark does not lower it), and a corrupt file refuses the start
// rather than risking an epoch used before.
func TestEpochStore(t *testing.T) {
	dir := t.TempDir()
	es, err := openEpochStore(dir)
	if err != nil || !es.fresh || es.mark != 0 {
		t.Fatalf("new: %+v, %v", es, err)
	}
	if err := es.raise(5); err != nil {
		t.Fatal(err)
	}
	if err := es.raise(3); err != nil || es.mark != 5 {
		t.Fatalf("a lower mark: %d, %v", es.mark, err)
	}
	es, err = openEpochStore(dir)
	if err != nil || es.fresh || es.mark != 5 {
		t.Fatalf("reopened: %+v, %v", es, err)
	}
	path := filepath.Join(dir, pairEpochFile)
	b, _ := os.ReadFile(path)
	b[7] ^= 1
	os.WriteFile(path, b, 0o600)
	if _, err := openEpochStore(dir); !errors.Is(err, errEpochCorrupt) {
		t.Fatalf("corrupt: %v, want errEpochCorrupt", err)
	}
	os.WriteFile(path, b[:10], 0o600)
	if _, err := openEpochStore(dir); !errors.Is(err, errEpochCorrupt) {
		t.Fatalf("truncated: %v, want errEpochCorrupt", err)
	}
}
