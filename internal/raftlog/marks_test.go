package raftlog

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/ticketing-dev/ticketing/internal/proctest"
	"github.com/ticketing-dev/ticketing/internal/raft"
)

// The tests of the batch marks of format version 2 (format.go): a bad
// record in the tail segment with a later batch after it is corruption,
// not a torn write.

const marksSegSize = 1 << 20

// openLogged opens dir with a logger whose output it returns.
func openLogged(dir string) (*Store, *proctest.LogBuffer, error) {
	out := proctest.NewLogBuffer()
	s, err := Open(dir, Options{SegmentSize: marksSegSize, Logger: hclog.New(&hclog.LoggerOptions{Output: out})})
	return s, out, err
}

// storeBatches stores each batch (first, last: term 1, 50 bytes) with one
// StoreLogs in a new log in dir, and returns the tail segment's path and
// its record offsets (offs[i] of index tail first + i; one more at the end).
func storeBatches(t *testing.T, dir string, batches ...[2]uint64) (string, []int64) {
	t.Helper()
	s := open(t, dir, marksSegSize)
	for _, b := range batches {
		mustStore(t, s, entries(b[0], b[1], 1, 50))
	}
	path, offs := tailOffs(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path, offs
}

func tailOffs(s *Store) (string, []int64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	seg := s.segs[len(s.segs)-1]
	return seg.path, append([]int64(nil), seg.offs...)
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// segVersionOf returns the version in path's header.
func segVersionOf(t *testing.T, path string) uint32 {
	t.Helper()
	return binary.LittleEndian.Uint32(readFile(t, path)[8:])
}

// wantCorrupt opens dir, which must fail naming path, off and "not a torn
// write", leaving path as before.
func wantCorrupt(t *testing.T, dir, path string, off int64) {
	t.Helper()
	before := readFile(t, path)
	s, logs, err := openLogged(dir)
	if err == nil {
		last, _ := s.LastIndex()
		s.Close()
		t.Fatalf("Open of a tail segment with a corrupt older batch succeeded (LastIndex %d; log: %s)", last, logs)
	}
	for _, want := range []string{path, fmt.Sprintf("corrupt record at offset %d ", off), "later batches follow it", "not a torn write"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("Open = %v; want an error with %q", err, want)
		}
	}
	if !bytes.Equal(readFile(t, path), before) {
		t.Fatalf("Open changed %s", path)
	}
}

// wantCut opens dir, which must succeed with entries 1..last (term 1, 50
// bytes) after a warning of a torn write, then takes a new entry last+1 of
// term 2 and keeps it across a reopen.
func wantCut(t *testing.T, dir string, last uint64) {
	t.Helper()
	s, logs, err := openLogged(dir)
	if err != nil {
		t.Fatalf("Open of a torn last batch: %v", err)
	}
	if !strings.Contains(logs.String(), "torn write") {
		t.Fatalf("no torn write warning; log: %s", logs)
	}
	m := newModel()
	m.store(entries(1, last, 1, 50))
	m.check(t, s, "reopened after the tear")
	next := []*raft.Log{entry(last+1, 2, 50)}
	mustStore(t, s, next)
	m.store(next)
	s = reopen(t, s)
	m.check(t, s, "a new entry of term 2, reopened")
	s.Close()
}

// TestOpenCorruptOlderBatch: a bad record in a batch of the tail segment
// that later batches follow is corruption of fdatasync'ed (acknowledged)
// entries, not a torn write: Open fails and leaves the file alone.
func TestOpenCorruptOlderBatch(t *testing.T) {
	three := [][2]uint64{{1, 4}, {5, 8}, {9, 12}}
	tests := []struct {
		name    string
		batches [][2]uint64
		index   uint64 // the damaged record
		damage  func(t *testing.T, path string, off int64)
	}{
		{"bad CRC in the middle of a batch", three, 6, func(t *testing.T, path string, off int64) {
			flipByte(t, path, off+recHeaderSize+40)
		}},
		{"bad CRC in a batch's first record", three, 5, func(t *testing.T, path string, off int64) {
			flipByte(t, path, off+recHeaderSize+40)
		}},
		{"bad CRC in a batch's last record", three, 8, func(t *testing.T, path string, off int64) {
			flipByte(t, path, off+recHeaderSize+40)
		}},
		{"bad CRC in the first batch", three, 2, func(t *testing.T, path string, off int64) {
			flipByte(t, path, off+5)
		}},
		{"bad record before a last batch of one", [][2]uint64{{1, 4}, {5, 8}, {9, 9}}, 8, func(t *testing.T, path string, off int64) {
			flipByte(t, path, off+recHeaderSize+40)
		}},
		{"length beyond the file", three, 6, func(t *testing.T, path string, off int64) {
			writeAt(t, path, off, []byte{0xff, 0xff, 0xff, 0x7f})
		}},
		{"record of another index", three, 6, func(t *testing.T, path string, off int64) {
			writeAt(t, path, off, appendRecord(nil, entry(7, 1, 50), 0))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path, offs := storeBatches(t, dir, tt.batches...)
			if v := segVersionOf(t, path); v != segVersion2 {
				t.Fatalf("new segment of version %d, want %d", v, segVersion2)
			}
			off := offs[tt.index-1]
			tt.damage(t, path, off)
			wantCorrupt(t, dir, path, off)
		})
	}
}

// TestOpenTornLastBatch: damage that can be shown to lie in the last batch
// only is a torn write: cut at the first bad record, everything before
// kept (TestOpenDamageAcrossLastTwoBatches has what cannot be).
func TestOpenTornLastBatch(t *testing.T) {
	testTornLastBatch(t, []tornCase{
		{"first record damaged, later ones intact", func(t *testing.T, path string, offs []int64) {
			flipByte(t, path, offs[4]+recHeaderSize+40)
		}, 4},
		{"middle record damaged, later ones intact", func(t *testing.T, path string, offs []int64) {
			flipByte(t, path, offs[6]+recHeaderSize+20)
		}, 6},
		{"last record damaged", func(t *testing.T, path string, offs []int64) {
			flipByte(t, path, offs[9]+recHeaderSize+20)
		}, 9},
		{"end missing (short)", func(t *testing.T, path string, offs []int64) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(offs[8] + 30); err != nil {
				t.Fatal(err)
			}
		}, 8},
		{"end zeroed", func(t *testing.T, path string, offs []int64) {
			writeAt(t, path, offs[7]+20, make([]byte, offs[10]-offs[7]-20))
		}, 7},
	})
}

// tornCase is a tear of the last batch of a log of two batches, 1..4 and
// 5..10, in one version 2 segment.
type tornCase struct {
	name string
	// tear damages the last batch, 5..10; offs[i] is i+1's offset.
	tear func(t *testing.T, path string, offs []int64)
	last uint64 // what is left
}

// testTornLastBatch runs each case in a subtest: Open must cut the torn
// last batch, keeping 1..last (wantCut).
func testTornLastBatch(t *testing.T, tests []tornCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path, offs := storeBatches(t, dir, [2]uint64{1, 4}, [2]uint64{5, 10})
			tt.tear(t, path, offs)
			wantCut(t, dir, tt.last)
		})
	}
}

// TestOpenVersion1Tail: a version 1 segment (no batch marks) is cut at its
// first bad record as before, even with later batches after it; appends
// to a version 1 tail stay version 1, and the next segment is version 2.
func TestOpenVersion1Tail(t *testing.T) {
	writeV1 := func(t *testing.T) {
		newSegVersion = segVersion1
		t.Cleanup(func() { newSegVersion = segVersion2 })
	}
	t.Run("bad record before later batches: cut", func(t *testing.T) {
		writeV1(t)
		dir := t.TempDir()
		path, offs := storeBatches(t, dir, [2]uint64{1, 4}, [2]uint64{5, 8}, [2]uint64{9, 12})
		if v := segVersionOf(t, path); v != segVersion1 {
			t.Fatalf("segment of version %d, want 1", v)
		}
		flipByte(t, path, offs[5]+recHeaderSize+40)
		wantCut(t, dir, 5)
	})
	t.Run("appends to a v1 tail, then a v2 segment", func(t *testing.T) {
		dir := t.TempDir()
		newSegVersion = segVersion1
		s := open(t, dir, 1024)
		m := newModel()
		for _, ls := range [][]*raft.Log{entries(1, 3, 1, 100), entries(4, 5, 1, 100)} {
			mustStore(t, s, ls)
			m.store(ls)
		}
		newSegVersion = segVersion2
		s = reopen(t, s) // a v1 tail, opened by a binary that creates v2 segments
		ls := entries(6, 7, 1, 100)
		mustStore(t, s, ls) // still fits in the v1 segment
		m.store(ls)
		segs := segmentFiles(t, dir)
		if len(segs) != 1 || segVersionOf(t, segs[0]) != segVersion1 {
			t.Fatalf("segments %v, want one of version 1", segs)
		}
		// No marks in the v1 segment: every type byte is LogCommand's.
		_, offs := tailOffs(s)
		b := readFile(t, segs[0])
		for i := 0; i < len(offs)-1; i++ {
			if c := b[offs[i]+recHeaderSize+16]; c != byte(raft.LogCommand) {
				t.Fatalf("type byte of index %d in a version 1 segment = %#x", i+1, c)
			}
		}
		ls = entries(8, 12, 1, 100)
		mustStore(t, s, ls) // a new segment
		m.store(ls)
		s = reopen(t, s)
		m.check(t, s, "a v1 and a v2 segment, reopened")
		s.Close()
		segs = segmentFiles(t, dir)
		if len(segs) != 2 || segVersionOf(t, segs[0]) != segVersion1 || segVersionOf(t, segs[1]) != segVersion2 {
			t.Fatalf("segments %v, want one of version 1 then one of version 2", segs)
		}
	})
}

// TestOpenCorruptAfterTailTruncation: batches written after a DeleteRange
// of the tail (cut at a record boundary, perhaps in a batch) still show a
// bad record before the cut to be corruption, and a torn batch after it to
// be torn.
func TestOpenCorruptAfterTailTruncation(t *testing.T) {
	setup := func(t *testing.T) (string, string, []int64) {
		dir := t.TempDir()
		s := open(t, dir, marksSegSize)
		mustStore(t, s, entries(1, 4, 1, 50))
		mustStore(t, s, entries(5, 8, 1, 50))
		mustStore(t, s, entries(9, 12, 1, 50))
		if err := s.DeleteRange(7, 12); err != nil {
			t.Fatal(err)
		}
		mustStore(t, s, entries(7, 9, 2, 50))
		mustStore(t, s, entries(10, 11, 2, 50))
		path, offs := tailOffs(s)
		m := newModel()
		m.store(entries(1, 6, 1, 50))
		m.store(entries(7, 11, 2, 50))
		s = reopen(t, s)
		m.check(t, s, "reopened")
		s.Close()
		return dir, path, offs
	}
	t.Run("before the cut point", func(t *testing.T) {
		dir, path, offs := setup(t)
		flipByte(t, path, offs[5]+recHeaderSize+40) // index 6, the last kept of batch 5..8
		wantCorrupt(t, dir, path, offs[5])
	})
	t.Run("first batch after the cut", func(t *testing.T) {
		dir, path, offs := setup(t)
		flipByte(t, path, offs[7]+recHeaderSize+40) // index 8
		wantCorrupt(t, dir, path, offs[7])
	})
	t.Run("torn last batch", func(t *testing.T) {
		dir, path, offs := setup(t)
		flipByte(t, path, offs[9]+recHeaderSize+40) // index 10
		s, _, err := openLogged(dir)
		if err != nil {
			t.Fatal(err)
		}
		m := newModel()
		m.store(entries(1, 6, 1, 50))
		m.store(entries(7, 9, 2, 50))
		m.check(t, s, "cut at 10")
		s.Close()
	})
}

// TestBatchMarksDoNotLeak: the marks are in the file (one start and one
// end per batch) but never in an entry's Type.
func TestBatchMarksDoNotLeak(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, marksSegSize)
	m := newModel()
	types := []raft.LogType{raft.LogCommand, raft.LogNoop, raft.LogAddPeerDeprecated,
		raft.LogRemovePeerDeprecated, raft.LogBarrier, raft.LogConfiguration}
	idx := uint64(1)
	for n := 1; n <= 4; n++ { // batches of 1 to 4, every type in each place
		for k := 0; k < len(types); k++ {
			var ls []*raft.Log
			for j := 0; j < n; j++ {
				l := entry(idx, 1, 20)
				l.Type = types[(k+j)%len(types)]
				ls = append(ls, l)
				idx++
			}
			mustStore(t, s, ls)
			m.store(ls)
		}
	}
	m.check(t, s, "stored")
	path, offs := tailOffs(s)
	b := readFile(t, path)
	var ends, starts int
	for i := 0; i < len(offs)-1; i++ {
		c := b[offs[i]+recHeaderSize+16]
		if c&markBatchEnd != 0 {
			ends++
		}
		if c&markBatchStart != 0 {
			starts++
		}
	}
	if batches := 4 * len(types); ends != batches || starts != batches {
		t.Fatalf("%d batch ends and %d batch starts in the file, want %d", ends, starts, batches)
	}
	s = reopen(t, s)
	m.check(t, s, "reopened")
	s.Close()
}

// TestStoreLogsRefusesMarkBits: a Type that uses the bits of the batch
// marks is refused before anything is written.
func TestStoreLogsRefusesMarkBits(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, marksSegSize)
	m := newModel()
	ls := entries(1, 5, 1, 20)
	mustStore(t, s, ls)
	m.store(ls)
	idx := uint64(6)
	path, _ := tailOffs(s)
	before := readFile(t, path)
	for _, typ := range []raft.LogType{0x80, 0x40, 0xc5, 0xff} {
		ls := entries(idx, idx+2, 1, 20)
		ls[1].Type = typ
		err := s.StoreLogs(ls)
		if err == nil || !strings.Contains(err.Error(), "batch marks") {
			t.Fatalf("StoreLogs of type %#x = %v; want a refusal", uint8(typ), err)
		}
	}
	if !bytes.Equal(readFile(t, path), before) {
		t.Fatal("a refused StoreLogs wrote to the segment")
	}
	m.check(t, s, "after the refused StoreLogs")
	s = reopen(t, s)
	m.check(t, s, "after the refused StoreLogs, reopened")
	s.Close()

	// Every LogType raft names is clear of the mark bits.
	for lt := 0; lt < 256; lt++ {
		if lt&typeMarks != 0 && raft.LogType(lt).String() != fmt.Sprint(lt) {
			t.Fatalf("raft.LogType %d (%v) uses the batch mark bits", lt, raft.LogType(lt))
		}
	}
}

// TestSegmentVersionRefused: a version this binary does not know is
// refused with the error that binaries before version 2 give for it.
func TestSegmentVersionRefused(t *testing.T) {
	for _, v := range []uint32{0, 3} {
		_, _, err := decodeSegHeader(encodeSegHeader(1, v))
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("segment format version %d", v)) {
			t.Fatalf("decodeSegHeader of version %d = %v", v, err)
		}
	}
}
