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

// zeroAhead records that seg's bytes are written up to end (its records
// end there) and writes zeros after them when fewer than zeroChunk/2
// bytes are zeroed past end; the caller's next fsync makes them durable.
// Called with wmu held.
//
// It is best effort: the zeros only spare the fdatasyncs some work, and a
// failed or partial write of them leaves zeros or preallocated space past
// the records, which read the same. So an error (ENOSPC or EFBIG where the
// records fit, as without fallocate) is not the caller's: the records stay,
// and zeroing stops for the segment (zeroed is set to the segment size)
// until a cut lowers zeroed again. An I/O error the page cache keeps shows
// in the caller's fsync.
func (s *Store) zeroAhead(seg *segment, end int64) {
	seg.zeroed = max(seg.zeroed, end)
	if seg.zeroed >= seg.size || end+zeroChunk/2 <= seg.zeroed {
		return
	}
	from := seg.zeroed
	to := min(from+zeroChunk, seg.size)
	if _, err := seg.f.WriteAt(zeroBlock[:to-from], from); err != nil {
		s.logger.Warn("writing zeros ahead of the records failed: not writing more in this segment", "file", seg.path, "offset", from, "error", err)
		seg.zeroed = seg.size
		return
	}
	seg.zeroed = to
	s.zeroWrites++
}
