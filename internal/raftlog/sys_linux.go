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
