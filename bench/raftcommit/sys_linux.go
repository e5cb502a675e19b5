package main

import (
	"errors"
	"os"
	"syscall"
)

// datasync is fdatasync(2), as internal/raftlog calls it.
func datasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
