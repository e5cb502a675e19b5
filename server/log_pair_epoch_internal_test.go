package server

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

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

// TestPairReepochWhileReplicating: an active that moves to a higher epoch
// while its passive is attached (reepoch) records the epoch durably, keeps
// replicating, and its passive takes the move in order with the commands:
// the same counter and ceiling, so that its own takeover, or its machine
// after the active dies, knows the new epoch.
func TestPairReepochWhileReplicating(t *testing.T) {
	clk := NewFakeClock()
	s, backup := seamPairNodes(t, clk)
	p, q := s.pairMode(), backup.pairMode()

	p.mu.Lock()
	from := p.serving - 1
	p.reepoch(p.serving + 2) // the peer used epoch from+2
	to := p.serving - 1
	p.mu.Unlock()
	if to <= from+2 || to%2 != 0 {
		t.Fatalf("reepoch from epoch %d past %d: now %d, want an even epoch above", from, from+2, to)
	}
	es, err := openEpochStore(s.cfg.DataDir)
	if err != nil || es.mark != to+1 {
		t.Fatalf("pair.epoch after the move: mark %v (%v), want %d", es, err, to+1)
	}
	deadline := time.Now().Add(seamDeadline)
	for {
		p.sh.mu.Lock()
		last, ceil, attached, pending := p.m.Last(), p.m.Ceiling(), p.attached != nil, len(p.pending)
		p.sh.mu.Unlock()
		q.sh.mu.Lock()
		ql, qc := q.m.Last(), q.m.Ceiling()
		q.sh.mu.Unlock()
		if last != epochBase(to) || ceil != epochCeil(to) {
			t.Fatalf("the active after the move: last %d, ceiling %d; want %d, %d", last, ceil, epochBase(to), epochCeil(to))
		}
		if attached && pending == 0 && ql == last && qc == ceil {
			return
		}
		if !attached || time.Now().After(deadline) {
			t.Fatalf("the passive after the move: attached %v, pending %d, last %d, ceiling %d; want attached, last %d, ceiling %d", attached, pending, ql, qc, last, ceil)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
