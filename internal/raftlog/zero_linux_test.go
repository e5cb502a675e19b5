//go:build linux

package raftlog

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// The FIEMAP ioctl (linux/fiemap.h), to see which extents of a file are
// written and which only preallocated.
const (
	fsIocFiemap           = 0xC020660B
	fiemapFlagSync        = 0x1
	fiemapExtentLast      = 0x1
	fiemapExtentUnwritten = 0x800
)

type fiemapExtent struct {
	Logical, Physical, Length uint64
	_                         [2]uint64
	Flags                     uint32
	_                         [3]uint32
}

type fiemapHeader struct {
	Start, Length                        uint64
	Flags, MappedExtents, ExtentCount, _ uint32
}

// unwrittenRanges returns the byte ranges [from, to) of path that are
// preallocated but not written (FIEMAP_EXTENT_UNWRITTEN), and false if
// the file system does not tell (no FIEMAP, as on tmpfs).
func unwrittenRanges(t *testing.T, path string) ([][2]int64, bool) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const n = 512
	buf := make([]byte, int(unsafe.Sizeof(fiemapHeader{}))+n*int(unsafe.Sizeof(fiemapExtent{})))
	h := (*fiemapHeader)(unsafe.Pointer(&buf[0]))
	h.Length = ^uint64(0)
	h.Flags = fiemapFlagSync
	h.ExtentCount = n
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return nil, false
	}
	exts := unsafe.Slice((*fiemapExtent)(unsafe.Pointer(&buf[unsafe.Sizeof(fiemapHeader{})])), n)[:h.MappedExtents]
	var out [][2]int64
	for _, e := range exts {
		if e.Flags&fiemapExtentUnwritten != 0 {
			out = append(out, [2]int64{int64(e.Logical), int64(e.Logical + e.Length)})
		}
	}
	return out, true
}

// needUnwrittenExtents skips the test where fallocate does not leave
// unwritten extents that FIEMAP shows (tmpfs, a file system without
// fallocate): there is nothing for zeroAhead to avoid. In CI (the disk
// is ext4) that is a failure.
func needUnwrittenExtents(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, "probe")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	defer f.Close()
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, 1<<20); err != nil {
		skipOrFail(t, "fallocate: %v", err)
	}
	if r, ok := unwrittenRanges(t, path); !ok || len(r) == 0 {
		skipOrFail(t, "the file system of %s shows no unwritten extents after fallocate (FIEMAP: %v)", dir, ok)
	}
}

func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// overlaps reports whether [from, to) meets any of rs.
func overlaps(rs [][2]int64, from, to int64) bool {
	for _, r := range rs {
		if r[0] < to && from < r[1] {
			return true
		}
	}
	return false
}

// TestZerosAheadOfRecords: a segment's bytes are written (not merely
// preallocated) from its header to at least half a zero chunk past its
// last record, from its creation on, after records that cross a chunk,
// after a reopen and after a tail truncation, so that no fdatasync after a
// StoreLogs has to record an extent conversion. The rest stays
// preallocated. Without zeroAhead everything past the records is an
// unwritten extent.
func TestZerosAheadOfRecords(t *testing.T) {
	dir := t.TempDir()
	needUnwrittenExtents(t, dir)
	const segSize = 8 << 20
	s := open(t, dir, segSize)
	defer func() { s.Close() }()

	check := func(when string) {
		t.Helper()
		seg := s.segs[len(s.segs)-1]
		end := seg.end()
		rs, ok := unwrittenRanges(t, seg.path)
		if !ok {
			t.Fatalf("%s: FIEMAP failed on %s", when, seg.path)
		}
		if ahead := min(end+zeroChunk/2, segSize); overlaps(rs, 0, ahead) {
			t.Fatalf("%s: records end at %d, but [0, %d) has unwritten extents: %v", when, end, ahead, rs)
		}
		if !overlaps(rs, end+2*zeroChunk, segSize) {
			t.Fatalf("%s: records end at %d; want the far end [%d, %d) still only preallocated, unwritten: %v", when, end, end+2*zeroChunk, segSize, rs)
		}
	}

	mustStore(t, s, entries(1, 1, 1, 100))
	check("after the first entry")
	if s.zeroWrites != 1 {
		t.Fatalf("zeroWrites = %d after the first entry, want 1 (with the new segment's header)", s.zeroWrites)
	}
	// Entries of 4 KiB up to 1.5 chunks: the zeroed part moves on.
	next := uint64(2)
	for s.segs[0].end() < zeroChunk*3/2 {
		mustStore(t, s, entries(next, next+7, 1, 4096))
		next += 8
	}
	check("past one and a half chunks")
	if s.zeroWrites < 2 {
		t.Fatalf("zeroWrites = %d, want at least 2", s.zeroWrites)
	}
	before := s.zeroWrites
	mustStore(t, s, entries(next, next, 1, 10))
	next++
	if s.zeroWrites != before {
		t.Fatalf("a small StoreLogs well inside the zeroed part wrote zeros (%d -> %d)", before, s.zeroWrites)
	}

	// After a reopen the Store does not know what was zeroed: it zeroes
	// from the records' end on the next StoreLogs.
	s = reopen(t, s)
	mustStore(t, s, entries(next, next, 1, 10))
	next++
	check("after a reopen")

	// A tail truncation preallocates the cut part again; the next
	// StoreLogs writes zeros after the records from there.
	if err := s.DeleteRange(10, next-1); err != nil {
		t.Fatal(err)
	}
	mustStore(t, s, entries(10, 10, 2, 10))
	check("after a tail truncation")

	// The entries read back as stored, through a reopen.
	s = reopen(t, s)
	var l raft.Log
	for i := uint64(1); i <= 10; i++ {
		if err := s.GetLog(i, &l); err != nil {
			t.Fatalf("GetLog(%d): %v", i, err)
		}
	}
	if l.Term != 2 {
		t.Fatalf("entry 10 has term %d, want 2", l.Term)
	}
}
