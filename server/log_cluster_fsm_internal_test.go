package server

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/raft"

	"github.com/ticketing-dev/ticketing/internal/wire"
	"github.com/ticketing-dev/ticketing/server/internal/lockcore"
)

// The cluster's state machine alone: entries in, results and state out.

type sinkBuf struct {
	bytes.Buffer
	cancelled bool
}

func (s *sinkBuf) ID() string    { return "test" }
func (s *sinkBuf) Cancel() error { s.cancelled = true; return nil }
func (s *sinkBuf) Close() error  { return nil }

func applyCmds(t *testing.T, f *clusterFSM, stint uint64, n int, cmds []byte) []cmdResult {
	t.Helper()
	if f.stint != stint {
		// The stint's takeover entry (stint 0) comes first.
		f.done = nil
		f.Apply(&raft.Log{Type: raft.LogCommand, Data: append(entryHeader(0, 1), appendStint(nil, stint)...)})
	}
	var got []cmdResult
	f.done = func(s uint64, res []cmdResult) {
		if s != stint {
			t.Fatalf("done for stint %d, want %d", s, stint)
		}
		got = res
	}
	out := f.Apply(&raft.Log{Type: raft.LogCommand, Index: 1, Data: append(entryHeader(stint, n), cmds...)})
	if err, ok := out.(error); ok && err != nil {
		t.Fatalf("apply: %v", err)
	}
	return got
}

func TestClusterFSMCommands(t *testing.T) {
	f := newClusterFSM()
	own := [wire.OwnerLen]byte{1}
	other := [wire.OwnerLen]byte{2}
	// Two grants of one entry: a new holding, then the holder's retry.
	res := applyCmds(t, f, 7, 3, appendGrant(appendGrant(appendGrant(nil, 1, "a", &own, 10, false), 2, "a", &own, 10, false), 3, "a", &other, 10, false))
	if len(res) != 3 || res[0].res.Token != 1 || res[1].res.Token != 1 || res[2].res.Token != 0 || !res[2].res.Held {
		t.Fatalf("grants: %+v", res)
	}
	// A release by the wrong token, by the right one with a hand-off to
	// the next waiter, then an expiry of the old token (stale: no-op).
	next := &lockcore.Recipient{Owner: other, LeaseS: 20, OwnedOnly: true}
	cmds := appendFree(nil, 4, "a", 9, freeRelease, &own, nil)
	cmds = appendFree(cmds, 5, "a", 1, freeRelease, &own, next)
	cmds = appendFree(cmds, 6, "a", 1, freeExpire, &own, nil)
	res = applyCmds(t, f, 7, 3, cmds)
	if res[0].res.Freed || !res[1].res.Freed || res[1].res.Token != 2 || res[2].res.Freed {
		t.Fatalf("frees: %+v", res)
	}
	h, held := f.sm.Holding("a")
	if !held || h.Token != 2 || h.Owner != other || h.LeaseS != 20 || !h.OwnedOnly || f.sm.Len() != 1 || f.nheld.Load() != 1 {
		t.Fatalf("after the hand-off: %+v held %d", h, f.sm.Len())
	}
	// RELEASE_OWNED only: a plain release of the owned-only holding is
	// refused; by owner and token it frees.
	res = applyCmds(t, f, 7, 2, appendFree(appendFree(nil, 8, "a", 2, freeRelease, &other, nil), 9, "a", 2, freeReleaseOwned, &other, nil))
	if _, held := f.sm.Holding("a"); res[0].res.Freed || !res[1].res.Freed || f.sm.Len() != 0 || f.nheld.Load() != 0 || held {
		t.Fatalf("owned release: %+v held %d", res, f.sm.Len())
	}
	// Floor raises the counter, never lowers it; Advertise records an
	// address (entries of stint 0 answer nobody).
	f.done = func(uint64, []cmdResult) { t.Fatal("stint 0 answered") }
	changed := 0
	f.changed = func() { changed++ }
	f.Apply(&raft.Log{Type: raft.LogCommand, Data: append(entryHeader(0, 3), appendAdvertise(appendFloor(appendFloor(nil, 100), 50), "n1", "h:1")...)})
	if f.sm.Last() != 100 || f.last.Load() != 100 || f.advertised("n1") != "h:1" || changed != 1 {
		t.Fatalf("floor/advertise: last %d addr %q changed %d", f.sm.Last(), f.advertised("n1"), changed)
	}
	f.changed = nil
	// The counter stops at MaxToken: exhausted, the key stays free.
	f.Apply(&raft.Log{Type: raft.LogCommand, Data: append(entryHeader(0, 1), appendFloor(nil, MaxToken)...)})
	res = applyCmds(t, f, 8, 1, appendGrant(nil, 1, "b", &own, 10, false))
	if _, held := f.sm.Holding("b"); res[0].res.Token != 0 || !errors.Is(res[0].res.Err, lockcore.ErrTokensExhausted) || held {
		t.Fatalf("grant at MaxToken: %+v", res)
	}
}

func TestClusterFSMBadEntries(t *testing.T) {
	own := [wire.OwnerLen]byte{1}
	good := appendGrant(nil, 1, "a", &own, 10, false)
	for name, data := range map[string][]byte{
		"empty":          nil,
		"version":        append([]byte{9}, entryHeader(1, 1)[1:]...),
		"count too big":  entryHeader(1, 1<<40),
		"truncated":      append(entryHeader(1, 1), good[:len(good)-1]...),
		"trailing":       append(append(entryHeader(1, 1), good...), 0),
		"unknown type":   append(entryHeader(1, 1), 99, 1),
		"short grant":    append(entryHeader(1, 2), good...),
		"truncated free": append(entryHeader(1, 1), appendFree(nil, 1, "a", 1, freeRelease, &own, nil)[:20]...),
	} {
		f := newClusterFSM()
		f.stint = 1
		out := f.Apply(&raft.Log{Type: raft.LogCommand, Data: data})
		if err, _ := out.(error); !errors.Is(err, errEntry) {
			t.Errorf("%s: apply returned %v, want errEntry", name, out)
		}
	}
	// Non-command entries (configuration) are skipped.
	f := newClusterFSM()
	if out := f.ApplyBatch([]*raft.Log{{Type: raft.LogConfiguration, Data: []byte("x")}}); out[0] != nil {
		t.Fatalf("configuration entry: %v", out[0])
	}
}

// An entry of a stint other than the latest one started (a deposed
// leader's, appended after a new takeover) changes nothing, on every node.
func TestClusterFSMSkipsOtherStints(t *testing.T) {
	f := newClusterFSM()
	own := [wire.OwnerLen]byte{1}
	applyCmds(t, f, 5, 1, appendGrant(nil, 1, "a", &own, 10, false))
	f.Apply(&raft.Log{Type: raft.LogCommand, Data: append(entryHeader(0, 1), appendStint(nil, 6)...)})
	f.done = func(uint64, []cmdResult) { t.Fatal("an old stint's entry answered") }
	out := f.Apply(&raft.Log{Type: raft.LogCommand, Data: append(entryHeader(5, 2),
		append(appendGrant(nil, 2, "b", &own, 10, false), appendFree(nil, 3, "a", 1, freeRelease, &own, nil)...)...)})
	_, b := f.sm.Holding("b")
	_, a := f.sm.Holding("a")
	if out != nil || b || !a || f.sm.Last() != 1 {
		t.Fatalf("old stint's entry applied: out %v, b %v, a %v, last %d", out, b, a, f.sm.Last())
	}
}

func TestClusterFSMSnapshotRoundTrip(t *testing.T) {
	f := newClusterFSM()
	own := [wire.OwnerLen]byte{3}
	f.Apply(&raft.Log{Type: raft.LogCommand, Data: append(entryHeader(0, 3), appendAdvertise(appendAdvertise(appendFloor(nil, 41), "b", "hb:2"), "a", "ha:1")...)})
	applyCmds(t, f, 5, 2, appendGrant(appendGrant(nil, 1, "x", &own, 7, true), 2, "y", &own, 9, false))
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	var sink sinkBuf
	if err := snap.Persist(&sink); err != nil {
		t.Fatal(err)
	}
	b := sink.Bytes()
	g := newClusterFSM()
	if err := g.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
	if g.sm.Last() != 43 || g.last.Load() != 43 || g.sm.Len() != 2 || g.nheld.Load() != 2 || g.stint != 5 || g.advertised("a") != "ha:1" || g.advertised("b") != "hb:2" {
		t.Fatalf("restored: last %d held %d addrs %v", g.sm.Last(), g.sm.Len(), g.addrs)
	}
	if x, held := g.sm.Holding("x"); !held || x.Token != 42 || !x.OwnedOnly || x.LeaseS != 7 {
		t.Fatalf("restored x: %+v", x)
	}
	// Equal states encode to equal bytes.
	snap2, _ := g.Snapshot()
	var sink2 sinkBuf
	snap2.Persist(&sink2)
	if !bytes.Equal(b, sink2.Bytes()) {
		t.Fatal("a restored state's snapshot differs")
	}
	// Restore refuses what is not a snapshot, and every truncation.
	for i := range len(b) {
		if err := newClusterFSM().Restore(io.NopCloser(bytes.NewReader(b[:i]))); !errors.Is(err, errSnapshot) && !errors.Is(err, lockcore.ErrSnapshot) {
			t.Fatalf("restore of %d of %d bytes: %v, want a snapshot error", i, len(b), err)
		}
	}
	if err := newClusterFSM().Restore(io.NopCloser(bytes.NewReader(append(b, 0)))); !errors.Is(err, errSnapshot) {
		t.Fatalf("restore with a trailing byte: %v, want errSnapshot", err)
	}
}
