// Package raftlog is a raft.LogStore (hashicorp/raft) in segment files
// that makes one fdatasync per StoreLogs.
//
// The log is a directory of segment files, <20-digit first index>.seg,
// each preallocated (fallocate) to Options.SegmentSize (less when disk
// space is short, see below), with zeros written ahead of the records a
// MiB at a time (zero.go: so that an fdatasync need not record an extent
// conversion), and holding
// consecutive entries as CRC32C-checked records (format.go has the layout),
// and a meta file, "meta", holding the index below which entries are
// deleted. StoreLogs encodes its batch into one buffer, writes it with one
// pwrite at the end of the tail segment and makes one fdatasync before it
// returns. A batch that does not fit in the tail segment goes whole into a
// new one (created as a .tmp file, header fsync'd, renamed, directory
// fsync'd), so a batch never spans two files. An in-memory index of record
// offsets makes GetLog one pread and a CRC check.
//
// Disk space. A segment's preallocation is an optimisation, not a
// requirement: when the file system cannot give a new segment (or the tail
// at Open) the full size (ENOSPC, EDQUOT, EFBIG), it is preallocated to
// half as much, and so on down to what its first batch needs (at least
// 64 KiB), with a warning; the next segment tries the full size again. A
// log on a nearly full disk thus goes on in smaller segments: a second
// full-size segment may never fit beside the first (a 64 MiB segment on a
// 70 MiB file system), and refusing every append until the compaction that
// would free the first (which needs the appends) would wedge it for good.
// When not even that fits, StoreLogs fails and WriteErr reports it until a
// StoreLogs succeeds: hashicorp/raft keeps a follower whose appends fail
// running (it stays behind) and a leader steps down, so the node learns of
// it there (ticketingd's health).
//
// Crash safety:
//
//   - Open scans every segment. A segment before the tail must be intact
//     and contiguous with the next; anything else is an error naming the
//     file: corruption is never skipped. The records of a segment end at a
//     zero length or at the end of the file, with only zeros after them
//     (preallocated space, zeros written ahead: holes are not read); a
//     zero length with anything else after it is a bad record, like a short
//     record, a CRC mismatch or a record of another index. A zeroed length
//     must not hide the acknowledged records after it.
//   - Torn write or corruption. A bad record in the tail segment is cut as
//     a torn write of the last, unacknowledged StoreLogs only if it can be
//     one: a torn write can only damage the last StoreLogs batch, since
//     every earlier one was fdatasync'ed before it was written. Segments of
//     format version 2 (format.go; new segments are created with it) mark
//     the first and the last record of every batch, and at a bad record in
//     a version 2 tail segment Open scans the rest of the file for valid
//     records: if one starts a batch, or a non-zero byte follows one that
//     ends a batch (a batch is written with one pwrite into zeros, so a
//     torn one leaves only zeros after its end), something was written
//     after the bad record's batch was complete, so it is not a torn write
//     but corruption of acknowledged entries. A bad record below the meta
//     file's first index is not torn either (a compaction writes that index
//     after the entries from it on were synced). Either way Open fails
//     with an error naming the file, the offset and the index, changing
//     nothing (dropping the later batches could lose committed entries);
//     docs/operations.md says what to do. Nor is damage that may reach
//     into the batch before the last: a block zeroed across the end of
//     that batch and the start of the last one leaves no mark to see, so
//     what follows the bad record must be shown to be the rest of its own
//     batch (unaccounted: valid records of the next indexes without a
//     start mark, a batch end followed by zeros only, or after a damaged
//     record with no valid next one, zeros only past the end its lengths
//     give); otherwise Open fails the same way. Only then (records of the
//     last batch, a damaged one between them at most, then zeros) is it
//     cut as a torn write: Open truncates the file at the bad record (and
//     preallocates it again) and fsyncs it, so that nothing after that
//     point can be taken for a record later, and logs a warning naming the
//     file, the offset and the index. A damaged last batch is cut even if
//     it had been acknowledged: the format cannot tell that from a torn
//     one; nor can it tell a log whose last batches were zeroed whole
//     (nothing but zeros after the last good record) from a shorter log.
//     A version 1 tail segment (no marks, written by earlier versions; a
//     version 1 tail gets its appends in version 1 until the next segment)
//     is cut at its first bad record at or above the meta file's index,
//     zero lengths included: without marks a corrupt acknowledged batch
//     cannot be told from a torn last one there (the cut is logged).
//   - Segments Open deletes (below the meta file's index, or holding no
//     entry: left by a compaction, a reset or a segment creation that a
//     crash interrupted) hold no entry of the log, and are logged.
//   - Downgrade. A version that knows only format version 1 refuses a
//     version 2 segment ("segment format version 2, want 1") rather than
//     misreading it: a log written by this version can go back to such a
//     version only while its segments are all version 1, that is before
//     this version created a segment.
//   - DeleteRange of the tail (a follower's log conflict) deletes the later
//     segment files newest first, fsyncing the directory after each, then
//     truncates the segment at the first deleted record and fsyncs it before
//     it returns: the deleted entries cannot reappear after a crash, even
//     when new, shorter entries are written where they were.
//   - DeleteRange of the head (compaction) writes the new first index to
//     the meta file (tmp, fsync, rename, directory fsync), then deletes the
//     segments that hold only deleted entries; Open deletes any it finds
//     left by a crash and ignores entries below the meta file's index.
//   - Gaps. hashicorp/raft v1.8.0, on a follower that installed a
//     snapshot beyond its log (and after a user snapshot restore), keeps
//     the old log if the store is not a raft.MonotonicLogStore
//     (installSnapshot's compactLogs deletes nothing from a log shorter
//     than TrailingLogs), and the next AppendEntries stores from the
//     snapshot's index+1: a StoreLogs whose first index is above
//     LastIndex+1. The Store says it is monotonic (IsMonotonic), so raft
//     deletes the whole log itself after the install (removeOldLogs, a
//     DeleteRange that a raft.LogCache in front sees too, and clears its
//     cache). A gap can still come after a crash between the install and
//     that deletion; StoreLogs then deletes every entry itself (meta file
//     first, then the segments) and starts again at the batch's index: the
//     entries before a gap are older than the snapshot.
//
// A directory is used by one Store at a time: Open takes a flock on
// dir/LOCK and fails with ErrLocked if it is held.
package raftlog

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/ticketing-dev/ticketing/internal/fsutil"
	"github.com/ticketing-dev/ticketing/internal/raft"
)

// DefaultSegmentSize is the size segment files are preallocated to.
const DefaultSegmentSize = 64 << 20

// ErrLocked is returned by Open when the directory is in use by another
// Store (in this process or another).
var ErrLocked = errors.New("raftlog: log directory is in use (locked by another process?)")

// ErrClosed is returned by the methods of a closed Store.
var ErrClosed = errors.New("raftlog: store is closed")

// Options configure a Store. The zero value is the default.
type Options struct {
	// SegmentSize is the size segment files are preallocated to (less
	// when disk space is short: see the package doc), and the size after
	// which StoreLogs starts a new one. 0 means DefaultSegmentSize.
	SegmentSize int64
	// Logger gets what Open repairs (a torn tail, leftover files). nil
	// discards.
	Logger hclog.Logger
}

// segment is one segment file and the offsets of its records.
type segment struct {
	first uint64
	path  string
	f     *os.File
	// version is the segment's format version (format.go): records are
	// appended in it.
	version uint32
	// offs[i] is the offset of entry first+i; the last element is the end
	// of the last record. len(offs)-1 entries.
	offs []int64
	// zeroed is the offset up to which the file's bytes are known to be
	// written (records, or zeros written ahead of them); past it they may
	// be only preallocated. The segment size after a failed write of zeros
	// (no more are tried). See zeroAhead.
	zeroed int64
	// size is the size the file is preallocated to (allocate): StoreLogs
	// starts a new segment when a batch does not fit below it. It is
	// Options.SegmentSize, or less when the file system had not that much
	// space left.
	size int64
}

func (s *segment) n() uint64    { return uint64(len(s.offs) - 1) }
func (s *segment) end() int64   { return s.offs[len(s.offs)-1] }
func (s *segment) last() uint64 { return s.first + s.n() - 1 } // first-1 if empty

// Store is a raft.LogStore in a directory. Its methods are safe for
// concurrent use; GetLog, FirstIndex and LastIndex run alongside a
// StoreLogs.
type Store struct {
	dir     string
	segSize int64
	logger  hclog.Logger
	lock    *os.File

	// wmu serialises StoreLogs, DeleteRange and Close; it guards metaFirst,
	// buf and broken.
	wmu        sync.Mutex
	metaFirst  uint64 // the meta file's index
	buf        []byte
	broken     error // set when the files may no longer match the index
	gapResets  int   // StoreLogs calls that came after a gap, for tests
	zeroWrites int   // zeroAhead writes, for tests

	// werrMu guards werr, WriteErr's answer: it must not wait for a
	// StoreLogs stuck on a slow disk.
	werrMu sync.Mutex
	werr   error

	// mu guards segs, first, last and closed (written with wmu held too).
	mu          sync.RWMutex
	segs        []*segment
	first, last uint64 // 0, 0 when empty
	closed      bool
}

var (
	_ raft.LogStore          = (*Store)(nil)
	_ raft.MonotonicLogStore = (*Store)(nil)
)

// IsMonotonic returns true: the Store holds consecutive entries only, and
// raft is to delete the whole log after installing a snapshot (see the
// package doc).
func (s *Store) IsMonotonic() bool { return true }

func segName(first uint64) string { return fmt.Sprintf("%020d.seg", first) }

// Open opens the log in dir, creating it (mode 0700) if needed, and
// recovers it as the package doc says.
func Open(dir string, opts Options) (*Store, error) {
	s := &Store{dir: dir, segSize: opts.SegmentSize, logger: opts.Logger}
	if s.segSize <= 0 {
		s.segSize = DefaultSegmentSize
	}
	if s.logger == nil {
		s.logger = hclog.NewNullLogger()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	if err := lockFile(lock); err != nil {
		lock.Close()
		if errors.Is(err, ErrLocked) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, dir)
		}
		return nil, fmt.Errorf("raftlog: lock %s: %w", dir, err)
	}
	s.lock = lock
	if err := s.recover(); err != nil {
		s.closeFiles()
		return nil, err
	}
	return s, nil
}

// recover reads the meta file and the segments.
func (s *Store) recover() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	var firsts []uint64
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasSuffix(name, ".tmp"):
			// A segment or meta file whose creation a crash interrupted.
			s.logger.Warn("removing an unfinished file", "file", filepath.Join(s.dir, name))
			if err := os.Remove(filepath.Join(s.dir, name)); err != nil {
				return fmt.Errorf("raftlog: %w", err)
			}
		case strings.HasSuffix(name, ".seg"):
			first, err := strconv.ParseUint(strings.TrimSuffix(name, ".seg"), 10, 64)
			if err != nil || name != segName(first) {
				return fmt.Errorf("raftlog: unexpected file %s", filepath.Join(s.dir, name))
			}
			firsts = append(firsts, first)
		}
	}
	slices.Sort(firsts)

	metaPath := filepath.Join(s.dir, "meta")
	b, err := os.ReadFile(metaPath)
	switch {
	case errors.Is(err, os.ErrNotExist) && len(firsts) == 0:
		// A new log.
		if err := s.writeMeta(1); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("raftlog: meta file: %w", err)
	default:
		if s.metaFirst, err = decodeMeta(b); err != nil {
			return fmt.Errorf("raftlog: %s: %w", metaPath, err)
		}
	}

	// Segments holding only entries below metaFirst are left by a
	// compaction or a reset that a crash interrupted: the next segment
	// starts at or below metaFirst.
	drop := 0
	for drop+1 < len(firsts) && firsts[drop+1] <= s.metaFirst {
		drop++
	}
	for _, first := range firsts[:drop] {
		path := filepath.Join(s.dir, segName(first))
		s.logger.Info("removing a segment file that holds only deleted entries (a compaction or a reset that a crash interrupted)",
			"file", path, "meta_first", s.metaFirst)
		if err := s.removeSegmentFile(path); err != nil {
			return err
		}
	}
	firsts = firsts[drop:]

	for i, first := range firsts {
		seg, err := s.openSegment(first, i == len(firsts)-1)
		if err != nil {
			return err
		}
		if i > 0 {
			prev := s.segs[i-1]
			if first != prev.last()+1 {
				seg.f.Close()
				return fmt.Errorf("raftlog: %s starts at index %d but %s ends at %d: segments are not contiguous (corrupt or missing file)",
					seg.path, first, prev.path, prev.last())
			}
		}
		s.segs = append(s.segs, seg)
	}
	if len(s.segs) == 0 {
		return nil
	}
	tail := s.segs[len(s.segs)-1]
	if tail.last() < s.metaFirst || tail.last() < s.segs[0].first {
		// Nothing at or above metaFirst: the log is empty (a crash in a
		// deletion of every entry, or after a new segment was created
		// for the first entry of an empty log).
		segs := s.segs
		s.segs = nil
		for _, seg := range segs {
			seg.f.Close()
			s.logger.Info("removing a segment file that holds no entry of the log (a reset, or the creation of a first segment, that a crash interrupted)",
				"file", seg.path, "meta_first", s.metaFirst)
			if err := s.removeSegmentFile(seg.path); err != nil {
				return err
			}
		}
		return nil
	}
	if s.segs[0].first > s.metaFirst {
		return fmt.Errorf("raftlog: %s starts at index %d but the log starts at %d (meta file): missing segment",
			s.segs[0].path, s.segs[0].first, s.metaFirst)
	}
	s.first = max(s.metaFirst, s.segs[0].first)
	s.last = tail.last()
	return nil
}

// openSegment opens and scans a segment file. The records end at a zero
// length, or at the end of the file, with only zeros after them; anything
// else (a short or malformed record, a CRC mismatch, a record of another
// index, a zero length with non-zero bytes after it) is a bad record. In a
// segment before the tail that is an error. In the tail segment it is cut
// as a torn write only if it can be one (tornWrite); otherwise it is an
// error and the file is left as it is.
func (s *Store) openSegment(first uint64, tail bool) (*segment, error) {
	path := filepath.Join(s.dir, segName(first))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	seg := &segment{first: first, path: path, f: f}
	fail := func(format string, args ...any) (*segment, error) {
		f.Close()
		return nil, fmt.Errorf("raftlog: %s: %s", path, fmt.Sprintf(format, args...))
	}
	fi, err := f.Stat()
	if err != nil {
		return fail("%v", err)
	}
	size := fi.Size()
	r := bufio.NewReaderSize(f, 1<<20)
	hdr := make([]byte, segHeaderSize)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return fail("reading the header: %v", err)
	}
	hfirst, version, err := decodeSegHeader(hdr)
	if err != nil {
		return fail("%v", err)
	}
	seg.version = version
	if hfirst != first {
		return fail("header says first index %d, the name %d", hfirst, first)
	}
	off := int64(segHeaderSize)
	seg.offs = append(seg.offs, off)
	var (
		rh      [recHeaderSize]byte
		payload []byte
		l       raft.Log
		why     string
	)
	for {
		if off+recHeaderSize > size {
			// Fewer bytes than a record header are left. Zeros are the
			// end, as a zero length is: a full segment is trimmed to its
			// records without an fsync (StoreLogs), and a power loss may
			// undo the trim and leave a few preallocated bytes.
			if rest := size - off; rest > 0 {
				tailBytes := make([]byte, rest)
				if _, err := io.ReadFull(r, tailBytes); err != nil {
					return fail("read at %d: %v", off, err)
				}
				if !allZero(tailBytes) {
					why = "short record header"
				}
			}
			break
		}
		if _, err := io.ReadFull(r, rh[:]); err != nil {
			return fail("read at %d: %v", off, err)
		}
		n := int64(binary.LittleEndian.Uint32(rh[0:]))
		if n == 0 {
			// The end of the records, if only zeros follow (preallocated
			// space, zeros written ahead). Anything else after a zero
			// length is damage, as a bad CRC is: a zeroed length must not
			// hide the records after it.
			nz, err := firstNonZero(f, off, size)
			if err != nil {
				return fail("read at %d: %v", off, err)
			}
			if nz >= 0 {
				why = fmt.Sprintf("zero record length, but non-zero bytes follow at offset %d", nz)
			}
			break
		}
		if n > maxRecordSize || off+recHeaderSize+n > size {
			why = "record length beyond the file"
			break
		}
		payload = slices.Grow(payload[:0], int(n))[:n]
		if _, err := io.ReadFull(r, payload); err != nil {
			return fail("read at %d: %v", off, err)
		}
		if _, err := decodeRecord(payload, binary.LittleEndian.Uint32(rh[4:]), version, &l); err != nil {
			why = "CRC mismatch or malformed record"
			break
		}
		if want := first + seg.n(); l.Index != want {
			why = fmt.Sprintf("record of index %d where %d belongs", l.Index, want)
			break
		}
		off += recHeaderSize + n
		seg.offs = append(seg.offs, off)
	}
	bad := first + seg.n() // the index the bad record would have held
	if why != "" && !tail {
		return fail("corrupt record at offset %d (index %d): %s", off, bad, why)
	}
	if why != "" {
		if err := s.tornWrite(f, size, off, bad, version); err != nil {
			return fail("corrupt record at offset %d (index %d): %s; %v: not a torn write", off, bad, why, err)
		}
		s.logger.Warn("torn write at the end of the log: dropping the unfinished last append",
			"file", path, "offset", off, "index", bad, "bytes", size-off, "reason", why)
		// Whatever follows the last good record (a torn append: parts of
		// records, or whole ones past a hole) goes, so that a later,
		// shorter append there cannot make it readable again.
		if err := s.cutAt(seg, off); err != nil {
			return fail("truncating the tail: %v", err)
		}
		return seg, nil
	}
	if tail {
		// Only zeros after the records: nothing to cut. The file keeps (or
		// gets back) its preallocation, smaller if space is short.
		if seg.size, err = s.allocate(f, path, off); err != nil {
			return fail("preallocating: %v", err)
		}
	}
	return seg, nil
}

// tornWrite returns nil if the bad record at off (of index bad) in the
// tail segment f of size bytes and format version can be what a crash
// during the last StoreLogs left, and otherwise the evidence that it is
// not: it is below the meta file's first index, or (version 2) a later
// batch follows it (laterBatch). A version 1 segment has no batch marks:
// anything at or above the meta file's index is taken for a torn write.
func (s *Store) tornWrite(f *os.File, size, off int64, bad uint64, version uint32) error {
	if bad < s.metaFirst {
		// The meta file's first index m was written by a compaction, after
		// entries from m on were stored and synced (or by a reset, before
		// entries from m were stored): entries below m had been synced
		// before it.
		return fmt.Errorf("the meta file's first index %d was written after it was stored", s.metaFirst)
	}
	if version < segVersion2 {
		return nil
	}
	// Only the last batch can be torn: a later batch after the bad
	// record means it is corruption of an acknowledged one.
	rest, err := readRest(f, size, off)
	if err != nil {
		return fmt.Errorf("scanning after it: %v", err)
	}
	if later := laterBatch(rest, off, bad-1); later != "" {
		return fmt.Errorf("later batches follow it (%s)", later)
	}
	// Nor can it reach into the batch before the last one, whose end mark
	// it may have destroyed with the next batch's start mark (a block
	// zeroed across the two): what follows the bad record must be
	// accounted for as the rest of its own batch.
	if why := unaccounted(rest, off, bad); why != "" {
		return fmt.Errorf("it may reach into an acknowledged batch (%s)", why)
	}
	return nil
}

// readRest returns the bytes of f from off to size.
func readRest(f *os.File, size, off int64) ([]byte, error) {
	if size <= off {
		return nil, nil
	}
	rest := make([]byte, size-off)
	if _, err := f.ReadAt(rest, off); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return rest, nil
}

// unaccounted checks that the bytes rest of a version 2 tail segment,
// from the bad record of index bad at file offset off to the end of the
// file, can be a torn last batch (the one the bad record is in), and
// returns a description of the bytes that cannot be, or "".
//
// A torn write leaves the bytes of its batch that reached the disk and
// zeros (what was there before) where the others should be. It cannot
// damage a byte of an earlier batch, fdatasync'ed before it was written;
// but damage that did (a block zeroed across the end of one batch and the
// start of the next) looks the same once the end and start marks are
// gone, so only what can be shown to be one batch is taken for a tear.
// Walking from the bad record: a valid record of the next index with no
// start mark is in the same batch as the record before it (and fixes
// where that one ended); one that ends a batch must be followed by zeros
// only. After a damaged record with no valid next record, only zeros may
// follow the end its length field and its data and extension lengths
// give (the smaller: a write torn inside one record reached the disk up
// to some byte, and every length that did is its true value); a zero or
// absurd length gives no end. Anything else is refused: a batch may end
// and another start inside what cannot be read.
func unaccounted(rest []byte, off int64, bad uint64) string {
	const minRecord = recHeaderSize + recFixedSize
	pos, idx := 0, bad // the damaged record idx is at pos
	for {
		next, l, marks, ok := findRecord(rest, pos+minRecord, idx+1)
		if !ok {
			end := damagedEnd(rest, pos)
			if i := slices.IndexFunc(rest[end:], func(c byte) bool { return c != 0 }); i >= 0 {
				return fmt.Sprintf("non-zero bytes at offset %d, after where the damaged record of index %d can end (offset %d), and no valid record of index %d",
					off+int64(end+i), idx, off+int64(end), idx+1)
			}
			return ""
		}
		// Valid records of the following indexes, from next on.
		for {
			at := off + int64(next)
			if marks&markBatchStart != 0 {
				return fmt.Sprintf("a batch starts at offset %d (index %d)", at, l.Index)
			}
			end := next + recordSize(&l)
			if marks&markBatchEnd != 0 {
				if i := slices.IndexFunc(rest[end:], func(c byte) bool { return c != 0 }); i >= 0 {
					return fmt.Sprintf("a batch ends at offset %d (index %d), and non-zero bytes follow it at offset %d", at, l.Index, off+int64(end+i))
				}
				return ""
			}
			if !slices.ContainsFunc(rest[end:], func(c byte) bool { return c != 0 }) {
				return "" // the rest of the batch did not reach the disk
			}
			idx = l.Index + 1
			if marks, ok = recordAt(rest, end, idx, &l); !ok {
				pos = end // another damaged record
				break
			}
			next = end
		}
	}
}

// recordAt decodes the record at rest[q:] into l and returns its marks, if
// it is a valid version 2 record of index idx.
func recordAt(rest []byte, q int, idx uint64, l *raft.Log) (byte, bool) {
	if len(rest)-q < recHeaderSize+recFixedSize {
		return 0, false
	}
	n := int64(binary.LittleEndian.Uint32(rest[q:]))
	if n < recFixedSize || n > int64(len(rest)-q-recHeaderSize) {
		return 0, false
	}
	p := rest[q+recHeaderSize : q+recHeaderSize+int(n)]
	if binary.LittleEndian.Uint64(p) != idx {
		return 0, false
	}
	marks, err := decodeRecord(p, binary.LittleEndian.Uint32(rest[q+4:]), segVersion2, l)
	return marks, err == nil
}

// findRecord returns the first offset in rest from from on holding a valid
// version 2 record of index idx, the record and its marks.
func findRecord(rest []byte, from int, idx uint64) (int, raft.Log, byte, bool) {
	var l raft.Log
	// A record starts with a non-zero length: none starts past the last
	// non-zero byte.
	nz := len(bytes.TrimRight(rest, "\x00"))
	for q := from; q < nz && q <= len(rest)-(recHeaderSize+recFixedSize); q++ {
		if marks, ok := recordAt(rest, q, idx, &l); ok {
			return q, l, marks, true
		}
	}
	return 0, l, 0, false
}

// damagedEnd returns where the damaged record at rest[pos:] can end: the
// smaller of the ends its length field and its data and extension lengths
// give, those that fit in rest. A record whose header or fields run past
// the end of rest (the file) ends there; one with a zero or absurd length
// and no readable data length ends after its header.
func damagedEnd(rest []byte, pos int) int {
	size := int64(len(rest))
	p := int64(pos)
	if p+recHeaderSize > size {
		return len(rest)
	}
	n := int64(binary.LittleEndian.Uint32(rest[pos:]))
	end, known := size, false
	if n > 0 && p+recHeaderSize+n <= size {
		end, known = p+recHeaderSize+n, true
	}
	if d := p + recHeaderSize + 29; d <= size {
		dataLen := int64(binary.LittleEndian.Uint32(rest[d-4:]))
		if e := d + dataLen + 4; e <= size {
			extLen := int64(binary.LittleEndian.Uint32(rest[e-4:]))
			if e+extLen <= size {
				end, known = min(end, e+extLen), true
			}
		}
	}
	if !known && (n == 0 || n > maxRecordSize) {
		// No length to go by: only the header is the record's.
		end = p + recHeaderSize
	}
	return int(end)
}

// firstNonZero returns the offset of the first non-zero byte of f in
// [from, to), or -1. It reads only the data regions (nextData): a hole,
// such as preallocated space never written, reads as zeros.
func firstNonZero(f *os.File, from, to int64) (int64, error) {
	var buf []byte
	for off := from; off < to; {
		dfrom, dto, err := nextData(f, off, to)
		if err != nil {
			return 0, err
		}
		if buf == nil && dfrom < dto {
			buf = make([]byte, min(dto-dfrom, zeroChunk))
		}
		for off = dfrom; off < dto; {
			b := buf[:min(dto-off, int64(len(buf)))]
			if _, err := f.ReadAt(b, off); err != nil {
				return 0, err
			}
			if i := slices.IndexFunc(b, func(c byte) bool { return c != 0 }); i >= 0 {
				return off + int64(i), nil
			}
			off += int64(len(b))
		}
		off = max(off, dto)
	}
	return -1, nil
}

// laterBatch scans rest, the bytes of a version 2 tail segment from the
// bad record at file offset off on, the last good record before it being
// of index lastGood,
// for valid records (lengths, CRC, an index above lastGood), trying every
// offset (the scan only runs on this failure path). It returns a
// description of the evidence if one of them begins a batch, or if a
// non-zero byte follows one that ends a batch: the bad record's batch was
// complete when something was written after it (a torn write leaves only
// zeros after its batch's end: the batch is written with one pwrite, into
// zeros). "" means that the valid records after off, if any, can all be of
// the bad record's batch: the last one, torn.
func laterBatch(rest []byte, off int64, lastGood uint64) string {
	if len(rest) <= 1 {
		return ""
	}
	// A record starts with a non-zero length: none starts past the last
	// non-zero byte (zeros written ahead, preallocated space).
	nz := len(bytes.TrimRight(rest, "\x00"))
	const minRecord = recHeaderSize + recFixedSize
	var l raft.Log
	for q := 1; q < nz && len(rest)-q >= minRecord; q++ {
		n := int(binary.LittleEndian.Uint32(rest[q:]))
		if n < recFixedSize || n > maxRecordSize || n > len(rest)-q-recHeaderSize {
			continue
		}
		p := rest[q+recHeaderSize : q+recHeaderSize+n]
		// A record at q follows at least q/minRecord others after off.
		if idx := binary.LittleEndian.Uint64(p); idx <= lastGood || idx-lastGood > uint64(q/minRecord)+1 || !wellFormed(p) {
			continue
		}
		marks, err := decodeRecord(p, binary.LittleEndian.Uint32(rest[q+4:]), segVersion2, &l)
		if err != nil {
			continue
		}
		at := off + int64(q)
		switch end := q + recHeaderSize + n; {
		case marks&markBatchStart != 0:
			return fmt.Sprintf("a batch starts at offset %d (index %d)", at, l.Index)
		case marks&markBatchEnd != 0 && end < nz:
			return fmt.Sprintf("a batch ends at offset %d (index %d), and non-zero bytes follow it at offset %d",
				at, l.Index, off+int64(end+slices.IndexFunc(rest[end:], func(c byte) bool { return c != 0 })))
		}
		q += recHeaderSize + n - 1
	}
	return ""
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// cutAt truncates seg's file at off, preallocates it again (allocate) and
// fsyncs it.
func (s *Store) cutAt(seg *segment, off int64) error {
	seg.zeroed = min(seg.zeroed, off)
	if err := seg.f.Truncate(off); err != nil {
		return err
	}
	size, err := s.allocate(seg.f, seg.path, off)
	if err != nil {
		return err
	}
	seg.size = size
	return seg.f.Sync()
}

// minAllocate is the least a segment is preallocated to when space is
// short (unless its first batch needs more): below it a segment would
// hold too few entries to be worth its file.
const minAllocate = 64 << 10

// allocate preallocates f (path) to the segment size, and returns the size
// it got. When the file system has not that much space (ENOSPC, EDQUOT,
// EFBIG), it tries half as much, and so on down to need bytes (at least
// minAllocate unless the segment size is smaller): a log on a nearly full
// disk goes on in smaller segments rather than refuse every append (a
// full-size segment may never fit again beside the one it follows). Only
// when need bytes cannot be had is it an error.
func (s *Store) allocate(f *os.File, path string, need int64) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	cur := fi.Size()
	want := max(s.segSize, need)
	least := max(need, min(minAllocate, want))
	for size := want; ; size = max(size/2, least) {
		err := preallocate(f, size)
		if err == nil {
			if size < want {
				s.logger.Warn("disk space is short: segment preallocated to less than the segment size",
					"file", path, "size", size, "segment_size", want)
			}
			return size, nil
		}
		if !noSpace(err) || size <= least {
			return 0, err
		}
		// A failed fallocate can leave blocks allocated and the size
		// raised (ext4): give them back before trying less.
		if err := f.Truncate(cur); err != nil {
			return 0, err
		}
	}
}

// writeMeta replaces the meta file with first, durably.
func (s *Store) writeMeta(first uint64) error {
	path := filepath.Join(s.dir, "meta")
	if err := fsutil.WriteFileSync(path+".tmp", encodeMeta(first)); err != nil {
		return fmt.Errorf("raftlog: meta file: %w", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return fmt.Errorf("raftlog: meta file: %w", err)
	}
	if err := fsutil.SyncDir(s.dir); err != nil {
		// The new meta file may or may not survive a crash: what is on
		// disk no longer matches the index for sure.
		s.broken = fmt.Errorf("raftlog: meta file: fsync of %s failed: %w", s.dir, err)
		return s.broken
	}
	s.metaFirst = first
	return nil
}

// removeSegmentFile deletes a segment file and fsyncs the directory.
func (s *Store) removeSegmentFile(path string) error {
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	if err := fsutil.SyncDir(s.dir); err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	return nil
}

// createSegment creates an empty segment for entries from first, whose
// first batch is batch bytes: a .tmp file, preallocated (allocate), with
// its header fsync'd, renamed, the directory fsync'd.
func (s *Store) createSegment(first uint64, batch int64) (*segment, error) {
	path := filepath.Join(s.dir, segName(first))
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	seg := &segment{first: first, path: path, f: f, version: newSegVersion, offs: []int64{segHeaderSize}, zeroed: segHeaderSize}
	seg.size, err = s.allocate(f, path, segHeaderSize+batch)
	if err == nil {
		_, err = f.WriteAt(encodeSegHeader(first, seg.version), 0)
	}
	if err == nil {
		// The first stretch of zeros goes in with the header's fsync.
		s.zeroAhead(seg, segHeaderSize)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, path)
		if err == nil {
			if err = fsutil.SyncDir(s.dir); err != nil {
				// Renamed, but perhaps not durably: remove it again (it
				// holds no entry), and trust nothing more if that fails.
				f.Close()
				if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
					s.broken = fmt.Errorf("raftlog: creating %s: %w (and removing it: %v)", path, err, rerr)
					return nil, s.broken
				}
				return nil, fmt.Errorf("raftlog: creating %s: %w", path, err)
			}
		}
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("raftlog: creating %s: %w", path, err)
	}
	// The open file keeps the name it was opened by: open it again by its
	// final name, so that the errors of later writes name the real file.
	if nf, err := os.OpenFile(path, os.O_RDWR, 0); err == nil {
		f.Close()
		seg.f = nf
	}
	return seg, nil
}

// FirstIndex returns the first index in the log, 0 if it is empty.
func (s *Store) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrClosed
	}
	return s.first, nil
}

// LastIndex returns the last index in the log, 0 if it is empty.
func (s *Store) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return 0, ErrClosed
	}
	return s.last, nil
}

// GetLog reads entry index into l: raft.ErrLogNotFound if it is not in
// the log. l's Data and Extensions are not shared with anything else.
func (s *Store) GetLog(index uint64, l *raft.Log) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	if s.first == 0 || index < s.first || index > s.last {
		return raft.ErrLogNotFound
	}
	i, _ := slices.BinarySearchFunc(s.segs, index, func(seg *segment, idx uint64) int {
		switch {
		case seg.last() < idx:
			return -1
		case seg.first > idx:
			return 1
		}
		return 0
	})
	seg := s.segs[i]
	k := index - seg.first
	off, end := seg.offs[k], seg.offs[k+1]
	buf := make([]byte, end-off)
	if _, err := seg.f.ReadAt(buf, off); err != nil {
		return fmt.Errorf("raftlog: reading index %d in %s: %w", index, seg.path, err)
	}
	if int64(binary.LittleEndian.Uint32(buf[0:])) != end-off-recHeaderSize {
		return fmt.Errorf("raftlog: index %d in %s at offset %d: bad record length", index, seg.path, off)
	}
	if _, err := decodeRecord(buf[recHeaderSize:], binary.LittleEndian.Uint32(buf[4:]), seg.version, l); err != nil {
		return fmt.Errorf("raftlog: index %d in %s at offset %d: %w", index, seg.path, off, err)
	}
	if l.Index != index {
		return fmt.Errorf("raftlog: %s at offset %d holds index %d, want %d", seg.path, off, l.Index, index)
	}
	return nil
}

// StoreLog stores one entry (StoreLogs of one).
func (s *Store) StoreLog(l *raft.Log) error {
	return s.StoreLogs([]*raft.Log{l})
}

// StoreLogs appends entries with consecutive indexes, from LastIndex+1 (or
// any index if the log is empty), durably: it returns after one
// fdatasync. A first index above LastIndex+1 (a gap, see the package doc)
// first deletes every entry. A first index at or below LastIndex is an
// error: raft deletes conflicting entries (DeleteRange) first. An entry
// whose Type uses the bits of the batch marks (format.go; no raft.LogType
// does) is refused before anything is written.
func (s *Store) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	next := logs[0].Index
	if next == 0 {
		return errors.New("raftlog: StoreLogs of index 0")
	}
	size := 0
	for i, l := range logs {
		if l.Index != next+uint64(i) {
			return fmt.Errorf("raftlog: StoreLogs: entry %d has index %d, want %d (not consecutive)", i, l.Index, next+uint64(i))
		}
		if l.Type&typeMarks != 0 {
			return fmt.Errorf("raftlog: StoreLogs: entry %d has type %d, which uses bits the format keeps for batch marks", l.Index, l.Type)
		}
		rs := recordSize(l)
		if rs-recHeaderSize > maxRecordSize {
			return fmt.Errorf("raftlog: StoreLogs: entry %d is %d bytes, more than a record holds (%d)", l.Index, rs, maxRecordSize)
		}
		size += rs
	}
	if s.first != 0 && next <= s.last {
		return fmt.Errorf("raftlog: StoreLogs from index %d, but the log ends at %d: delete the conflicting entries first", next, s.last)
	}
	err := s.storeLogs(logs, next, int64(size))
	s.noteWrite(err)
	return err
}

// storeLogs is StoreLogs after the checks of its arguments: logs, from
// next, are size bytes of records.
func (s *Store) storeLogs(logs []*raft.Log, next uint64, size int64) error {
	if s.first != 0 {
		if next > s.last+1 {
			s.logger.Info("entries stored after a gap: deleting the log before it", "first", s.first, "last", s.last, "next", next)
			if err := s.deleteAll(next); err != nil {
				return err
			}
			s.gapResets++
		}
	}
	if s.first == 0 && len(s.segs) == 1 && s.segs[0].first != next {
		// An empty log with a segment: the one a failed write of another
		// first index left. Entries from next must not go into it.
		seg := s.segs[0]
		s.mu.Lock()
		s.segs = nil
		s.mu.Unlock()
		seg.f.Close()
		if err := s.removeSegmentFile(seg.path); err != nil {
			s.broken = err
			return err
		}
	}
	var tail *segment
	if len(s.segs) > 0 {
		tail = s.segs[len(s.segs)-1]
	}
	if tail != nil && tail.n() == 0 && tail.end()+size > tail.size {
		// An empty tail preallocated smaller than the batch (space was
		// short): it takes the batch, so it must have room for it.
		sz, err := s.allocate(tail.f, tail.path, tail.end()+size)
		if err != nil {
			return fmt.Errorf("raftlog: preallocating %s: %w", tail.path, err)
		}
		tail.size = sz
	}
	var prev *segment
	if tail == nil || (tail.n() > 0 && tail.end()+size > tail.size) {
		if tail == nil && next != s.metaFirst {
			if err := s.writeMeta(next); err != nil {
				return err
			}
		}
		seg, err := s.createSegment(next, size)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.segs = append(s.segs, seg)
		s.mu.Unlock()
		prev, tail = tail, seg
	}
	if prev != nil {
		// The full segment's preallocated rest is no use: give it back.
		// Not fsync'd: zeros or no bytes after its records read the same.
		_ = prev.f.Truncate(prev.end())
	}

	s.buf = s.buf[:0]
	offs := make([]int64, 0, len(logs))
	start := tail.end()
	for i, l := range logs {
		var marks byte
		if tail.version >= segVersion2 {
			if i == 0 {
				marks |= markBatchStart
			}
			if i == len(logs)-1 {
				marks |= markBatchEnd
			}
		}
		s.buf = appendRecord(s.buf, l, marks)
		offs = append(offs, start+int64(len(s.buf)))
	}
	if _, err := tail.f.WriteAt(s.buf, start); err != nil {
		s.undoWrite(tail, start, err)
		return fmt.Errorf("raftlog: writing %s: %w", tail.path, err)
	}
	s.zeroAhead(tail, start+int64(len(s.buf)))
	if err := datasync(tail.f); err != nil {
		// After a failed fdatasync the page cache may hold data that is not
		// on disk and never will be: nothing can be trusted any more.
		s.broken = fmt.Errorf("raftlog: fsync of %s failed: %w", tail.path, err)
		return s.broken
	}
	s.mu.Lock()
	tail.offs = append(tail.offs, offs...)
	if s.first == 0 {
		s.first = next
	}
	s.last = logs[len(logs)-1].Index
	s.mu.Unlock()
	return nil
}

// noteWrite records the outcome of a write for WriteErr: err, or nil
// (then broken, if set). Called with wmu held.
func (s *Store) noteWrite(err error) {
	if err == nil {
		err = s.broken
	}
	s.werrMu.Lock()
	s.werr = err
	s.werrMu.Unlock()
}

// WriteErr returns nil while the log can be written, and otherwise why
// not: the error of the last StoreLogs that failed to write (ENOSPC when
// the disk is full, an I/O error...), until one succeeds, or of the last
// DeleteRange that failed, until a StoreLogs succeeds; or, for good, the
// error after which the Store trusts its files no more (a failed fsync)
// and refuses every write until it is opened again. A StoreLogs refused
// for its arguments (entries not consecutive, or overlapping the log)
// writes nothing and changes nothing here. It does not wait for a
// StoreLogs in progress. A node whose log store reports an error here
// cannot follow its leader (raft's appends fail) or lead: it is not
// healthy.
func (s *Store) WriteErr() error {
	s.werrMu.Lock()
	defer s.werrMu.Unlock()
	return s.werr
}

// undoWrite cuts what a failed write may have left after start.
func (s *Store) undoWrite(seg *segment, start int64, cause error) {
	if err := s.cutAt(seg, start); err != nil {
		s.broken = fmt.Errorf("raftlog: a write to %s failed (%v) and undoing it too: %w", seg.path, cause, err)
	}
}

func (s *Store) usable() error {
	if s.closed {
		return ErrClosed
	}
	return s.broken
}

// deleteAll deletes every entry: the meta file first (to newFirst, above
// every entry), then the segments, oldest first. Called with wmu held.
func (s *Store) deleteAll(newFirst uint64) error {
	if err := s.writeMeta(newFirst); err != nil {
		return err
	}
	s.mu.Lock()
	segs := s.segs
	s.segs, s.first, s.last = nil, 0, 0
	s.mu.Unlock()
	for _, seg := range segs {
		seg.f.Close()
		if err := s.removeSegmentFile(seg.path); err != nil {
			// Open deletes it: the meta file says its entries are gone.
			s.broken = err
			return err
		}
	}
	return nil
}

// DeleteRange deletes entries min to max inclusive. The range must cover
// the head of the log (min <= FirstIndex: compaction) or its tail (max >=
// LastIndex: a log conflict); both are durable when it returns. Parts of
// the range outside the log are ignored.
func (s *Store) DeleteRange(min, max uint64) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	if s.first == 0 || min > max || max < s.first || min > s.last {
		return nil
	}
	var err error
	switch {
	case min <= s.first && max >= s.last:
		err = s.deleteAll(max + 1)
	case min <= s.first:
		err = s.deleteHead(max)
	case max >= s.last:
		err = s.deleteTail(min)
	default:
		return fmt.Errorf("raftlog: DeleteRange(%d, %d) of the middle of the log [%d, %d]: only the head or the tail can be deleted", min, max, s.first, s.last)
	}
	if err != nil {
		// A success leaves WriteErr as it was: it is about appends.
		s.noteWrite(err)
	}
	return err
}

// deleteHead deletes the entries up to max (first <= max < last).
func (s *Store) deleteHead(max uint64) error {
	if err := s.writeMeta(max + 1); err != nil {
		return err
	}
	k := 0
	for k < len(s.segs)-1 && s.segs[k].last() <= max {
		k++
	}
	s.mu.Lock()
	gone := s.segs[:k]
	s.segs = slices.Clone(s.segs[k:])
	s.first = max + 1
	s.mu.Unlock()
	for _, seg := range gone {
		seg.f.Close()
		if err := s.removeSegmentFile(seg.path); err != nil {
			// Harmless for the log (Open removes it), but report it.
			return err
		}
	}
	return nil
}

// deleteTail deletes the entries from min (first < min <= last).
func (s *Store) deleteTail(min uint64) error {
	i := len(s.segs) - 1
	for s.segs[i].first > min {
		i--
	}
	seg := s.segs[i]
	s.mu.Lock()
	gone := s.segs[i+1:]
	s.segs = slices.Clone(s.segs[:i+1])
	cut := seg.offs[min-seg.first]
	seg.offs = seg.offs[:min-seg.first+1]
	s.last = min - 1
	s.mu.Unlock()
	// Newest first, so that a crash leaves contiguous segments.
	for j := len(gone) - 1; j >= 0; j-- {
		gone[j].f.Close()
		if err := s.removeSegmentFile(gone[j].path); err != nil {
			s.broken = err
			return err
		}
	}
	if err := s.cutAt(seg, cut); err != nil {
		s.broken = fmt.Errorf("raftlog: truncating %s: %w", seg.path, err)
		return s.broken
	}
	return nil
}

// Close closes the files and releases the directory's lock. Later calls
// return ErrClosed.
func (s *Store) Close() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.closed = true
	return s.closeFiles()
}

func (s *Store) closeFiles() error {
	var errs []error
	for _, seg := range s.segs {
		errs = append(errs, seg.f.Close())
	}
	s.segs = nil
	if s.lock != nil {
		errs = append(errs, s.lock.Close())
	}
	return errors.Join(errs...)
}
