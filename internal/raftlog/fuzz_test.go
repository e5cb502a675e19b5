package raftlog

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ticketing-dev/ticketing/internal/raft"
)

// FuzzOpen damages the segment files of a valid log as the input says and
// opens it. Open must not panic, and must either fail or return a prefix
// of the log (entries 1..last as stored) that keeps every entry of every
// batch followed by a later batch whose bytes are intact: such a batch was
// acknowledged (its fdatasync returned before the later batch was
// written), so dropping it is never a torn write. Nor may it drop entries
// of a batch before the last one while a later batch has a non-zero byte
// left (a block zeroed across two batches): only a log whose later
// batches are zeros throughout looks like a shorter log with a torn last
// batch, or one where the damage rewrote the lengths of the first dropped
// record so that they all claim those bytes.
//
// The log: 1 KiB segments of 61-byte records, batches 1-4, 5-8, 9-12,
// 13-16 (the first segment), 17-20, 21-24, 25-28, 29 (the tail). The
// input is a list of 4-byte operations: b0&3 is the operation (0 set the
// byte to v, 1 zero v+1 bytes, 2 truncate the file, 3 xor the byte with v,
// 0x40 if v is 0), b0>>2&1 the file (0 the tail, 1 the first segment), b1
// and b2 the offset (big endian, modulo the file's length), b3 v.
func FuzzOpen(f *testing.F) {
	lg := buildFuzzLog(f)
	tail := lg.segs[len(lg.segs)-1]
	op := func(code, file byte, off int64, v byte) []byte {
		return []byte{code | file<<2, byte(off >> 8), byte(off), v}
	}
	zeroLen := func(idx uint64) []byte { return op(1, 0, tail.offs[idx-tail.first], 3) }
	f.Add([]byte{})
	f.Add(zeroLen(21))                                                        // the issue: the length of a later batch's first record
	f.Add(zeroLen(22))                                                        // of its second record
	f.Add(op(1, 0, tail.offs[21-tail.first], byte(2*61-1)))                   // records 21-22 zeroed
	f.Add(op(3, 0, tail.offs[22-tail.first]+recHeaderSize+30, 0))             // a bad CRC in 22
	f.Add(zeroLen(26))                                                        // in the last batch but one
	f.Add(op(3, 0, tail.offs[29-tail.first]+20, 0))                           // the last batch torn
	f.Add(op(2, 0, tail.offs[27-tail.first]+7, 0))                            // the file cut short
	f.Add(append(zeroLen(26), op(0, 0, tail.offs[len(tail.offs)-1]+9, 7)...)) // and a byte after the end
	f.Add(op(1, 1, segHeaderSize+61*5, 3))                                    // the first segment: a zero length
	f.Add(op(2, 1, 1000, 0))                                                  // the first segment cut short
	f.Add(op(3, 0, 3, 0))                                                     // the tail's header
	f.Add(op(1, 0, tail.offs[28-tail.first]+40, 60))                          // zeros across the end of 25-28 and the start of 29
	f.Add(op(1, 0, tail.offs[28-tail.first], 80))                             // from 28's length into 29
	f.Add(append(zeroLen(28), op(1, 0, tail.offs[29-tail.first], 20)...))     // 28's length and 29's header
	f.Fuzz(func(t *testing.T, damage []byte) {
		files := lg.damaged(damage)
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "meta"), encodeMeta(1), 0o600); err != nil {
			t.Fatal(err)
		}
		for i, seg := range lg.segs {
			if err := os.WriteFile(filepath.Join(dir, segName(seg.first)), files[i], 0o600); err != nil {
				t.Fatal(err)
			}
		}
		// Every batch before the last intact one must survive.
		var keep uint64
		for i, b := range lg.batches {
			if i > 0 && bytes.Equal(sub(files[b.seg], b.from, b.to), sub(lg.files[b.seg], b.from, b.to)) {
				keep = lg.batches[i-1].last
			}
		}
		s, err := Open(dir, Options{SegmentSize: fuzzSegSize})
		if err != nil {
			return
		}
		defer s.Close()
		first, _ := s.FirstIndex()
		last, _ := s.LastIndex()
		if last < keep || last > lg.last || (last > 0 && first != 1) || (last == 0 && first != 0) {
			t.Fatalf("Open succeeded with [%d, %d]; the log was [1, %d], and every entry up to %d was followed by an intact later batch", first, last, lg.last, keep)
		}
		if last < lg.last {
			lg.checkCut(t, files, last)
		}
		var l raft.Log
		for i := uint64(1); i <= last; i++ {
			if err := s.GetLog(i, &l); err != nil {
				t.Fatalf("GetLog(%d) of [1, %d]: %v", i, last, err)
			}
			want := fuzzEntry(i)
			if l.Index != i || l.Term != want.Term || l.Type != want.Type || !bytes.Equal(l.Data, want.Data) {
				t.Fatalf("GetLog(%d) = index %d term %d type %v data %x; want %x", i, l.Index, l.Term, l.Type, l.Data, want.Data)
			}
		}
	})
}

const fuzzSegSize = 1024

// fuzzEntry is entry i of FuzzOpen's log: 20 bytes of data, 61 a record.
func fuzzEntry(i uint64) *raft.Log { return entry(i, 1, 20) }

type fuzzBatch struct {
	seg      int   // in fuzzLog.segs
	from, to int64 // its bytes in the file
	last     uint64
}

type fuzzLog struct {
	segs    []*segment // first and offs only
	files   [][]byte
	batches []fuzzBatch
	last    uint64
}

// buildFuzzLog stores FuzzOpen's log and reads its files.
func buildFuzzLog(f *testing.F) *fuzzLog {
	if n := recordSize(fuzzEntry(1)); n != 61 {
		f.Fatalf("a record of %d bytes, want 61", n)
	}
	dir := f.TempDir()
	s, err := Open(dir, Options{SegmentSize: fuzzSegSize})
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	lg := &fuzzLog{}
	for _, b := range [][2]uint64{{1, 4}, {5, 8}, {9, 12}, {13, 16}, {17, 20}, {21, 24}, {25, 28}, {29, 29}} {
		var ls []*raft.Log
		for i := b[0]; i <= b[1]; i++ {
			ls = append(ls, fuzzEntry(i))
		}
		if err := s.StoreLogs(ls); err != nil {
			f.Fatal(err)
		}
		seg := s.segs[len(s.segs)-1]
		lg.batches = append(lg.batches, fuzzBatch{seg: len(s.segs) - 1, from: seg.offs[b[0]-seg.first], to: seg.end(), last: b[1]})
		lg.last = b[1]
	}
	if len(s.segs) != 2 || s.segs[1].first != 17 {
		f.Fatalf("segments from %d and %d; want 1 and 17", s.segs[0].first, s.segs[len(s.segs)-1].first)
	}
	for _, seg := range s.segs {
		b, err := os.ReadFile(seg.path)
		if err != nil {
			f.Fatal(err)
		}
		lg.segs = append(lg.segs, &segment{first: seg.first, offs: append([]int64(nil), seg.offs...)})
		lg.files = append(lg.files, b)
	}
	return lg
}

// damaged returns copies of the files with damage applied (see FuzzOpen).
func (lg *fuzzLog) damaged(damage []byte) [][]byte {
	files := make([][]byte, len(lg.files))
	for i, b := range lg.files {
		files[i] = bytes.Clone(b)
	}
	for k := 0; k+4 <= len(damage) && k < 4*16; k += 4 {
		code, v := damage[k]&3, damage[k+3]
		fi := len(files) - 1 // the tail
		if damage[k]>>2&1 == 1 {
			fi = 0
		}
		b := files[fi]
		if len(b) == 0 {
			continue
		}
		off := (int(damage[k+1])<<8 | int(damage[k+2])) % len(b)
		switch code {
		case 0:
			b[off] = v
		case 1:
			clear(b[off:min(len(b), off+int(v)+1)])
		case 2:
			files[fi] = b[:off]
		case 3:
			if v == 0 {
				v = 0x40
			}
			b[off] ^= v
		}
	}
	return files
}

// sub is b[from:to], or nil if b is shorter.
func sub(b []byte, from, to int64) []byte {
	if int64(len(b)) < to {
		return nil
	}
	return b[from:to]
}

// checkCut fails t if Open, returning entries up to last, dropped entries
// of a batch before the last one while a later batch has a non-zero byte
// in files, unless the damage rewrote the lengths of the first dropped
// record so that every one of them claims more than its bytes (a torn
// record is judged by its lengths).
func (lg *fuzzLog) checkCut(t *testing.T, files [][]byte, last uint64) {
	t.Helper()
	c := last + 1
	bi := slices.IndexFunc(lg.batches, func(b fuzzBatch) bool { return c <= b.last })
	if bi < 0 || bi == len(lg.batches)-1 {
		return
	}
	seg := lg.segs[lg.batches[bi].seg]
	o := seg.offs[c-seg.first]
	file := files[lg.batches[bi].seg]
	// The ends the damaged record's lengths claim: its length field (if
	// not zero or absurd), and its data and extensions lengths (if they
	// can be read).
	origEnd := o + int64(recordSize(fuzzEntry(c)))
	var claims []int64
	u32 := func(at int64) (int64, bool) {
		if at+4 > int64(len(file)) {
			return 0, false
		}
		return int64(binary.LittleEndian.Uint32(file[at:])), true
	}
	if n, ok := u32(o); ok && n > 0 && n <= maxRecordSize {
		claims = append(claims, o+recHeaderSize+n)
	}
	if d, ok := u32(o + recHeaderSize + 25); ok {
		if e, ok := u32(o + recHeaderSize + 29 + d); ok {
			claims = append(claims, o+recHeaderSize+recFixedSize+d+e)
		}
	}
	if len(claims) > 0 && !slices.ContainsFunc(claims, func(end int64) bool { return end <= origEnd }) {
		return
	}
	for _, b := range lg.batches[bi+1:] {
		f := files[b.seg]
		rest := f[min(int64(len(f)), b.from):min(int64(len(f)), b.to)]
		if i := slices.IndexFunc(rest, func(x byte) bool { return x != 0 }); i >= 0 {
			t.Fatalf("Open dropped entries %d.. of the batch ending at %d, but the later batch ending at %d has a non-zero byte at offset %d", c, lg.batches[bi].last, b.last, b.from+int64(i))
		}
	}
}
