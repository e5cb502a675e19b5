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
