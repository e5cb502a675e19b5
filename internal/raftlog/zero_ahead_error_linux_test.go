//go:build linux

package raftlog

import (
	"testing"
)

// TestZeroAheadWriteErrorKeepsRecords: the zeros written ahead are an
// optimisation (they change nothing in the format or the recovery), but a
// failed zero write makes StoreLogs undo records that were written fine and
// return an error, and when the undo's re-preallocation fails too, break the
// Store for good. Here the failing write is EFBIG from RLIMIT_FSIZE (the
// package's fault injection, as in TestFailedFirstWriteThenOtherIndex): the
// segment was preallocated before the limit, the records end below it, the
// zeros ahead (and the undo's fallocate back to the segment size) cross it.
// The same happens with ENOSPC on a file system without fallocate (NFS,
// ZFS before 2.2, FUSE...), where the zeros need up to a MiB of new space
// the records do not. Before the change this StoreLogs succeeded.
func TestZeroAheadWriteErrorKeepsRecords(t *testing.T) {
	dir := t.TempDir()
	const segSize = 8 << 20
	s := open(t, dir, segSize)
	defer func() { s.Close() }()
	m := newModel()
	first := entries(1, 1, 1, 100)
	mustStore(t, s, first) // the segment: preallocated to 8 MiB, zeros to 1 MiB
	m.store(first)

	// Entries of 64 KiB up to 1.75 MiB, under a 2 MiB limit: the records fit,
	// 1 MiB of zeros after them does not.
	ls := entries(2, 28, 1, 64<<10)
	end := s.segs[0].end()
	for _, l := range ls {
		end += int64(recordSize(l))
	}
	var err error
	withFileSizeLimit(t, 2<<20, func() {
		err = s.StoreLogs(ls)
	})
	if err != nil {
		t.Errorf("StoreLogs of records ending at %d, below RLIMIT_FSIZE (2 MiB): %v (zeroWrites %d, broken: %v)", end, err, s.zeroWrites, s.broken)
	} else {
		m.store(ls)
	}
	if s.broken != nil {
		t.Fatalf("the Store is broken after a failed write of zeros only: %v", s.broken)
	}
	more := entries(m.last+1, m.last+1, 1, 100)
	if err := s.StoreLogs(more); err != nil {
		t.Fatalf("next StoreLogs: %v", err)
	}
	m.store(more)
	s = reopen(t, s)
	m.check(t, s, "reopened")
}
