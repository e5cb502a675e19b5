package raftlog

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// entry builds entry idx of term with n bytes of data that depend on both.
func entry(idx, term uint64, n int) *raft.Log {
	d := make([]byte, n)
	for i := range d {
		d[i] = byte(idx*31 + term*7 + uint64(i))
	}
	return &raft.Log{Index: idx, Term: term, Type: raft.LogCommand, Data: d, AppendedAt: time.Unix(0, int64(idx)*1000+5)}
}

func entries(first, last, term uint64, n int) []*raft.Log {
	var ls []*raft.Log
	for i := first; i <= last; i++ {
		ls = append(ls, entry(i, term, n))
	}
	return ls
}

func open(t *testing.T, dir string, segSize int64) *Store {
	t.Helper()
	s, err := Open(dir, Options{SegmentSize: segSize})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func reopen(t *testing.T, s *Store) *Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return open(t, s.dir, s.segSize)
}

func mustStore(t *testing.T, s *Store, ls []*raft.Log) {
	t.Helper()
	if err := s.StoreLogs(ls); err != nil {
		t.Fatal(err)
	}
}

// model is what a store must hold: index -> entry.
type model struct {
	first, last uint64
	logs        map[uint64]*raft.Log
}

func newModel() *model { return &model{logs: map[uint64]*raft.Log{}} }

func (m *model) store(ls []*raft.Log) {
	if m.first == 0 {
		m.first = ls[0].Index
	}
	for _, l := range ls {
		m.logs[l.Index] = l
	}
	m.last = ls[len(ls)-1].Index
}

// check compares s with m: FirstIndex, LastIndex, every entry, and
// ErrLogNotFound around them.
func (m *model) check(t *testing.T, s *Store, when string) {
	t.Helper()
	first, err1 := s.FirstIndex()
	last, err2 := s.LastIndex()
	if err1 != nil || err2 != nil || first != m.first || last != m.last {
		t.Fatalf("%s: FirstIndex, LastIndex = %d, %d (%v, %v); want %d, %d", when, first, last, err1, err2, m.first, m.last)
	}
	var l raft.Log
	for i := m.first; i <= m.last && m.first != 0; i++ {
		if err := s.GetLog(i, &l); err != nil {
			t.Fatalf("%s: GetLog(%d): %v", when, i, err)
		}
		want := m.logs[i]
		if l.Index != want.Index || l.Term != want.Term || l.Type != want.Type || !bytes.Equal(l.Data, want.Data) ||
			!bytes.Equal(l.Extensions, want.Extensions) || !l.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("%s: GetLog(%d) = index %d term %d type %v data %x ext %x at %v; want term %d data %x",
				when, i, l.Index, l.Term, l.Type, l.Data, l.Extensions, l.AppendedAt, want.Term, want.Data)
		}
	}
	for _, i := range []uint64{0, m.first - 1, m.last + 1, m.last + 100} {
		if m.first != 0 && i >= m.first && i <= m.last {
			continue
		}
		if err := s.GetLog(i, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("%s: GetLog(%d) outside [%d, %d] = %v; want ErrLogNotFound", when, i, m.first, m.last, err)
		}
	}
}

func TestAppendGet(t *testing.T) {
	s := open(t, t.TempDir(), 0)
	m := newModel()
	m.check(t, s, "empty")

	ls := entries(1, 10, 1, 40)
	ls[3].Extensions = []byte("ext")
	ls[4].Data = nil
	ls[5].AppendedAt = time.Time{}
	ls[6].Type = raft.LogConfiguration
	mustStore(t, s, ls)
	m.store(ls)
	one := entry(11, 2, 5)
	if err := s.StoreLog(one); err != nil {
		t.Fatal(err)
	}
	m.store([]*raft.Log{one})
	m.check(t, s, "stored")
	s = reopen(t, s)
	m.check(t, s, "reopened")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close = %v; want ErrClosed", err)
	}
	var l raft.Log
	if _, err := s.LastIndex(); !errors.Is(err, ErrClosed) {
		t.Fatalf("LastIndex after Close: %v", err)
	}
	if err := s.GetLog(1, &l); !errors.Is(err, ErrClosed) {
		t.Fatalf("GetLog after Close: %v", err)
	}
	if err := s.StoreLog(entry(12, 2, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("StoreLog after Close: %v", err)
	}
}

func TestStoreLogsContiguity(t *testing.T) {
	tests := []struct {
		name string
		logs []*raft.Log
		want string
	}{
		{"gap inside the batch", []*raft.Log{entry(11, 1, 1), entry(13, 1, 1)}, "not consecutive"},
		{"out of order", []*raft.Log{entry(12, 1, 1), entry(11, 1, 1)}, "not consecutive"},
		{"repeats the last entry", []*raft.Log{entry(10, 2, 1)}, "delete the conflicting entries first"},
		{"overlaps", entries(5, 12, 2, 1), "delete the conflicting entries first"},
		{"index 0", []*raft.Log{entry(0, 1, 1)}, "index 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := open(t, t.TempDir(), 0)
			defer s.Close()
			m := newModel()
			ls := entries(1, 10, 1, 8)
			mustStore(t, s, ls)
			m.store(ls)
			err := s.StoreLogs(tt.logs)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("StoreLogs = %v; want an error with %q", err, tt.want)
			}
			m.check(t, s, "after the refused StoreLogs")
			s = reopen(t, s)
			m.check(t, s, "reopened")
			next := entries(11, 12, 1, 8)
			mustStore(t, s, next)
			m.store(next)
			m.check(t, s, "appended")
		})
	}
}

// TestStoreLogsAfterGap is what raft does on a follower that installed a
// snapshot beyond its log: the next StoreLogs starts after the snapshot.
func TestStoreLogsAfterGap(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1024)
	mustStore(t, s, entries(1, 40, 1, 50))
	mustStore(t, s, entries(100, 105, 3, 50))
	m := newModel()
	m.store(entries(100, 105, 3, 50))
	m.check(t, s, "after the gap")
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segs) != 1 || filepath.Base(segs[0]) != segName(100) {
		t.Fatalf("segments %v; want only %s", segs, segName(100))
	}
	s = reopen(t, s)
	m.check(t, s, "reopened")
	s.Close()
}

func TestDeleteRangeHead(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 1024) // about 8 entries of 100 bytes a segment
	m := newModel()
	for i := uint64(1); i <= 200; i += 10 {
		ls := entries(i, i+9, 1, 100)
		mustStore(t, s, ls)
		m.store(ls)
	}
	segsBefore, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	for _, upTo := range []uint64{1, 5, 37, 38, 100, 150} {
		if err := s.DeleteRange(m.first, upTo); err != nil {
			t.Fatal(err)
		}
		for i := m.first; i <= upTo; i++ {
			delete(m.logs, i)
		}
		m.first = upTo + 1
		m.check(t, s, fmt.Sprintf("after DeleteRange(.., %d)", upTo))
		s = reopen(t, s)
		m.check(t, s, fmt.Sprintf("reopened after DeleteRange(.., %d)", upTo))
	}
	segsAfter, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	if len(segsAfter) >= len(segsBefore)/3 {
		t.Fatalf("%d segments before compaction, %d after: whole segments were not removed", len(segsBefore), len(segsAfter))
	}
	// Deleting a range beyond the first index still deletes from it.
	if err := s.DeleteRange(1, 160); err != nil {
		t.Fatal(err)
	}
	m.first = 161
	m.check(t, s, "DeleteRange(1, 160)")
	// Everything, then append at any index.
	if err := s.DeleteRange(161, 200); err != nil {
		t.Fatal(err)
	}
	m = newModel()
	m.check(t, s, "deleted everything")
	s = reopen(t, s)
	m.check(t, s, "reopened empty")
	ls := entries(500, 520, 4, 100)
	mustStore(t, s, ls)
	m.store(ls)
	s = reopen(t, s)
	m.check(t, s, "appended at 500")
	s.Close()
}

func TestDeleteRangeMiddle(t *testing.T) {
	s := open(t, t.TempDir(), 0)
	defer s.Close()
	mustStore(t, s, entries(1, 10, 1, 8))
	if err := s.DeleteRange(3, 5); err == nil || !strings.Contains(err.Error(), "middle") {
		t.Fatalf("DeleteRange(3, 5) = %v; want an error", err)
	}
	// Outside the log: nothing to do.
	for _, r := range [][2]uint64{{20, 30}, {5, 2}} {
		if err := s.DeleteRange(r[0], r[1]); err != nil {
			t.Fatalf("DeleteRange(%d, %d) = %v", r[0], r[1], err)
		}
	}
	if first, _ := s.FirstIndex(); first != 1 {
		t.Fatalf("FirstIndex = %d", first)
	}
	if last, _ := s.LastIndex(); last != 10 {
		t.Fatalf("LastIndex = %d", last)
	}
}

// TestTailTruncationNoResurrection: after a tail DeleteRange from i and a
// new entry i of a later term, of the same size, written where the old one
// was, a reopen must not find the old entries i+1... behind it: they have
// valid CRCs and contiguous indexes, but an older term.
func TestTailTruncationNoResurrection(t *testing.T) {
	for _, segSize := range []int64{0, 1024} {
		t.Run(fmt.Sprintf("segSize=%d", segSize), func(t *testing.T) {
			s := open(t, t.TempDir(), segSize)
			m := newModel()
			ls := entries(1, 30, 1, 60)
			for i := 0; i < len(ls); i += 5 {
				mustStore(t, s, ls[i:i+5])
			}
			m.store(ls)
			for _, from := range []uint64{25, 11, 3} {
				if err := s.DeleteRange(from, m.last); err != nil {
					t.Fatal(err)
				}
				for i := from; i <= m.last; i++ {
					delete(m.logs, i)
				}
				m.last = from - 1
				m.check(t, s, fmt.Sprintf("after DeleteRange(%d, ..)", from))
				term := m.logs[from-1].Term + 1
				next := []*raft.Log{entry(from, term, 60)}
				mustStore(t, s, next)
				m.store(next)
				s = reopen(t, s)
				m.check(t, s, fmt.Sprintf("reopened after the truncation from %d and a new entry of term %d", from, term))
			}
			s.Close()
		})
	}
}

// TestRandomOps runs random appends (with rotations of tiny segments), head
// compactions, tail truncations with re-appends of a new term, and gaps,
// reopening after every step and checking every entry.
func TestRandomOps(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 2048)
	m := newModel()
	rng := rand.New(rand.NewPCG(1, 2))
	term := uint64(1)
	for step := range 300 {
		var what string
		switch r := rng.IntN(20); {
		case r < 14 || m.first == 0:
			n := 1 + rng.IntN(30)
			next := m.last + 1
			if m.first == 0 && m.last == 0 {
				next = 1
			}
			var ls []*raft.Log
			for i := range n {
				ls = append(ls, entry(next+uint64(i), term, rng.IntN(200)))
			}
			mustStore(t, s, ls)
			m.store(ls)
			what = fmt.Sprintf("StoreLogs %d..%d", next, m.last)
		case r < 17:
			upTo := m.first + uint64(rng.IntN(int(m.last-m.first+1)))
			if upTo == m.last {
				upTo--
			}
			if upTo < m.first {
				continue
			}
			if err := s.DeleteRange(m.first, upTo); err != nil {
				t.Fatal(err)
			}
			m.first = upTo + 1
			what = fmt.Sprintf("DeleteRange head to %d", upTo)
		case r < 19:
			from := m.first + 1 + uint64(rng.IntN(int(m.last-m.first+1)))
			if from > m.last {
				continue
			}
			if err := s.DeleteRange(from, m.last); err != nil {
				t.Fatal(err)
			}
			m.last = from - 1
			term++
			what = fmt.Sprintf("DeleteRange tail from %d", from)
		default:
			next := m.last + 2 + uint64(rng.IntN(50))
			ls := entries(next, next+uint64(rng.IntN(10)), term, 30)
			mustStore(t, s, ls)
			m = newModel()
			m.store(ls)
			what = fmt.Sprintf("StoreLogs after a gap, %d..%d", next, m.last)
		}
		m.check(t, s, fmt.Sprintf("step %d (%s)", step, what))
		s = reopen(t, s)
		m.check(t, s, fmt.Sprintf("step %d (%s), reopened", step, what))
	}
	s.Close()
}

// segmentFiles returns the store's segment files, oldest first.
func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	return segs
}

// fillSegments stores 1..n (term 1, 100 bytes) in 1 KiB segments.
func fillSegments(t *testing.T, dir string, n uint64) {
	t.Helper()
	s := open(t, dir, 1024)
	for i := uint64(1); i <= n; i += 4 {
		mustStore(t, s, entries(i, min(i+3, n), 1, 100))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeAt writes b into the file at path at offset off.
func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestOpenCorruptSegment(t *testing.T) {
	tests := []struct {
		name    string
		corrupt func(t *testing.T, segs []string) string // returns the file the error must name
		want    string
	}{
		{"record of a middle segment", func(t *testing.T, segs []string) string {
			flipByte(t, segs[1], segHeaderSize+recHeaderSize+40)
			return segs[1]
		}, "corrupt record"},
		{"last record of a middle segment", func(t *testing.T, segs []string) string {
			fi, _ := os.Stat(segs[1])
			flipByte(t, segs[1], fi.Size()-3)
			return segs[1]
		}, "corrupt record"},
		{"header of a middle segment", func(t *testing.T, segs []string) string {
			flipByte(t, segs[2], 2)
			return segs[2]
		}, "bad magic"},
		{"header of the tail segment", func(t *testing.T, segs []string) string {
			flipByte(t, segs[len(segs)-1], 17)
			return segs[len(segs)-1]
		}, "header CRC"},
		{"missing middle segment", func(t *testing.T, segs []string) string {
			if err := os.Remove(segs[1]); err != nil {
				t.Fatal(err)
			}
			return segs[2]
		}, "not contiguous"},
		{"missing first segment", func(t *testing.T, segs []string) string {
			if err := os.Remove(segs[0]); err != nil {
				t.Fatal(err)
			}
			return segs[1]
		}, "missing segment"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			fillSegments(t, dir, 60)
			segs := segmentFiles(t, dir)
			if len(segs) < 4 {
				t.Fatalf("only %d segments", len(segs))
			}
			name := tt.corrupt(t, segs)
			s, err := Open(dir, Options{SegmentSize: 1024})
			if err == nil {
				s.Close()
				t.Fatal("Open of a corrupt log succeeded")
			}
			if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Open = %v; want an error naming %s with %q", err, name, tt.want)
			}
		})
	}
}

// TestOpenTornTail: a torn last append (a record with a bad CRC, or a hole
// of zeros, with whole records after it) leaves the prefix before it; the
// rest is cut, so that a new append of the same size there does not bring
// the old records after it back.
func TestOpenTornTail(t *testing.T) {
	tests := []struct {
		name string
		tear func(t *testing.T, path string, off int64) // off: record 8's offset
	}{
		{"bad CRC", func(t *testing.T, path string, off int64) { flipByte(t, path, off+recHeaderSize+35) }},
		{"zero length", func(t *testing.T, path string, off int64) { writeAt(t, path, off, make([]byte, 4)) }},
		{"record of another index", func(t *testing.T, path string, off int64) {
			writeAt(t, path, off, appendRecord(nil, entry(9, 1, 50), 0))
		}},
		{"length beyond the file", func(t *testing.T, path string, off int64) {
			writeAt(t, path, off, []byte{0xff, 0xff, 0xff, 0x7f})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, 0)
			mustStore(t, s, entries(1, 4, 1, 50))
			mustStore(t, s, entries(5, 10, 1, 50))
			s.mu.RLock()
			seg := s.segs[0]
			off := seg.offs[7]
			s.mu.RUnlock()
			s.Close()
			tt.tear(t, seg.path, off)

			s = open(t, dir, 0)
			m := newModel()
			m.store(entries(1, 7, 1, 50))
			m.check(t, s, "reopened after the tear")
			next := []*raft.Log{entry(8, 2, 50)}
			mustStore(t, s, next)
			m.store(next)
			s = reopen(t, s)
			m.check(t, s, "a new entry 8 of term 2, reopened")
			s.Close()
		})
	}
}

// TestOpenAfterInterruptedSteps recreates what a crash between the steps
// of a rotation, a compaction or a reset leaves.
func TestOpenAfterInterruptedSteps(t *testing.T) {
	t.Run("segment created, nothing written", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, 1024)
		mustStore(t, s, entries(1, 20, 1, 100))
		seg, err := s.createSegment(21, 0)
		if err != nil {
			t.Fatal(err)
		}
		seg.f.Close()
		// And a segment whose creation stopped before the rename.
		if err := os.WriteFile(filepath.Join(dir, segName(21)+".tmp"), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
		m := newModel()
		m.store(entries(1, 20, 1, 100))
		s = reopen(t, s)
		m.check(t, s, "reopened")
		if _, err := os.Stat(filepath.Join(dir, segName(21)+".tmp")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf(".tmp file left: %v", err)
		}
		ls := entries(21, 30, 1, 100)
		mustStore(t, s, ls)
		m.store(ls)
		s = reopen(t, s)
		m.check(t, s, "appended")
		s.Close()
	})
	t.Run("first segment of an empty log created, nothing written", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, 1024)
		if err := s.writeMeta(7); err != nil {
			t.Fatal(err)
		}
		seg, err := s.createSegment(7, 0)
		if err != nil {
			t.Fatal(err)
		}
		seg.f.Close()
		s = reopen(t, s)
		newModel().check(t, s, "reopened")
		ls := entries(7, 9, 1, 10)
		mustStore(t, s, ls)
		m := newModel()
		m.store(ls)
		s = reopen(t, s)
		m.check(t, s, "appended")
		s.Close()
	})
	t.Run("compaction: meta written, segments not deleted", func(t *testing.T) {
		dir := t.TempDir()
		fillSegments(t, dir, 60)
		segs := segmentFiles(t, dir)
		saved := map[string][]byte{}
		for _, p := range segs {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			saved[p] = b
		}
		s := open(t, dir, 1024)
		if err := s.DeleteRange(1, 45); err != nil {
			t.Fatal(err)
		}
		s.Close()
		for p, b := range saved {
			if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
				if err := os.WriteFile(p, b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		s = open(t, dir, 1024)
		m := newModel()
		m.store(entries(46, 60, 1, 100))
		m.check(t, s, "reopened")
		s.Close()
		if n := len(segmentFiles(t, dir)); n >= len(segs) {
			t.Fatalf("%d segments after the reopen, %d before the compaction", n, len(segs))
		}
	})
	t.Run("reset after a gap: meta written, segments not deleted", func(t *testing.T) {
		dir := t.TempDir()
		fillSegments(t, dir, 60)
		s := open(t, dir, 1024)
		if err := s.writeMeta(100); err != nil {
			t.Fatal(err)
		}
		s = reopen(t, s)
		newModel().check(t, s, "reopened")
		if n := len(segmentFiles(t, dir)); n != 0 {
			t.Fatalf("%d segments left", n)
		}
		s.Close()
	})
}

func TestOpenLocked(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, 0)
	if s2, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		if err == nil {
			s2.Close()
		}
		t.Fatalf("second Open = %v; want ErrLocked", err)
	}
	s.Close()
	s = open(t, dir, 0)
	s.Close()
}

func TestOpenUnexpectedFile(t *testing.T) {
	dir := t.TempDir()
	fillSegments(t, dir, 10)
	if err := os.WriteFile(filepath.Join(dir, "12.seg"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), "12.seg") {
		t.Fatalf("Open = %v; want an error naming 12.seg", err)
	}
}

// TestOpenMiddleSegmentTrimUndone: StoreLogs trims a full segment to its
// records without an fsync when it starts the next one, so a power loss
// can undo the trim. Zeros after the last record read as the end however
// few are left (here 1 to 7 bytes, less than a record header); other
// bytes there are still corruption.
func TestOpenMiddleSegmentTrimUndone(t *testing.T) {
	for _, tail := range [][]byte{{0}, {0, 0, 0}, make([]byte, recHeaderSize-1), {0, 0xff, 0}} {
		t.Run(fmt.Sprintf("%x", tail), func(t *testing.T) {
			dir := t.TempDir()
			fillSegments(t, dir, 60)
			segs := segmentFiles(t, dir)
			fi, err := os.Stat(segs[1])
			if err != nil {
				t.Fatal(err)
			}
			writeAt(t, segs[1], fi.Size(), tail)
			s, err := Open(dir, Options{SegmentSize: 1024})
			if !allZero(tail) {
				if err == nil {
					s.Close()
					t.Fatal("Open succeeded with non-zero bytes after a middle segment's records")
				}
				if !strings.Contains(err.Error(), segs[1]) || !strings.Contains(err.Error(), "short record header") {
					t.Fatalf("Open = %v; want a short record header in %s", err, segs[1])
				}
				return
			}
			if err != nil {
				t.Fatalf("Open with %d zero bytes after a middle segment's records: %v", len(tail), err)
			}
			defer s.Close()
			last, _ := s.LastIndex()
			if last != 60 {
				t.Fatalf("LastIndex = %d, want 60", last)
			}
			var l raft.Log
			for i := uint64(1); i <= 60; i++ {
				if err := s.GetLog(i, &l); err != nil {
					t.Fatalf("GetLog(%d): %v", i, err)
				}
			}
		})
	}
}
