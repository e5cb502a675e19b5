package raftlog

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A record whose length field reads zero
// ended the records without a look at what follows, so an acknowledged
// batch after it was cut without a word, and nothing was logged.

// TestOpenZeroLengthBeforeLaterBatch is the reproduction: three
// batches (1-4, 5-8, 9-12) in a version 2 tail segment, then the length of
// record 5 or 6 set to zero, or records 5-6 zeroed. Open must refuse, as it
// does for a bad CRC there, and leave the file as it is.
func TestOpenZeroLengthBeforeLaterBatch(t *testing.T) {
	three := [][2]uint64{{1, 4}, {5, 8}, {9, 12}}
	tests := []struct {
		name   string
		index  uint64 // the damaged record, where the error must point
		damage func(t *testing.T, path string, offs []int64)
	}{
		{"length of record 5 zero", 5, func(t *testing.T, path string, offs []int64) {
			writeAt(t, path, offs[4], make([]byte, 4))
		}},
		{"length of record 6 zero", 6, func(t *testing.T, path string, offs []int64) {
			writeAt(t, path, offs[5], make([]byte, 4))
		}},
		{"records 5-6 zeroed", 5, func(t *testing.T, path string, offs []int64) {
			writeAt(t, path, offs[4], make([]byte, offs[6]-offs[4]))
		}},
		{"record 8 (a batch end) zeroed", 8, func(t *testing.T, path string, offs []int64) {
			writeAt(t, path, offs[7], make([]byte, offs[8]-offs[7]))
		}},
		{"length of record 2 zero", 2, func(t *testing.T, path string, offs []int64) {
			writeAt(t, path, offs[1], make([]byte, 4))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path, offs := storeBatches(t, dir, three...)
			if v := segVersionOf(t, path); v != segVersion2 {
				t.Fatalf("new segment of version %d, want %d", v, segVersion2)
			}
			tt.damage(t, path, offs)
			wantCorrupt(t, dir, path, offs[tt.index-1])
		})
	}
}

// TestOpenZeroLengthInLastBatch: a zero length in the last batch, with
// bytes of that batch after it, is a torn write (the page holding the
// length did not reach the disk): cut, and the cut is logged.
func TestOpenZeroLengthInLastBatch(t *testing.T) {
	testTornLastBatch(t, []tornCase{
		{"length of the last batch's first record zero", func(t *testing.T, path string, offs []int64) {
			writeAt(t, path, offs[4], make([]byte, 4))
		}, 4},
		{"length of a middle record zero", func(t *testing.T, path string, offs []int64) {
			writeAt(t, path, offs[6], make([]byte, 4))
		}, 6},
		{"length of the last record zero", func(t *testing.T, path string, offs []int64) {
			writeAt(t, path, offs[9], make([]byte, 4))
		}, 9},
	})
}

// TestOpenNonZeroAfterLastBatchEnd: after the record that ends a batch,
// a torn write leaves only zeros (the batch was written with one pwrite,
// into zeros); other bytes there mean that something was written after
// that batch was complete, so a bad record before it is not torn.
func TestOpenNonZeroAfterLastBatchEnd(t *testing.T) {
	dir := t.TempDir()
	path, offs := storeBatches(t, dir, [2]uint64{1, 4}, [2]uint64{5, 8})
	flipByte(t, path, offs[5]+recHeaderSize+40)                         // record 6
	writeAt(t, path, offs[8]+100, []byte{0xa5, 0xa5, 0xa5, 0xa5, 0x01}) // after 8, the batch end
	wantCorrupt(t, dir, path, offs[5])
}

// TestOpenZeroLengthVersion1: a version 1 segment has no batch marks, so a
// zero length with records after it cannot be told from a torn write: it
// is cut, as a bad CRC there is (the documented limit of version 1), but
// no longer silently.
func TestOpenZeroLengthVersion1(t *testing.T) {
	newSegVersion = segVersion1
	t.Cleanup(func() { newSegVersion = segVersion2 })
	dir := t.TempDir()
	path, offs := storeBatches(t, dir, [2]uint64{1, 4}, [2]uint64{5, 8}, [2]uint64{9, 12})
	writeAt(t, path, offs[5], make([]byte, 4))
	wantCut(t, dir, 5)
}

// TestOpenZeroLengthMiddleSegment: in a segment before the tail, a zero
// length with records after it is corruption, named as such (it was
// refused before too, but as segments that are not contiguous).
func TestOpenZeroLengthMiddleSegment(t *testing.T) {
	dir := t.TempDir()
	fillSegments(t, dir, 60)
	segs := segmentFiles(t, dir)
	off := int64(segHeaderSize + recordSize(entry(1, 1, 100)))
	writeAt(t, segs[1], off, make([]byte, 4))
	s, err := Open(dir, Options{SegmentSize: 1024})
	if err == nil {
		s.Close()
		t.Fatal("Open succeeded")
	}
	for _, want := range []string{segs[1], fmt.Sprintf("corrupt record at offset %d ", off), "zero record length"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("Open = %v; want an error with %q", err, want)
		}
	}
}

// TestOpenDamageBelowMetaFirst: a compaction writes the meta file's first
// index m after entries from m on were stored and synced, so a bad record
// below m is not a torn write, even in the last batch or in a version 1
// segment: cutting there dropped every entry of the log (the tail then
// ended below m, and Open deleted its segments as left by a reset).
func TestOpenDamageBelowMetaFirst(t *testing.T) {
	for _, v := range []uint32{segVersion1, segVersion2} {
		t.Run(fmt.Sprintf("version %d", v), func(t *testing.T) {
			newSegVersion = v
			t.Cleanup(func() { newSegVersion = segVersion2 })
			dir := t.TempDir()
			s := open(t, dir, marksSegSize)
			mustStore(t, s, entries(1, 4, 1, 50))
			mustStore(t, s, entries(5, 12, 1, 50)) // the last batch
			if err := s.DeleteRange(1, 6); err != nil {
				t.Fatal(err)
			}
			path, offs := tailOffs(s)
			s.Close()
			flipByte(t, path, offs[4]+recHeaderSize+40) // record 5, below 7
			before := readFile(t, path)
			s, logs, err := openLogged(dir)
			if err == nil {
				first, _ := s.FirstIndex()
				last, _ := s.LastIndex()
				s.Close()
				t.Fatalf("Open succeeded with [%d, %d] (7..12 were acknowledged); log: %s; segments left: %v", first, last, logs, segmentFiles(t, dir))
			}
			for _, want := range []string{path, fmt.Sprintf("corrupt record at offset %d ", offs[4]), "first index 7", "not a torn write"} {
				if !strings.Contains(err.Error(), want) {
					t.Fatalf("Open = %v; want an error with %q", err, want)
				}
			}
			if string(readFile(t, path)) != string(before) {
				t.Fatalf("Open changed %s", path)
			}
		})
	}
}

// TestOpenLogsRemovedSegments: the segments Open deletes (below the meta
// file's index, left by a compaction a crash interrupted; or holding no
// entry) are logged with their names.
func TestOpenLogsRemovedSegments(t *testing.T) {
	dir := t.TempDir()
	fillSegments(t, dir, 60)
	segs := segmentFiles(t, dir)
	saved, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, dir, 1024)
	if err := s.DeleteRange(1, 45); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.WriteFile(segs[0], saved, 0o600); err != nil {
		t.Fatal(err)
	}
	s, logs, err := openLogged(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if !strings.Contains(logs.String(), filepath.Base(segs[0])) || !strings.Contains(logs.String(), "removing") {
		t.Fatalf("the removal of %s is not logged: %s", segs[0], logs)
	}
}

// TestFirstNonZero: the check after a zero length finds a non-zero byte
// past holes and past data regions of zeros (it skips the holes, nextData),
// and reports -1 when only zeros follow.
func TestFirstNonZero(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 64 << 20
	if err := f.Truncate(size); err != nil { // a hole
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 3<<20), 1<<20); err != nil { // zeros written
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to, want int64 }{
		{0, size, -1},
		{100, 5 << 20, -1},
	} {
		if got, err := firstNonZero(f, c.from, c.to); err != nil || got != c.want {
			t.Fatalf("firstNonZero(%d, %d) of zeros = %d, %v; want %d", c.from, c.to, got, err, c.want)
		}
	}
	const at = 48<<20 + 12345
	if _, err := f.WriteAt([]byte{7}, at); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to, want int64 }{
		{0, size, at},
		{2 << 20, size, at},
		{at, at + 1, at},
		{0, at, -1},
		{at + 1, size, -1},
	} {
		if got, err := firstNonZero(f, c.from, c.to); err != nil || got != c.want {
			t.Fatalf("firstNonZero(%d, %d) = %d, %v; want %d", c.from, c.to, got, err, c.want)
		}
	}
}
