package raftlog

// Zeros written ahead.
//
// A segment is preallocated with fallocate, which on ext4 and XFS leaves
// unwritten extents: space reserved, reading as zeros. A write into one
// converts the written part to a written extent, and the fdatasync after
// it must then also write that change (the inode, or an extent block)
// before it returns: on ext4 one more synchronous write in every
// StoreLogs, found here to be about a quarter of a StoreLogs' cost (the
// write, the inode, the cache flush). So the Store writes zeros ahead of
// its records, zeroChunk at a time, in the same StoreLogs that comes within
// half a chunk of the zeroed part (and the first chunk with a new
// segment's header): the conversion then costs one inode write per chunk,
// not per StoreLogs, and an fdatasync after a write into zeroed bytes
// writes the data and flushes the disk's cache, nothing more. Zeros
// written ahead read as the end of the records, as preallocated space
// does, so the format and the recovery are as before.

// zeroChunk is how much is zeroed ahead of the records at a time.
const zeroChunk = 1 << 20

// zeroBlock is zeroChunk zero bytes, only ever read.
var zeroBlock = make([]byte, zeroChunk)

// zeroAhead writes zeros after seg's records, which end at end, when
// fewer than zeroChunk/2 bytes are zeroed past end; the caller's next
// fsync makes them durable. Called with wmu held.
func (s *Store) zeroAhead(seg *segment, end int64) error {
	if seg.zeroed >= s.segSize || end+zeroChunk/2 <= seg.zeroed {
		return nil
	}
	from := max(seg.zeroed, end)
	to := min(from+zeroChunk, s.segSize)
	if to <= from {
		return nil
	}
	if _, err := seg.f.WriteAt(zeroBlock[:to-from], from); err != nil {
		return err
	}
	seg.zeroed = to
	s.zeroWrites++
	return nil
}
