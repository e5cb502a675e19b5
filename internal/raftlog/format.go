package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// On-disk format. All integers are little endian.
//
// A segment file starts with a header of segHeaderSize bytes:
//
//	magic [8]byte "TKRFTLOG", version u32, reserved u32, first index u64,
//	CRC32C u32 of the 24 bytes before it, 4 zero bytes
//
// then records, each
//
//	length u32 (of what follows the CRC), CRC32C u32 (of what follows it),
//	index u64, term u64, type u8, AppendedAt i64 (unix nanoseconds, 0 for
//	the zero time), data length u32, data, extensions length u32,
//	extensions
//
// A length of zero (preallocated space reads as zeros) or the end of the
// file ends the records, if only zeros follow: a zero length with other
// bytes after it is a bad record.
//
// Segment versions. Version 1 records carry the raft.LogType in the type
// byte as it is. Version 2 (what new segments are created with) marks the
// batches of StoreLogs in the type byte's two high bits: markBatchEnd on
// the last record of every StoreLogs batch, markBatchStart on its first
// (a batch of one has both); they are masked off when decoding, and
// StoreLogs refuses a LogType that uses them (raft's go up to 5). Records
// are appended to a segment in its own version, so a version 1 tail
// segment stays version 1 (without marks) until the next segment is
// created. A binary that only knows version 1 refuses a version 2 segment
// ("segment format version 2, want 1").
//
// The marks let Open tell a torn write from corruption in a version 2
// tail segment: a torn write (a crash during the last StoreLogs) can only
// damage the last batch, since every earlier one was fdatasync'ed before
// it was written. At the first bad record (a zero length with non-zero
// bytes after it, a short record, a CRC mismatch, another index), Open
// scans the rest of the file for valid records (CRC, lengths, an index
// above the last good one): a valid batch start after the bad record, or
// a non-zero byte after a valid batch end, is a later batch, so the bad
// record is corruption of an acknowledged batch and Open fails without
// changing the file. So it does when the bytes after the bad record cannot
// be shown to be the rest of its batch (unaccounted: a block zeroed across
// two batches destroys both marks). Otherwise the bad record is in the
// last batch and is cut as a torn write. A version 1 tail segment is cut
// at its first bad record (package doc).
//
// The meta file holds the first index the log may hold (entries below it
// are deleted even if a segment still has them):
//
//	magic [8]byte "TKRFTMET", version u32 (1), first index u64, CRC32C u32
//	of the 20 bytes before it
const (
	segMagic    = "TKRFTLOG"
	metaMagic   = "TKRFTMET"
	metaVersion = 1
	segVersion1 = 1 // records without batch marks
	segVersion2 = 2 // batch marks in the type byte

	// The type byte's bits that version 2 uses for batch marks.
	markBatchEnd   = 0x80
	markBatchStart = 0x40
	typeMarks      = markBatchEnd | markBatchStart

	segHeaderSize = 32
	metaSize      = 24

	recHeaderSize = 8                     // length, CRC
	recFixedSize  = 8 + 8 + 1 + 8 + 4 + 4 // index .. data length, extensions length
	// maxRecordSize bounds a record's length field, so that a corrupt
	// length is not taken for a huge allocation.
	maxRecordSize = 1 << 30
)

// No raft.LogType may use the mark bits: this fails to compile if raft's
// last LogType reaches the lower of them (a LogType is a uint8, so the
// constant would be negative; StoreLogs also refuses any entry that uses
// them).
const _ = markBatchStart - 1 - raft.LogConfiguration

// newSegVersion is the version new segments are created with; tests set it
// to segVersion1 to write old segments.
var newSegVersion uint32 = segVersion2

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errTorn marks a record that is incomplete or fails its CRC.
var errTorn = errors.New("torn or corrupt record")

func encodeSegHeader(first uint64, version uint32) []byte {
	b := make([]byte, segHeaderSize)
	copy(b, segMagic)
	binary.LittleEndian.PutUint32(b[8:], version)
	binary.LittleEndian.PutUint64(b[16:], first)
	binary.LittleEndian.PutUint32(b[24:], crc32.Checksum(b[:24], castagnoli))
	return b
}

// decodeSegHeader returns the first index and the version of a segment
// header.
func decodeSegHeader(b []byte) (uint64, uint32, error) {
	if len(b) < segHeaderSize || string(b[:8]) != segMagic {
		return 0, 0, errors.New("not a segment file (bad magic)")
	}
	if crc32.Checksum(b[:24], castagnoli) != binary.LittleEndian.Uint32(b[24:]) {
		return 0, 0, errors.New("segment header CRC mismatch")
	}
	v := binary.LittleEndian.Uint32(b[8:])
	if v != segVersion1 && v != segVersion2 {
		return 0, 0, fmt.Errorf("segment format version %d, want %d or %d", v, segVersion1, segVersion2)
	}
	return binary.LittleEndian.Uint64(b[16:]), v, nil
}

func encodeMeta(first uint64) []byte {
	b := make([]byte, metaSize)
	copy(b, metaMagic)
	binary.LittleEndian.PutUint32(b[8:], metaVersion)
	binary.LittleEndian.PutUint64(b[12:], first)
	binary.LittleEndian.PutUint32(b[20:], crc32.Checksum(b[:20], castagnoli))
	return b
}

func decodeMeta(b []byte) (uint64, error) {
	if len(b) != metaSize || string(b[:8]) != metaMagic {
		return 0, errors.New("not a meta file")
	}
	if crc32.Checksum(b[:20], castagnoli) != binary.LittleEndian.Uint32(b[20:]) {
		return 0, errors.New("meta file CRC mismatch")
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != metaVersion {
		return 0, fmt.Errorf("meta format version %d, want %d", v, metaVersion)
	}
	return binary.LittleEndian.Uint64(b[12:]), nil
}

// recordSize is the encoded size of l.
func recordSize(l *raft.Log) int {
	return recHeaderSize + recFixedSize + len(l.Data) + len(l.Extensions)
}

// appendRecord appends l's record to b, with marks (batch marks of a
// version 2 segment, 0 in version 1) in its type byte. l.Type must not use
// the mark bits.
func appendRecord(b []byte, l *raft.Log, marks byte) []byte {
	start := len(b)
	n := recordSize(l)
	b = append(b, make([]byte, n)...)
	r := b[start:]
	binary.LittleEndian.PutUint32(r[0:], uint32(n-recHeaderSize))
	p := r[recHeaderSize:]
	binary.LittleEndian.PutUint64(p[0:], l.Index)
	binary.LittleEndian.PutUint64(p[8:], l.Term)
	p[16] = byte(l.Type) | marks
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	binary.LittleEndian.PutUint64(p[17:], uint64(at))
	binary.LittleEndian.PutUint32(p[25:], uint32(len(l.Data)))
	o := 29 + copy(p[29:], l.Data)
	binary.LittleEndian.PutUint32(p[o:], uint32(len(l.Extensions)))
	copy(p[o+4:], l.Extensions)
	binary.LittleEndian.PutUint32(r[4:], crc32.Checksum(p, castagnoli))
	return b
}

// wellFormed reports whether the lengths in payload p agree with its
// size (the CRC is not checked).
func wellFormed(p []byte) bool {
	if len(p) < recFixedSize {
		return false
	}
	dataLen := int64(binary.LittleEndian.Uint32(p[25:]))
	if 29+dataLen+4 > int64(len(p)) {
		return false
	}
	extLen := int64(binary.LittleEndian.Uint32(p[29+dataLen:]))
	return recFixedSize+dataLen+extLen == int64(len(p))
}

// decodeRecord decodes the payload p (what follows the CRC) of a record
// whose CRC field is crc, in a segment of version, into l, and returns its
// batch marks (0 in version 1). l's Data and Extensions alias p.
func decodeRecord(p []byte, crc uint32, version uint32, l *raft.Log) (byte, error) {
	if !wellFormed(p) || crc32.Checksum(p, castagnoli) != crc {
		return 0, errTorn
	}
	dataLen := int(binary.LittleEndian.Uint32(p[25:]))
	extLen := int(binary.LittleEndian.Uint32(p[29+dataLen:]))
	typ, marks := p[16], byte(0)
	if version >= segVersion2 {
		typ, marks = typ&^typeMarks, typ&typeMarks
	}
	*l = raft.Log{
		Index: binary.LittleEndian.Uint64(p[0:]),
		Term:  binary.LittleEndian.Uint64(p[8:]),
		Type:  raft.LogType(typ),
	}
	if at := int64(binary.LittleEndian.Uint64(p[17:])); at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	if dataLen > 0 {
		l.Data = p[29 : 29+dataLen : 29+dataLen]
	}
	if extLen > 0 {
		o := 29 + dataLen + 4
		l.Extensions = p[o : o+extLen : o+extLen]
	}
	return marks, nil
}
