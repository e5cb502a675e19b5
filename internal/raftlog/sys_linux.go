package raftlog

import (
	"errors"
	"os"
	"syscall"
)

// preallocate reserves size bytes for f (mode 0: the file size becomes at
// least size; the new space reads as zeros). A file system without
// fallocate leaves the file as it is: the records are then appended at its
// end, which reads as EOF instead of zeros.
func preallocate(f *os.File, size int64) error {
	for {
		err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOSYS):
			return nil
		default:
			return err
		}
	}
}

// datasync is fdatasync(2): the data and the metadata needed to read it
// back (the file size, the conversion of preallocated extents to written
// ones), not the timestamps.
func datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// noSpace reports whether err says that the file system has not the space
// asked for: ENOSPC, EDQUOT (a quota), or EFBIG (the file size limit,
// RLIMIT_FSIZE, or the file system's largest file).
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.EFBIG)
}

// nextData returns the first data region [from, to) of f at or after off
// and before end (lseek SEEK_DATA, SEEK_HOLE), from = to = end if there is
// none: what is not in a data region is a hole and reads as zeros. On
// ext4, XFS and tmpfs, preallocated space that was never written (nor
// read into the page cache) is a hole here, so that Open need not read a
// segment's empty preallocated tail. A file system that does not know
// holes reports all of the file as data.
func nextData(f *os.File, off, end int64) (int64, int64, error) {
	const seekData, seekHole = 3, 4
	fd := int(f.Fd())
	from, err := syscall.Seek(fd, off, seekData)
	if errors.Is(err, syscall.ENXIO) {
		return end, end, nil // no data after off
	}
	if errors.Is(err, syscall.EINVAL) {
		return off, end, nil // whence not supported
	}
	if err != nil {
		return 0, 0, err
	}
	if from >= end {
		return end, end, nil
	}
	to, err := syscall.Seek(fd, from, seekHole)
	if err != nil {
		return 0, 0, err
	}
	return from, min(to, end), nil
}
