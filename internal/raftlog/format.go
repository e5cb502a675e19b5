package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/hashicorp/raft"
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
// file ends the records.
//
// The meta file holds the first index the log may hold (entries below it
// are deleted even if a segment still has them):
//
//	magic [8]byte "TKRFTMET", version u32, first index u64, CRC32C u32 of
//	the 20 bytes before it
const (
	segMagic      = "TKRFTLOG"
	metaMagic     = "TKRFTMET"
	formatVersion = 1

	segHeaderSize = 32
	metaSize      = 24

	recHeaderSize = 8                     // length, CRC
	recFixedSize  = 8 + 8 + 1 + 8 + 4 + 4 // index .. data length, extensions length
	// maxRecordSize bounds a record's length field, so that a corrupt
	// length is not taken for a huge allocation.
	maxRecordSize = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errTorn marks a record that is incomplete or fails its CRC.
var errTorn = errors.New("torn or corrupt record")

func encodeSegHeader(first uint64) []byte {
	b := make([]byte, segHeaderSize)
	copy(b, segMagic)
	binary.LittleEndian.PutUint32(b[8:], formatVersion)
	binary.LittleEndian.PutUint64(b[16:], first)
	binary.LittleEndian.PutUint32(b[24:], crc32.Checksum(b[:24], castagnoli))
	return b
}

func decodeSegHeader(b []byte) (uint64, error) {
	if len(b) < segHeaderSize || string(b[:8]) != segMagic {
		return 0, errors.New("not a segment file (bad magic)")
	}
	if crc32.Checksum(b[:24], castagnoli) != binary.LittleEndian.Uint32(b[24:]) {
		return 0, errors.New("segment header CRC mismatch")
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != formatVersion {
		return 0, fmt.Errorf("segment format version %d, want %d", v, formatVersion)
	}
	return binary.LittleEndian.Uint64(b[16:]), nil
}

func encodeMeta(first uint64) []byte {
	b := make([]byte, metaSize)
	copy(b, metaMagic)
	binary.LittleEndian.PutUint32(b[8:], formatVersion)
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
	if v := binary.LittleEndian.Uint32(b[8:]); v != formatVersion {
		return 0, fmt.Errorf("meta format version %d, want %d", v, formatVersion)
	}
	return binary.LittleEndian.Uint64(b[12:]), nil
}

// recordSize is the encoded size of l.
func recordSize(l *raft.Log) int {
	return recHeaderSize + recFixedSize + len(l.Data) + len(l.Extensions)
}

// appendRecord appends l's record to b.
func appendRecord(b []byte, l *raft.Log) []byte {
	start := len(b)
	n := recordSize(l)
	b = append(b, make([]byte, n)...)
	r := b[start:]
	binary.LittleEndian.PutUint32(r[0:], uint32(n-recHeaderSize))
	p := r[recHeaderSize:]
	binary.LittleEndian.PutUint64(p[0:], l.Index)
	binary.LittleEndian.PutUint64(p[8:], l.Term)
	p[16] = byte(l.Type)
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

// decodeRecord decodes the payload p (what follows the CRC) of a record
// whose CRC field is crc into l. l's Data and Extensions alias p.
func decodeRecord(p []byte, crc uint32, l *raft.Log) error {
	if len(p) < recFixedSize || crc32.Checksum(p, castagnoli) != crc {
		return errTorn
	}
	dataLen := int(binary.LittleEndian.Uint32(p[25:]))
	if 29+dataLen+4 > len(p) {
		return errTorn
	}
	extLen := int(binary.LittleEndian.Uint32(p[29+dataLen:]))
	if recFixedSize+dataLen+extLen != len(p) {
		return errTorn
	}
	*l = raft.Log{
		Index: binary.LittleEndian.Uint64(p[0:]),
		Term:  binary.LittleEndian.Uint64(p[8:]),
		Type:  raft.LogType(p[16]),
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
	return nil
}
